"""MiniRL's routing-replay checks. (Its loss is a composition registered as method
`minirl`: the PPO clip on ρ = π_θ/π_old from `objectives.ppo_clip` times the engine weight
w = sg(min(π_old/μ, C)) from `corrections.tis`, C = `engine_cap`, None = untruncated.)

    w_t = sg(min(exp(lp_old,t - lp_mu,t), C))
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
with LLMs: Formulation and Practices", arXiv:2512.01374. Confirmed against the paper:
title, id, the MiniRL baseline with an importance-sampling correction of the
training/inference discrepancy, PPO-style clipping against staleness, and Routing Replay
(replaying inference or training routes). Unconfirmed: normalization details and whether
the engine weight is truncated (so `engine_cap` is explicit, None = untruncated).
Detached: w, the clip bounds. Loss is 0 where `mask` is False.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from policylab.errors import MissingQuantityError, ShapeError


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
