"""RIPO: probability-dependent PPO ratio bounds from a Fisher–Rao ball, and the PPO clip
with per-token bounds that it (and `gppo_fdiv`) uses.

On the sampled-token-vs-rest Bernoulli the Fisher–Rao distance is
d(p, q) = 2·|arcsin √p − arcsin √q|. A ball of radius δ around p_old = exp(lp_old), mapped
to the ratio q/p_old:

    a_old = arcsin √p_old
    r_lo  = sin²(max(0,   a_old − δ/2)) / p_old
    r_hi  = sin²(min(π/2, a_old + δ/2)) / p_old          (so r_hi·p_old <= 1)
    ρ = exp(lp − lp_old);  loss = −min(ρA, clip(ρ, r_lo, r_hi)·A)

Rare tokens get wide bounds, confident tokens narrow ones (δ = 0.2: p_old 0.5 ->
[0.8013, 1.1987], 0.9 -> [0.9249, 1.0574], 0.1 -> [0.4837, 1.6757]).

Paper: title and arXiv id **unconfirmed** ("RIPO"); this is a construction consistent
with the described geometry, not a verified copy of the published formula.
Detached: the bounds (computed from lp_old only, once per round; they never change when
the learner moves, conventions rule 11), the advantages. Loss is 0 where `mask` is False.
An underflowed p_old = 0 gets the bounds [0, inf] (any ratio is inside the ball's limit).
Deviation: the shared log-ratio guard of `objectives.common` (`log_ratio_clamp`, default
20) before the exp, as in ppo_clip; metrics use the shared key scheme (`METRIC_KEYS`).
No equation number: the paper could not be checked.
"""

from __future__ import annotations

import math

import torch

from policylab.errors import ShapeError
from policylab.kernels.checks import check_finite, masked
from policylab.kernels.corrections.common import check_positive, check_roles, scalar
from policylab.kernels.objectives.common import (
    DEFAULT_LOG_RATIO_CLAMP,
    Regions,
    check_log_ratio_clamp,
    guard,
    summarize,
    token_inputs,
)


def ripo_bounds(
    logp_old: torch.Tensor, *, delta: float, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_lo, r_hi) detached, shaped like `logp_old`, in its dtype (computed in float64).

    logp_old must be finite and <= 0 where `mask` counts (everywhere if mask is None);
    positions outside the mask get the neutral bounds [1, 1]. delta > 0 is the
    Fisher–Rao radius (**unconfirmed** default, so required)."""
    delta = check_positive("delta", delta)
    if mask is None:
        mask = torch.ones_like(logp_old, dtype=torch.bool)
    check_finite(logp_old, "logp_old", mask)
    lp = torch.where(mask, logp_old.detach(), torch.zeros_like(logp_old)).to(torch.float64)
    if bool((lp > 0).any()):
        raise ValueError("`logp_old` has log-probabilities > 0 (p_old > 1) at counted positions")
    p = torch.exp(lp)
    a = torch.asin(torch.sqrt(p))
    half = delta / 2
    safe_p = torch.where(p > 0, p, torch.ones_like(p))
    lo = torch.sin((a - half).clamp_min(0.0)) ** 2 / safe_p
    hi = torch.sin((a + half).clamp_max(math.pi / 2)) ** 2 / safe_p
    lo = torch.where(p > 0, lo, torch.zeros_like(lo))
    hi = torch.where(p > 0, hi, torch.full_like(hi, math.inf))
    one = torch.ones_like(lo)
    lo, hi = torch.where(mask, lo, one), torch.where(mask, hi, one)
    return lo.to(logp_old.dtype), hi.to(logp_old.dtype)


def clip_to_bounds(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    lo: torch.Tensor,
    hi: torch.Tensor,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
    method: str = "clip_to_bounds",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clip with per-token bounds: loss = −min(ρA, clip(ρ, lo, hi)A), ρ = exp(lp − lp_old).

    logp (differentiable), logp_old, mask: [B, T]; adv [B] or [B, T]; lo, hi: detached
    [B, T] tensors with lo <= 1 <= hi at counted positions (hi may be inf). Gradient
    coefficient (∂L/∂lp = −c·A): c = ρ unless the clipped branch is flat (A > 0 and ρ > hi,
    or A < 0 and ρ < lo), where c = 0; a ratio exactly on a bound is inside.
    log_ratio_clamp: the shared guard of `objectives.common` on |lp − lp_old| (hits
    counted in `log_ratio_clamped`). Returns (loss [B, T], 0 where mask is False; metrics
    with the shared `METRIC_KEYS`, regions taken against the per-token bounds, plus
    `<method>/bound_lo_mean` and `<method>/bound_hi_mean` over finite bounds).
    """
    check_roles(method, mask, logp=logp, logp_old=logp_old)
    for name, b in (("lo", lo), ("hi", hi)):
        if not isinstance(b, torch.Tensor) or b.shape != mask.shape:
            raise ShapeError(f"`{name}` must be a tensor shaped like `mask` {tuple(mask.shape)}")
        if b.requires_grad:
            raise ValueError(f"`{name}` requires grad; trust-region bounds must be detached")
    if bool(((lo > 1) | (hi < 1) | torch.isnan(lo) | torch.isnan(hi))[mask].any()):
        raise ValueError("bounds must satisfy lo <= 1 <= hi at counted positions")
    check_log_ratio_clamp(log_ratio_clamp, logp.dtype)
    x = token_inputs(logp, logp_old, adv, mask)  # 0 at masked positions; lp_old, A detached
    one = torch.ones((), dtype=logp.dtype, device=logp.device)
    lo_c = torch.where(mask, lo.to(logp.dtype), one)  # neutral [1, 1] at masked positions
    hi_c = torch.where(mask, hi.to(logp.dtype), one)
    log_ratio, clamped = guard(x.lp - x.lp_old, log_ratio_clamp)
    ratio = torch.exp(log_ratio)  # ρ = exp(lp − lp_old)
    surrogate = torch.minimum(ratio * x.adv, torch.clamp(ratio, lo_c, hi_c) * x.adv)
    loss = masked(-surrogate, mask)  # −min(ρA, clip(ρ, lo, hi)·A)
    reg = bound_regions(ratio, x.adv, mask, lo_c, hi_c)
    return loss, bounds_metrics(ratio, reg, mask, lo_c, hi_c, clamped=clamped, method=method)


def bound_regions(ratio, adv, mask, lo, hi) -> Regions:
    """The four clip regions of a detached ratio against per-token bounds (strict)."""
    r = ratio.detach()
    pos, neg = (adv > 0) & mask, (adv < 0) & mask
    low, high = r < lo, r > hi
    return Regions(low & pos, low & neg, high & pos, high & neg)


def bounds_metrics(ratio, reg, mask, lo, hi, *, clamped, method: str) -> dict[str, torch.Tensor]:
    """The `METRIC_KEYS` of a per-token-bound clip (zeroed = low_neg + high_pos) plus
    `<method>/bound_lo_mean` and `<method>/bound_hi_mean` (over finite upper bounds)."""
    metrics = summarize(ratio, mask, reg, zeroed=reg.low_neg | reg.high_pos, clamped=clamped)
    finite_hi = hi[mask][torch.isfinite(hi[mask])]
    metrics[f"{method}/bound_lo_mean"] = scalar(lo[mask].mean(), lo)
    metrics[f"{method}/bound_hi_mean"] = scalar(finite_hi.mean() if finite_hi.numel() else 0.0, lo)
    return metrics


def ripo(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    delta: float,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """RIPO loss: PPO clip with the Fisher–Rao bounds of `ripo_bounds` (see module doc).

    logp: [B, T] learner (differentiable); logp_old, mask: [B, T]; adv [B] or [B, T];
    delta > 0 (**unconfirmed**). Returns (loss [B, T], 0 where mask is False; metrics:
    the shared `METRIC_KEYS` plus `ripo/bound_lo_mean`, `ripo/bound_hi_mean`).
    """
    check_roles("ripo", mask, logp=logp, logp_old=logp_old)
    lo, hi = ripo_bounds(logp_old, delta=delta, mask=mask)
    return clip_to_bounds(logp, logp_old, adv, mask, lo=lo, hi=hi,
                          log_ratio_clamp=log_ratio_clamp, method="ripo")
