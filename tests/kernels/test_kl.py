"""kl: estimator values and autograd gradients vs the exact KL on a categorical policy,
full-vocabulary exact KL (chunked), placement, reward penalty."""

import math

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels import kl
from policylab.errors import NonFiniteError, ShapeError

F64 = torch.float64
ESTIMATORS = {"k1": kl.k1, "k2": kl.k2, "k3": kl.k3}


def test_hand_values():
    # lp = −1, lp_ref = −2: k1 = 1, k2 = ½·1² = 0.5, k3 = e^{−1} − (−1) − 1 = 0.36788
    # lp = −2, lp_ref = −1: k1 = −1, k2 = 0.5, k3 = e^{1} − 1 − 1 = 0.71828
    lp = torch.tensor([[-1.0, -2.0]], dtype=F64)
    ref = torch.tensor([[-2.0, -1.0]], dtype=F64)
    assert_close(kl.k1(lp, ref), torch.tensor([[1.0, -1.0]], dtype=F64), rtol=0, atol=0)
    assert_close(kl.k2(lp, ref), torch.tensor([[0.5, 0.5]], dtype=F64), rtol=0, atol=0)
    assert_close(kl.k3(lp, ref), torch.tensor([[math.exp(-1), math.e - 2]], dtype=F64), rtol=1e-15, atol=0)


def test_estimator_table_hand_values_and_loop():
    # d = log p − log q = [ln 2, −ln 2, 0] (samples from p):
    # k1 = d;  k2 = ½d² = ½·0.480453 = 0.240227 (both signs);  k3 = e^(−d) − 1 + d:
    # ln 2 -> 0.5 − 1 + 0.693147 = 0.193147;  −ln 2 -> 2 − 1 − 0.693147 = 0.306853;  0 -> 0
    d = torch.tensor([math.log(2), -math.log(2), 0.0], dtype=F64)
    assert torch.equal(kl.kl_estimate(d, "k1"), d)
    half_sq = 0.5 * math.log(2) ** 2
    assert_close(kl.kl_estimate(d, "k2"), torch.tensor([half_sq, half_sq, 0.0], dtype=F64), rtol=1e-15, atol=0)
    assert_close(kl.kl_estimate(d, "k3"), torch.tensor([0.5 - 1 + math.log(2), 1 - math.log(2), 0.0], dtype=F64),
                 rtol=1e-15, atol=1e-17)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(20, generator=g, dtype=F64)
    naive = {"k1": lambda v: v, "k2": lambda v: 0.5 * v * v, "k3": lambda v: math.exp(-v) - 1 + v}
    for name, f in naive.items():
        want = torch.tensor([f(float(v)) for v in x], dtype=F64)
        assert_close(kl.kl_estimate(x, name), want, rtol=1e-12, atol=1e-15)
        # the per-token KL terms are the table at d = lp − lp_ref
        per_token = ESTIMATORS[name](x.reshape(4, 5), torch.zeros(4, 5, dtype=F64))
        assert torch.equal(per_token, kl.kl_estimate(x, name).reshape(4, 5))
    with pytest.raises(ValueError, match="`estimator` must be one of"):
        kl.kl_estimate(x, "k4")


def test_pointwise_derivatives_and_k3_sign():
    torch.manual_seed(0)
    lp = (torch.randn(4, 5, dtype=F64) - 2).requires_grad_()
    ref = torch.randn(4, 5, dtype=F64) - 2
    # ∂k1/∂lp = 1 ; ∂k2/∂lp = lp − lp_ref ; ∂k3/∂lp = 1 − exp(lp_ref − lp)
    expected = {"k1": torch.ones_like(ref), "k2": lp.detach() - ref, "k3": 1 - torch.exp(ref - lp.detach())}
    for name, fn in ESTIMATORS.items():
        (g,) = torch.autograd.grad(fn(lp, ref).sum(), lp)
        assert_close(g, expected[name], rtol=1e-13, atol=1e-15)
    assert (kl.k3(lp, ref) > 0).all()
    assert (kl.k3(lp, lp.detach()) == 0).all()  # = 0 iff lp = lp_ref


def categorical(seed, V=6):
    torch.manual_seed(seed)
    theta = torch.randn(V, dtype=F64, requires_grad=True)
    ref_logp = torch.log_softmax(torch.randn(V, dtype=F64), -1)
    return theta, ref_logp


def exact_grads(theta, ref_logp):
    def logp():
        return torch.log_softmax(theta, -1)
    q = ref_logp.exp()
    (g_rev,) = torch.autograd.grad((logp().exp() * (logp() - ref_logp)).sum(), theta)  # ∇KL(π‖π_ref)
    (g_fwd,) = torch.autograd.grad((q * (ref_logp - logp())).sum(), theta)  # ∇KL(π_ref‖π)
    return g_rev, g_fwd


def expected_autograd_grad(fn, theta, ref_logp):
    """E_{y~π}[∇_θ k(y)]: what backprop of a sampled loss term gives on average (the sampling
    distribution is NOT differentiated: weights π(y) are detached)."""
    logp = torch.log_softmax(theta, -1)
    (g,) = torch.autograd.grad((logp.exp().detach() * fn(logp, ref_logp)).sum(), theta)
    return g


def expected_value_grad(fn, theta, ref_logp):
    """∇_θ E_{y~π}[k(y)] = E[∇k + k·∇log π]: the score-function (KL-in-reward) gradient."""
    logp = torch.log_softmax(theta, -1)
    (g,) = torch.autograd.grad((logp.exp() * fn(logp, ref_logp)).sum(), theta)
    return g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_autograd_gradients_vs_exact_kl_gradient(seed):
    theta, ref_logp = categorical(seed)
    g_rev, g_fwd = exact_grads(theta, ref_logp)
    assert (g_rev - g_fwd).norm() > 1e-2  # the two KL directions differ here
    g = {n: expected_autograd_grad(fn, theta, ref_logp) for n, fn in ESTIMATORS.items()}
    assert_close(g["k1"], torch.zeros_like(g_rev), rtol=0, atol=1e-15)  # zero in expectation
    assert g_rev.norm() > 1e-2                                          # ... while ∇KL is not
    assert_close(g["k2"], g_rev, rtol=1e-12, atol=1e-14)                # k2: exactly ∇KL(π‖π_ref)
    assert_close(g["k3"], g_fwd, rtol=1e-12, atol=1e-14)                # k3: ∇KL(π_ref‖π) ...
    assert (g["k3"] - g_rev).norm() > 1e-2                              # ... not ∇KL(π‖π_ref)


@pytest.mark.parametrize("seed", [0, 1])
def test_values_and_score_function_gradients(seed):
    theta, ref_logp = categorical(seed)
    logp = torch.log_softmax(theta, -1).detach()
    p = logp.exp()
    true_kl = (p * (logp - ref_logp)).sum()
    # E_π[k1] = E_π[k3] = KL (unbiased); E_π[k2] ≠ KL (biased)
    assert (p * kl.k1(logp, ref_logp)).sum().item() == pytest.approx(true_kl.item(), rel=1e-12)
    assert (p * kl.k3(logp, ref_logp)).sum().item() == pytest.approx(true_kl.item(), rel=1e-12)
    assert abs((p * kl.k2(logp, ref_logp)).sum().item() - true_kl.item()) > 1e-3
    # KL in the reward (score function): ∇E[k] = ∇KL for k1 and k3, not for k2
    g_rev, _ = exact_grads(theta, ref_logp)
    for name in ("k1", "k3"):
        assert_close(expected_value_grad(ESTIMATORS[name], theta, ref_logp), g_rev, rtol=1e-12, atol=1e-14)
    assert (expected_value_grad(kl.k2, theta, ref_logp) - g_rev).norm() > 1e-3


def test_estimators_with_mask():
    lp = torch.tensor([[-1.0, float("nan")]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-2.0, float("inf")]], dtype=F64)
    mask = torch.tensor([[True, False]])
    for fn in ESTIMATORS.values():
        out = fn(lp, ref, mask=mask)
        (g,) = torch.autograd.grad(out.sum(), lp)
        assert out[0, 1].item() == 0.0 and g[0, 1].item() == 0.0 and torch.isfinite(g).all()
    with pytest.raises(NonFiniteError, match="`logp`"):
        kl.k1(lp, ref)  # without a mask every entry must be finite


def test_k3_overflow_is_refused_not_inf():
    lp, ref = torch.tensor([[-100.0]]), torch.tensor([[-1.0]])  # lp_ref − lp = 99 > 88.7 (fp32)
    with pytest.raises(NonFiniteError, match="k3 overflowed"):
        kl.k3(lp, ref)


def test_estimator_shape_mismatch():
    with pytest.raises(ShapeError, match="`logp_ref` has shape"):
        kl.k2(torch.zeros(2, 3), torch.zeros(2, 4))


def exact_loop(logits, ref_logits, temperature=1.0):
    B, T, _ = logits.shape
    out = torch.zeros(B, T, dtype=logits.dtype)
    for b in range(B):
        for t in range(T):
            lp = torch.log_softmax(logits[b, t] / temperature, -1)
            lq = torch.log_softmax(ref_logits[b, t] / temperature, -1)
            out[b, t] = (lp.exp() * (lp - lq)).sum()
    return out


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_exact_matches_loop_for_every_chunking(chunk_size, temperature):
    torch.manual_seed(3)
    logits = torch.randn(2, 3, 7, dtype=F64, requires_grad=True)
    ref_logits = torch.randn(2, 3, 7, dtype=F64)
    got = kl.exact(logits, ref_logits, temperature=temperature, chunk_size=chunk_size)
    ref = exact_loop(logits, ref_logits, temperature)
    assert_close(got, ref, rtol=1e-13, atol=1e-15)
    w = torch.randn(2, 3, dtype=F64)
    (g_got,) = torch.autograd.grad((got * w).sum(), logits)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), logits)
    assert_close(g_got, g_ref, rtol=1e-12, atol=1e-14)


def test_exact_equals_expected_k1_and_ignores_ref_grad():
    torch.manual_seed(4)
    logits = torch.randn(1, 2, 5, dtype=F64)
    ref_logits = torch.randn(1, 2, 5, dtype=F64, requires_grad=True)
    out = kl.exact(logits, ref_logits, chunk_size=1)
    logp, ref_logp = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits.detach(), -1)
    assert_close(out, (logp.exp() * kl.k1(logp, ref_logp)).sum(-1), rtol=1e-13, atol=1e-15)
    assert not out.requires_grad  # ref_logits is a frozen anchor


def test_exact_mask_dtype_and_bad_args():
    logits = torch.randn(2, 2, 4, dtype=torch.bfloat16)
    assert kl.exact(logits, logits, chunk_size=3).dtype == torch.bfloat16
    bad = torch.randn(1, 2, 4)
    bad[0, 1, 0] = float("nan")
    mask = torch.tensor([[True, False]])
    out = kl.exact(bad, torch.zeros(1, 2, 4), chunk_size=1, mask=mask)
    assert out[0, 1].item() == 0.0 and torch.isfinite(out).all()
    with pytest.raises(NonFiniteError, match="non-finite"):
        kl.exact(bad, torch.zeros(1, 2, 4), chunk_size=1)
    with pytest.raises(ShapeError, match=r"\[B, T, V\]"):
        kl.exact(torch.zeros(2, 4), torch.zeros(2, 4), chunk_size=1)
    with pytest.raises(ValueError, match="temperature"):
        kl.exact(bad, bad, temperature=0.0, chunk_size=1)
    with pytest.raises(ValueError, match="chunk_size"):
        kl.exact(bad, bad, chunk_size=0)
    with pytest.raises(TypeError):
        kl.exact(bad, bad)  # chunk_size is required


def test_placement():
    assert kl.check_placement(True, False) is kl.Placement.REWARD
    assert kl.check_placement(False, True) is kl.Placement.LOSS
    assert kl.check_placement(False, False) is kl.Placement.NONE
    with pytest.raises(ValueError, match="both in the reward"):
        kl.check_placement(True, True)
    with pytest.raises(ValueError, match="must be bool"):
        kl.check_placement(1, 0)


def test_reward_penalty_reads_logp_old():
    # β = 0.1, k1 penalty (subtracted from the reward): β·(lp_old − lp_ref)
    # = 0.1·(−1 + 1.5) = 0.05 and 0.1·(−2 + 1) = −0.1 (a single-token k1 can be a bonus)
    logp_old = torch.tensor([[-1.0, -2.0, float("nan")]], dtype=F64)
    logp_ref = torch.tensor([[-1.5, -1.0, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True, False]])
    out = kl.reward_penalty(logp_old, logp_ref, mask, coef=0.1)
    assert_close(out, torch.tensor([[0.05, -0.1, 0.0]], dtype=F64), rtol=1e-14, atol=1e-16)
    assert not out.requires_grad
    k3 = kl.reward_penalty(logp_old, logp_ref, mask, coef=0.1, estimator="k3")
    assert_close(k3, 0.1 * kl.k3(logp_old, logp_ref, mask=mask), rtol=0, atol=0)
    assert (k3[mask] > 0).all()
    with pytest.raises(ValueError, match="requires grad"):  # the learner's logp is refused
        kl.reward_penalty(logp_old.clone().requires_grad_(), logp_ref, mask, coef=0.1)
    with pytest.raises(ValueError, match="estimator"):
        kl.reward_penalty(logp_old, logp_ref, mask, coef=0.1, estimator="k4")
    with pytest.raises(ValueError, match="coef"):
        kl.reward_penalty(logp_old, logp_ref, mask, coef=-0.1)
