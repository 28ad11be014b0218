"""ZCPO: the hand-worked coefficients, zero sums, eligibility, a naive loop reference, the
exact full-vocabulary KL (and the refusal of a sampled-token log-ratio in its place), and
the trainer's skipped step when no group is eligible (bit-identical weights under weight
decay, no scheduler advance)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from policylab import methods
from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.objectives.zcpo import (
    FullVocabKL,
    from_worker,
    full_vocab_kl,
    response_drift,
    zcpo_coefficients,
)

F = torch.float64
ONE = torch.ones(4, 1, dtype=torch.bool)


def _kl(values):
    return FullVocabKL(torch.tensor(values, dtype=F).reshape(-1, 1), "test")


def test_hand_worked_coefficients_sum_to_zero():
    # rewards [1,0,0,1]: mean 0.5, population σ = 0.5; K = [0.1,0.3,0.2,0.2]: mean 0.2, β = 1
    # c = ((r − 0.5) − (K − 0.2))/0.5 = [(0.5−(−0.1)), (−0.5−0.1), (−0.5−0), (0.5−0)]/0.5 = [1.2, −1.2, −1.0, 1.0]
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=F)
    c, info = zcpo_coefficients(r, torch.zeros(4, dtype=torch.long), _kl([0.1, 0.3, 0.2, 0.2]), ONE, beta=1.0,
                                std="population")
    assert_close(c, torch.tensor([1.2, -1.2, -1.0, 1.0], dtype=F))
    assert abs(float(c.sum())) < 1e-12 and info["zcpo/eligible_group_frac"] == 1.0


def test_ineligible_groups():
    # equal rewards with unequal drift: σ = 0, ineligible, c = 0; G = 1: ineligible
    r = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=F)
    c, info = zcpo_coefficients(r, torch.tensor([0, 0, 1, 2]), _kl([0.1, 0.5, 0.2, 0.2]), ONE, beta=1.0,
                                std="population")
    assert bool((c == 0).all()) and info["zcpo/eligible_group_frac"] == 0.0


def _naive(r, group, K, beta, ddof):
    out = []
    for i in range(len(r)):
        idx = [j for j in range(len(r)) if group[j] == group[i]]
        rs, ks = [r[j] for j in idx], [K[j] for j in idx]
        mr, mk = sum(rs) / len(rs), sum(ks) / len(ks)
        sd = math.sqrt(sum((x - mr) ** 2 for x in rs) / max(len(rs) - ddof, 1))
        out.append(0.0 if len(idx) < 2 or sd == 0 else ((r[i] - mr) - beta * (K[i] - mk)) / sd)
    return out


@pytest.mark.parametrize("std, ddof", [("population", 0), ("unbiased", 1)])
def test_matches_a_naive_loop_with_padding(std, ddof):
    g = torch.Generator().manual_seed(1)
    B, T = 10, 5
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:, 0] = True
    mask[2, :] = torch.tensor([False, False, True, True, False])  # leading and trailing padding
    kl = torch.where(mask, torch.rand(B, T, generator=g, dtype=F), torch.tensor(99.0, dtype=F))  # garbage outside
    r = torch.randint(0, 2, (B,), generator=g).to(F)
    group = torch.tensor([3, 3, 3, 1, 1, 8, 8, 8, 8, 5])
    c, _ = zcpo_coefficients(r, group, FullVocabKL(kl, "t"), mask, beta=0.7, std=std)
    K = [float(kl[i][mask[i]].mean()) for i in range(B)]
    assert_close(c, torch.tensor(_naive(r.tolist(), group.tolist(), K, 0.7, ddof), dtype=F))


def test_full_vocab_kl_is_exact_and_a_sampled_log_ratio_is_refused():
    g = torch.Generator().manual_seed(0)
    lp = torch.log_softmax(torch.randn(2, 3, 11, generator=g, dtype=F), -1)
    lq = torch.log_softmax(torch.randn(2, 3, 11, generator=g, dtype=F), -1)
    mask = torch.tensor([[True, True, False], [False, True, True]])
    got = full_vocab_kl(lp, lq, mask).values
    for i in range(2):
        for t in range(3):
            want = float((lp[i, t].exp() * (lp[i, t] - lq[i, t])).sum()) if mask[i, t] else 0.0
            assert math.isclose(float(got[i, t]), want, abs_tol=1e-12)
    with pytest.raises(ShapeError, match="full-vocabulary log-probs \\[B, T, V\\].*sampled-token log-ratio is not"):
        full_vocab_kl(lp[..., 0], lq[..., 0], mask)
    sampled = lp[..., 0] - lq[..., 0]  # a [B, T] sampled-token log-ratio
    with pytest.raises(PolicylabError, match="needs the full-vocabulary KL drift.*vocab_stats"):
        zcpo_coefficients(torch.tensor([1.0, 0.0], dtype=F), torch.zeros(2, dtype=torch.long), sampled, mask,
                          beta=1.0, std="population")
    with pytest.raises(PolicylabError, match="negative at a counted position"):
        response_drift(from_worker(torch.where(mask, sampled, 0.0) - 1.0), mask)


def test_bad_input():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=F)
    with pytest.raises(PolicylabError, match="std"):
        zcpo_coefficients(r, torch.zeros(4, dtype=torch.long), _kl([0.1] * 4), ONE, beta=1.0, std=None)
    with pytest.raises(PolicylabError, match="beta"):
        zcpo_coefficients(r, torch.zeros(4, dtype=torch.long), _kl([0.1] * 4), ONE, beta=-1.0, std="population")


def test_method_refuses_a_separate_kl_or_entropy_term():
    m = methods.get("zcpo")
    with pytest.raises(PolicylabError, match="no separate KL loss"):
        m.with_params({"kl_coef": 0.1}, methods.RunShape())
    with pytest.raises(PolicylabError, match="entropy_coef=0"):
        m.with_params({"entropy_coef": 0.1}, methods.RunShape())


def test_no_eligible_group_skips_the_step_bit_identically_under_weight_decay(tiny_model_dir, tmp_path):
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    cfg = tiny_config(tiny_model_dir, tmp_path / "z", method="zcpo", method_params={},
                      train={"weight_decay": 0.1, "steps": 3})
    tr = Trainer(cfg)
    tr.task.reward_fn = lambda texts, answers, **kw: [1.0] * len(texts)  # every group all-equal: none eligible
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    sched = tr.scheduler.last_epoch
    m = tr.train_step()
    assert m["skipped_no_signal"] == 1.0 and m["adv/zcpo/eligible_group_frac"] == 0.0
    assert tr.policy_version == 0 and tr.scheduler.last_epoch == sched and not tr.optimizer.state
    for k, v in tr.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    # with a reward signal the same run trains, and weight decay moves the weights
    tr.task.reward_fn = lambda texts, answers, **kw: [float(i % 2) for i in range(len(texts))]
    m = tr.train_step()
    assert m.get("skipped_no_signal", 0.0) == 0.0 and tr.policy_version == 1
    assert any(not torch.equal(v, before[k]) for k, v in tr.model.state_dict().items())
