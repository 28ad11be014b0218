"""Every shipped config loads and validates (a typo in a committed recipe fails here)."""

from pathlib import Path

import pytest

from policylab import methods
from policylab.trainer.config import load_config
from policylab.trainer.loop import run_shape

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_loads(path):
    cfg = load_config(path)
    # the method's parameters validate and resolve against the run, and its checks pass;
    # every parameter the recipe sets is the value the method then runs with
    m = methods.get(cfg.method).with_params(cfg.method_params, run_shape(cfg))
    assert m.name == cfg.method
    for key, value in cfg.method_params.items():
        assert m.p[key] == value, (key, m.p[key], value)
    assert all(m.p[q.name] is not None for q in m.params if q.resolve is not None), "a run-derived value unresolved"
