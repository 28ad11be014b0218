"""MiniRL: engine correction × clipped staleness term, plus MoE routing-replay checks.

    w_t = sg(min(exp(lp_old,t - lp_mu,t), C))      C = engine_cap; None = no truncation
    ρ_t = exp(lp_t - lp_old,t)
    loss_t = -w_t · min(ρ_t A_t, clip(ρ_t, 1 - eps_low, 1 + eps_high) A_t)

On the first minibatch of a round lp = lp_old in value, ρ = 1, the clip is inactive and
the gradient is -w·A·∇lp: engine-corrected REINFORCE. Later minibatches are off-policy and
the clip bites.

Routing replay (MoE): the trainer forward reuses the expert indices recorded at rollout
(or at the old-policy training forward) instead of recomputing top-k routing.
`RoutingRecord` holds them ([B, T, layers, k] + the model id); `check_routing` is called
when replay is enabled and refuses replay without routes and routes given to a dense
model. That the forward actually reads the routes is the model adapter's job (not here).

Paper: C. Zheng, K. Dang, B. Yu et al. (Qwen Team), "Stabilizing Reinforcement Learning
with LLMs: Formulation and Practices", arXiv:2512.01374. Confirmed with the search tool:
title, id, the MiniRL baseline with an importance-sampling correction of the
training/inference discrepancy, PPO-style clipping against staleness, and Routing Replay
(replaying inference or training routes). Unconfirmed: normalization details and whether
the engine weight is truncated (so `engine_cap` is explicit, None = untruncated).
Detached: w, the clip bounds. Loss is 0 where `mask` is False.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from .._checks import check_finite, expand_adv
from ..errors import MissingQuantityError, ShapeError
from ._common import check_positive, check_roles, masked_fraction, masked_log_ratio, masked_mean, prefixed
from ._host import clip_active, clipped_surrogate
from .diagnostics import log_ratio_stats


@dataclass(frozen=True)
class RoutingRecord:
    """Expert indices chosen per token: [B, T, layers, k] integer, for model `model_id`,
    recorded at `recorded_at` ("rollout" = inference routes, "old_forward" = training)."""

    expert_indices: torch.Tensor
    model_id: str
    recorded_at: Literal["rollout", "old_forward"] = "rollout"

    def __post_init__(self):
        e = self.expert_indices
        if not isinstance(e, torch.Tensor) or e.dim() != 4:
            raise ShapeError(f"`expert_indices` must be [B, T, layers, k], got {getattr(e, 'shape', e)}")
        if e.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
            raise ShapeError(f"`expert_indices` must be integer, got {e.dtype}")
        if bool((e < 0).any()):
            raise ShapeError("`expert_indices` has negative expert ids")
        if self.recorded_at not in ("rollout", "old_forward"):
            raise ValueError(f"`recorded_at` must be 'rollout' or 'old_forward', got {self.recorded_at!r}")


def check_routing(
    record: RoutingRecord | None,
    *,
    model_is_moe: bool,
    n_layers: int,
    k: int,
    batch_shape: tuple[int, int] | None = None,
    model_id: str | None = None,
) -> None:
    """Refuse an inconsistent routing-replay request (call it whenever replay is enabled).

    MoE model without a record -> MissingQuantityError; dense model given a record ->
    ValueError; record not [B, T, n_layers, k] (B, T checked if `batch_shape` is given) ->
    ShapeError; record for another model (if `model_id` is given) -> ValueError.
    """
    if model_is_moe and record is None:
        raise MissingQuantityError(
            "minirl routing replay", "routing",
            "Record the expert indices [B, T, layers, k] in the rollout engine (or at the "
            "old-policy forward) and pass them as a RoutingRecord.")
    if not model_is_moe:
        if record is not None:
            raise ValueError("routing replay was given routes, but the model is dense (no experts)")
        return
    shape = tuple(record.expert_indices.shape)
    if shape[2:] != (int(n_layers), int(k)):
        raise ShapeError(f"routing record is {shape}, expected [B, T, {n_layers}, {k}] (layers, top-k)")
    if batch_shape is not None and shape[:2] != tuple(batch_shape):
        raise ShapeError(f"routing record covers {shape[:2]} but the batch is {tuple(batch_shape)}")
    if model_id is not None and record.model_id != model_id:
        raise ValueError(f"routing record is for model {record.model_id!r}, not {model_id!r}")


def minirl_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_behavior: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    engine_cap: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MiniRL per-token loss (see module doc).

    logp: [B, T] learner (differentiable); logp_old, logp_behavior, mask: [B, T];
    adv: [B] or [B, T]. eps_low, eps_high > 0 on ρ; engine_cap > 0 or None.
    Returns (loss [B, T], 0 where mask is False; metrics).
    """
    check_roles("minirl", mask, logp=logp, logp_old=logp_old, logp_behavior=logp_behavior)
    check_positive("eps_low", eps_low)
    check_positive("eps_high", eps_high)
    adv = expand_adv(adv, logp)
    check_finite(adv, "adv", mask)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    adv = torch.where(mask, adv, zero)
    k_raw = masked_log_ratio(logp_old.detach(), logp_behavior.detach(), mask)  # log engine ratio, uncapped
    log_k = k_raw
    if engine_cap is not None:
        log_k = torch.clamp(k_raw, max=math.log(check_positive("engine_cap", engine_cap)))
    w = torch.where(mask, torch.exp(log_k), zero).detach()
    rho = torch.exp(masked_log_ratio(logp, logp_old.detach(), mask))
    lo, hi = 1.0 - float(eps_low), 1.0 + float(eps_high)
    loss = torch.where(mask, w * clipped_surrogate(rho, adv, lo, hi), zero)
    capped = k_raw > math.log(engine_cap) if engine_cap is not None else torch.zeros_like(mask)
    metrics = {
        "clip_frac": masked_fraction(clip_active(rho.detach(), adv, lo, hi), mask, logp),
        "frac_engine_capped": masked_fraction(capped, mask, logp),
        "engine_weight_mean": masked_mean(w, mask, logp),
        **log_ratio_stats(k_raw, mask, logp_old),  # = mismatch_stats(logp_old, logp_behavior, mask)
    }
    return loss, prefixed("minirl", metrics)
