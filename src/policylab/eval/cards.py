"""Metric cards: evaluation measurements listed next to the training methods.

A metric is not a `Method` (nothing is trained by it), so it has a registry of its own:
`METRICS`, a plain dict from name to `MetricCard`. `policylab methods` lists both tables
(family "metric" for these), `policylab methods NAME` prints a metric's card, the README
table lists them, and `policylab eval RUN --metrics ...` computes them
(`policylab.eval.suite`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

from policylab.eval import calibration, coverage, suite as eval_metrics, evaluate
from policylab.kernels import metrics
from policylab.errors import PolicylabError
from policylab.methods.spec import source_location


@dataclass(frozen=True)
class MetricCard:
    name: str
    title: str  # paper title
    arxiv: str
    summary: str  # one line: what it measures
    inputs: str  # what it reads
    cli: str  # the `policylab eval --metrics` name
    status: str  # what was measured, where the numbers are
    not_established: str
    kernels: tuple[Callable, ...] = ()
    confirmed: str = ""
    unconfirmed: tuple[str, ...] = ()
    decision: str = ""  # calibration: what the "decision" is
    family: str = "metric"


METRICS: dict[str, MetricCard] = {}


def register_metric(card: MetricCard) -> MetricCard:
    if card.name in METRICS:
        raise ValueError(f"metric {card.name!r} is already registered")
    METRICS[card.name] = card
    return card


def get_metric(name: str) -> MetricCard:
    try:
        return METRICS[name]
    except KeyError:
        near = difflib.get_close_matches(str(name), list(METRICS), n=3, cutoff=0.4)
        hint = f" Did you mean: {', '.join(near)}?" if near else ""
        raise PolicylabError(f"unknown metric {name!r}.{hint}") from None


def metric_names() -> list[str]:
    return sorted(METRICS)


_MEASURED = "benchmarks/results/eval_metrics_quickstart.md"
_STATUS = ("kernel verified; `policylab eval --metrics` on SmolLM2-135M-Instruct, the 30-step GRPO quickstart "
           "checkpoint against the base model, 99 held-out problems x 8 samples (" + _MEASURED + ")")
_TAX_STATUS = _STATUS[:-1] + ": coverage rose at every K (pass@1 0.19 -> 0.92, pass@8 0.78 -> 0.99), tax -0.72 at "\
    "K = 1 to -0.21 at K = 8, no problem lost)"
_CALIB_STATUS = _STATUS[:-1] + ": measured, but on this task the first reply token is the restated first operand, "\
    "not the answer, so the ECE/Brier describe that token (decision accuracy 9% base, 8% trained); no answer "\
    "calibration measured yet)"

register_metric(MetricCard(
    name="sharpening_tax", title="Sharpening Tax in Post-Training", arxiv="",
    summary="base-minus-post coverage at a fixed budget K (unbiased pass@K averaged over tasks); signed, "
            "> 0 = coverage lost",
    inputs="per task and model: n samples and c correct, one K; identical task sets for both models",
    cli="sharpening_tax",
    status=_TAX_STATUS,
    not_established="why coverage changes; pass@1, entropy and coverage are different quantities; the "
                    "difficulty-conditioned temperature policy is offered as a function with a required h, not "
                    "measured",
    kernels=(metrics.pass_at_k, coverage.coverage_at_k, coverage.sharpening_tax, coverage.difficulty_temperature),
    confirmed="the unbiased pass@k estimator (Chen et al., arXiv 2107.03374) and its hand case n = 4, c = 1, K = 2 "
              "-> 0.5; differing K or task sets are refused",
    unconfirmed=("title and arXiv id of the paper", "the temperature policy T(x) = h(p̂(x)): h is a required "
                 "argument, no default"),
))

register_metric(MetricCard(
    name="calib_rl",
    title="Balancing Classification and Calibration Performance in Decision-Making LLMs via Calibration Aware "
          "Reinforcement Learning", arxiv="2601.13284",
    summary="decision-token calibration: temperature fitted on a validation split, then accuracy, NLL, Brier and "
            "ECE (10 equal-width bins) on a disjoint test split",
    inputs="decision-token logits over the choices, labels, split tags (val / test); fitting on a test row raises",
    cli="calibration",
    status=_CALIB_STATUS,
    not_established="post-hoc temperature is not calibration-aware RL (the paper's training method is not "
                    "implemented); the first digit's probability says nothing about the reasoning before it; the "
                    "arithmetic held-out split has 99 problems (~half per split): small-sample ECE",
    kernels=(evaluate.decision_logits, calibration.fit_temperature, calibration.calibration_metrics,
             calibration.calib_rl, metrics.ece, metrics.brier, eval_metrics.calibration),
    decision=eval_metrics.DECISION,
    confirmed="title and arXiv id; that calibration is measured on the decision token's probabilities with ECE; "
              "temperature scaling as in arXiv 1706.04599",
    unconfirmed=("the number of ECE bins (10: library decision)", "the arithmetic decision (the first digit) is "
                 "the library's reformulation, not the paper's tasks"),
))


def metric_table_text() -> str:
    """The metric cards (`policylab.eval.cards`): name, family, what it measures, status."""
    rows = [("metric", "family", "eval name", "status")]
    rows += [(m.name, m.family, m.cli, m.status) for _, m in sorted(METRICS.items())]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
        if j == 0:
            lines.append("-" * (sum(widths) + 2 * len(widths) + 10))
    return "\n".join(lines)


def metric_card_text(card) -> str:
    """One metric's card, with the functions that compute it (`module.function  path:line`)."""
    parts = [
        f"{card.name}: {card.title}" + (f" (arXiv {card.arxiv})" if card.arxiv else ""),
        f"  family        {card.family} (not a training method: `policylab eval RUN --metrics {card.cli}`)",
        f"  what it does  {card.summary}",
        f"  needs         {card.inputs}",
    ]
    if card.decision:
        parts.append(f"  decision      {card.decision}")
    parts += [f"  status        {card.status}", f"  not shown     {card.not_established}"]
    if card.confirmed:
        parts.append(f"  confirmed     {card.confirmed}")
    if card.unconfirmed:
        parts.append(f"  unconfirmed   {'; '.join(card.unconfirmed)}")
    parts.append("  kernels")
    for fn in card.kernels:
        qual, path, line = source_location(fn)
        parts.append(f"    {qual}  {path}:{line}")
    return "\n".join(parts)
