"""GPPO: PPO's forward value, with bounded gradients instead of zero on clipped tokens.

Paper: "Klear-Reasoner: Advancing Reasoning Capability via Gradient-Preserving Clipping
Policy Optimization", Kuaishou Klear team, arXiv 2508.07629 (GPPO objective, Sec. on GPPO).

The clip bounds are made differentiable with a unit carrier (value 1, gradient ∇lp):

    lo = (1−ε_low)·exp(d − sg(d)),  hi = (1+ε_high)·exp(d − sg(d)),  d = lp − lp_old
    ℓ = −min(ρA, c(ρ)A),  c(ρ) = hi if ρ > 1+ε_high, lo if ρ < 1−ε_low, ρ otherwise

Values are exactly PPO's (lo, hi equal the constants 1∓ε). Gradient ∂ℓ/∂lp = −coef·A with

    A > 0, ρ > 1+ε_high:  coef = 1+ε_high   (PPO: 0)
    A < 0, ρ < 1−ε_low:   coef = 1−ε_low    (PPO: 0)
    everywhere else:      coef = ρ          (identical to PPO, including A < 0, ρ > 1+ε_high)

This matches the one-line change the authors' public README gives (the PPO clamp bounds
replaced by (1∓ε)·ρ/sg(ρ)), checked against that README, not against the PDF. The region is
chosen with detached masks (`torch.where`) so the selected branch passes its gradient and
a ratio exactly on a bound counts as inside. The paper's general form scales the two
boundary gradients by β1, β2 and sets β1 = β2 = 1 in its experiments; only β = 1 is
implemented (a later generalization, CE-GPPO, tunes them).

Detached: `logp_old`, `adv`, the bound constants. Deviation: the log-ratio guard
(`log_ratio_clamp`) on ρ; the carriers use the unclamped d, so the boundary gradients stay
exactly (1∓ε) even for extreme log-ratios. clip_frac is 0 (GPPO zeroes no token); the
region fractions count tokens that get a boundary gradient (high_pos, low_neg).
Equation number: the GPPO objective of arXiv 2508.07629 (its number was not checked).
"""

from __future__ import annotations

import torch

from policylab.kernels.objectives.common import (
    DEFAULT_LOG_RATIO_CLAMP,
    check_eps,
    check_log_ratio_clamp,
    clip_regions,
    guard,
    summarize,
    token_inputs,
    unit_carrier,
)


def gppo(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GPPO loss per token -> `(loss [B, T], metrics)`; forward equal to `ppo_clip`.

    ℓ = −min(ρA, c(ρ)A) with the clipped branch c(ρ) = (1∓ε)·exp(d − sg(d)) on the clipped
    side (arXiv 2508.07629, GPPO objective; module doc).

    logp, logp_old: `[B, T]`; adv: `[B]` or `[B, T]`; mask: bool `[B, T]` (True = counts).
    eps_low in [0, 1), eps_high ≥ 0 (required; the paper's values are not confirmed here).
    Metrics: `gppo_metrics` (clip_frac always 0).
    """
    check_eps(eps_low, eps_high)
    check_log_ratio_clamp(log_ratio_clamp, logp.dtype)
    x = token_inputs(logp, logp_old, adv, mask)  # 0 at masked positions; lp_old, A detached
    d = x.lp - x.lp_old
    log_ratio, clamped = guard(d, log_ratio_clamp)
    ratio = torch.exp(log_ratio)  # ρ = exp(lp − lp_old)
    carrier = unit_carrier(d)  # value 1, gradient ∇lp (the unclamped d)
    reg = clip_regions(ratio, x.adv, mask, eps_low, eps_high)
    # c(ρ): the bound times the carrier where min() picks the clipped branch, ρ elsewhere
    clipped = torch.where(reg.high_pos, (1.0 + eps_high) * carrier,
                          torch.where(reg.low_neg, (1.0 - eps_low) * carrier, ratio))
    loss = -clipped * x.adv  # A = 0 at masked positions
    return loss.to(logp.dtype), gppo_metrics(ratio, reg, mask, clamped=clamped)


def gppo_metrics(ratio, reg, mask, *, clamped) -> dict[str, torch.Tensor]:
    """The `METRIC_KEYS` of GPPO: the four clip regions of ρ (high_pos and low_neg get the
    boundary gradient), no zeroed token, the ratio's min / mean / max."""
    return summarize(ratio, mask, reg, zeroed=None, clamped=clamped)
