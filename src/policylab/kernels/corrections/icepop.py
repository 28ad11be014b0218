"""IcePop: two-sided masking of the engine ratio.

    k_t = exp(lp_old,t - lp_mu,t)                       engine ratio (same weights θ_old)
    M(k) = k   if low <= k <= high   (both bounds inclusive)
         = 0   otherwise
    loss_t = sg(M(k_t)) · loss^base_t                  loss^base = PPO clip on ρ = π_θ/π_old

Paper: Ling Team, "Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale
Thinking Model" (Ring-1T report), arXiv:2510.18855. Confirmed against the report: the
title and id, and the objective M(π_train(θ_old)/π_infer(θ_old)) · min(r A, clip(r) A)
with M(k) = k on [α, β] and 0 outside (an in-band token keeps the value k, not 1).
Unconfirmed: the defaults α = 0.5, β = 5 (so `low`/`high` are required), whether the
bounds are inclusive (policylab: inclusive, conventions rule 10), and the pairing with the
earlier IcePop technical note.

Normalizer (**unconfirmed**, library default): a token zeroed by M is a weight of 0, not a
removed token; it stays in the aggregation normalizer (conventions rule 4). The alternative
(drop it from the normalizer) is available through `icepop_normalizer_mask(...,
masked_in_normalizer=False)`, which the trainer must then use for every reduction.

Detached: the weight. Positions where `mask` is False get weight 0. IcePop never reads
the live `logp`: a token with k = 1 is kept whatever its policy ratio ρ.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import zero_outside_
from policylab.kernels.corrections.common import (
    band_sides,
    check_band,
    check_roles,
    fraction,
    masked_log_ratio,
    prefixed,
)
from policylab.kernels.corrections.diagnostics import ess_from_sums, log_ratio_stats


def band_weight(log_k: torch.Tensor, mask: torch.Tensor, low: float, high: float, *,
                out: torch.Tensor | None = None, scratch: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(M(k) [B, T] with k = exp(log k), 0 outside the band and where the mask is False;
    number of counted tokens above the band; number below) from a masked log engine ratio
    (private helper shared with online_icepop; bounds already validated). The weights are
    written into `out` and the band sides into `scratch` when given (buffers shaped like
    log_k that the caller gives up, e.g. log_k itself for `scratch`)."""
    # k, with log k capped just above log(high): every k above the band stays above it and
    # finite (an inf would turn the product below into NaN); values in or below the band
    # are untouched
    cap = math.log(high) + 1.0 if math.isfinite(high) else math.inf
    w = torch.clamp(log_k, max=cap, out=out).exp_() if out is not None else log_k.clamp(max=cap).exp_()
    # side: +1 above the band, −1 below, 0 inside and at masked positions
    side, n_high, n_low = band_sides(w, low, high, mask, out=scratch)
    # M(k) = k inside the band, 0 outside: k · (1 − |side|) · mask
    zero_outside_(w.mul_(side.abs_().neg_().add_(1.0)), mask)
    return w, n_high, n_low


def icepop(
    logp_old: torch.Tensor,
    logp_behavior: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float,
    high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IcePop weights M(exp(logp_old - logp_behavior)) with the band [low, high] inclusive.

    logp_old, logp_behavior, mask: [B, T]; 0 <= low < high (**unconfirmed** defaults, so
    required). Returns (weights [B, T] detached; metrics: fraction masked below / above /
    total among counted tokens, ESS of the weights, raw ratio statistics).
    """
    finite = check_roles("icepop", mask, logp_old=logp_old, logp_behavior=logp_behavior)
    low, high = check_band(low, high)
    n = int(torch.count_nonzero(mask))
    log_k = masked_log_ratio(logp_old.detach(), logp_behavior.detach(), mask, finite=finite)
    w = torch.empty_like(log_k)  # the statistics' temporary, then the weights
    stats = log_ratio_stats(log_k, mask, log_k, n=n, scratch=w)
    w, n_high, n_low = band_weight(log_k, mask, low, high, out=w, scratch=log_k)
    del log_k  # its buffer held the band sides
    total = w.sum()
    metrics = {
        "frac_masked": fraction(n_low + n_high, n, w),
        "frac_masked_low": fraction(n_low, n, w),
        "frac_masked_high": fraction(n_high, n, w),
        "weight_mean": fraction(total, n, w),
        "ess": ess_from_sums(total, w, n),
        **stats,
    }
    return w, prefixed("icepop", metrics)


def icepop_normalizer_mask(
    weights: torch.Tensor, mask: torch.Tensor, *, masked_in_normalizer: bool = True
) -> torch.Tensor:
    """The mask the trainer should count in the aggregation normalizer.

    masked_in_normalizer=True (library default, **unconfirmed**): `mask` unchanged, so a
    token zeroed by IcePop still counts in the denominator. False: tokens with weight 0 are
    dropped from the denominator too (mask & weights != 0). Returns a new bool [B, T].
    """
    if weights.shape != mask.shape:
        raise ValueError(f"`weights` {tuple(weights.shape)} and `mask` {tuple(mask.shape)} differ")
    if masked_in_normalizer:
        return mask.clone()
    return mask & (weights != 0)
