"""Executable worked examples for the question bank.

An example is a function registered with `@example("name")` that takes plain keyword
arguments (numbers, lists, strings), calls policylab's real kernels, and returns a dict of
named results (numbers, lists of numbers, strings). The bank's YAML names the function and
its arguments; the numbers shown to the reader are computed by these functions when the
bank is built, so a changed kernel changes (or breaks) the page.

The registry is `learn.examples.registry`; this package imports every example module so
that EXAMPLES is complete, and re-exports `EXAMPLES` and `example`.
"""

from __future__ import annotations

from policylab.learn.examples import (  # noqa: F401  (imported for their registrations)
    core_advantages,
    core_geometry,
    core_graded,
    core_objectives,
    mixed_policy,
    offpolicy_async,
    offpolicy_engine,
    offpolicy_objectives,
    offpolicy_topics,
    pipelines,
    rich_rewards,
    sequence_objectives,
    sequence_weighting,
    subjects,
    testtime,
)
from policylab.learn.examples.registry import EXAMPLES, example

__all__ = ["EXAMPLES", "example"]
