import math

import pytest
import torch

from policylab.errors import MissingQuantityError
from policylab.kernels.objectives import METRIC_KEYS
from policylab.kernels.objectives import fdiv as fdiv_mod
from policylab.kernels.objectives.fdiv import DIVERGENCES, TOPOLOGIES, fdiv_bounds, fdiv_value, gppo_fdiv

F64 = torch.float64


def lp_of(*probs):
    return torch.log(torch.tensor([list(probs)], dtype=F64))


def naive_value(rho, p, divergence, topology):
    """Literal per-name formulas (non-negative generators), one scalar at a time."""
    g = {
        "kl_old_new": lambda u: u - 1 - math.log(u) if u > 0 else math.inf,
        "kl_new_old": lambda u: (u * math.log(u) if u > 0 else 0.0) - u + 1,
        "tv": lambda u: abs(u - 1) / 2,
        "chi2": lambda u: (u - 1) ** 2,
        "two_sided_log": lambda u: abs(math.log(u)) if u > 0 else math.inf,
    }[divergence]
    if topology == "mc":
        return g(rho)
    if topology == "atomic":
        return p * g(rho)
    rest = (1 - rho * p) / (1 - p)
    return p * g(rho) + (1 - p) * (g(rest) if rest >= 0 else math.inf)


def test_reference_values():
    # two-sided log, delta 0.2: |log rho| <= 0.2 -> [e^-0.2, e^0.2] = [0.8187, 1.2214]
    lo, hi = fdiv_bounds(lp_of(0.3), divergence="two_sided_log", topology="mc", delta=0.2)
    torch.testing.assert_close(torch.cat([lo, hi]).flatten(), torch.tensor([0.8187, 1.2214], dtype=F64),
                               atol=1e-4, rtol=0)
    # MC k3 (KL(old||new)), delta 0.01: rho - 1 - log rho = 0.01 -> [0.8652, 1.1482] for every p_old
    # check: 1.1482 - 1 - log 1.1482 = 0.1482 - 0.1382 = 0.0100
    p = lp_of(0.01, 0.1, 0.5, 0.9)
    lo, hi = fdiv_bounds(p, divergence="kl_old_new", topology="mc", delta=0.01)
    torch.testing.assert_close(lo, torch.full((1, 4), 0.8652, dtype=F64), atol=1e-4, rtol=0)
    torch.testing.assert_close(hi, torch.full((1, 4), 1.1482, dtype=F64), atol=1e-4, rtol=0)
    # binary KL(old||new), delta 0.01:
    # p 0.01 -> [0.1593, 3.1126]: 0.01 ln(0.01/0.031126) + 0.99 ln(0.99/0.968874) = -0.011355 + 0.021354 = 0.0100
    # p 0.1 -> [0.6291, 1.4768]; p 0.5 -> [0.8593, 1.1407]; p 0.9 -> [0.9470, 1.0412]
    lo, hi = fdiv_bounds(p, divergence="kl_old_new", topology="binary", delta=0.01)
    torch.testing.assert_close(lo, torch.tensor([[0.1593, 0.6291, 0.8593, 0.9470]], dtype=F64), atol=1e-4, rtol=0)
    torch.testing.assert_close(hi, torch.tensor([[3.1126, 1.4768, 1.1407, 1.0412]], dtype=F64), atol=1e-4, rtol=0)


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_bounds_contain_one_hit_delta_and_respect_feasibility(divergence, topology):
    p = torch.tensor([[0.003, 0.05, 0.3, 0.6, 0.97]], dtype=F64)
    delta = 0.02
    lo, hi = fdiv_bounds(torch.log(p), divergence=divergence, topology=topology, delta=delta)
    assert bool((lo <= 1).all()) and bool((hi >= 1).all())
    if topology == "binary":
        assert bool((hi * p <= 1 + 1e-12).all())
    for j in range(p.shape[1]):
        pj = float(p[0, j])
        for bound in (float(lo[0, j]), float(hi[0, j])):
            # every returned bound is inside the set, and it is its edge (tight to 1e-6) unless
            # it sits at a limit of the domain (0 or the binary cap 1/p)
            at_limit = bound == 0.0 or (topology == "binary" and abs(bound * pj - 1) < 1e-9)
            if bound > 0:
                assert naive_value(bound, pj, divergence, topology) <= delta + 1e-9
            if not at_limit:
                assert naive_value(bound, pj, divergence, topology) == pytest.approx(delta, abs=1e-6)


def test_small_delta_shrinks_to_one():
    for divergence in DIVERGENCES:
        for topology in TOPOLOGIES:
            lo, hi = fdiv_bounds(lp_of(0.2, 0.7), divergence=divergence, topology=topology, delta=1e-10)
            assert bool(((1 - lo) < 1e-3).all()) and bool(((hi - 1) < 1e-3).all())


def test_closed_forms_agree_with_bisection():
    p = torch.tensor([0.01, 0.2, 0.5, 0.9], dtype=F64)
    for divergence, topology in [("tv", "mc"), ("chi2", "mc"), ("two_sided_log", "mc"),
                                 ("tv", "atomic"), ("chi2", "atomic"), ("two_sided_log", "atomic"),
                                 ("tv", "binary"), ("chi2", "binary")]:
        closed = fdiv_mod._closed_form(p, divergence, topology, 0.05)
        solved = fdiv_mod._solve(p, divergence, topology, 0.05, 1e-12, 200)
        torch.testing.assert_close(closed[0], solved[0], atol=1e-9, rtol=0)
        torch.testing.assert_close(closed[1], solved[1], atol=1e-9, rtol=1e-9)


def test_literal_names_compute_what_they_say():
    rho, p = torch.tensor([1.3], dtype=F64), torch.tensor([0.4], dtype=F64)
    # MC kl_old_new is k3 = rho - 1 - log rho = 0.3 - 0.26236 = 0.03764, NOT |log rho| = 0.26236
    k3 = fdiv_value(rho, p, divergence="kl_old_new", topology="mc")
    assert k3.item() == pytest.approx(0.3 - math.log(1.3))
    assert k3.item() != pytest.approx(abs(math.log(1.3)))
    assert fdiv_value(rho, p, divergence="two_sided_log", topology="mc").item() == pytest.approx(math.log(1.3))
    # binary kl_old_new is the Bernoulli KL(old || new): p_new = 0.52
    expect = 0.4 * math.log(0.4 / 0.52) + 0.6 * math.log(0.6 / 0.48)
    assert fdiv_value(rho, p, divergence="kl_old_new", topology="binary").item() == pytest.approx(expect)
    # and KL(new || old) in the other direction
    expect_r = 0.52 * math.log(0.52 / 0.4) + 0.48 * math.log(0.48 / 0.6)
    assert fdiv_value(rho, p, divergence="kl_new_old", topology="binary").item() == pytest.approx(expect_r)
    # an ambiguous "kl" is refused
    with pytest.raises(ValueError, match="unknown divergence 'kl'"):
        fdiv_bounds(lp_of(0.5), divergence="kl", topology="mc", delta=0.1)


def test_value_refusals():
    with pytest.raises(ValueError, match="ratio"):
        fdiv_value(torch.tensor([0.0]), torch.tensor([0.5]), divergence="tv", topology="mc")
    with pytest.raises(ValueError, match="ratio"):
        fdiv_value(torch.tensor([-1.0]), torch.tensor([0.5]), divergence="tv", topology="mc")
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        fdiv_value(torch.tensor([1.0]), torch.tensor([1.0]), divergence="tv", topology="binary")
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        fdiv_bounds(torch.zeros(1, 1, dtype=F64), divergence="tv", topology="binary", delta=0.1)
    with pytest.raises(ValueError, match="p_old"):
        fdiv_bounds(torch.tensor([[0.2]], dtype=F64), divergence="tv", topology="mc", delta=0.1)
    with pytest.raises(ValueError, match="delta"):
        fdiv_bounds(lp_of(0.5), divergence="tv", topology="mc", delta=0.0)
    with pytest.raises(ValueError, match="topology"):
        fdiv_bounds(lp_of(0.5), divergence="tv", topology="full", delta=0.1)


def test_gradient_regions_and_naive_loop():
    # binary KL(old||new), delta 0.01, p_old 0.5 -> bounds [0.8593, 1.1407]
    # rho 1.2, A=+1: clipped flat -> 0    rho 1.2, A=-1: unclipped -> -c·A = +1.2
    # rho 0.8, A=-1: clipped flat -> 0    rho 0.8, A=+1: unclipped -> -0.8
    # same rho 1.2, A=+1 at p_old 0.1 (hi 1.4768): inside -> -1.2
    p_old = torch.tensor([[0.5, 0.5, 0.5, 0.5, 0.1]], dtype=F64)
    rho = torch.tensor([[1.2, 1.2, 0.8, 0.8, 1.2]], dtype=F64)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0]], dtype=F64)
    lp_old = torch.log(p_old)
    lp = (lp_old + torch.log(rho)).requires_grad_(True)
    kw = dict(divergence="kl_old_new", topology="binary", delta=0.01)
    loss, m = gppo_fdiv(lp, lp_old, adv, torch.ones(1, 5, dtype=torch.bool), **kw)
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, 1.2, 0.0, -0.8, -1.2]], dtype=F64))
    assert set(METRIC_KEYS) <= set(m) and m["clip_frac"].item() == pytest.approx(2 / 5)
    # naive loop on random inputs, with padding garbage
    torch.manual_seed(80)
    lp_old = -torch.rand(3, 6, dtype=F64) * 3 - 0.01
    lp = lp_old + 0.3 * torch.randn(3, 6, dtype=F64)
    a = torch.randn(3, dtype=F64)
    mask = torch.rand(3, 6) > 0.3
    lo, hi = fdiv_bounds(lp_old, mask=mask, **kw)
    expected = torch.zeros(3, 6, dtype=F64)
    for i in range(3):
        for t in range(6):
            if mask[i, t]:
                r = math.exp(lp[i, t] - lp_old[i, t])
                c = min(max(r, float(lo[i, t])), float(hi[i, t]))
                expected[i, t] = -min(r * a[i], c * a[i])
    garbage = torch.where(mask, lp, torch.full_like(lp, float("nan")))
    loss, _ = gppo_fdiv(garbage, lp_old, a, mask, **kw)
    torch.testing.assert_close(loss, expected)


def test_bounds_frozen_and_detached():
    lp_old = lp_of(0.2, 0.6).requires_grad_(True)
    lo, hi = fdiv_bounds(lp_old, divergence="chi2", topology="binary", delta=0.05)
    assert not lo.requires_grad and not hi.requires_grad
    lo2, hi2 = fdiv_bounds(lp_old.detach().clone(), divergence="chi2", topology="binary", delta=0.05)
    assert torch.equal(lo, lo2) and torch.equal(hi, hi2)


def test_missing_role():
    with pytest.raises(MissingQuantityError, match="logp_old"):
        gppo_fdiv(lp_of(0.5), None, torch.ones(1, dtype=F64), torch.ones(1, 1, dtype=torch.bool),
                  divergence="tv", topology="mc", delta=0.1)
