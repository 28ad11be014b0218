"""Round stages that read provenance: metrics split by source (and by task domain).

Borrowed, injected or guided data is counted separately in every metric
(docs/conventions.md rule 9): a method whose batches mix sources lists `SOURCE_METRICS`
among its round stages, and the run log then carries, per source kind present in the
trained batch,

    rollout/sequences@source=K      rows of that kind
    reward/mean@source=K            their mean shaped reward
    accuracy@source=K               their mean raw verifier outcome
    response/length_mean@source=K   their mean counted length

(`runlog.write_plots` draws every `reward/mean@source=*` and `accuracy@source=*` in
`plots/by_source.png`). `DOMAIN_METRICS` does the same per task domain
(`plots/by_domain.png`).
"""

from __future__ import annotations

import torch

from policylab.batch import RolloutBatch, source_kind
from policylab.methods.context import StageContext
from policylab.methods.spec import Stage


def split_metrics(batch: RolloutBatch, labels: list[str], tag: str) -> dict[str, float]:
    """The per-label metrics of `batch` (labels [B], one per row) under `@<tag>=<label>`."""
    out: dict[str, float] = {}
    lengths = batch.response_lengths.float()
    correct = batch.outcome.get("correct")
    for label in dict.fromkeys(labels):
        rows = torch.tensor([x == label for x in labels], dtype=torch.bool, device=lengths.device)
        n = int(rows.sum())
        out[f"rollout/sequences@{tag}={label}"] = float(n)
        out[f"response/length_mean@{tag}={label}"] = float(lengths[rows].mean())
        if batch.rewards is not None:
            out[f"reward/mean@{tag}={label}"] = float(batch.rewards[rows].float().mean())
        if correct is not None:
            out[f"accuracy@{tag}={label}"] = float(correct[rows].float().mean())
    return out


def source_metrics(batch: RolloutBatch, ctx: StageContext):
    """Metrics of the round's batch split by source kind (native, gold, peer, ...)."""
    return {}, split_metrics(batch, [source_kind(s) for s in batch.sources], "source")


SOURCE_METRICS = Stage("round", source_metrics, reads=("source", "rewards", "outcome.correct"))


def domain_metrics(batch: RolloutBatch, ctx: StageContext):
    """Metrics split by task domain (extras["domain"], an index into `tasks.mixture.DOMAINS`):
    a mixture of domains is reported per domain, never only as an average."""
    from policylab.tasks.mixture import DOMAINS

    if "domain" not in batch.extras:
        return {}, {}
    return {}, split_metrics(batch, [DOMAINS[int(d)] for d in batch.extras["domain"].tolist()], "domain")


DOMAIN_METRICS = Stage("round", domain_metrics, reads=("extras.domain", "rewards", "outcome.correct"))
