"""Building batch rows that no rollout engine sampled (demonstrations, gold answers, expert
traces, re-tokenized peer texts), rebuilding sampled rows on another prompt (a hinted
sample trained on the unhinted prompt), and assembling a method's mixed groups.

Every row built here carries its source and producer (`policylab.batch`), and its
behavior log-probs as known: a deterministic producer (a solver) writes its text with
probability 1 (log-prob 0.0, exactly); a producer whose per-token log-probs are unknown in
the learner's tokenization has `behavior_mask` False there.
"""

from __future__ import annotations

import torch

from policylab.batch import RolloutBatch, SamplingSettings, concat_batches
from policylab.errors import ShapeError
from policylab.methods.context import Sampled


def response_ids(tokenizer, text: str) -> list[int]:
    """The learner's tokenization of a response text, ending with the eos token (as a
    sampled response that finished)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(ids) + [int(tokenizer.eos_token_id)]


def real_prompts(batch: RolloutBatch) -> list[list[int]]:
    """Each row's prompt ids without left padding."""
    P = batch.prompt_width
    return [row[:P][m[:P]].tolist() for row, m in zip(batch.tokens, batch.attention_mask)]


def build_rows(prompts: list[list[int]], responses: list[list[int]], *, group: list[int], source: list[str],
               producer: list[str], policy_version: int, batch_id: str, sampling: SamplingSettings, engine: str,
               pad_id: int, counted_from: list[int] | None = None, logp_behavior: list[list[float]] | None = None,
               behavior_known: list[list[bool]] | None = None, prompt_index: list[int] | None = None) -> RolloutBatch:
    """A validated RolloutBatch of given rows (prompt ids, response ids).

    counted_from[i]: the first response position that counts in the loss (default 0; an
    expert prefix before it is context, attended to but not trained on).
    logp_behavior[i]: the producer's log-prob per response token (default: 0.0 for every
    token, a deterministic producer). behavior_known[i]: where those are known (default:
    everywhere)."""
    B = len(prompts)
    if not (len(responses) == len(group) == len(source) == len(producer) == B):
        raise ShapeError("prompts, responses, group, source and producer need one entry per row")
    if any(len(r) == 0 for r in responses):
        raise ShapeError("a row has an empty response")
    P, T = max(len(p) for p in prompts), max(len(r) for r in responses)
    tokens = torch.full((B, P + T), int(pad_id), dtype=torch.long)
    att = torch.zeros((B, P + T), dtype=torch.bool)
    loss_mask = torch.zeros((B, T), dtype=torch.bool)
    lpb = torch.zeros((B, T))
    known = torch.zeros((B, T), dtype=torch.bool)
    start = counted_from or [0] * B
    for i, (p, r) in enumerate(zip(prompts, responses)):
        tokens[i, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        att[i, P - len(p):P] = True
        tokens[i, P:P + len(r)] = torch.tensor(r, dtype=torch.long)
        att[i, P:P + len(r)] = True
        if not 0 <= start[i] < len(r):
            raise ShapeError(f"row {i}: counted_from {start[i]} outside its {len(r)} response tokens")
        loss_mask[i, start[i]:len(r)] = True
        if logp_behavior is not None:
            if len(logp_behavior[i]) != len(r):
                raise ShapeError(f"row {i}: {len(logp_behavior[i])} behavior log-probs for {len(r)} tokens")
            lpb[i, :len(r)] = torch.tensor(logp_behavior[i], dtype=lpb.dtype)
        kn = behavior_known[i] if behavior_known is not None else [True] * len(r)
        known[i, :len(r)] = torch.tensor(kn, dtype=torch.bool)
    lpb = torch.where(loss_mask, lpb, torch.zeros(()))
    return RolloutBatch(
        tokens=tokens, attention_mask=att, loss_mask=loss_mask, prompt_width=P,
        group=torch.tensor(group, dtype=torch.long), policy_version=torch.full((B,), int(policy_version)),
        batch_id=batch_id, source=tuple(source), producer=tuple(producer), engine=engine, sampling=sampling,
        logp_behavior=lpb, behavior_mask=known,
        extras={"truncated": torch.zeros(B, dtype=torch.bool),
                "prompt_lengths": torch.tensor([len(p) for p in prompts]),
                "prompt_index": torch.tensor(prompt_index if prompt_index is not None else list(range(B)))},
    ).validate()


def with_prompts(batch: RolloutBatch, prompts: list[list[int]], *, pad_id: int, source: list[str] | None = None,
                 producer: list[str] | None = None) -> RolloutBatch:
    """`batch` with each row's prompt replaced by `prompts[i]` (left-padded again); the
    response columns, masks and every [B, T] field are unchanged. A change of source
    (native -> hinted) goes through `RolloutBatch.replace`, which refuses any relabel
    that would make a non-native row native."""
    B = batch.size
    if len(prompts) != B:
        raise ShapeError(f"{len(prompts)} prompts for {B} rows")
    P = max(len(p) for p in prompts)
    ptoks = torch.full((B, P), int(pad_id), dtype=torch.long)
    patt = torch.zeros((B, P), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ptoks[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        patt[i, P - len(p):] = True
    W = batch.prompt_width
    changes = dict(tokens=torch.cat([ptoks, batch.tokens[:, W:]], 1),
                   attention_mask=torch.cat([patt, batch.attention_mask[:, W:]], 1), prompt_width=P,
                   extras={**batch.extras, "prompt_lengths": torch.tensor([len(p) for p in prompts])})
    if source is not None:
        changes["source"] = tuple(source)
    if producer is not None:
        changes["producer"] = tuple(producer)
    return batch.replace(**changes).validate()


def assemble(parts: list[tuple[RolloutBatch, list[str], list]], *, batch_id: str, group_order: list[int],
             prompt_ids: list[list[int]], group_examples: list) -> Sampled:
    """The parts (batch, texts, examples) as one `Sampled` whose rows are grouped by
    prompt in `group_order`, each group's rows in the order of the parts."""
    batch = concat_batches([b for b, _, _ in parts], batch_id)
    texts = [t for _, ts, _ in parts for t in ts]
    examples = [e for _, _, es in parts for e in es]
    pos = {g: j for j, g in enumerate(group_order)}
    gids = batch.group.tolist()
    order = sorted(range(batch.size), key=lambda i: (pos[gids[i]], i))
    return Sampled(batch.select(torch.tensor(order, dtype=torch.long)), [texts[i] for i in order],
                   [examples[i] for i in order], prompt_ids, group_examples)
