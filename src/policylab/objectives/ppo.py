"""PPO clipped surrogate (token level), with decoupled bounds and optional dual clip.

Paper: "Proximal Policy Optimization Algorithms", Schulman et al., arXiv 1707.06347,
Eq. (7) (L^CLIP). Decoupled bounds ε_low ≠ ε_high ("clip-higher"): "DAPO: An Open-Source
LLM Reinforcement Learning System at Scale", arXiv 2503.14476 (ε_low = 0.2, ε_high = 0.28).
Dual clip: "Mastering Complex Control in MOBA Games with Deep Reinforcement Learning",
arXiv 1912.09729.

Per valid token, ρ = exp(lp − lp_old):

    ℓ = −min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A)
      = −A·min(ρ, 1+ε_high)   if A > 0
      = −A·max(ρ, 1−ε_low)    if A < 0
    dual clip (A < 0 only): ℓ = −max(min(ρA, clip(ρ)A), c·A)   (= −c·A when ρ > c)

Gradient (∂ℓ/∂lp): −ρA everywhere except the clipped regions (A > 0, ρ > 1+ε_high),
(A < 0, ρ < 1−ε_low) and, with a dual clip, (A < 0, ρ > c), where it is exactly 0. A ratio
exactly on a bound is treated as inside (full gradient ρA), deterministically.

Detached: `logp_old`, `adv`. Differentiable: `logp` only. Advantages `[B]` (broadcast over
the sequence) or `[B, T]`. Deviation from the papers: the log-ratio guard
(`log_ratio_clamp`, see `_metrics`) — PPO has none; it only changes tokens with
|lp − lp_old| > 20 and counts them in `log_ratio_clamped`.
"""

from __future__ import annotations

import math

import torch

from ._metrics import (
    DEFAULT_LOG_RATIO_CLAMP,
    check_eps,
    check_log_ratio_clamp,
    clip_regions,
    guarded_log_ratio,
    prepare,
    summarize,
)


def _check_dual_clip(dual_clip) -> None:
    if dual_clip is None:
        return
    if isinstance(dual_clip, bool) or not isinstance(dual_clip, (int, float)) \
            or not math.isfinite(dual_clip) or dual_clip <= 1:
        raise ValueError(f"`dual_clip` must be None or a finite number > 1, got {dual_clip!r}")


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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss per token -> `(loss [B, T], metrics)`.

    logp, logp_old: `[B, T]` learner / sampler-weights log-probs of the sampled tokens.
    adv: `[B]` or `[B, T]`. mask: bool `[B, T]`, True = counts; loss is exactly 0 elsewhere.
    eps_low in [0, 1), eps_high ≥ 0 (PPO: 0.2/0.2; DAPO clip-higher: 0.2/0.28).
    dual_clip: None or c > 1 (A < 0 tokens with ρ > c get loss −c·A and zero gradient).
    log_ratio_clamp: guard on |lp − lp_old| before the exp (hits counted in metrics).
    Metrics: see `objectives._metrics` (clip_frac = low_neg + high_pos + dual_clip_frac).
    """
    check_eps(eps_low, eps_high)
    _check_dual_clip(dual_clip)
    check_log_ratio_clamp(log_ratio_clamp, logp.dtype)
    tb = prepare(logp, logp_old, adv, mask)
    log_ratio, clamped = guarded_log_ratio(tb.logp, tb.logp_old, tb.mask, log_ratio_clamp)
    ratio = log_ratio.exp()
    reg = clip_regions(ratio, tb.adv, tb.mask, eps_low, eps_high)
    # the ratio each token's surrogate actually uses: a constant in the zeroing regions
    eff = torch.where(reg.high_pos, 1.0 + eps_high, torch.where(reg.low_neg, 1.0 - eps_low, ratio))
    dual = None
    if dual_clip is not None:
        dual = (tb.adv < 0) & tb.mask & (ratio.detach() > dual_clip)
        eff = torch.where(dual, float(dual_clip), eff)
    loss = (-eff * tb.adv).to(logp.dtype)  # A is 0 outside the mask and eff finite: 0 there
    zeroed = reg.low_neg | reg.high_pos
    if dual is not None:
        zeroed = zeroed | dual
    metrics = summarize(ratio, tb.mask, reg, zeroed=zeroed, dual=dual, clamped=clamped, mask_f=tb.mask_f, pad_value=1.0)
    return loss, metrics
