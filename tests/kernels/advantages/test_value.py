"""value_loss and explained_variance (advantages/value.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages import explained_variance, value_loss
from policylab.errors import NonFiniteError, PolicylabError, ShapeError

F64 = torch.float64


def naive_value_loss(v, v_old, r, m, eps):
    out = torch.zeros_like(v)
    for b in range(v.shape[0]):
        for t in range(v.shape[1]):
            if not m[b, t]:
                continue
            un = (float(v[b, t]) - float(r[b, t])) ** 2
            if eps is None:
                out[b, t] = 0.5 * un
                continue
            vc = float(v_old[b, t]) + min(max(float(v[b, t]) - float(v_old[b, t]), -eps), eps)
            out[b, t] = 0.5 * max(un, (vc - float(r[b, t])) ** 2)
    return out


def hand_case():
    # ε_v = 0.2, V_old = 1 everywhere.
    # row 0, target R = 2:
    #   V = 1.1 inside the clip: ½(1.1−2)² = 0.405, grad V−R = −0.9
    #   V = 1.5 moved towards R past the clip: V_clip = 1.2, ½max(0.25, 0.64) = 0.32, grad 0
    #   V = 0.5 moved away from R past the clip: V_clip = 0.8, ½max(2.25, 1.44) = 1.125, grad −1.5
    # row 1, target R = 0 (mirror image):
    #   V = 0.5 towards R past the clip: V_clip = 0.8, ½max(0.25, 0.64) = 0.32, grad 0
    #   V = 1.5 away from R past the clip: V_clip = 1.2, ½max(2.25, 1.44) = 1.125, grad +1.5
    #   V = 0.9 inside: ½·0.81 = 0.405, grad +0.9
    # plus a padded column holding NaN everywhere.
    nan = float("nan")
    v = torch.tensor([[1.1, 1.5, 0.5, nan], [0.5, 1.5, 0.9, nan]], dtype=F64, requires_grad=True)
    v_old = torch.tensor([[1.0, 1.0, 1.0, nan], [1.0, 1.0, 1.0, nan]], dtype=F64)
    r = torch.tensor([[2.0, 2.0, 2.0, nan], [0.0, 0.0, 0.0, nan]], dtype=F64)
    m = torch.tensor([[True, True, True, False]] * 2)
    return v, v_old, r, m


def test_hand_case_values_and_gradient_regions():
    v, v_old, r, m = hand_case()
    loss, metrics = value_loss(v, v_old, r, m, clip_eps=0.2)
    expected = torch.tensor([[0.405, 0.32, 1.125, 0.0], [0.32, 1.125, 0.405, 0.0]], dtype=F64)
    assert_close(loss, expected, rtol=0, atol=1e-12)
    loss.sum().backward()
    grad = torch.tensor([[-0.9, 0.0, -1.5, 0.0], [0.0, 1.5, 0.9, 0.0]], dtype=F64)
    assert_close(v.grad, grad, rtol=0, atol=1e-12)  # NaN at padding never reaches the gradient
    # clipped term strictly larger on 2 of 6 valid tokens
    assert_close(metrics["clip_frac"], torch.tensor(2 / 6, dtype=F64))
    assert not metrics["clip_frac"].requires_grad


def test_no_clip_is_plain_half_squared_error():
    v, v_old, r, m = hand_case()
    loss, metrics = value_loss(v, v_old, r, m, clip_eps=None)
    loss.sum().backward()
    # grad = V − R on every valid token: row 0: [−0.9, −0.5, −1.5], row 1: [0.5, 1.5, 0.9]
    grad = torch.tensor([[-0.9, -0.5, -1.5, 0.0], [0.5, 1.5, 0.9, 0.0]], dtype=F64)
    assert_close(v.grad, grad, rtol=0, atol=1e-12)
    assert metrics["clip_frac"] == 0


@pytest.mark.parametrize("eps", [None, 0.1, 0.5])
def test_matches_naive_reference(eps):
    g = torch.Generator().manual_seed(3)
    v, v_old, r = (torch.randn(4, 7, generator=g, dtype=F64) for _ in range(3))
    m = torch.rand(4, 7, generator=g) > 0.3
    loss, _ = value_loss(v, v_old, r, m, clip_eps=eps)
    assert_close(loss, naive_value_loss(v, v_old, r, m, eps))


def test_explained_variance_hand_cases():
    m = torch.ones(1, 3, dtype=torch.bool)
    r = torch.tensor([[1.0, 2.0, 3.0]], dtype=F64)
    v = torch.tensor([[1.0, 2.0, 4.0]], dtype=F64)
    # R − V = [0, 0, −1]: var = 2/9 ; Var(R) = 2/3 ; 1 − (2/9)/(2/3) = 2/3
    assert_close(explained_variance(v, r, m), torch.tensor(2 / 3, dtype=F64))
    assert_close(explained_variance(r, r, m), torch.tensor(1.0, dtype=F64))
    const = torch.full((1, 3), 2.0, dtype=F64)
    # Var(R) = 0: 1 if the residual has no variance either, else 0 (finite convention)
    assert explained_variance(const - 1, const, m).item() == 1.0
    assert explained_variance(v, const, m).item() == 0.0
    assert explained_variance(v, r, ~m).item() == 0.0


def test_bad_inputs():
    v, v_old, r, m = hand_case()
    with pytest.raises(ShapeError, match="`returns` has shape"):
        value_loss(v, v_old, r[:, :3], m, clip_eps=0.2)
    with pytest.raises(ShapeError, match="`mask` must be a bool"):
        value_loss(v, v_old, r, m.long(), clip_eps=0.2)
    bad = r.clone()
    bad[0, 1] = float("inf")
    with pytest.raises(NonFiniteError, match=r"`returns`.*index \[0, 1\]"):
        value_loss(v, v_old, bad, m, clip_eps=0.2)
    with pytest.raises(PolicylabError, match="`clip_eps` must be a finite number > 0"):
        value_loss(v, v_old, r, m, clip_eps=0.0)
    with pytest.raises(ShapeError, match=r"must be \[B, T\]"):
        value_loss(v[0], v_old[0], r[0], m[0], clip_eps=0.2)
