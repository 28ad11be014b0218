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
Equation number: the IcePop objective of the report (its number was not checked).

Normalizer (**unconfirmed**, library default): a token zeroed by M is a weight of 0, not a
removed token; it stays in the aggregation normalizer (conventions rule 4). The alternative
(drop it from the normalizer) is available through `icepop_normalizer_mask(...,
masked_in_normalizer=False)`, which the trainer must then use for every reduction.

Detached: the weight. Positions where `mask` is False get weight 0. IcePop never reads
the live `logp`: a token with k = 1 is kept whatever its policy ratio ρ. Deviations: none
in the weight; a k that overflows to inf is outside every finite band (weight 0, no NaN).

`icepop(..., fast=False)` runs the equation as written below; `fast=True` (the default,
what the trainer runs) runs `corrections.fast.icepop_fast` (the weights built in place,
the band counted from sign sums), equal in fp64 (tests/kernels/corrections/
test_correction_fast_paths.py).
"""

from __future__ import annotations

import torch

from policylab.kernels.corrections.common import (
    check_band,
    check_roles,
    ess_from_sums,
    fraction,
    masked_log_ratio,
    prefixed,
)
from policylab.kernels.corrections.diagnostics import log_ratio_stats
from policylab.kernels.corrections.fast import icepop_fast


def icepop(
    logp_old: torch.Tensor,
    logp_behavior: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float,
    high: float,
    fast: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IcePop weights M(exp(logp_old - logp_behavior)) with the band [low, high] inclusive.

    M(k) = k if low <= k <= high, else 0 (arXiv 2510.18855, the IcePop objective, equation
    number not checked; module doc). logp_old, logp_behavior, mask: [B, T]; 0 <= low < high (**unconfirmed**
    defaults, so required). fast: the in-place variant (default) or the plain equation.
    Returns (weights [B, T] detached, 0 where mask is False; `icepop_metrics`).
    """
    finite = check_roles("icepop", mask, logp_old=logp_old, logp_behavior=logp_behavior)
    low, high = check_band(low, high)
    if fast:
        return icepop_fast(logp_old, logp_behavior, mask, low=low, high=high, finite=finite)
    log_k = masked_log_ratio(logp_old.detach(), logp_behavior.detach(), mask)  # 0 at masked positions
    k = torch.exp(log_k)  # engine ratio k = π_old / μ (same weights θ_old)
    in_band = (k >= low) & (k <= high) & mask  # α <= k <= β, both inclusive
    weight = torch.where(in_band, k, torch.zeros((), dtype=k.dtype, device=k.device))  # M(k), detached
    return weight, icepop_metrics(log_k, k, weight, mask, low=low, high=high)


def icepop_metrics(log_k, k, weight, mask, *, low: float, high: float) -> dict[str, torch.Tensor]:
    """Metrics "icepop/<name>": the fractions of counted tokens masked below / above / in
    total, the weights' mean and ESS, the raw engine-ratio statistics (`mismatch_stats`)."""
    n = int(torch.count_nonzero(mask))
    n_low = torch.count_nonzero((k < low) & mask)
    n_high = torch.count_nonzero((k > high) & mask)
    total = weight.sum()
    metrics = {
        "frac_masked": fraction(n_low + n_high, n, weight),
        "frac_masked_low": fraction(n_low, n, weight),
        "frac_masked_high": fraction(n_high, n, weight),
        "weight_mean": fraction(total, n, weight),
        "ess": ess_from_sums(total, weight, n),
        **log_ratio_stats(log_k, mask, log_k, n=n, fast=False),
    }
    return prefixed("icepop", metrics)


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
