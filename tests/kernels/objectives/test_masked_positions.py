"""Sequence-level kernels read per-sequence values through masked reductions only.

For each kernel that reduces over a response (a sequence ratio, a sequence advantage, a
prefix mean, a trajectory weight), a batch whose rows have masked LEADING and TRAILING
positions (filled with garbage) must give exactly what the compacted batch gives: the
same per-row loss sums and the same gradients on the counted tokens. Reading a value at
response position 0 (masked here) would lose the row; summing over masked positions would
move it. LUSPO once read its advantage from position 0.
"""

from __future__ import annotations

import pytest
import torch

from policylab.kernels import corrections, objectives

F64 = torch.float64


def _rows():
    """Three rows of counted tokens (lengths 3, 1, 2), their log-probs and advantages."""
    g = torch.Generator().manual_seed(5)
    counted = [3, 1, 2]
    lp_old = [(-torch.rand(n, generator=g, dtype=F64) * 2 - 0.05) for n in counted]
    lp = [o + 0.05 * torch.randn(len(o), generator=g, dtype=F64) for o in lp_old]
    return counted, lp, lp_old, torch.tensor([1.0, -0.5, 2.0], dtype=F64)


def _pack(vals, lead: list[int], T: int, fill: float):
    """[B, T] with row i's values starting at column lead[i]; every other entry `fill`."""
    out = torch.full((len(vals), T), fill, dtype=F64)
    mask = torch.zeros(len(vals), T, dtype=torch.bool)
    for i, v in enumerate(vals):
        out[i, lead[i]: lead[i] + len(v)] = v
        mask[i, lead[i]: lead[i] + len(v)] = True
    return out, mask


def _loss_and_grad(kernel, lp_rows, lp_old_rows, adv, lead, T, fill):
    lp, mask = _pack(lp_rows, lead, T, fill)
    lp_old, _ = _pack(lp_old_rows, lead, T, fill)
    lp = lp.requires_grad_(True)
    loss = kernel(lp, lp_old, adv, mask)
    loss.sum().backward()
    grads = [lp.grad[i][mask[i]] for i in range(len(lp_rows))]
    return loss.detach().sum(-1), grads


KERNELS = {
    "gspo": lambda lp, old, a, m: objectives.gspo(lp, old, a, m, eps_low=0.2, eps_high=0.2)[0],
    "gspo_token": lambda lp, old, a, m: objectives.gspo_token(lp, old, a.unsqueeze(-1).expand_as(lp).clone(), m,
                                                             eps_low=0.2, eps_high=0.2)[0],
    "luspo": lambda lp, old, a, m: objectives.luspo(lp, old, a, m, eps_low=0.2, eps_high=0.2)[0],
    "tapo": lambda lp, old, a, m: objectives.tapo(lp, old, a, m, eps_schedule=lambda t: 0.2 + 0 * t.to(F64))[0],
    "ggpo": lambda lp, old, a, m: objectives.ggpo(lp, old, a, torch.tensor([0, 0, 1]), m, beta=0.5, coef_clip=5.0)[0],
    "ppo_clip": lambda lp, old, a, m: objectives.ppo_clip(lp, old, a, m, eps_low=0.2, eps_high=0.2)[0],
    "cispo": lambda lp, old, a, m: objectives.cispo(lp, old, a, m, eps_low=0.2, eps_high=0.2)[0],
    "gppo": lambda lp, old, a, m: objectives.gppo(lp, old, a, m, eps_low=0.2, eps_high=0.2)[0],
    "mis_weighted": lambda lp, old, a, m: (
        objectives.reinforce(lp, a, m)[0]
        * corrections.mis(old, lp.detach(), m, low=0.0, high=5.0, kind="geomean", mode="truncate")[0].unsqueeze(-1)),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_masked_leading_and_trailing_positions_change_nothing(name):
    counted, lp, lp_old, adv = _rows()
    # compacted: every row starts at column 0, width = longest row
    ref_loss, ref_grad = _loss_and_grad(KERNELS[name], lp, lp_old, adv, [0, 0, 0], max(counted), -1.0)
    # shifted: rows start at columns 2, 4, 1 of a wider matrix, garbage everywhere else
    for fill in (-1.0, -30.0):
        loss, grad = _loss_and_grad(KERNELS[name], lp, lp_old, adv, [2, 4, 1], 8, fill)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
        for g, r in zip(grad, ref_grad):
            torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    assert any(float(g.abs().sum()) > 0 for g in ref_grad)  # the comparison is not between zeros


def test_luspo_row_whose_first_response_token_is_masked_keeps_its_gradient():
    # hand case: one row, counted tokens at columns 1 and 2 (column 0 masked, garbage 7.0),
    # s = 1, A = 1: LUSPO's per-token gradient is -s·A = -1 on both counted tokens (the
    # advantage read at column 0 would have been 0 and the row would get no gradient)
    lp_old = torch.tensor([[7.0, -1.0, -2.0]], dtype=F64)
    lp = lp_old.clone().requires_grad_(True)
    mask = torch.tensor([[False, True, True]])
    loss, _ = objectives.luspo(lp, lp_old, torch.tensor([1.0], dtype=F64), mask, eps_low=0.2, eps_high=0.2)
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -1.0, -1.0]], dtype=F64))
