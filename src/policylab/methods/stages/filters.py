"""Group filters: which sampled groups go on to the update. Dropped groups are replaced
by sampling more prompts (the trainer's refill loop), never padded with zero advantages."""

from __future__ import annotations

from policylab.batch import RolloutBatch
from policylab.kernels.filters import dynamic_sampling_keep
from policylab.methods.context import StageContext
from policylab.methods.spec import Stage


def dynamic_sampling(batch: RolloutBatch, ctx: StageContext):
    """DAPO: keep a group iff its raw outcome is not constant (0 < #correct < G)."""
    batch.require("dynamic sampling", "outcome.correct")
    keep, info = dynamic_sampling_keep(batch.outcome["correct"], batch.group)
    return keep, {f"filter/{k}": v for k, v in info.items()}


def eligible(batch: RolloutBatch, ctx: StageContext):
    """Keep only the groups whose self-generated label exists (`outcome["eligible"]`)."""
    batch.require("eligibility filter", "outcome.eligible")
    return batch.outcome["eligible"].bool(), {}


DYNAMIC_SAMPLING = Stage("filter", dynamic_sampling, kernels=(dynamic_sampling_keep,), reads=("outcome.correct",))
ELIGIBLE = Stage("filter", eligible, reads=("outcome.eligible",))
