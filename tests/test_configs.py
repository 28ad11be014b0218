"""Every shipped config loads and validates (a typo in a committed recipe fails here)."""

from pathlib import Path

import pytest

from policylab import methods
from policylab.config import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_loads(path):
    cfg = load_config(path)
    methods.get(cfg.method).with_params(cfg.method_params)
