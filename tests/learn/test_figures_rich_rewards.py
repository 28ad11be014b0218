"""The figures of rlcr, mad_rl, rlcpr, code_opt and rfpo: their points equal fresh calls of
the kernels (rlcr's and mad_rl's through the method's own stage, so the parse and the
class mapping are in the loop)."""

from __future__ import annotations

import math

import torch

from policylab.learn import figures as F
from policylab.kernels.rewards import calibration as cal
from policylab.kernels.rewards import critic_reward as crit
from policylab.kernels.rewards import distribution as dist


def _series(fig, panel, label_start):
    return next(s for s in fig.panels[panel].series if s.label["en"].startswith(label_start))


def test_rlcr_points_are_c_minus_the_brier_term_and_the_penalty():
    fig = F.figure("rlcr")
    right, wrong = _series(fig, 0, "right"), _series(fig, 0, "wrong")
    q = torch.tensor(right.x)
    ones, valid = torch.ones_like(q), torch.ones_like(q, dtype=torch.bool)
    torch.testing.assert_close(torch.tensor(right.y), cal.rlcr_rewards(ones, q, valid, invalid_penalty=1.0).double(),
                               check_dtype=False)
    torch.testing.assert_close(torch.tensor(wrong.y), cal.rlcr_rewards(0 * ones, q, valid, invalid_penalty=1.0).double(),
                               check_dtype=False)
    # q = 0.5, right: 1 − 0.25 = 0.75; wrong: −0.25
    i = right.x.index(0.5)
    assert math.isclose(right.y[i], 0.75) and math.isclose(wrong.y[i], -0.25)
    # the penalty path (invalid_confidence_penalty 1): right 1 − 1 = 0, wrong 0 − 1 = −1, for each unparsed field
    assert _series(fig, 1, "right").y == [0.0] * 3 and _series(fig, 1, "wrong").y == [-1.0] * 3


def test_mad_rl_points_follow_the_frequencies_with_the_invalid_reply_kept():
    fig = F.figure("mad_rl")
    freq = fig.panels[0].series[0].y
    assert freq == [5 / 8, 2 / 8, 1 / 8]  # heads ×5, tails ×2, one invalid reply in the denominator
    r = fig.panels[1].series[0].y
    eps, K = 0.01, 3  # target_smoothing default; K = 2 classes + invalid
    t = [(1 - eps) * p + eps / K for p in (0.5, 0.5, 0.0)]
    # reward = correct + λ·log(p̃*(c)/f̂(c)), λ = 1
    want = [1 + math.log(t[0] / freq[0])] * 5 + [1 + math.log(t[1] / freq[1])] * 2 + [0 + math.log(t[2] / freq[2])]
    torch.testing.assert_close(torch.tensor(r), torch.tensor(want), rtol=1e-5, atol=1e-5, check_dtype=False)
    ids = torch.tensor([0] * 5 + [1] * 2 + [2])
    kr, _ = dist.mad_rl_rewards(torch.tensor([1.0] * 7 + [0.0], dtype=torch.float64), ids, torch.zeros(8, dtype=torch.long),
                                torch.tensor([[0.5, 0.5, 0.0]] * 8, dtype=torch.float64), coef=1.0, smoothing=eps,
                                form="log_ratio")
    torch.testing.assert_close(torch.tensor(r), kr, rtol=1e-5, atol=1e-5, check_dtype=False)


def test_rlcpr_penalizes_only_when_the_posteriors_are_concentrated():
    fig = F.figure("rlcpr")
    conc, spread = fig.panels[0].series
    # lengths 6, 9, 12, 18, λ = 0.2: r = 1 − 0.2·(L − 6)/(18 − 6 + eps)
    torch.testing.assert_close(torch.tensor(conc.y), torch.tensor([1.0, 0.95, 0.9, 0.8]), rtol=0, atol=1e-6,
                               check_dtype=False)
    assert spread.y == [1.0] * 4


def test_code_opt_gate_and_noise_band():
    fig = F.figure("code_opt")
    right, wrong = fig.panels[0].series
    assert set(wrong.y) == {0.0}  # incorrect_reward, however fast
    lo, hi = (m.value for m in fig.panels[0].marks)
    for x, y in zip(right.x, right.y):
        if lo <= x <= hi:
            assert y == 1.0  # inside the noise band: no speed-up either way
    assert right.y[0] == 1.5 and right.y[-1] == 0.5  # 1 ± speed weight 0.5 at the ends


def test_rfpo_points_equal_the_kernel():
    fig = F.figure("rfpo")
    fin8, fin32, trunc = fig.panels[0].series
    v = torch.tensor(fin8.x, dtype=torch.float64)
    for s, L, finished in ((fin8, 8, True), (fin32, 32, True), (trunc, 8, False)):
        r, _, _ = crit.rfpo_rewards(v, torch.full_like(v, float(L)), torch.full((len(v),), finished), bias=(-0.1, 0.01),
                                    tau=0.5)
        torch.testing.assert_close(torch.tensor(s.y, dtype=torch.float64), r)
    # |y| = 32: b = −0.1 + 0.32 = 0.22, so a finished reply needs V ≥ 0.72
    assert all(y == float(x >= 0.72 - 1e-12) for x, y in zip(fin32.x, fin32.y))
