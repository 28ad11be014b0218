"""cord_combine (geometry/cord.py): CORD's full-step projection."""

import pytest
import torch
from torch.testing import assert_close

from policylab.errors import MissingQuantityError, NonFiniteError, PolicylabError, ShapeError
from policylab.kernels.geometry import cord_combine

F64 = torch.float64


def v(*xs):
    return [torch.tensor(xs, dtype=F64)]


def naive(gp, go, weight, mode):
    """Flatten everything into one vector and follow the specification line by line."""
    p = torch.cat([t.reshape(-1) for t in gp])
    o = weight * torch.cat([t.reshape(-1) for t in go])
    d = sum(float(p[i]) * float(o[i]) for i in range(p.numel()))
    n = sum(float(p[i]) ** 2 for i in range(p.numel()))
    if n > 0 and (mode == "always" or d < 0):
        o = o - (d / n) * p
    flat = p + o
    out, at = [], 0
    for t in gp:
        out.append(flat[at : at + t.numel()].reshape(t.shape))
        at += t.numel()
    return out


def combine(gp, go, weight=1.0, mode="conflict_only", scope="global"):
    return cord_combine(gp, go, weight=weight, mode=mode, scope=scope)


def test_hand_cases_of_the_specification():
    # g_p = (1, 0), g_o = (−1, 1): d = −1 < 0, n = 1 → g_o' = (−1, 1) − (−1)(1, 0) = (0, 1); g = (1, 1)
    g, info = combine(v(1, 0), v(-1, 1))
    assert_close(g[0], torch.tensor([1.0, 1.0], dtype=F64))
    assert info["conflict"] == 1.0 and info["projected"] == 1.0 and info["dot"] == -1.0
    # g_o = (1, 1): d = 1 >= 0 → conflict_only keeps it: g = (2, 1)
    g, info = combine(v(1, 0), v(1, 1))
    assert_close(g[0], torch.tensor([2.0, 1.0], dtype=F64))
    assert info["conflict"] == 0.0 and info["projected"] == 0.0
    # always: g_o' = (1, 1) − 1·(1, 0) = (0, 1); g = (1, 1)
    g, _ = combine(v(1, 0), v(1, 1), mode="always")
    assert_close(g[0], torch.tensor([1.0, 1.0], dtype=F64))


def test_zero_weight_gives_the_protected_gradient():
    # λ = 0: g_o ← 0, d = 0, nothing projected, g = g_p
    g, info = combine(v(1, 0), v(-1, 1), weight=0.0, mode="always")
    assert_close(g[0], torch.tensor([1.0, 0.0], dtype=F64))
    assert info["projected"] == 0.0


def test_the_weight_is_applied_before_the_projection():
    # λ = 2: g_o = (−2, 2), d = −2, g_o' = (−2, 2) + 2·(1, 0) = (0, 2); g = (1, 2)
    g, _ = combine(v(1, 0), v(-1, 1), weight=2.0)
    assert_close(g[0], torch.tensor([1.0, 2.0], dtype=F64))


def test_strict_boundary_and_zero_protected_gradient():
    # d = 0 exactly: conflict_only projects only when d < 0 → g = (1, 1); always removes 0·g_p → same
    for mode in ("conflict_only", "always"):
        g, info = combine(v(1, 0), v(0, 1), mode=mode)
        assert_close(g[0], torch.tensor([1.0, 1.0], dtype=F64))
        assert info["conflict"] == 0.0
    # ‖g_p‖ = 0: no direction to project on: g = g_p + λ g_o
    g, info = combine(v(0, 0), v(-1, 1), weight=0.5, mode="always")
    assert_close(g[0], torch.tensor([-0.5, 0.5], dtype=F64))
    assert info["projected"] == 0.0 and info["cos"] == 0.0


def test_guarantees_on_random_gradients():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        gp = [torch.randn(3, 4, generator=gen, dtype=F64), torch.randn(5, generator=gen, dtype=F64)]
        go = [torch.randn(3, 4, generator=gen, dtype=F64), torch.randn(5, generator=gen, dtype=F64)]
        n = sum(float(t.pow(2).sum()) for t in gp)
        for mode in ("conflict_only", "always"):
            g, _ = combine(gp, go, weight=0.7, mode=mode)
            inner = sum(float((a * b).sum()) for a, b in zip(g, gp))
            if mode == "always":
                assert inner == pytest.approx(n, rel=1e-12)  # ⟨g, g_p⟩ = ‖g_p‖² exactly
            else:
                assert inner >= n * (1 - 1e-12)  # ⟨g, g_p⟩ ≥ ‖g_p‖²
            for got, want in zip(g, naive(gp, go, 0.7, mode)):
                assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_projection_is_over_the_whole_flattened_vector():
    # the same numbers split into tensors of different shapes give the same result
    gen = torch.Generator().manual_seed(1)
    p, o = torch.randn(12, generator=gen, dtype=F64), -torch.randn(12, generator=gen, dtype=F64)
    one, _ = combine([p], [o], mode="always")
    split, _ = combine([p[:5], p[5:].reshape(7, 1)], [o[:5], o[5:].reshape(7, 1)], mode="always")
    assert_close(torch.cat([split[0], split[1].reshape(-1)]), one[0], rtol=1e-13, atol=1e-13)


def test_per_tensor_scope_projects_each_pair():
    # tensor 0: g_p = (1, 0), g_o = (−1, 1) conflicts → (1, 1); tensor 1: g_p = (0, 1), g_o = (3, 5) does not → (3, 6).
    # Globally d = −1 + 5 = 4 >= 0: nothing projected → ((0, 1), (3, 6)); the two scopes differ.
    gp = [torch.tensor([1.0, 0.0], dtype=F64), torch.tensor([0.0, 1.0], dtype=F64)]
    go = [torch.tensor([-1.0, 1.0], dtype=F64), torch.tensor([3.0, 5.0], dtype=F64)]
    per, info = combine(gp, go, scope="per_tensor")
    assert_close(per[0], torch.tensor([1.0, 1.0], dtype=F64))
    assert_close(per[1], torch.tensor([3.0, 6.0], dtype=F64))
    assert info["projected"] == 0.5
    glob, _ = combine(gp, go)
    assert_close(glob[0], torch.tensor([0.0, 1.0], dtype=F64))


def test_full_step_differs_from_projecting_each_micro_batch():
    # g_p = (1, 0); micro-batch gradients g_o1 = (−1, 1), g_o2 = (3, 0).
    # per micro-batch: g_o1 conflicts → (0, 1); g_o2 does not → (3, 0); g = (1, 0) + (3, 1) = (4, 1)
    # full step: g_o = (2, 1), d = 2 >= 0, kept: g = (3, 1)
    gp = v(1, 0)
    per_mb = torch.tensor([1.0, 0.0], dtype=F64)
    for mb in (v(-1, 1), v(3, 0)):
        g, _ = combine(gp, mb)
        per_mb = per_mb + (g[0] - gp[0])
    full, _ = combine(gp, v(2, 1))
    assert_close(per_mb, torch.tensor([4.0, 1.0], dtype=F64))
    assert_close(full[0], torch.tensor([3.0, 1.0], dtype=F64))


def test_swapping_the_protected_objective_changes_the_result():
    # protect a = (1, 0) against b = (−1, 1): (1, 1)
    # protect b: d = ⟨a, b⟩ = −1, n = ‖b‖² = 2 → a' = (1, 0) − (−1/2)(−1, 1) = (0.5, 0.5); g = b + a' = (−0.5, 1.5)
    g_a, _ = combine(v(1, 0), v(-1, 1))
    g_b, _ = combine(v(-1, 1), v(1, 0))
    assert_close(g_a[0], torch.tensor([1.0, 1.0], dtype=F64))
    assert_close(g_b[0], torch.tensor([-0.5, 1.5], dtype=F64))


def test_bad_input_is_refused():
    with pytest.raises(MissingQuantityError, match="protected objective's gradient.*retention set"):
        combine(None, v(1, 0))
    with pytest.raises(ShapeError, match="tensor 0"):
        combine(v(1, 0), v(1, 0, 0))
    with pytest.raises(ShapeError, match="one per parameter"):
        combine(v(1, 0), v(1, 0) + v(1, 0))
    with pytest.raises(PolicylabError, match="`weight`"):
        combine(v(1, 0), v(1, 0), weight=-1.0)
    with pytest.raises(PolicylabError, match="`mode`"):
        combine(v(1, 0), v(1, 0), mode="sometimes")
    with pytest.raises(PolicylabError, match="`scope`"):
        combine(v(1, 0), v(1, 0), scope="per_layer")
    with pytest.raises(NonFiniteError, match="g_other"):
        combine(v(1, 0), v(float("nan"), 0))
