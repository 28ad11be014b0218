"""CISPO: clip the (detached) importance-sampling weight, never drop a token's gradient.

Paper: "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
MiniMax, arXiv 2506.13585, the CISPO objective and its clipped weight (Eqs. 4–5).

    ρ = exp(lp − lp_old),   w = sg(clip(ρ, 1−ε_low, 1+ε_high)),   ℓ = −w · A · lp   (Eqs. 4–5)

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

`cispo(..., fast=False)` runs the equation as written below; `fast=True` (the default, what
the trainer runs) runs `objectives.fast.cispo_fast`, equal in fp64 in value, gradient and
metrics (tests/kernels/objectives/test_objective_fast_paths.py).
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
)
from policylab.kernels.objectives.fast import cispo_fast


def cispo(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float | None,
    eps_high: float,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
    fast: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO loss per token, ℓ = −sg(clip(ρ, 1−ε_low, 1+ε_high))·A·lp -> `(loss [B, T], metrics)`.

    logp, logp_old: `[B, T]`; adv: `[B]` or `[B, T]`; mask: bool `[B, T]` (True = counts).
    eps_low: None (no lower bound — the paper's setting) or ≥ 0; eps_high ≥ 0 (required).
    fast: the in-place / per-row variant (default) or the plain equation (False).
    Metrics: `cispo_metrics`; clip_frac is always 0 (no token is zeroed), the region
    fractions show where the weight is capped.
    """
    check_eps(eps_low, eps_high, allow_no_low=True)
    check_log_ratio_clamp(log_ratio_clamp, logp.dtype)
    if fast:
        return cispo_fast(logp, logp_old, adv, mask, eps_low=eps_low, eps_high=eps_high,
                          log_ratio_clamp=log_ratio_clamp)
    x = token_inputs(logp, logp_old, adv, mask)  # 0 at masked positions; lp_old, A detached
    log_ratio, clamped = guard((x.lp - x.lp_old).detach(), log_ratio_clamp)  # w is detached
    ratio = torch.exp(log_ratio)  # ρ, 1 at masked positions
    lower = None if eps_low is None else 1.0 - eps_low
    weight = torch.clamp(ratio, min=lower, max=1.0 + eps_high)  # w = sg(clip(ρ)), Eq. (5)
    loss = -weight * x.adv * x.lp  # Eq. (4); A and lp are 0 at masked positions
    return loss.to(logp.dtype), cispo_metrics(ratio, x.adv, mask, eps_low=eps_low, eps_high=eps_high, clamped=clamped)


def cispo_metrics(ratio, adv, mask, *, eps_low: float | None, eps_high: float, clamped) -> dict[str, torch.Tensor]:
    """The `METRIC_KEYS` of CISPO from the detached ratio ρ [B, T] (1 at masked positions):
    the regions where the weight is capped, no zeroed token, the ratio's min / mean / max."""
    reg = clip_regions(ratio, adv, mask, eps_low, eps_high)
    return summarize(ratio, mask, reg, zeroed=None, clamped=clamped, pad_value=1.0)
