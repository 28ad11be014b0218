"""Executable worked examples for the question bank.

An example is a function registered with `@example("name")` that takes plain keyword
arguments (numbers, lists, strings), calls policylab's real kernels, and returns a dict of
named results (numbers, lists of numbers, strings). The bank's YAML names the function and
its arguments; the numbers shown to the reader are computed by these functions when the
bank is built, so a changed kernel changes (or breaks) the page.
"""

from __future__ import annotations

from typing import Callable

EXAMPLES: dict[str, Callable[..., dict]] = {}


def example(name: str):
    def register(fn):
        if name in EXAMPLES:
            raise ValueError(f"example {name!r} is registered twice")
        EXAMPLES[name] = fn
        return fn

    return register


from policylab.learn.examples import (
    core_advantages,
    core_geometry,
    core_graded,
    core_objectives,
    sequence_objectives as more_objectives,
    mixed_policy,
    offpolicy_async,
    offpolicy_engine,
    offpolicy_objectives,
    offpolicy_topics,
    pipelines,
    rich_rewards as rewards_more,
    testtime,
)  # noqa: E402,F401  (register the examples)
