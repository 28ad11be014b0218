"""ISO's kernels (geometry/spectrum.py): the fixed-spectrum layer and the retractions."""

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.geometry import (
    FixedSpectrumLinear,
    orthonormality_error,
    polar_retraction,
    qr_retraction,
    retract,
)

F64 = torch.float64


def svd_polar(X):
    """Naive reference: the orthonormal polar factor P Rᵀ of X = P S Rᵀ."""
    P, _, Rh = torch.linalg.svd(X, full_matrices=False)
    return P @ Rh


def near_frame(m, q, noise, seed):
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(m, q, generator=gen, dtype=F64))
    return Q + noise * torch.randn(m, q, generator=gen, dtype=F64)


def test_polar_hand_case():
    # X = [[2, 0], [0, 0.5], [0, 0]] = Q H with Q = [[1, 0], [0, 1], [0, 0]], H = diag(2, 0.5):
    # far from orthonormal (|XᵀX − I| = 3 > 0.5) → the SVD route
    X = torch.tensor([[2.0, 0.0], [0.0, 0.5], [0.0, 0.0]], dtype=F64)
    Q, info = polar_retraction(X)
    assert_close(Q, torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=F64), rtol=0, atol=1e-15)
    assert info["svd"] and info["error_before"] == pytest.approx(3.0)


def test_polar_newton_schulz_matches_the_svd_factor():
    for seed, noise in ((0, 1e-3), (1, 3e-2), (2, 1e-5)):
        X = near_frame(20, 6, noise, seed)
        Q, info = polar_retraction(X)
        assert not info["svd"] and 1 <= info["iterations"] <= 8
        assert_close(Q, svd_polar(X), rtol=1e-10, atol=1e-12)
        assert orthonormality_error(Q) < 1e-12 and info["error_after"] <= 1e-12
    X = near_frame(9, 9, 0.0, 3)  # already orthonormal (to rounding): unchanged
    Q, info = polar_retraction(X)
    assert info["iterations"] <= 1
    assert_close(Q, X, rtol=1e-12, atol=1e-12)


def test_polar_is_the_nearest_frame_and_qr_is_another_one():
    X = near_frame(15, 5, 5e-2, 4)
    P, _ = polar_retraction(X)
    Q = qr_retraction(X)
    assert orthonormality_error(Q) < 1e-12
    R = Q.T @ X  # QR: X = Q R with R upper triangular, diag(R) > 0
    assert_close(torch.triu(R), R, rtol=0, atol=1e-12)
    assert bool((torch.diagonal(R) > 0).all())
    assert float((P - X).norm()) < float((Q - X).norm())  # the polar factor is the closest frame
    assert_close(retract(X, "qr"), Q)
    assert_close(retract(X, "polar"), P)


def test_fixed_spectrum_layer_reproduces_the_linear_and_refuses_a_weight_update():
    gen = torch.Generator().manual_seed(5)
    lin = nn.Linear(6, 4, bias=True).double()
    with torch.no_grad():
        lin.weight.copy_(torch.randn(4, 6, generator=gen, dtype=F64))
    layer = FixedSpectrumLinear.from_linear(lin)
    x = torch.randn(3, 6, generator=gen, dtype=F64)
    assert_close(layer(x), lin(x), rtol=1e-12, atol=1e-12)
    assert_close(layer.weight, lin.weight, rtol=1e-12, atol=1e-12)
    assert_close(layer.sigma, torch.linalg.svdvals(lin.weight.detach()), rtol=1e-12, atol=1e-12)
    names = {n for n, _ in layer.named_parameters()}
    assert names == {"U", "V", "bias"} and not layer.sigma.requires_grad
    assert "sigma" in layer.state_dict()
    with pytest.raises(PolicylabError, match="fixed-spectrum layer .* cannot be assigned"):
        layer.weight = torch.zeros(4, 6, dtype=F64)
    with pytest.raises((KeyError, PolicylabError)):
        layer.weight = nn.Parameter(torch.zeros(4, 6, dtype=F64))


def test_rotated_frames_keep_the_spectrum_and_change_the_weight():
    gen = torch.Generator().manual_seed(6)
    lin = nn.Linear(5, 7, bias=False).double()
    layer = FixedSpectrumLinear.from_linear(lin)
    sigma = layer.sigma.clone()
    before = layer.weight.detach().clone()
    with torch.no_grad():  # an arbitrary step on the frames, then the retraction
        layer.U.add_(0.05 * torch.randn(layer.U.shape, generator=gen, dtype=F64))
        layer.V.add_(0.05 * torch.randn(layer.V.shape, generator=gen, dtype=F64))
        layer.U.copy_(retract(layer.U, "polar"))
        layer.V.copy_(retract(layer.V, "polar"))
    assert torch.equal(layer.sigma, sigma)
    assert float((layer.weight.detach() - before).abs().max()) > 1e-2
    assert_close(torch.linalg.svdvals(layer.weight.detach()), sigma, rtol=1e-12, atol=1e-12)


def test_bad_input_is_refused():
    with pytest.raises(ShapeError, match="m >= q"):
        polar_retraction(torch.ones(2, 3, dtype=F64))
    with pytest.raises(ShapeError, match="m >= q"):
        qr_retraction(torch.ones(2, 3, dtype=F64))
    with pytest.raises(PolicylabError, match="retraction must be one of polar, qr"):
        retract(torch.eye(3, dtype=F64), "cayley")
    with pytest.raises(ShapeError, match="frames must be"):
        FixedSpectrumLinear(torch.eye(3), torch.ones(2), torch.eye(3))
