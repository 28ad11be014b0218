"""reinforce: hand case, detached weight, loop reference, metrics, bad inputs."""

import pytest
import torch
from torch.testing import assert_close

from policylab.errors import NonFiniteError, ShapeError
from policylab.kernels.objectives import METRIC_KEYS, reinforce

F64 = torch.float64


def grad_of(loss, lp):
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return g


def reinforce_loop(lp, adv, mask, weight=None):
    B, T = lp.shape
    rows = []
    for b in range(B):
        row = []
        for t in range(T):
            if not mask[b, t]:
                row.append(torch.zeros((), dtype=lp.dtype))
                continue
            a = float(adv[b] if adv.dim() == 1 else adv[b, t])
            w = 1.0 if weight is None else float(weight[b] if weight.dim() == 1 else weight[b, t])
            row.append(-w * a * lp[b, t])
        rows.append(torch.stack(row))
    return torch.stack(rows)


def test_hand_case():
    # lp = [−2, −0.5], A = 0.5: ℓ = −0.5·(−2) = 1.0 and −0.5·(−0.5) = 0.25; ∂ℓ/∂lp = −A = −0.5.
    # with w = [0.8, 2.0]: ℓ = [0.8, 0.5], ∂ℓ/∂lp = [−0.4, −1.0].
    lp = torch.tensor([[-2.0, -0.5]], dtype=F64, requires_grad=True)
    adv, mask = torch.tensor([0.5], dtype=F64), torch.ones(1, 2, dtype=torch.bool)
    loss, _ = reinforce(lp, adv, mask)
    assert_close(loss, torch.tensor([[1.0, 0.25]], dtype=F64), rtol=1e-15, atol=0)
    assert_close(grad_of(loss, lp), torch.tensor([[-0.5, -0.5]], dtype=F64), rtol=1e-15, atol=0)
    w = torch.tensor([[0.8, 2.0]], dtype=F64)
    loss, m = reinforce(lp, adv, mask, weight=w)
    assert_close(loss, torch.tensor([[0.8, 0.5]], dtype=F64), rtol=1e-15, atol=0)
    assert_close(grad_of(loss, lp), torch.tensor([[-0.4, -1.0]], dtype=F64), rtol=1e-15, atol=0)
    assert m["ratio/min"].item() == 0.8 and m["ratio/max"].item() == 2.0


def test_weight_is_detached():
    lp = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    w = torch.tensor([1.5, ], dtype=F64, requires_grad=True)  # [B], broadcast
    loss, _ = reinforce(lp, torch.tensor([1.0], dtype=F64), torch.ones(1, 2, dtype=torch.bool), weight=w)
    g_lp, g_w = torch.autograd.grad(loss.sum(), [lp, w], allow_unused=True)
    assert g_w is None
    assert_close(g_lp, torch.tensor([[-1.5, -1.5]], dtype=F64), rtol=0, atol=0)


@pytest.mark.parametrize("weight_shape", [None, "seq", "tok"])
def test_matches_loop_reference(weight_shape):
    torch.manual_seed(0)
    B, T = 3, 5
    lp = (torch.randn(B, T, dtype=F64) - 2).requires_grad_()
    adv = torch.randn(B, T, dtype=F64)
    mask = torch.rand(B, T) > 0.3
    mask[:, 0] = True
    weight = {None: None, "seq": torch.rand(B, dtype=F64), "tok": torch.rand(B, T, dtype=F64)}[weight_shape]
    loss, _ = reinforce(lp, adv, mask, weight=weight)
    ref = reinforce_loop(lp, adv, mask, weight)
    assert_close(loss, ref, rtol=1e-14, atol=1e-15)
    assert_close(grad_of(loss, lp), grad_of(ref, lp), rtol=1e-14, atol=1e-15)


def test_metrics_scheme():
    lp = torch.tensor([[-1.0, -2.0, float("nan")]], requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    loss, m = reinforce(lp, torch.tensor([1.0]), mask)
    assert set(m) == set(METRIC_KEYS)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())
    assert m["clip_frac"].item() == 0 and m["log_ratio_clamped"].item() == 0
    assert m["ratio/mean"].item() == 1.0  # no weight: exactly 1
    g = grad_of(loss, lp)
    assert loss[0, 2].item() == 0.0 and g[0, 2].item() == 0.0  # NaN padding does not leak


@pytest.mark.parametrize("change, err, match", [
    (dict(mask=torch.ones(2, 4, dtype=torch.bool)), ShapeError, "`mask` has shape"),
    (dict(mask=torch.ones(2, 3)), ShapeError, "must be a bool tensor"),
    (dict(logp=torch.tensor([[0.0, float("nan"), 0.0], [0.0] * 3])), NonFiniteError, "`logp`"),
    (dict(adv=torch.ones(2, 4)), ShapeError, "`adv` must be"),
    (dict(weight=torch.ones(5)), ShapeError, "`weight` must be"),
    (dict(weight=torch.tensor([1.0, -0.1])), ValueError, "negative"),
    (dict(weight=torch.tensor([1.0, float("inf")])), NonFiniteError, "`weight`"),
])
def test_bad_inputs(change, err, match):
    kwargs = dict(logp=torch.zeros(2, 3), adv=torch.ones(2), mask=torch.ones(2, 3, dtype=torch.bool))
    kwargs.update(change)
    with pytest.raises(err, match=match):
        reinforce(**kwargs)


def test_empty_mask_contributes_exactly_zero():
    # a micro-batch whose sequences are all masked out: loss all 0 (finite, grad 0), metrics
    # finite counts 0, ratio/min|max = +inf|−inf (identities of min/max), no NaN anywhere.
    lp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    mask = torch.zeros(1, 2, dtype=torch.bool)
    loss, m = reinforce(lp, torch.ones(1), mask)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert (loss == 0).all() and (g == 0).all()
    assert m["clip_frac"].item() == 0 and m["log_ratio_clamped"].item() == 0
    assert m["ratio/min"].item() == float("inf") and m["ratio/max"].item() == float("-inf")
    assert not any(torch.isnan(v) for v in m.values())
