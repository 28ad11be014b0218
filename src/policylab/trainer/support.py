"""Helpers of the trainer that are not the loop itself: seeding and the run-config file."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
import yaml

from policylab.trainer.config import ConfigError, RunConfig, config_from_dict


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every global RNG the run touches: python, numpy, torch CPU."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_config(cfg: RunConfig, run_dir: Path) -> None:
    """Write run_dir/config.yaml atomically (a temporary file renamed into place)."""
    from policylab.trainer.run_paths import guard, replace_file

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    replace_file(guard(run_dir, "config.yaml"), yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def load_run_config(run_dir: Path) -> RunConfig:
    from policylab.trainer.config import read_yaml

    from policylab.trainer.run_paths import guard

    if not Path(run_dir).is_dir():
        raise ConfigError(f"{run_dir} is not a directory: give the run directory a policylab run wrote")
    p = guard(run_dir, "config.yaml")  # a link or a special file is refused, not read
    if not p.is_file():
        raise ConfigError(f"{run_dir} has no config.yaml: is it a policylab run directory?")
    data = read_yaml(p)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: not a run config (the top level must be a mapping of config sections)")
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
