"""Diagnostics every method logs, whatever its stages: the rollout's rewards, lengths and
group statistics, the roles' agreement (KL to the reference, engine mismatch), and the
one rule by which metrics of several micro-batches or optimizer steps are combined.
"""

from __future__ import annotations

import math

from policylab.batch import RolloutBatch
from policylab.kernels import kl
from policylab.kernels.advantages import group_stats
from policylab.kernels.checks import masked_mean

# metrics that count something: combined by summing (a count over micro-batches or steps)
COUNT_SUFFIXES = ("_count", "/n", "/n_tokens", "log_ratio_clamped")


def is_count(key: str) -> bool:
    return key.startswith("skipped") or key == "tokens" or key.endswith(COUNT_SUFFIXES)


class MetricReducer:
    """Combines metric dicts (of micro-batches, or of the optimizer steps of one rollout
    step): keys ending in /min or /max by min or max; counts (`is_count`: skipped_*,
    tokens, *_count, */n, */n_tokens, *log_ratio_clamped) by sum; everything else by a
    weighted mean (weight: the micro-batch's counted tokens, or 1 per optimizer step). A
    key missing from some dicts is combined over the dicts that have it."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.n = 0

    def add(self, metrics: dict, weight: float = 1.0) -> None:
        self.n += 1
        for k, v in metrics.items():
            v = float(v)
            if k.endswith("/min"):
                self.sums[k] = min(self.sums.get(k, math.inf), v)
            elif k.endswith("/max"):
                self.sums[k] = max(self.sums.get(k, -math.inf), v)
            elif is_count(k):
                self.sums[k] = self.sums.get(k, 0.0) + v
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v * weight
                self.weights[k] = self.weights.get(k, 0.0) + weight

    def result(self) -> dict[str, float]:
        return {k: (v / self.weights[k] if self.weights.get(k) else v) for k, v in self.sums.items()}


def reduce_steps(rows: list[dict]) -> dict[str, float]:
    """The metrics of one rollout step's optimizer steps (each weighs 1), plus their number."""
    r = MetricReducer()
    for row in rows:
        r.add(row)
    return {**r.result(), "optimizer_steps": len(rows)}


def rollout_metrics(batch: RolloutBatch, t_gen: float) -> dict[str, float]:
    """Rewards, lengths, throughput and group statistics of a sampled batch."""
    lengths = batch.response_lengths.float()
    m = {
        "reward/mean": float(batch.rewards.mean()),
        "reward/std": float(batch.rewards.std(unbiased=False)),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "rollout/sequences": batch.size,
        "rollout/tokens_per_s": float(lengths.sum()) / max(t_gen, 1e-9),
        "rollout/completions_per_s": batch.size / max(t_gen, 1e-9),
    }
    if "gold_correct" in batch.extras:
        m["accuracy"] = float(batch.extras["gold_correct"].float().mean())
    if "truncated" in batch.extras:
        m["response/truncated_frac"] = float(batch.extras["truncated"].float().mean())
    for k, v in group_stats(batch.outcome["correct"].float(), batch.group).items():
        m[f"groups/{k}"] = float(v)
    return m


def role_diagnostics(batch: RolloutBatch) -> dict[str, float]:
    """KL to the reference (k3 on the sampling policy's tokens) and the engine mismatch
    |logp_old − logp_behavior| on the trained batch, for whichever roles it holds."""
    out = {}
    if batch.logp_ref is not None:
        sampler = batch.logp_old if batch.logp_old is not None else batch.logp_behavior
        out["kl/ref_k3"] = float(masked_mean(kl.k3(sampler, batch.logp_ref, mask=batch.loss_mask), batch.loss_mask))
    if batch.logp_old is not None and batch.logp_behavior is not None:
        dd = (batch.logp_old - batch.logp_behavior)[batch.loss_mask]
        out["mismatch/old_vs_behavior_abs_dlogp_mean"] = float(dd.abs().mean()) if dd.numel() else 0.0
        out["mismatch/old_vs_behavior_abs_dlogp_max"] = float(dd.abs().max()) if dd.numel() else 0.0
    return out


__all__ = ["COUNT_SUFFIXES", "MetricReducer", "is_count", "reduce_steps", "role_diagnostics", "rollout_metrics"]
