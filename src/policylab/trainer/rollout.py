"""Collecting one training batch: the method's source -> its reward stages -> its filters,
refilled until enough groups pass.

The source records the behavior log-prob of every sampled token. Reward stages score the
decoded text; the raw outcome (correctness) is kept apart from the shaped reward, and
filters decide on what they declare to read (dynamic sampling: the raw outcome only).
Filtered groups are replaced by sampling more prompts, never by padding with
zero-advantage data.
"""

from __future__ import annotations

import torch

from policylab.batch import RolloutBatch, SamplingSettings, concat_batches
from policylab.errors import PolicylabError
from policylab.methods.context import Sampled, StageContext
from policylab.methods.spec import Method, Stage


def apply_changes(batch: RolloutBatch, changes: dict, stage: Stage) -> RolloutBatch:
    """`batch` with a stage's changes: `outcome` and `extras` dicts are merged into the
    batch's; any field (or outcome/extras key) the stage did not declare in `writes` is
    refused, so a stage cannot change what it does not say it changes."""
    if not changes:
        return batch
    declared = set(stage.writes)
    fields = {}
    for key, value in changes.items():
        if key in ("outcome", "extras"):
            undeclared = [f"{key}.{k}" for k in value if f"{key}.{k}" not in declared]
            if undeclared:
                raise PolicylabError(f"stage `{stage.name}` writes {undeclared} without declaring them")
            fields[key] = {**getattr(batch, key), **value}
        else:
            if key not in declared:
                raise PolicylabError(f"stage `{stage.name}` writes `{key}` without declaring it")
            fields[key] = value
    return batch.replace(**fields).validate()


def _score_sampled(method: Method, s: Sampled, ctx: StageContext, info: dict) -> Sampled:
    for stage in method.active("reward"):
        changes, sinfo = stage.fn(s, ctx.for_stage(method, stage))
        s.batch = apply_changes(s.batch, changes, stage)
        info.update(sinfo)
    return s


def _keep(method: Method, batch: RolloutBatch, ctx: StageContext) -> torch.Tensor:
    keep = torch.ones(batch.size, dtype=torch.bool)
    for stage in method.active("filter"):
        k, _ = stage.fn(batch, ctx.for_stage(method, stage))
        keep = keep & k
    return keep


def collect(method: Method, ctx: StageContext, *, prompts_per_step: int, max_refill_rounds: int,
            tag: str) -> tuple[RolloutBatch | None, dict]:
    """Sample until the batch has `prompts_per_step` groups that pass the filters (or the
    refill budget is spent: then a smaller batch trains and that is logged)."""
    need, parts, info, rounds, sampled = prompts_per_step, [], {}, 0, 0
    n_seen_groups = n_kept_groups = 0
    while need > 0 and rounds <= max_refill_rounds:
        round_ctx = StageContext(**{**ctx.__dict__, "batch_tag": f"{tag}-r{rounds}"})
        s = method.source.fn(need, round_ctx.for_stage(method, method.source))
        sampled += s.batch.size
        s = _score_sampled(method, s, round_ctx, info)
        b = s.batch
        keep = _keep(method, b, round_ctx)
        n_seen_groups += int(torch.unique(b.group).numel())
        kept = b.select(keep)
        kept_groups = torch.unique(kept.group)
        n_kept_groups += int(kept_groups.numel())
        if kept_groups.numel() > need:  # more than needed: keep whole groups, in order
            kept = kept.select(torch.isin(kept.group, kept_groups[:need]))
            info["filter/surplus_groups_dropped"] = info.get("filter/surplus_groups_dropped", 0) + int(kept_groups.numel() - need)
        if kept.size:
            parts.append(kept)
        need -= min(need, int(kept_groups.numel()))
        rounds += 1
    info["filter/filtered_fraction"] = 1.0 - n_kept_groups / max(n_seen_groups, 1)
    info["filter/refill_rounds"] = rounds - 1
    info["filter/missing_groups"] = need  # > 0: the refill budget ran out, a smaller batch trains
    info["rollout/sampled_sequences"] = sampled
    if not parts:
        return None, info
    return concat_batches(parts, tag), info


def sampling_from(cfg) -> SamplingSettings:
    return SamplingSettings(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
