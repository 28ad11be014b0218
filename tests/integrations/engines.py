"""Engine imports for the integration tests.

An engine that is not installed skips its tests, except where the environment asks for
it: `POLICYLAB_REQUIRE_ENGINES=verl,trl` (set by `make test` for the environments it
builds) turns a missing engine into a failure, so CI cannot pass by skipping."""

from __future__ import annotations

import importlib
import os

import pytest


def require(name: str):
    wanted = {e.strip() for e in os.environ.get("POLICYLAB_REQUIRE_ENGINES", "").split(",") if e.strip()}
    if name in wanted:
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=f"{name} is not installed here (make test runs these tests "
                               f"in the environment it builds for {name})")
