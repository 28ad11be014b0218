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

from policylab.kernels.objectives.common import (
    DEFAULT_LOG_RATIO_CLAMP,
    check_eps,
    check_log_ratio_clamp,
    band_counts,
    clip_regions,
    from_counts,
    guard,
    prepare,
    ratio_summary,
    row_flag_count,
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
    log_ratio, clamped = guard(tb.log_ratio(), log_ratio_clamp)
    ratio = log_ratio.exp_()  # in place on the fresh log-ratio; exactly 1 at masked positions
    lower, upper = 1.0 - eps_low, 1.0 + eps_high
    if tb.adv_row is not None:
        return _ppo_rows(ratio, tb, lower, upper, dual_clip, clamped, logp.dtype)
    reg = clip_regions(ratio, tb.adv, tb.mask, eps_low, eps_high)
    # the ratio each token's surrogate actually uses: a constant in the zeroing regions
    eff = torch.where(reg.high_pos, upper, torch.where(reg.low_neg, lower, ratio))
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


def _ppo_rows(ratio, tb, lower: float, upper: float, dual_clip, clamped, dtype):
    """`ppo_clip` for advantages given per sequence: the min/clip pair becomes a one-sided
    clamp per row (A > 0: min(ρ, 1+ε_high); A < 0: max(ρ, 1−ε_low), then min(·, c) with a
    dual clip). A clamp passes the gradient on its bound, so a ratio exactly on a bound is
    inside, as in the token path; region counts come from per-row sums (`band_counts`)."""
    a = tb.adv_row
    inf = torch.full((), math.inf, dtype=ratio.dtype, device=ratio.device)
    pos, neg = a > 0, a < 0
    hi = torch.where(pos, torch.full_like(inf, upper), inf)
    if dual_clip is not None:
        hi = torch.where(neg, torch.full_like(inf, float(dual_clip)), hi)
    lo = torch.where(neg, torch.full_like(inf, lower), -inf)
    # −eff·A, built in place in the clamp's output (the clamp's backward needs its input,
    # not its output); 0 at masked positions (eff is finite there)
    loss = ratio.clamp(lo.unsqueeze(-1), hi.unsqueeze(-1)).mul_((-a).unsqueeze(-1)).mul_(tb.mask_f)
    r = ratio.detach()
    counts = band_counts(r, a, lower, upper)
    dual = torch.zeros((), dtype=counts["low_pos"].dtype) if dual_clip is None else row_flag_count(r, dual_clip, a)
    summary = ratio_summary(r, tb.mask, tb.mask_f, pad_value=1.0)
    metrics = from_counts(counts, summary, zeroed=counts["low_neg"] + counts["high_pos"] + dual,
                          dual=dual, clamped=clamped)
    return loss.to(dtype), metrics
