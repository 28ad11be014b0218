"""The rule-based line-step scorer used by grpo_process in the trainer."""

import torch

from policylab.kernels.rewards import exact_numeric_reward
from policylab.kernels.rewards.process import line_steps


def test_lines_become_steps_with_their_own_rewards(tokenizer):
    text = "3 + 4 = 8\nso 7"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    T = len(ids) + 3
    tokens = torch.tensor([ids + [0, 0, 0]])
    mask = torch.tensor([[True] * len(ids) + [False] * 3])
    out = line_steps(tokenizer, tokens, mask, ["7"], exact_numeric_reward)
    # two lines: "3 + 4 = 8\n" (last number 8: wrong -> 0) and "so 7" (right -> 1)
    assert out["step_mask"][0].tolist()[:3] == [True, True, False]
    assert out["step_rewards"][0, :2].tolist() == [0.0, 1.0]
    # the first step ends at the token holding the newline, the last at the last valid token
    first_end = int(out["step_ends"][0, 0])
    assert "\n" in tokenizer.decode([ids[first_end]])
    assert int(out["step_ends"][0, 1]) == len(ids) - 1 < T


def test_empty_response_has_no_step(tokenizer):
    out = line_steps(tokenizer, torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.bool), ["1"],
                     exact_numeric_reward)
    assert not out["step_mask"].any()
