"""CISPO: clip the (detached) importance-sampling weight, never drop a token's gradient.

Paper: "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
MiniMax, arXiv 2506.13585, the CISPO objective and its clipped weight (Eqs. 4–5).

    ρ = exp(lp − lp_old),   w = sg(clip(ρ, 1−ε_low, 1+ε_high)),   ℓ = −w · A · lp

Gradient: ∂ℓ/∂lp = −w·A for every valid token — coefficient w, never zero unless A = 0.
There is no autograd path through ρ (w is detached). The paper normalizes by the total
token count of the group (`token_mean`).

Lower bound: the paper states it imposed no lower bound on the IS weight (ε_low set to a
large value) and tuned only ε_high (confirmed through secondary sources quoting the paper;
the ε_high value used is not confirmed here, so both bounds are required arguments).
`eps_low=None` is that setting: w = sg(min(ρ, 1+ε_high)); any eps_low ≥ 1 is equivalent.

Loss values are weighted log-probs (−w·A·lp), not surrogate values: they are not comparable
with PPO loss values and are not 0 at ρ = 1. Detached: `logp_old`, `adv`, `w`.
Deviations: the log-ratio guard (`log_ratio_clamp`) only affects w when ρ < e^-20 without a
lower bound (w = 2e-9 instead of smaller); the paper's unified token-mask variant (which
can recover PPO-style dropping) is not implemented.
"""

from __future__ import annotations

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
    summarize,
)


def cispo(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float | None,
    eps_high: float,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO loss per token -> `(loss [B, T], metrics)`.

    logp, logp_old: `[B, T]`; adv: `[B]` or `[B, T]`; mask: bool `[B, T]` (True = counts).
    eps_low: None (no lower bound — the paper's setting) or ≥ 0; eps_high ≥ 0 (required).
    Metrics: see `objectives._metrics`; clip_frac is always 0 (no token is zeroed), the
    region fractions show where the weight is capped.
    """
    check_eps(eps_low, eps_high, allow_no_low=True)
    check_log_ratio_clamp(log_ratio_clamp, logp.dtype)
    tb = prepare(logp, logp_old, adv, mask)
    log_ratio, clamped = guard(tb.log_ratio().detach(), log_ratio_clamp)  # w is detached: no graph
    ratio = log_ratio.exp_()  # exactly 1 at masked positions
    lower = None if eps_low is None else 1.0 - eps_low
    if tb.adv_row is not None:
        summary = ratio_summary(ratio, tb.mask, tb.mask_f, pad_value=1.0)
        counts = band_counts(ratio, tb.adv_row, lower, 1.0 + eps_high)
        zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
        # −w·A on the counted positions (0 elsewhere), built in place in the ratio's buffer
        coef = ratio.clamp_(min=lower, max=1.0 + eps_high).mul_((-tb.adv_row).unsqueeze(-1)).mul_(tb.mask_f)
        loss = (coef * tb.logp_for_product).to(logp.dtype)
        return loss, from_counts(counts, summary, zeroed=zero, dual=zero, clamped=clamped)
    weight = ratio.clamp(min=lower, max=1.0 + eps_high)
    loss = (-weight * tb.adv * tb.logp).to(logp.dtype)  # A and lp are 0 outside the mask, weight finite
    reg = clip_regions(ratio, tb.adv, tb.mask, eps_low, eps_high)
    metrics = summarize(ratio, tb.mask, reg, zeroed=None, clamped=clamped, mask_f=tb.mask_f, pad_value=1.0)
    return loss, metrics
