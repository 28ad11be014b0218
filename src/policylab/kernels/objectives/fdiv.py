"""f-divergence trust regions on the policy ratio (`gppo_fdiv`).

Two independent choices, each under its literal name:

divergence f, written as a non-negative generator g(u) (u = π_new/π_old; the linear term
f'(1)(u − 1) is removed, which leaves every full-distribution divergence unchanged because
E_old[u − 1] = 0, but makes every single-atom term >= 0):
    "kl_old_new"     KL(π_old || π_new):  g(u) = u − 1 − log u        (the k3 estimator)
    "kl_new_old"     KL(π_new || π_old):  g(u) = u log u − u + 1
    "tv"             total variation:      g(u) = |u − 1| / 2
    "chi2"           Pearson χ²(π_new || π_old): g(u) = (u − 1)²
    "two_sided_log"  |log u| (a symmetric log-ratio band; not an f-divergence, no KL)

topology, i.e. how the divergence is estimated from the sampled token (p = p_old of it):
    "mc"      g(ρ)                                   independent of p
    "atomic"  p · g(ρ)                               only the sampled atom's term
    "binary"  p·g(ρ) + (1−p)·g((1 − ρp)/(1 − p))     sampled token vs the rest; feasible
                                                     only for ρ·p <= 1 (needs 0 < p < 1)

Per token the set {ρ : D̂(ρ) <= δ} is an interval [r_lo, r_hi] containing 1 (D̂ is 0 at 1
and monotone on each side). Closed forms: tv, chi2, two_sided_log for mc/atomic; tv, chi2
for binary. Otherwise bisection to `tol` (in log ρ above 1, in ρ below 1), returning the
endpoint inside the set. Then loss = −min(ρA, clip(ρ, r_lo, r_hi)A) with the bounds
detached and computed from lp_old only.

Reference values: two_sided_log δ = 0.2 -> [0.8187, 1.2214]; mc kl_old_new δ = 0.01 ->
[0.8652, 1.1482]; binary kl_old_new δ = 0.01 -> p 0.01: [0.1593, 3.1126], 0.5:
[0.8593, 1.1407], 0.9: [0.9470, 1.0412].

Paper: title and arXiv id **unconfirmed** (a generalized proximal framework pairing an
f-divergence with an estimation topology, referred to as GPPO). The pairings it publishes
are unconfirmed; the non-negative generators in mc/atomic are a library decision.
No equation number: the paper could not be checked. Detached: the bounds (from lp_old
only), the advantages. Deviation: the shared log-ratio guard of `objectives.common`
(`log_ratio_clamp`) before the exp, as in ppo_clip (`clip_to_bounds`).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from policylab.kernels.checks import check_finite
from policylab.kernels.corrections.common import check_positive, check_roles
from policylab.kernels.objectives.common import DEFAULT_LOG_RATIO_CLAMP
from policylab.kernels.objectives.ripo import clip_to_bounds

DIVERGENCES = ("kl_old_new", "kl_new_old", "tv", "chi2", "two_sided_log")
TOPOLOGIES = ("mc", "atomic", "binary")
Divergence = Literal["kl_old_new", "kl_new_old", "tv", "chi2", "two_sided_log"]
Topology = Literal["mc", "atomic", "binary"]


def _check_names(divergence: str, topology: str) -> None:
    if divergence not in DIVERGENCES:
        raise ValueError(f"unknown divergence {divergence!r}; use one of {DIVERGENCES} (literal names)")
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; use one of {TOPOLOGIES}")


def _gen(u: torch.Tensor, divergence: str) -> torch.Tensor:
    """Non-negative generator g(u) for u >= 0 (u = 0 handled as the limit; u < 0 -> inf)."""
    if divergence == "kl_old_new":
        out = u - 1 - torch.log(u)
    elif divergence == "kl_new_old":
        out = torch.xlogy(u, u) - u + 1
    elif divergence == "tv":
        out = (u - 1).abs() / 2
    elif divergence == "chi2":
        out = (u - 1) ** 2
    else:
        out = torch.log(u).abs()
    return torch.where(u < 0, torch.full_like(out, math.inf), out)


def _estimate(rho: torch.Tensor, p: torch.Tensor, divergence: str, topology: str) -> torch.Tensor:
    if topology == "mc":
        return _gen(rho, divergence)
    if topology == "atomic":
        return p * _gen(rho, divergence)
    rest = (1 - rho * p) / (1 - p)
    return p * _gen(rho, divergence) + (1 - p) * _gen(rest, divergence)


def fdiv_value(
    ratio: torch.Tensor, p_old: torch.Tensor, *, divergence: Divergence, topology: Topology
) -> torch.Tensor:
    """D̂_τ(ρ) per token (see module doc). ratio > 0; p_old in (0, 1] ((0, 1) for binary)."""
    _check_names(divergence, topology)
    if bool((ratio <= 0).any()) or not bool(torch.isfinite(ratio).all()):
        raise ValueError("`ratio` must be finite and > 0")
    _check_p(p_old, topology)
    return _estimate(ratio, p_old, divergence, topology)


def _check_p(p: torch.Tensor, topology: str) -> None:
    bad = ~torch.isfinite(p) | (p <= 0) | (p > 1)
    if topology == "binary":
        bad = bad | (p >= 1)
    if bool(bad.any()):
        need = "(0, 1)" if topology == "binary" else "(0, 1]"
        raise ValueError(f"p_old must be in {need} for topology {topology!r}")


def _closed_form(p, divergence, topology, delta):
    """(lo, hi) in closed form, or None when only bisection applies."""
    if topology in ("mc", "atomic"):
        s = delta / p if topology == "atomic" else torch.full_like(p, delta)
        if divergence == "tv":
            return (1 - 2 * s).clamp_min(0), 1 + 2 * s
        if divergence == "chi2":
            return (1 - s.sqrt()).clamp_min(0), 1 + s.sqrt()
        if divergence == "two_sided_log":
            return torch.exp(-s), torch.exp(s)
        return None
    if divergence == "tv":
        half = delta / p
    elif divergence == "chi2":
        half = torch.sqrt(delta * (1 - p) / p)
    else:
        return None
    return (1 - half).clamp_min(0), torch.minimum(1 + half, 1 / p)


def _bisect(feasible, a: torch.Tensor, b: torch.Tensor, tol: float, max_iter: int) -> torch.Tensor:
    """Boundary between a (feasible) and b (infeasible) of a set monotone along [a, b]."""
    for _ in range(max_iter):
        if float((b - a).abs().max()) <= tol:
            break
        mid = (a + b) / 2
        ok = feasible(mid)
        a, b = torch.where(ok, mid, a), torch.where(ok, b, mid)
    return a


def _solve(p, divergence, topology, delta, tol, max_iter):
    ok_rho = lambda r: _estimate(r, p, divergence, topology) <= delta  # noqa: E731
    zero, one = torch.zeros_like(p), torch.ones_like(p)
    # lower side, in ρ on [0, 1]
    lo = torch.where(ok_rho(zero), zero, _bisect(ok_rho, one, zero, tol, max_iter))
    # upper side, in x = log ρ; binary is capped at the feasibility limit ρ = 1/p
    ok_x = lambda x: ok_rho(torch.exp(x))  # noqa: E731
    if topology == "binary":
        top = -torch.log(p)
    else:
        top = one.clone()
        for _ in range(12):  # doubling up to x = 4096 (exp overflows to inf: infeasible)
            grow = ok_x(top)
            if not bool(grow.any()):
                break
            top = torch.where(grow, top * 2, top)
    hi_x = torch.where(ok_x(top), top, _bisect(ok_x, zero, top, tol, max_iter))
    return lo, torch.exp(hi_x)


def fdiv_bounds(
    logp_old: torch.Tensor,
    *,
    divergence: Divergence,
    topology: Topology,
    delta: float,
    mask: torch.Tensor | None = None,
    tol: float = 1e-12,
    max_iter: int = 200,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token trust-region ratio bounds (r_lo, r_hi), detached, shaped and typed like
    `logp_old` (solved in float64). Positions outside `mask` get [1, 1]. Raises on an
    unknown name, delta <= 0, or p_old outside (0, 1] ((0, 1) for binary)."""
    _check_names(divergence, topology)
    delta = check_positive("delta", delta)
    if mask is None:
        mask = torch.ones_like(logp_old, dtype=torch.bool)
    check_finite(logp_old, "logp_old", mask)
    fill = math.log(0.5)  # a harmless p for positions that do not count
    lp = torch.where(mask, logp_old.detach(), torch.full_like(logp_old, fill)).to(torch.float64)
    p = torch.exp(lp)
    _check_p(p, topology)
    closed = _closed_form(p, divergence, topology, delta)
    lo, hi = closed if closed is not None else _solve(p, divergence, topology, delta, tol, max_iter)
    one = torch.ones_like(lo)
    lo, hi = torch.where(mask, lo, one), torch.where(mask, hi, one)
    return lo.to(logp_old.dtype), hi.to(logp_old.dtype)


def gppo_fdiv(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    divergence: Divergence,
    topology: Topology,
    delta: float,
    tol: float = 1e-12,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """f-divergence PPO: clip ρ to the `fdiv_bounds` interval (see module doc).

    logp: [B, T] learner (differentiable); logp_old, mask: [B, T]; adv [B] or [B, T].
    divergence / topology: literal names; delta > 0 (**unconfirmed** pairings/defaults).
    log_ratio_clamp: shared guard on |lp − lp_old| (see `objectives.common`).
    Returns (loss [B, T], 0 where mask is False; metrics: shared `METRIC_KEYS` plus
    `gppo_fdiv/bound_lo_mean`, `gppo_fdiv/bound_hi_mean`).
    """
    check_roles("gppo_fdiv", mask, logp=logp, logp_old=logp_old)
    lo, hi = fdiv_bounds(logp_old, divergence=divergence, topology=topology, delta=delta,
                         mask=mask, tol=tol)
    return clip_to_bounds(logp, logp_old, adv, mask, lo=lo, hi=hi,
                          log_ratio_clamp=log_ratio_clamp, method="gppo_fdiv")
