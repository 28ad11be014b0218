"""gae and whiten (advantages/gae.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages import gae, whiten
from policylab.errors import NonFiniteError, PolicylabError, ShapeError

F64 = torch.float64


def naive_gae(r, v, m, gamma, lam):
    """Explicit-sum reference: Â_t = Σ_k (γλ)^k δ_{t+k} over the valid tokens of a row."""
    B, T = r.shape
    adv = torch.zeros(B, T, dtype=F64)
    ret = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        lam_b = float(lam[b]) if isinstance(lam, torch.Tensor) else lam
        idx = [t for t in range(T) if m[b, t]]
        vals = [float(v[b, t]) for t in idx] + [0.0]  # V = 0 after the last valid token
        deltas = [float(r[b, t]) + gamma * vals[j + 1] - vals[j] for j, t in enumerate(idx)]
        for j, t in enumerate(idx):
            a = sum((gamma * lam_b) ** k * deltas[j + k] for k in range(len(idx) - j))
            adv[b, t] = a
            ret[b, t] = a + vals[j]
    return adv, ret


def random_case(seed, B=5, T=9, holes=False):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=F64)
    v = torch.randn(B, T, generator=g, dtype=F64)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    m = torch.arange(T) < lengths.unsqueeze(1)
    if holes:
        m = m & (torch.rand(B, T, generator=g) > 0.3)
    return r, v, m


def test_hand_case_from_methods():
    # T=3, γ=1, λ=0.8, r=[0,0,1], V=[0.5,0.6,0.7]
    # δ0 = 0 + 0.6 - 0.5 = 0.1 ; δ1 = 0 + 0.7 - 0.6 = 0.1 ; δ2 = 1 + 0 - 0.7 = 0.3
    # Â2 = 0.3 ; Â1 = 0.1 + 0.8*0.3 = 0.34 ; Â0 = 0.1 + 0.8*0.34 = 0.372
    # R = Â + V = [0.872, 0.94, 1.0]
    r = torch.tensor([[0.0, 0.0, 1.0]], dtype=F64)
    v = torch.tensor([[0.5, 0.6, 0.7]], dtype=F64)
    m = torch.ones(1, 3, dtype=torch.bool)
    adv, ret = gae(r, v, m, gamma=1.0, lam=0.8)
    assert_close(adv, torch.tensor([[0.372, 0.34, 0.3]], dtype=F64), rtol=0, atol=1e-12)
    assert_close(ret, torch.tensor([[0.872, 0.94, 1.0]], dtype=F64), rtol=0, atol=1e-12)


def test_lambda_one_is_monte_carlo_and_lambda_zero_is_td():
    r, v, m = random_case(0)
    adv1, ret1 = gae(r, v, m, gamma=1.0, lam=1.0)
    # Â_t = Σ_{u≥t} r_u − V_t on valid tokens (right-padded mask here)
    rz = torch.where(m, r, 0)
    mc = rz.flip(1).cumsum(1).flip(1)
    assert_close(adv1, torch.where(m, mc - v, 0))
    assert_close(ret1, torch.where(m, mc, 0))
    adv0, _ = gae(r, v, m, gamma=0.9, lam=0.0)
    v_next = torch.cat([torch.where(m, v, 0)[:, 1:], torch.zeros(v.shape[0], 1, dtype=F64)], 1)
    delta = r + 0.9 * v_next - v
    assert_close(adv0, torch.where(m, delta, 0))


@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matches_naive_reference(seed, holes):
    r, v, m = random_case(seed, holes=holes)
    lam = torch.rand(r.shape[0], generator=torch.Generator().manual_seed(seed + 50), dtype=F64)
    for lam_arg in (0.95, lam):
        adv, ret = gae(r, v, m, gamma=0.97, lam=lam_arg)
        ref_adv, ref_ret = naive_gae(r, v, m, 0.97, lam_arg)
        assert_close(adv, ref_adv)
        assert_close(ret, ref_ret)


def test_per_sequence_lambda_equals_row_by_row_scalar_calls():
    r, v, m = random_case(4)
    lam = torch.tensor([0.0, 0.5, 0.8, 0.95, 1.0], dtype=F64)
    adv, ret = gae(r, v, m, gamma=1.0, lam=lam)
    for b in range(5):
        a_b, r_b = gae(r[b : b + 1], v[b : b + 1], m[b : b + 1], gamma=1.0, lam=float(lam[b]))
        assert_close(adv[b : b + 1], a_b, rtol=0, atol=0)
        assert_close(ret[b : b + 1], r_b, rtol=0, atol=0)


def test_padding_never_enters():
    r, v, m = random_case(5, T=6)
    adv, ret = gae(r, v, m, gamma=0.99, lam=0.9)
    # append 4 padded columns holding garbage, NaN and inf
    pad_r = torch.tensor([[7.0, float("nan"), float("inf"), -3.0]], dtype=F64).expand(5, 4)
    r2, v2 = torch.cat([r, pad_r], 1), torch.cat([v, pad_r.flip(1)], 1)
    m2 = torch.cat([m, torch.zeros(5, 4, dtype=torch.bool)], 1)
    # also overwrite already-masked positions inside the original width
    r2 = torch.where(m2, r2, float("nan"))
    adv2, ret2 = gae(r2, v2, m2, gamma=0.99, lam=0.9)
    assert_close(adv2[:, :6], adv, rtol=0, atol=0)
    assert_close(ret2[:, :6], ret, rtol=0, atol=0)
    assert (adv2[~m2] == 0).all() and (ret2[~m2] == 0).all()


def test_interior_hole_is_skipped_not_a_zero_reward_step():
    # valid tokens at 0, 2, 3 (position 1 masked with a huge reward and value):
    # same result as the compact sequence [t0, t2, t3]
    r = torch.tensor([[0.0, 100.0, 0.0, 1.0]], dtype=F64)
    v = torch.tensor([[0.5, 100.0, 0.6, 0.7]], dtype=F64)
    m = torch.tensor([[True, False, True, True]])
    adv, ret = gae(r, v, m, gamma=1.0, lam=0.8)
    # compact case = the METHODS hand case: [0.372, 0.34, 0.3]
    assert_close(adv, torch.tensor([[0.372, 0.0, 0.34, 0.3]], dtype=F64), rtol=0, atol=1e-12)
    assert_close(ret, torch.tensor([[0.872, 0.0, 0.94, 1.0]], dtype=F64), rtol=0, atol=1e-12)


def test_results_are_detached_and_keep_dtype():
    r = torch.zeros(2, 3, requires_grad=True)
    v = torch.ones(2, 3, requires_grad=True)
    adv, ret = gae(r, v, torch.ones(2, 3, dtype=torch.bool), gamma=1.0, lam=0.9)
    assert not adv.requires_grad and not ret.requires_grad
    assert adv.dtype == torch.float32
    empty_row = gae(r.detach(), v.detach(), torch.zeros(2, 3, dtype=torch.bool), gamma=1.0, lam=0.9)
    assert (empty_row[0] == 0).all()


def test_bad_inputs():
    r = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ShapeError, match="`mask` must be a bool"):
        gae(r, r, m.float(), gamma=1.0, lam=0.9)
    with pytest.raises(ShapeError, match="`values` has shape"):
        gae(r, torch.zeros(2, 4), m, gamma=1.0, lam=0.9)
    with pytest.raises(ShapeError, match="must be \\[B, T\\]"):
        gae(torch.zeros(3), torch.zeros(3), torch.ones(3, dtype=torch.bool), gamma=1.0, lam=0.9)
    bad = r.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(NonFiniteError, match=r"`token_rewards`.*index \[1, 2\]"):
        gae(bad, r, m, gamma=1.0, lam=0.9)
    with pytest.raises(NonFiniteError, match="`values`"):
        gae(r, bad, m, gamma=1.0, lam=0.9)
    with pytest.raises(PolicylabError, match="`lam` must be a number in \\[0, 1\\]"):
        gae(r, r, m, gamma=1.0, lam=1.2)
    with pytest.raises(PolicylabError, match="`gamma` must be a number in \\[0, 1\\]"):
        gae(r, r, m, gamma=-0.1, lam=0.9)
    with pytest.raises(PolicylabError, match="`lam` must lie in \\[0, 1\\]; entry 1"):
        gae(r, r, m, gamma=1.0, lam=torch.tensor([0.5, float("nan")]))
    with pytest.raises(ShapeError, match="`lam` as a tensor must be \\[B\\]"):
        gae(r, r, m, gamma=1.0, lam=torch.tensor([0.5, 0.5, 0.5]))
    with pytest.raises(PolicylabError, match="`gamma` must be a float"):
        gae(r, r, m, gamma=torch.tensor([1.0, 1.0]), lam=0.9)
    with pytest.raises(ShapeError, match="floating point"):
        gae(r.long(), r, m, gamma=1.0, lam=0.9)


# ----- whiten -------------------------------------------------------------------------

def naive_whiten(adv, m, eps, ddof):
    vals = [float(adv[b, t]) for b in range(adv.shape[0]) for t in range(adv.shape[1]) if m[b, t]]
    mean = sum(vals) / len(vals)
    var = sum((x - mean) ** 2 for x in vals) / max(len(vals) - ddof, 1)
    out = torch.zeros_like(adv)
    for b in range(adv.shape[0]):
        for t in range(adv.shape[1]):
            if m[b, t]:
                out[b, t] = (float(adv[b, t]) - mean) / (var**0.5 + eps)
    return out


def test_whiten_hand_case():
    # valid values [1, 2, 3, 6] (the 100 is padding): mean 3, deviations [-2, -1, 0, 3]
    # population var = (4 + 1 + 0 + 9)/4 = 3.5 ; unbiased = 14/3
    adv = torch.tensor([[1.0, 2.0, 100.0], [3.0, 6.0, float("nan")]], dtype=F64)
    m = torch.tensor([[True, True, False], [True, True, False]])
    out = whiten(adv, m, eps=0.0)
    s = 3.5**0.5
    assert_close(out, torch.tensor([[-2 / s, -1 / s, 0.0], [0.0, 3 / s, 0.0]], dtype=F64))
    out_u = whiten(adv, m, eps=0.0, std="unbiased")
    su = (14 / 3) ** 0.5
    assert_close(out_u, torch.tensor([[-2 / su, -1 / su, 0.0], [0.0, 3 / su, 0.0]], dtype=F64))


@pytest.mark.parametrize("seed", [0, 1])
def test_whiten_matches_naive(seed):
    r, _, m = random_case(seed, holes=True)
    m[0, 0] = True  # at least one valid token
    for std, ddof in (("population", 0), ("unbiased", 1)):
        assert_close(whiten(r, m, eps=1e-8, std=std), naive_whiten(r, m, 1e-8, ddof))


def test_whiten_bad_inputs():
    m = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(PolicylabError, match="no True entry"):
        whiten(torch.zeros(1, 2), ~m, eps=1e-8)
    with pytest.raises(PolicylabError, match="`std` must be"):
        whiten(torch.zeros(1, 2), m, eps=1e-8, std=None)
    with pytest.raises(PolicylabError, match="`eps` must be a finite number >= 0"):
        whiten(torch.zeros(1, 2), m, eps=-1.0)
    with pytest.raises(ShapeError, match=r"`adv` must be \[B, T\]"):
        whiten(torch.zeros(2), m[0], eps=1e-8)
    with pytest.raises(NonFiniteError, match="`adv`"):
        whiten(torch.tensor([[1.0, float("inf")]]), m, eps=1e-8)
