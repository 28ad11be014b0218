"""The test-time adaptation figures plot what the kernels compute: each view's points
equal fresh calls of `testtime.ttpo`, `testtime.probe` and `testtime.tasco`."""

from __future__ import annotations

import math

import torch

from policylab import methods
from policylab.kernels.advantages import grpo
from policylab.learn.figures import figure
from policylab.kernels.testtime import probe_erpo_advantages


def test_ttpo_points_are_the_split_weights():
    m = methods.get("ttpo")
    (panel,) = figure("ttpo").panels
    distill, rl = panel.series
    tau_conv, tau_err = m.p.ttpo_tau_conv, m.p.ttpo_tau_err
    # answers 12, 12, 7: rewards (agreement) 1, 1, 0; the dissent's GRPO advantage (0 − 2/3)/(std + eps)
    a_dissent = float(grpo(torch.tensor([1.0, 1.0, 0.0]), torch.zeros(3, dtype=torch.long), std=m.p.std,
                           eps=m.p.eps)[2])
    assert a_dissent < 0
    for p, w_sd, w_rl in zip(distill.x, distill.y, rl.y):
        assert w_sd == (m.p.ttpo_sd_coef if p <= tau_conv else 0.0)  # converged tokens: exactly 0
        assert math.isclose(w_rl, m.p.ttpo_rl_coef * a_dissent if p <= tau_err else 0.0, rel_tol=1e-12)
    assert tau_conv in distill.x and tau_err in rl.x  # the kinks are on the grid


def test_probe_erpo_points_are_the_branch_advantages():
    m = methods.get("probe_erpo")
    high, low = figure("probe_erpo").panels
    G = len(high.series[0].y)
    for panel, is_low in ((high, False), (low, True)):
        want, _ = probe_erpo_advantages(torch.arange(G), torch.full((G,), is_low), torch.zeros(G, dtype=torch.long),
                                        top_k=m.p.probe_top_k, suppress_frac=m.p.probe_suppress_frac,
                                        pos_coef=m.p.probe_pos_coef, neg_coef=m.p.probe_neg_coef)
        assert panel.series[0].y == want.double().tolist()
    # defaults: high branch [+1, 0, ..., 0]; low branch (ceil(0.5 · 8) = 4 lowest ranks) [0]*4 + [−1]*4
    assert high.series[0].y == [1.0] + [0.0] * (G - 1)
    assert low.series[0].y == [0.0] * 4 + [-1.0] * 4
    assert max(low.series[0].y) <= 0  # the low branch has no positive target


def test_tasco_points_are_lambda_times_k3_and_its_gradient():
    m = methods.get("tasco")
    loss_panel, grad_panel = figure("tasco").panels
    (s,) = loss_panel.series
    lam, K = m.p.tasco_lambda, m.p.tasco_perturbations
    for x, y in zip(s.x, s.y):
        assert math.isclose(y, lam * (math.expm1(x) - x), rel_tol=1e-9, abs_tol=1e-15)
    clean, pert = grad_panel.series
    for x, gc, gp in zip(clean.x, clean.y, pert.y):
        # L_t = λ · (1/K) Σ_k (e^{x_k} − x_k − 1), x_k = lp_k − lp_clean: ∂/∂lp_k = λ/K (e^x − 1), summed over the
        # K copies λ (e^x − 1); the clean side gets the opposite
        assert math.isclose(gp, lam * math.expm1(x), rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(gc, -gp, rel_tol=1e-9, abs_tol=1e-15)
    assert K >= 1
