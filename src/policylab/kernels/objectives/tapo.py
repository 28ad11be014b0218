"""TAPO: per-token weight from the prefix geometric-mean ratio, with a position-dependent
trust interval.

    u_t = lp_t − lp_old,t                              (0 at positions that do not count)
    n_t = Σ_{j<=t} m_j                                 valid positions up to t
    G_t = exp((1/n_t)·Σ_{j<=t} m_j u_j)                prefix geometric ratio, detached
    w_t = sg(G_t) · exp(lp_t − sg(lp_t))               value G_t, gradient G_t·∇lp_t only
    loss_t = −min(w_t A_t, clip(w_t, 1 − ε(t), 1 + ε(t)) A_t)

u = [0.2, −0.1, 0.4] gives G = [e^0.2, e^0.05, e^(0.5/3)] = [1.2214, 1.0513, 1.1814]
(not the product e^0.5 = 1.6487). ∂loss_t/∂lp_j = 0 for j ≠ t; unclipped,
∂loss_t/∂lp_t = −G_t·A_t (not −G_t·A_t/n_t).

Paper: "Trajectory-Aware Policy Optimization: Closing the State Distribution Gap in
Long-Horizon LLM RL" — title **unconfirmed**; no arXiv id. **Unconfirmed**: whether position t itself is in its prefix (`include_current`,
default True; with False, G_t uses j < t and G = 1 before the first counted token), and
the ε(t) schedule (`eps_schedule`, required: a function from the position tensor [B, T]
to ε [B, T] (or broadcastable), ε >= 0; it should tighten with t).
Detached: G, ε, the advantages. Loss is 0 where `mask` is False. The clip decision is
made on G (the value of w); a value exactly on a bound is inside.
Deviation: the shared log-ratio guard (`log_ratio_clamp`, default 20) on the prefix mean
log-ratio before the exp; hits are counted in `log_ratio_clamped`.
No equation number: the paper could not be checked.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from policylab.errors import ShapeError
from policylab.kernels.checks import check_finite, masked
from policylab.kernels.corrections.common import check_roles, masked_log_ratio
from policylab.kernels.objectives.common import (
    DEFAULT_LOG_RATIO_CLAMP,
    check_log_ratio_clamp,
    summarize,
    token_inputs,
)
from policylab.kernels.objectives.ripo import bound_regions


def prefix_geometric_ratio(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    mask: torch.Tensor,
    *,
    include_current: bool = True,
    log_ratio_clamp: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(G [B, T] detached, guard hits [B, T] bool); G = 1 where the prefix is empty.

    With `log_ratio_clamp`, the prefix mean log-ratio is clamped to ±clamp before the exp
    (hits reported); None = no guard."""
    u = masked_log_ratio(logp.detach(), logp_old.detach(), mask).to(torch.float64)
    s = torch.cumsum(u, dim=-1)
    n = torch.cumsum(mask.to(torch.float64), dim=-1)
    if not include_current:
        s, n = s - u, n - mask.to(torch.float64)
    mean = s / n.clamp_min(1)
    hit = torch.zeros_like(mask)
    if log_ratio_clamp is not None:
        hit = (mean.abs() > log_ratio_clamp) & mask
        mean = mean.clamp(-log_ratio_clamp, log_ratio_clamp)
    return torch.exp(mean).to(logp.dtype), hit


def tapo(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_schedule: Callable[[torch.Tensor], torch.Tensor],
    positions: torch.Tensor | None = None,
    include_current: bool = True,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TAPO per-token loss (see module doc).

    logp: [B, T] learner (differentiable); logp_old, mask: [B, T]; adv [B] or [B, T].
    eps_schedule: positions -> ε (**unconfirmed** schedule); positions: [B, T] position
    index passed to it (default: the 0-based response column t). log_ratio_clamp: guard on
    the prefix mean log-ratio. Returns (loss [B, T], 0 where mask is False; metrics: the
    shared `METRIC_KEYS` with ratio = G and regions against [1 − ε(t), 1 + ε(t)], plus
    `tapo/eps_mean`).
    """
    check_roles("tapo", mask, logp=logp, logp_old=logp_old)
    check_log_ratio_clamp(log_ratio_clamp, logp.dtype)
    x = token_inputs(logp, logp_old, adv, mask)  # 0 at masked positions; lp_old, A detached
    eps = _eps(eps_schedule, positions, mask, logp)
    G, hit = prefix_geometric_ratio(x.lp, x.lp_old, mask, include_current=include_current,
                                    log_ratio_clamp=log_ratio_clamp)
    w = G * torch.exp(x.lp - x.lp.detach())  # value G_t, gradient G_t·∇lp_t
    lo, hi = 1 - eps, 1 + eps
    surrogate = torch.minimum(w * x.adv, torch.clamp(w, lo, hi) * x.adv)
    loss = masked(-surrogate, mask)  # −min(w A, clip(w, 1 − ε(t), 1 + ε(t)) A)
    return loss, tapo_metrics(G, bound_regions(G, x.adv, mask, lo, hi), mask, eps, clamped=hit)


def tapo_metrics(G, reg, mask, eps, *, clamped) -> dict[str, torch.Tensor]:
    """The `METRIC_KEYS` with ratio = G and regions against [1 − ε(t), 1 + ε(t)] (zeroed =
    low_neg + high_pos), plus `tapo/eps_mean` over the valid tokens."""
    metrics = summarize(G, mask, reg, zeroed=reg.low_neg | reg.high_pos, clamped=clamped)
    metrics["tapo/eps_mean"] = eps[mask].mean().detach()
    return metrics


def _eps(eps_schedule, positions, mask, logp) -> torch.Tensor:
    """ε [B, T] from the schedule, checked: finite and >= 0 at counted positions."""
    B, T = mask.shape
    if positions is None:
        positions = torch.arange(T, device=mask.device).expand(B, T)
    elif positions.shape != mask.shape:
        raise ShapeError(f"`positions` must be [B, T] = {(B, T)}, got {tuple(positions.shape)}")
    eps = torch.as_tensor(eps_schedule(positions), dtype=logp.dtype, device=logp.device)
    try:
        eps = torch.broadcast_to(eps, (B, T))
    except RuntimeError as err:
        raise ShapeError(
            f"`eps_schedule` returned shape {tuple(eps.shape)}, not broadcastable to {(B, T)}"
        ) from err
    check_finite(eps, "eps_schedule(positions)", mask)
    if bool((eps[mask] < 0).any()):
        raise ValueError("`eps_schedule` returned a negative ε at a counted position")
    one = torch.ones((), dtype=logp.dtype, device=logp.device)
    return torch.where(mask, eps.detach(), one)
