"""The registry of worked examples: `@example("name")` adds a function to EXAMPLES.

An example takes plain keyword arguments (numbers, lists, strings), calls policylab's
real kernels, and returns a dict of named results (numbers, lists of numbers, strings).
"""

from __future__ import annotations

from typing import Callable

EXAMPLES: dict[str, Callable[..., dict]] = {}


def example(name: str):
    """Register the decorated function as the worked example `name` (a name is used once)."""
    def register(fn):
        if name in EXAMPLES:
            raise ValueError(f"example {name!r} is registered twice")
        EXAMPLES[name] = fn
        return fn

    return register
