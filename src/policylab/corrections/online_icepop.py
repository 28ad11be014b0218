"""Online IcePop: IcePop for a batch that gets exactly one update, without the PPO clip.

    k_t = exp(sg(lp_t) - lp_mu,t)                 the learner IS π_old in value (one update)
    loss_t = -sg(M(k_t)) · A_t · exp(lp_t - sg(lp_t))    M as in `icepop`, band inclusive

The unit carrier exp(lp - sg(lp)) has value 1 and gradient ∇lp, so the gradient of a
token is -M(k)·A·∇lp: IcePop's gradient at ρ = 1; an out-of-band token gets none.

The derivation only holds if the batch is fresh: sampled by the current weights and used
once. `BatchLedger` enforces that (METHODS.md §3.8): `consume(batch_id, policy_version,
current_version)` raises BatchReuseError on a second use of a batch_id (including a
re-delivered copy) and on a batch sampled by other weights. Call `check` before the
forward and `consume` after the optimizer step; save `state_dict()` in checkpoints.

Paper: title **unconfirmed** (an online variant of IcePop, see `icepop`: Ring-1T report,
arXiv:2510.18855). Band defaults unconfirmed, so `low`/`high` are required.
Detached: M(k). Loss is 0 where `mask` is False.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .._checks import check_finite, expand_adv
from ..errors import BatchReuseError
from ._common import check_band, check_roles, fraction, masked_log_ratio, prefixed
from .diagnostics import log_ratio_stats
from .icepop import band_weight


def _as_version(v, name: str) -> int:
    """An int version, or a [B] tensor of versions that must all be equal."""
    if isinstance(v, torch.Tensor):
        flat = v.reshape(-1)
        if flat.numel() == 0:
            raise BatchReuseError(f"`{name}` is empty")
        if bool((flat != flat[0]).any()):
            raise BatchReuseError(
                f"`{name}` mixes policy versions {sorted(set(flat.tolist()))}; an online "
                "update needs every sequence sampled by the current weights"
            )
        return int(flat[0])
    return int(v)


class BatchLedger:
    """Record of consumed single-use batches: batch_id -> policy version it was used at."""

    def __init__(self) -> None:
        self._consumed: dict[str, int] = {}

    def __contains__(self, batch_id: str) -> bool:
        return batch_id in self._consumed

    def __len__(self) -> int:
        return len(self._consumed)

    def check(self, batch_id: str, policy_version, current_version) -> None:
        """Raise BatchReuseError unless `batch_id` is unused and was sampled by the current
        weights. `policy_version` is an int or the batch's [B] version tensor."""
        if batch_id in self._consumed:
            raise BatchReuseError(
                f"batch_id {batch_id!r} was already used for an update (at policy version "
                f"{self._consumed[batch_id]}); an online method uses a batch exactly once"
            )
        v_batch = _as_version(policy_version, "policy_version")
        v_now = _as_version(current_version, "current_version")
        if v_batch != v_now:
            raise BatchReuseError(
                f"batch_id {batch_id!r} was sampled at policy version {v_batch} but the "
                f"current weights are version {v_now}; an online update needs fresh samples"
            )

    def consume(self, batch_id: str, policy_version, current_version) -> None:
        """`check`, then mark the batch consumed (call once, after the optimizer step)."""
        self.check(batch_id, policy_version, current_version)
        self._consumed[batch_id] = _as_version(current_version, "current_version")

    def state_dict(self) -> dict:
        return {"consumed": dict(self._consumed)}

    def load_state_dict(self, state: Mapping) -> None:
        consumed = state.get("consumed")
        if not isinstance(consumed, Mapping):
            raise ValueError("BatchLedger state must have a `consumed` mapping")
        self._consumed = {str(k): int(v) for k, v in consumed.items()}


def online_icepop(
    logp: torch.Tensor,
    logp_behavior: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float,
    high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Online IcePop per-token loss (no PPO clip; see module doc).

    logp: [B, T] learner log-probs (differentiable) at the version that sampled the batch;
    logp_behavior, mask: [B, T]; adv: [B] (broadcast) or [B, T]; 0 <= low < high.
    Returns (loss [B, T], 0 where mask is False; metrics). Single use is the caller's job
    via `BatchLedger`.
    """
    check_roles("online_icepop", mask, logp=logp, logp_behavior=logp_behavior)
    low, high = check_band(low, high)
    adv = expand_adv(adv, logp)
    check_finite(adv, "adv", mask)
    log_k = masked_log_ratio(logp.detach(), logp_behavior.detach(), mask)
    n = int(torch.count_nonzero(mask))
    stats = log_ratio_stats(log_k, mask, logp)  # = mismatch_stats(logp, logp_behavior, mask)
    w, n_high, n_low = band_weight(log_k, mask, low, high, scratch=log_k)  # log k is not needed after
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    lp = torch.where(mask, logp, zero)
    carrier = torch.exp(lp - lp.detach())
    loss = torch.where(mask, -w * torch.where(mask, adv, zero) * carrier, zero)
    metrics = {
        "frac_masked": fraction(n_high + n_low, n, w),
        **stats,
    }
    return loss, prefixed("online_icepop", metrics)
