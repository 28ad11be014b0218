"""Online IcePop's single-use ledger.

Online IcePop is a composition (method `online_icepop`): the policy gradient at ratio 1
(`objectives.reinforce` with the unit carrier) times IcePop's band weight on the learner
itself (`corrections.icepop` with sg(lp) in the numerator):

    k_t = exp(sg(lp_t) - lp_mu,t)                 the learner IS π_old in value (one update)
    loss_t = -sg(M(k_t)) · A_t · exp(lp_t - sg(lp_t))    M as in `icepop`, band inclusive

The unit carrier exp(lp - sg(lp)) has value 1 and gradient ∇lp, so the gradient of a
token is -M(k)·A·∇lp: IcePop's gradient at ρ = 1; an out-of-band token gets none.

The derivation only holds if the batch is fresh: sampled by the current weights and used
once. `BatchLedger` enforces that (single-use batches: a batch that assumed fresh data
is refused a second use, and a batch from another policy version):
`consume(batch_id, policy_version, current_version)` raises BatchReuseError on a second
use of a batch_id (including a re-delivered copy) and on a batch sampled by other weights.
The method's round stage calls `consume` once per round; save `state_dict()` in checkpoints.

Paper: title **unconfirmed** (an online variant of IcePop, see `icepop`: Ring-1T report,
arXiv:2510.18855).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from policylab.errors import BatchReuseError


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
