"""Graded rule-based judges for numeric answers: an interval per reply (for Range-GRPO)
and several reward dimensions per reply (for GPRL).

These are transparent procedural stand-ins for an LLM judge with calibrated uncertainty
and for several reward models: enough to run the estimators that read intervals `[B, 2]`
and reward vectors `[B, D]` end to end on a verifiable task. They are not a judge; a
method's card says so. Each takes `(completions, answers)` like a verifier.

Interval judge `numeric_interval` (x = last number of the reply, a = the gold answer,
d = |x − a|):

    no number            [0.0, 0.3]          (uncertain, low)
    d = 0                [0.8, 1.0]          (right; the judge is not fully sure)
    d > 0                [s/2, s], s = 0.6/(1 + d)   (partial credit, shrinking with the error)

so a right reply is determinately above every wrong one (0.8 > 0.3), a near miss above a
far one when their intervals do not overlap, and a reply without a number overlaps most
wrong ones (undetermined).

Dimensions (each in [0, 1]):

    correct     1 if x = a (the exact-numeric verifier)
    closeness   1 / (1 + d)   (0 without a number)
    terse       1 if the reply is the number alone (up to whitespace and a final period)
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Sequence

import torch

from policylab.errors import PolicylabError
from policylab.kernels.rewards.verifiers import extract_last_number


def _distance(reply: str, answer) -> float | None:
    x = extract_last_number(reply)
    if x is None:
        return None
    try:
        return float(abs(Decimal(x) - Decimal(str(answer).strip())))
    except InvalidOperation:
        raise PolicylabError(f"graded judge: the gold answer {answer!r} is not a number") from None


def _check(completions: Sequence[str], answers: Sequence) -> None:
    if len(completions) != len(answers):
        raise PolicylabError(f"graded judge: {len(completions)} replies but {len(answers)} answers")


def numeric_interval(completions: Sequence[str], answers: Sequence) -> torch.Tensor:
    """[B, 2] (low, high) judge interval per reply (see the module doc)."""
    _check(completions, answers)
    out = []
    for reply, a in zip(completions, answers):
        d = _distance(reply, a)
        if d is None:
            out.append((0.0, 0.3))
        elif d == 0:
            out.append((0.8, 1.0))
        else:
            s = 0.6 / (1.0 + d)
            out.append((s / 2, s))
    return torch.tensor(out, dtype=torch.float64)


_TERSE = re.compile(r"^\s*[-+\u2212]?\d[\d,]*(\.\d+)?\s*\.?\s*$")


def _dim_correct(reply, a) -> float:
    d = _distance(reply, a)
    return float(d == 0) if d is not None else 0.0


def _dim_closeness(reply, a) -> float:
    d = _distance(reply, a)
    return 0.0 if d is None else 1.0 / (1.0 + d)


def _dim_terse(reply, a) -> float:
    return float(bool(_TERSE.match(reply)))


DIMENSIONS = {"correct": _dim_correct, "closeness": _dim_closeness, "terse": _dim_terse}
INTERVAL_JUDGES = {"numeric_interval": numeric_interval}


def parse_dimensions(spec: str) -> list[str]:
    """Dimension names from "a,b,c" (each a key of DIMENSIONS, no repeats)."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in DIMENSIONS]
    if not names or unknown or len(set(names)) != len(names):
        raise PolicylabError(f"reward dimensions {spec!r}: use distinct names among {', '.join(DIMENSIONS)}")
    return names


def reward_vectors(completions: Sequence[str], answers: Sequence, dimensions: Sequence[str]) -> torch.Tensor:
    """[B, D] rewards, one column per named dimension."""
    _check(completions, answers)
    fns = [DIMENSIONS[d] for d in dimensions]
    return torch.tensor([[f(r, a) for f in fns] for r, a in zip(completions, answers)], dtype=torch.float64)


# What these judges need of a task: they read the gold answer as a number. A method whose
# stages call one of them can only be fed by a task with numeric gold answers
# (`policylab compare` checks it before any run starts).
NEEDS_NUMERIC_GOLD = "numeric gold answers"
numeric_interval.task_needs = NEEDS_NUMERIC_GOLD
reward_vectors.task_needs = NEEDS_NUMERIC_GOLD
