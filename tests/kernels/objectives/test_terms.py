"""masked_nll and entropy_bonus: hand cases, loop reference, gradient, masked garbage, refusals,
and the old names (testtime.self_distill_nll, testtime.entropy_bonus) are the same functions."""

import math

import pytest
import torch

from policylab.errors import NonFiniteError, PolicylabError, ShapeError
from policylab.kernels import testtime
from policylab.kernels.objectives import entropy_bonus, masked_nll

F64 = torch.float64
TERMS = {"masked_nll": masked_nll, "entropy_bonus": entropy_bonus}


def loop(values, mask, coef):
    """Naive reference: −coef·v at counted positions, 0 elsewhere, one element at a time."""
    out = torch.zeros(values.shape, dtype=values.dtype)
    for b in range(values.shape[0]):
        for t in range(values.shape[1]):
            if mask[b, t]:
                out[b, t] = -coef * values[b, t]
    return out


def test_hand_worked():
    # lp = [[−0.5, −2.0], [−1.0, NaN (masked)]], coef 0.1:
    # ℓ = [[−0.1·(−0.5), −0.1·(−2.0)], [−0.1·(−1.0), 0]] = [[0.05, 0.2], [0.1, 0]]
    lp = torch.tensor([[-0.5, -2.0], [-1.0, float("nan")]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    loss = masked_nll(lp, mask, coef=0.1)
    torch.testing.assert_close(loss.detach(), torch.tensor([[0.05, 0.2], [0.1, 0.0]], dtype=F64), rtol=0, atol=1e-16)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    # ∂ℓ/∂lp = −coef = −0.1 on counted tokens, exactly 0 on the masked NaN
    torch.testing.assert_close(g, torch.tensor([[-0.1, -0.1], [-0.1, 0.0]], dtype=F64), rtol=0, atol=0)
    # entropy H = [[0.3, 1.2]], second masked, coef 0.5: ℓ = [[−0.15, 0]]
    h = torch.tensor([[0.3, 1.2]], dtype=F64)
    out = entropy_bonus(h, torch.tensor([[True, False]]), coef=0.5)
    torch.testing.assert_close(out, torch.tensor([[-0.15, 0.0]], dtype=F64), rtol=0, atol=1e-16)


@pytest.mark.parametrize("name", sorted(TERMS))
def test_matches_loop_and_masked_garbage_never_leaks(name):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 7, generator=g, dtype=F64)
    mask = torch.rand(5, 7, generator=g) > 0.4
    for garbage in (float("nan"), float("inf"), -float("inf"), 1e300):
        v = torch.where(mask, x, torch.full((), garbage, dtype=F64)).requires_grad_()
        loss = TERMS[name](v, mask, coef=0.3)
        torch.testing.assert_close(loss.detach(), loop(x, mask, 0.3), rtol=1e-15, atol=0)
        (grad,) = torch.autograd.grad(loss.sum(), v)
        assert torch.equal(grad, torch.where(mask, torch.tensor(-0.3, dtype=F64), 0.0))  # ∂ℓ/∂v = −coef


def test_old_names_are_the_one_implementation():
    assert testtime.self_distill_nll is masked_nll
    assert testtime.entropy_bonus is entropy_bonus


@pytest.mark.parametrize("name", sorted(TERMS))
def test_refusals(name):
    fn = TERMS[name]
    ok, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(PolicylabError, match="`coef` must be a finite number >= 0"):
        fn(ok, mask, coef=-0.1)
    with pytest.raises(PolicylabError, match="`coef` must be a finite number >= 0"):
        fn(ok, mask, coef=math.inf)
    with pytest.raises(ShapeError, match="must be a bool tensor"):
        fn(ok, mask.float(), coef=1.0)
    with pytest.raises(ShapeError, match="must be \\[B, T\\]"):
        fn(torch.zeros(6), mask, coef=1.0)
    with pytest.raises(ShapeError, match="`mask` has shape"):
        fn(ok, torch.ones(2, 4, dtype=torch.bool), coef=1.0)
    with pytest.raises(NonFiniteError, match="non-finite"):
        fn(torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]]), mask, coef=1.0)
