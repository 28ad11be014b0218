"""The validation layer (trainer.config): every number of a run config has a range rule,
the rules' boundaries are what they say, and paths and devices are checked before work."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from policylab.errors import ConfigError
from policylab.trainer.config import FIELD_RULES, Range, RunConfig, check_device, check_path_value, load_config


def _numeric_fields(obj, prefix=""):
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            yield from _numeric_fields(v, key + ".")
        elif isinstance(v, bool):
            continue
        elif isinstance(v, (int, float)) or (isinstance(v, tuple) and v and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            yield key


def test_every_number_of_a_run_config_has_a_rule():
    keys = set(_numeric_fields(RunConfig()))
    missing = sorted(keys - set(FIELD_RULES))
    assert not missing, f"add a rule for {missing} in trainer/config.py FIELD_RULES"
    assert not sorted(set(FIELD_RULES) - keys)  # no rule for a key that does not exist
    for key, rule in FIELD_RULES.items():  # the defaults pass their own rules
        node = RunConfig()
        for part in key.split("."):
            node = getattr(node, part)
        assert rule.problem(key, node) is None, key


def test_range_boundaries_hand_checked():
    closed = Range(lo=0, hi=1)  # [0, 1]
    assert closed.problem("k", 0) is None and closed.problem("k", 1) is None
    assert closed.problem("k", -1e-12) == "k must be in [0, 1], got -1e-12"
    half = Range(lo=0, hi=1, hi_open=True)  # [0, 1)
    assert half.problem("k", 0.999) is None and half.problem("k", 1) == "k must be in [0, 1), got 1"
    pos = Range(lo=0, lo_open=True, why="w")  # > 0
    assert pos.problem("k", 1e-300) is None and pos.problem("k", 0.0) == "k must be > 0, got 0.0 (w)"
    ints = Range(lo=1, integer=True)
    assert ints.problem("k", 2.0) is None and ints.problem("k", 2.5) == "k must be an integer, got 2.5"
    assert ints.problem("k", 2**63) == f"k is {2**63}, beyond the 64-bit integer range"
    assert ints.problem("k", True) == "k must be a number, got True"
    assert ints.problem("k", float("nan")) == "k is nan: every number in a config must be finite"
    pair = Range(lo=0, hi=1, hi_open=True, length=2)
    assert pair.problem("b", (0.9, 0.999)) is None
    assert pair.problem("b", (0.9,)) == "b must be 2 numbers, got (0.9,)"
    assert pair.problem("b", (0.9, 1.0)) == "b = [0.9, 1.0]: element 1 must be in [0, 1), got 1.0"


@pytest.mark.parametrize("override, key", [
    ("seed=4294967296", "seed"), ("train.betas=[0.9, 1.0]", "train.betas"), ("train.lora_alpha=0", "train.lora_alpha"),
    ("eval.k=[1, 0]", "eval.k"), ("log.keep_checkpoints=-1", "log.keep_checkpoints"),
    ("rollout.max_refill_rounds=-1", "rollout.max_refill_rounds"), ("task.sandbox_memory_mb=63", "task.sandbox_memory_mb"),
    ("train.budget_tokens=-1", "train.budget_tokens"), ("eval.every=-2", "eval.every"),
])
def test_out_of_range_values_name_their_key(override, key):
    with pytest.raises(ConfigError, match=rf"^{key.replace('.', chr(92) + '.')} "):
        load_config(None, [override])


def test_the_largest_accepted_seed_trains_numpy():
    import numpy as np

    cfg = load_config(None, ["seed=4294967295"])
    np.random.seed(cfg.seed)  # the boundary of the rule is numpy's own


def test_run_dir_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    assert check_path_value("run_dir", "~/runs/a") == str(tmp_path / "home" / "runs" / "a")
    assert check_path_value("run_dir", "runs/a") == "runs/a"
    for bad, what in [("/", "filesystem root"), ("~", "home directory"), ("~nosuchuser_x/a", "does not exist"),
                      ("", "is empty"), ("a/" + "b" * 256, "limit is 255"), ("x" * 200 + "/" + "y" * 200 + "/z" * 2000,
                                                                            "limit is 4096")]:
        with pytest.raises(ConfigError, match=what):
            check_path_value("run_dir", bad)
    assert load_config(None, ["run_dir=~/r"]).run_dir == str(tmp_path / "home" / "r")


def test_devices():
    check_device("train.device", "cpu")
    for bad, what in [("meta", "without data"), ("gpu", "not a torch device"), ("cuda:7", "cuda")]:
        with pytest.raises(ConfigError, match=what):
            check_device("train.device", bad)


def test_pickle_model_weights_are_scanned_never_run(small_model_dir, tmp_path):
    import shutil

    import torch

    from policylab.trainer.config import check_model_value

    d = tmp_path / "m"
    shutil.copytree(small_model_dir, d)
    weights = {k: v for k, v in __import__("safetensors.torch", fromlist=["load_file"]).load_file(
        str(d / "model.safetensors")).items()}
    (d / "model.safetensors").unlink()
    torch.save(weights, d / "pytorch_model.bin")  # plain tensors: accepted
    check_model_value("model", str(d))
    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"w": Payload()}, d / "pytorch_model.bin")
    with pytest.raises(ConfigError, match=r"pytorch_model.bin is a pickle that names code \(posix.system\)"):
        check_model_value("model", str(d))
    assert not marker.exists()
    for bad, what in [(str(tmp_path / "nope" / "x"), "does not exist"), (str(d / "config.json"), "is a file")]:
        with pytest.raises(ConfigError, match=what):
            check_model_value("model", bad)
    check_model_value("model", "embedded")
    assert Path(d).is_dir()
