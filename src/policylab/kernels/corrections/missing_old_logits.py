"""Decoupled engine / staleness correction, with the exact old log-probs required.

The total ratio of a token splits into two factors that must be corrected separately:

    exp(lp - lp_mu) = d · s
    d = exp(lp_old - lp_mu)   engine discrepancy: same version v_b, different engine
    s = exp(lp - lp_old)      staleness: same (training) engine, version v_b -> v_now

    loss_t = sg(W(d_t)) · ( -min(s_t A_t, clip(s_t, 1 - eps_low, 1 + eps_high) A_t) )

W is an engine correction (`tis`, `icepop` or `kpop`) acting on d only; the PPO clip acts
on s only; their thresholds never share a parameter. The loss is the composition
registered as method `missing_old_logits` (the host `objectives.ppo_clip` on s, the chosen
correction's weight on d); this module holds the decomposition and the provenance check.

`lp_old` must be the TRAINING engine at EXACTLY the behavior version v_b: asynchronous
pipelines lose it. `require_exact_old` refuses a missing one (never zero-filled), an
approximation (an EWMA proximal policy, kind "approx_ewma"), and a version tag that
differs from the behavior's; nothing substitutes `logp` or `logp_behavior` for it.
Exact recovery routes (outside this kernel): keep the v_b weights until all of its
samples are consumed and recompute; serve an old-logit model next to the trainer; or
interrupt partial rollouts at weight updates.

Paper: "Missing Old Logits in Asynchronous Agentic RL: Semantic Mismatch and Repair
Methods for Off-Policy Correction" (title **unconfirmed**; no arXiv id). Detached: the engine weight and everything computed from
lp_old / lp_mu; only `logp` carries gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from policylab.batch import HOW_TO_PRODUCE
from policylab.errors import MissingQuantityError
from policylab.kernels.corrections.common import check_roles, masked_log_ratio

_METHOD = "missing_old_logits"


@dataclass(frozen=True)
class VersionedLogprobs:
    """Log-probs [B, T] with their provenance: the weights version and the engine that
    produced them, and whether they are exact or an approximation."""

    tensor: torch.Tensor
    policy_version: int
    engine: str
    kind: Literal["exact", "approx_ewma"] = "exact"

    def __post_init__(self):
        if self.kind not in ("exact", "approx_ewma"):
            raise ValueError(f"`kind` must be 'exact' or 'approx_ewma', got {self.kind!r}")
        if not isinstance(self.tensor, torch.Tensor):
            raise TypeError(f"`tensor` must be a torch.Tensor, got {type(self.tensor).__name__}")


def decompose(
    logp: torch.Tensor, logp_old: torch.Tensor, logp_behavior: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Log-ratio decomposition, all [B, T], 0 where mask is False:
    engine_log_ratio = lp_old - lp_mu (detached), staleness_log_ratio = lp - lp_old and
    total_log_ratio = lp - lp_mu (both carry the gradient of `logp`)."""
    check_roles(_METHOD, mask, logp=logp, logp_old=logp_old, logp_behavior=logp_behavior)
    return {
        "engine_log_ratio": masked_log_ratio(logp_old.detach(), logp_behavior.detach(), mask),
        "staleness_log_ratio": masked_log_ratio(logp, logp_old.detach(), mask),
        "total_log_ratio": masked_log_ratio(logp, logp_behavior.detach(), mask),
    }


def require_exact_old(
    old: VersionedLogprobs | None, behavior: VersionedLogprobs | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp_old, logp_behavior) tensors, or MissingQuantityError naming the role when
    `old` is None, an approximation, or from another version than `behavior`."""
    if behavior is None:
        raise MissingQuantityError(_METHOD, "logp_behavior", HOW_TO_PRODUCE["logp_behavior"])
    if old is None:
        raise MissingQuantityError(_METHOD, "logp_old", HOW_TO_PRODUCE["logp_old"])
    if behavior.kind != "exact":
        raise MissingQuantityError(
            _METHOD, "logp_behavior",
            f"Got kind {behavior.kind!r}; behavior log-probs must be the exact ones the "
            "rollout engine recorded.")
    if old.kind != "exact":
        raise MissingQuantityError(
            _METHOD, "logp_old",
            f"Got an approximation (kind {old.kind!r}), which is never accepted as exact "
            "old log-probs. " + HOW_TO_PRODUCE["logp_old"])
    if old.policy_version != behavior.policy_version:
        raise MissingQuantityError(
            _METHOD, "logp_old",
            f"`logp_old` is tagged version {old.policy_version} but `logp_behavior` was "
            f"sampled at version {behavior.policy_version}; the old log-probs must come from "
            "the training engine at exactly the behavior version (snapshot, old-logit "
            "server or interrupted rollouts).")
    return old.tensor, behavior.tensor
