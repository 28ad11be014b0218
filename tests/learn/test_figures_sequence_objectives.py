"""The figures of conspo, zcpo, stare, reco, erpo, tlm_dre and rlid plot what their kernels
return: points checked against fresh kernel calls and the invariants the captions state."""

from __future__ import annotations

import math

import torch
from torch.testing import assert_close

from policylab import methods
from policylab.learn import figures
from policylab.kernels.objectives import conspo as conspo_k
from policylab.kernels.objectives import erpo as erpo_k
from policylab.kernels.objectives import zcpo as zcpo_k

F = torch.float64


def _series(name, panel=0):
    return figures.figure(name).panels[panel].series


def test_conspo_points_equal_a_fresh_conspo_call():
    pos, swept, other = _series("conspo")
    p = methods.get("conspo").p
    i = len(swept.x) // 3
    lp = torch.tensor([[-1.0], [swept.x[i]], [-2.5]], dtype=F, requires_grad=True)
    loss, _ = conspo_k.conspo(lp, torch.ones(3, 1, dtype=torch.bool), torch.zeros(3, dtype=torch.long),
                              torch.tensor([True, False, False]), tau=p.conspo_tau, margin=p.conspo_margin_max)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert_close([pos.y[i], swept.y[i], other.y[i]], g.reshape(-1).tolist())
    # the caption: the closer the swept negative, the harder both it and the positive are pushed
    assert swept.y[-1] > swept.y[0] > 0 and pos.y[-1] < pos.y[0] < 0 and other.y[-1] < other.y[0]


def test_zcpo_coefficients_sum_to_zero_and_equal_the_kernel():
    series = _series("zcpo")
    for i in (0, len(series[0].x) // 2, len(series[0].x) - 1):
        ys = [s.y[i] for s in series]
        assert abs(sum(ys)) < 1e-9
        kl = torch.tensor([[series[0].x[i]], [0.2], [0.2], [0.2]], dtype=F)
        c, _ = zcpo_k.zcpo_coefficients(torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=F), torch.zeros(4, dtype=torch.long),
                                        zcpo_k.from_worker(kl), torch.ones(4, 1, dtype=torch.bool),
                                        beta=methods.get("zcpo").p.drift_coef, std=methods.get("zcpo").p.std)
        assert_close(ys, c.tolist())


def test_stare_weights_are_w_and_m_below_the_target_and_1_above():
    s = _series("stare")
    p = methods.get("stare").p
    for series, below in zip(s, (p.stare_amplify, p.stare_attenuate, p.stare_amplify, 0.9)):
        for x, y in zip(series.x, series.y):
            assert math.isclose(y, below if x < p.stare_target_entropy else 1.0, rel_tol=1e-6), (series.label, x, y)


def test_erpo_reco_tlm_rlid_invariants():
    # erpo: ω_0 from a fresh call at one point; ω increases with the typicality
    for s, c in zip(_series("erpo"), (0.25, 1.0, 4.0)):
        i = len(s.x) // 2
        w, _ = erpo_k.question_weights(torch.tensor([s.x[i], -2.0, -1.5], dtype=F), qkl_coef=c)
        assert math.isclose(s.y[i], float(w[0]), rel_tol=1e-12) and s.y == sorted(s.y)
    # reco: token weight 1 at p = p_old = 0.5; response weight 1/(G·π) above 1/G, 1 below
    tok = _series("reco", 0)[0]
    assert math.isclose(tok.y[tok.x.index(0.5)], 1.0) and max(tok.y) < 1.0 + 1e-12
    resp = _series("reco", 1)[0]
    G = methods.get("reco").p.reco_group_size or figures.RUN.group_size
    for x, y in zip(resp.x, resp.y):
        assert math.isclose(y, 1.0 / max(1.0, G * x), rel_tol=1e-9)
    # tlm_dre: the two turn weights average to 1; the positive push is constant (κ₊ = 0)
    w0, w1 = _series("tlm_dre", 0)
    assert all(abs((a + b) / 2 - 1) < 1e-12 for a, b in zip(w0.y, w1.y))
    assert set(_series("tlm_dre", 1)[0].y) == {1.0}
    # rlid: R = 0 at balanced labels, weights × lengths equal for every episode
    r = _series("rlid", 0)[0]
    assert r.y[r.x.index(0.5)] < 1e-12 and min(r.y) == r.y[r.x.index(0.5)]
    long, one = _series("rlid", 1)
    assert all(math.isclose(L * a, b, rel_tol=1e-9) for L, a, b in zip(long.x, long.y, one.y))
