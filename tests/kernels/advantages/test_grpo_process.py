"""grpo_process (advantages/grpo_process.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages import grpo, grpo_process
from policylab.errors import GroupError, MissingQuantityError, NonFiniteError, PolicylabError, ShapeError

F64 = torch.float64


def naive_grpo_process(step_rewards, step_ends, step_mask, group, T, std, eps):
    B, K = step_rewards.shape
    normed = {}
    for gid in set(group.tolist()):
        pool = [(b, k) for b in range(B) for k in range(K) if group[b] == gid and step_mask[b, k]]
        vals = [float(step_rewards[b, k]) for b, k in pool]
        mean = sum(vals) / len(vals)
        ddof = 1 if std == "unbiased" else 0
        s = (sum((x - mean) ** 2 for x in vals) / max(len(vals) - ddof, 1)) ** 0.5
        for (b, k), x in zip(pool, vals):
            normed[b, k] = 0.0 if len(set(vals)) == 1 else (x - mean) / (s + eps)
    out = torch.zeros(B, T, dtype=step_rewards.dtype)
    for b in range(B):
        for t in range(T):
            out[b, t] = sum(normed[b, k] for k in range(K) if step_mask[b, k] and int(step_ends[b, k]) >= t)
    return out


def hand_inputs():
    # y1 step rewards [0.2, 1.0], y2 [0.2, 0.0]; steps end at tokens 2 and 4 (1-based),
    # i.e. indices 1 and 3 (0-based, inclusive)
    step_rewards = torch.tensor([[0.2, 1.0], [0.2, 0.0]], dtype=F64)
    step_ends = torch.tensor([[1, 3], [1, 3]])
    step_mask = torch.ones(2, 2, dtype=torch.bool)
    return step_rewards, step_ends, step_mask, torch.tensor([6, 6])


def test_hand_case_population():
    # pool = [0.2, 1.0, 0.2, 0.0], mean 0.35
    # deviations [−0.15, 0.65, −0.15, −0.35]; Σ dev² = 0.0225 + 0.4225 + 0.0225 + 0.1225 = 0.59
    # population std = √(0.59/4) = 0.38406
    # r̃ = [−0.3906, 1.6925 | −0.3906, −0.9113]
    # y1: tokens 1-2 get −0.3906 + 1.6925 = 1.3019, tokens 3-4 get 1.6925
    # y2: tokens 1-2 get −0.3906 − 0.9113 = −1.3019, tokens 3-4 get −0.9113
    a = grpo_process(*hand_inputs(), T=4, std="population", eps=0.0)
    expected = torch.tensor([[1.3019, 1.3019, 1.6925, 1.6925], [-1.3019, -1.3019, -0.9113, -0.9113]], dtype=F64)
    assert_close(a, expected, rtol=0, atol=1e-4)


def test_pool_is_the_group_not_one_response():
    sr, se, sm, g = hand_inputs()
    pooled = grpo_process(sr, se, sm, g, T=4, std="population", eps=0.0)
    # normalizing each response alone: y1 [0.2, 1.0] → [−1, 1], token 1 gets 0 — different
    per_response = grpo_process(sr, se, sm, torch.tensor([6, 7]), T=4, std="population", eps=0.0)
    assert_close(per_response[0], torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=F64), rtol=0, atol=1e-12)
    assert (pooled - per_response).abs().max() > 0.3


def test_tokens_after_the_last_step_get_zero():
    a = grpo_process(*hand_inputs(), T=6, std="population", eps=0.0)
    assert a[:, 4:].tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_one_step_per_response_reduces_to_grpo():
    g = torch.Generator().manual_seed(1)
    r = torch.randn(8, generator=g, dtype=F64)
    group = torch.tensor([30, 2, 30, 2, 2, 30, 17, 17])
    T = 5
    for std in ("unbiased", "population"):
        a = grpo_process(r.unsqueeze(1), torch.full((8, 1), T - 1), torch.ones(8, 1, dtype=torch.bool), group, T=T, std=std)
        assert_close(a, grpo(r, group, std=std).unsqueeze(1).expand(8, T))


@pytest.mark.parametrize("std", ["unbiased", "population"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_reference(std, seed):
    g = torch.Generator().manual_seed(seed)
    B, K, T = 9, 4, 12
    step_rewards = torch.randn(B, K, generator=g, dtype=F64)
    step_mask = torch.rand(B, K, generator=g) > 0.35
    step_mask[:, 0] = True
    # strictly increasing ends: cumulative positive gaps
    step_ends = torch.randint(1, 3, (B, K), generator=g).cumsum(1) - 1
    step_rewards[~step_mask] = float("nan")  # ignored entries may hold anything
    group = torch.tensor([8, -1, 8, 50, -1, 50, 8, 3, 50])
    a = grpo_process(step_rewards, step_ends, step_mask, group, T=T, std=std, eps=1e-6)
    assert_close(a, naive_grpo_process(step_rewards, step_ends, step_mask, group, T, std, 1e-6))


def test_zero_spread_pool_and_singleton_pool():
    sr = torch.tensor([[0.5, 0.5], [0.5, 0.0], [1.0, 0.0]], dtype=F64)
    se = torch.tensor([[0, 1], [1, 2], [0, 0]])
    sm = torch.tensor([[True, True], [True, False], [True, False]])
    # group 1 pool = [0.5, 0.5, 0.5] → all zero; group 2 pool = [1.0] (single step) → zero
    a = grpo_process(sr, se, sm, torch.tensor([1, 1, 2]), T=3)
    assert (a == 0).all()
    with pytest.raises(GroupError, match=r"\[2\]"):
        grpo_process(sr, se, sm, torch.tensor([1, 1, 2]), T=3, on_singleton="raise")


def test_bad_inputs():
    sr, se, sm, g = hand_inputs()
    with pytest.raises(MissingQuantityError, match="grpo_process needs `step_ends`"):
        grpo_process(sr, None, sm, g, T=4)
    no_step = sm.clone()
    no_step[1] = False
    with pytest.raises(MissingQuantityError, match=r"Row\(s\) \[1\] have no valid step"):
        grpo_process(sr, se, no_step, g, T=4)
    with pytest.raises(ShapeError, match=r"`step_ends`\[0, 1\] = 4 is outside the response \[0, 4\)"):
        grpo_process(sr, torch.tensor([[1, 4], [1, 3]]), sm, g, T=4)
    with pytest.raises(ShapeError, match="row 1 step 1 ends at 1"):
        grpo_process(sr, torch.tensor([[1, 3], [1, 1]]), sm, g, T=4)
    with pytest.raises(ShapeError, match="integer tensor"):
        grpo_process(sr, se.double(), sm, g, T=4)
    with pytest.raises(ShapeError, match="`step_mask` has shape"):
        grpo_process(sr, se, sm[:, :1], g, T=4)
    nan = sr.clone()
    nan[1, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"`step_rewards`.*index \[1, 0\]"):
        grpo_process(nan, se, sm, g, T=4)
    with pytest.raises(PolicylabError, match="`T` must be a positive int"):
        grpo_process(sr, se, sm, g, T=0)
    with pytest.raises(ShapeError, match="`group` has 3 entries but there are 2"):
        grpo_process(sr, se, sm, torch.tensor([6, 6, 6]), T=4)
