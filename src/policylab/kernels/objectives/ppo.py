"""PPO clipped surrogate (token level), with decoupled bounds and optional dual clip.

Paper: "Proximal Policy Optimization Algorithms", Schulman et al., arXiv 1707.06347,
Eq. (7) (L^CLIP). Decoupled bounds ε_low ≠ ε_high ("clip-higher"): "DAPO: An Open-Source
LLM Reinforcement Learning System at Scale", arXiv 2503.14476 (ε_low = 0.2, ε_high = 0.28).
Dual clip: "Mastering Complex Control in MOBA Games with Deep Reinforcement Learning",
arXiv 1912.09729 (its dual-clip objective; equation number not checked).

Per valid token, ρ = exp(lp − lp_old) (Eq. 6's r_t(θ)):

    ℓ = −min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A)                                   Eq. (7)
      = −A·min(ρ, 1+ε_high)   if A > 0
      = −A·max(ρ, 1−ε_low)    if A < 0
    dual clip (A < 0 only): ℓ = −max(min(ρA, clip(ρ)A), c·A)   (= −c·A when ρ > c)

Gradient (∂ℓ/∂lp): −ρA everywhere except the clipped regions (A > 0, ρ > 1+ε_high),
(A < 0, ρ < 1−ε_low) and, with a dual clip, (A < 0, ρ > c), where it is exactly 0. A ratio
exactly on a bound is treated as inside (full gradient ρA), deterministically.

Detached: `logp_old`, `adv` (and the clip bounds, constants). Differentiable: `logp` only.
Advantages `[B]` (broadcast over the sequence) or `[B, T]`. Deviations from the papers: the
log-ratio guard (`log_ratio_clamp`, see `objectives.common`) — PPO has none; it only
changes tokens with |lp − lp_old| > 20 and counts them in `log_ratio_clamped`. The dual
clip is applied with a strict ρ > c (on c the gradient stays −ρA, like every bound).

`ppo_clip(..., fast=False)` runs the equation as written below; `fast=True` (the default,
what the trainer runs) runs `objectives.fast.ppo_clip_fast`, equal in fp64 in value,
gradient and metrics (tests/kernels/objectives/test_objective_fast_paths.py).
"""

from __future__ import annotations

import torch

from policylab.kernels.objectives.common import (
    DEFAULT_LOG_RATIO_CLAMP,
    check_dual_clip,
    check_eps,
    check_log_ratio_clamp,
    clip_regions,
    guard,
    summarize,
    token_inputs,
)
from policylab.kernels.objectives.fast import ppo_clip_fast


def ppo_clip(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
    fast: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss per token -> `(loss [B, T], metrics)`.

    ℓ = −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A), ρ = exp(lp − lp_old) (arXiv 1707.06347,
    Eq. 7); with a dual clip c, ℓ = −c·A where A < 0 and ρ > c (arXiv 1912.09729).

    logp, logp_old: `[B, T]` learner / sampler-weights log-probs of the sampled tokens.
    adv: `[B]` or `[B, T]`. mask: bool `[B, T]`, True = counts; loss is exactly 0 elsewhere.
    eps_low in [0, 1), eps_high ≥ 0 (PPO: 0.2/0.2; DAPO clip-higher: 0.2/0.28).
    dual_clip: None or c > 1 (A < 0 tokens with ρ > c get loss −c·A and zero gradient).
    log_ratio_clamp: guard on |lp − lp_old| before the exp (hits counted in metrics).
    fast: the in-place / per-row variant (default) or the plain equation (False).
    Metrics: `ppo_clip_metrics` (clip_frac = low_neg + high_pos + dual_clip_frac).
    """
    check_eps(eps_low, eps_high)
    check_dual_clip(dual_clip)
    check_log_ratio_clamp(log_ratio_clamp, logp.dtype)
    if fast:
        return ppo_clip_fast(logp, logp_old, adv, mask, eps_low=eps_low, eps_high=eps_high,
                             dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp)
    x = token_inputs(logp, logp_old, adv, mask)  # 0 at masked positions; lp_old, A detached
    log_ratio, clamped = guard(x.lp - x.lp_old, log_ratio_clamp)
    ratio = torch.exp(log_ratio)  # ρ = exp(lp − lp_old), 1 at masked positions
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    surrogate = torch.minimum(ratio * x.adv, clipped * x.adv)  # Eq. (7)
    if dual_clip is not None:
        surrogate = torch.where(dual_region(ratio, x.adv, dual_clip), dual_clip * x.adv, surrogate)
    loss = -surrogate  # A = 0 at masked positions: exactly 0 there
    return loss.to(logp.dtype), ppo_clip_metrics(ratio, x.adv, mask, eps_low=eps_low, eps_high=eps_high,
                                                 dual_clip=dual_clip, clamped=clamped)


def dual_region(ratio: torch.Tensor, adv: torch.Tensor, dual_clip: float) -> torch.Tensor:
    """Detached bool [B, T]: A < 0 and ρ > c (strict), where the dual clip sets ℓ = −c·A."""
    return (adv < 0) & (ratio.detach() > dual_clip)


def ppo_clip_metrics(ratio, adv, mask, *, eps_low: float, eps_high: float, dual_clip: float | None,
                     clamped) -> dict[str, torch.Tensor]:
    """The `METRIC_KEYS` of a PPO clip over the valid tokens, from the ratio ρ [B, T]
    (1 at masked positions), the advantages [B, T] and the guard's hit count: the four
    clip regions, the zeroed tokens (A < 0 below 1−ε_low, A > 0 above 1+ε_high, and the
    dual-clip region) and the ratio's min / mean / max."""
    reg = clip_regions(ratio, adv, mask, eps_low, eps_high)
    zeroed = reg.low_neg | reg.high_pos
    dual = None
    if dual_clip is not None:
        dual = dual_region(ratio, adv, dual_clip) & mask
        zeroed = zeroed | dual
    return summarize(ratio, mask, reg, zeroed=zeroed, dual=dual, clamped=clamped, pad_value=1.0)
