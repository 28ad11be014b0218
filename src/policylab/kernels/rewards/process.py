"""A rule-based process reward for `grpo_process`: a response's steps are its lines.

Step k of response i ends at the response token where its line ends (a token whose text
contains a newline, or the last valid token). A step scores `reward_fn([line], [answer])`:
with the exact-numeric verifier, a line earns 1 when its last number is the correct result.
This is a transparent stand-in for a process reward model, enough to exercise the
process-supervision advantage end to end; it is not a PRM.
"""

from __future__ import annotations

import torch


def line_steps(tokenizer, response_tokens: torch.Tensor, loss_mask: torch.Tensor, answers: list[str], reward_fn,
               *, max_steps: int = 8) -> dict[str, torch.Tensor]:
    """Per-step rewards `[B, K]`, step ends `[B, K]` (response-token index, inclusive) and
    step mask `[B, K]` for responses split at newlines. Lines beyond `max_steps` merge into
    the last step. A response with no valid token has no step (step_mask all False)."""
    B, T = response_tokens.shape
    ends = torch.zeros(B, max_steps, dtype=torch.long)
    rewards = torch.zeros(B, max_steps)
    smask = torch.zeros(B, max_steps, dtype=torch.bool)
    for i in range(B):
        n = int(loss_mask[i].sum())
        if n == 0:
            continue
        toks = response_tokens[i, :n].tolist()
        cuts = [t for t, tok in enumerate(toks[:-1]) if "\n" in tokenizer.decode([tok])]
        cuts = cuts[: max_steps - 1] + [n - 1]
        start = 0
        for k, end in enumerate(cuts):
            text = tokenizer.decode(toks[start : end + 1], skip_special_tokens=True)
            rewards[i, k] = float(reward_fn([text], [answers[i]])[0])
            ends[i, k], smask[i, k] = end, True
            start = end + 1
    return {"step_rewards": rewards, "step_ends": ends, "step_mask": smask}
