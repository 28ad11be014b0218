"""A method defined outside the package (docs/examples/outside_method: a kernel, a family
module, a test) runs through `method: my_methods.family:CAPPED_PG` without any file of
the library changing, and a received run directory naming it is refused until the user
allows the import."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from policylab import methods
from policylab.errors import UntrustedImportError
from policylab.methods import registry

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "outside_method"
PATH = "my_methods.family:CAPPED_PG"


@pytest.fixture
def example_on_path(tmp_path, monkeypatch):
    """The example package copied to a temporary directory on sys.path; afterwards its
    modules and its registration are gone again."""
    root = tmp_path / "site"
    shutil.copytree(EXAMPLE, root)
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m == "my_methods" or m.startswith("my_methods.")]:
        del sys.modules[name]
    registry.REGISTRY.pop("capped_pg", None)


def test_the_examples_own_test_passes(example_on_path):
    mod = importlib.import_module("test_capped_pg")
    mod.test_hand_worked_and_naive_loop()


def test_import_path_resolves_registers_and_refuses_bad_paths(example_on_path):
    m = methods.get(PATH)
    assert m.name == "capped_pg" and methods.get("capped_pg") is m  # registered under its own name
    assert methods.get(PATH) is m  # a second lookup finds the same method
    assert m.card.status == registry.EXTERNAL  # it states no evidence: nothing measured here
    with pytest.raises(registry.UnknownMethodError, match="cannot import NOPE from my_methods.family"):
        methods.get("my_methods.family:NOPE")
    with pytest.raises(registry.UnknownMethodError, match="is a function, not a policylab Method"):
        methods.get("my_methods.capped_pg:capped_pg")
    with pytest.raises(registry.UnknownMethodError, match="not an import path"):
        methods.get("my methods:X")


def test_trains_two_steps_on_the_tiny_model(example_on_path, small_model_dir, tmp_path):
    from trainer_utils import tiny_config

    from policylab.trainer.loop import Trainer

    cfg = tiny_config(small_model_dir, tmp_path / "run", method=PATH, method_params={"adv_cap": 0.5},
                      rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4})
    tr = Trainer(cfg)
    start = {k: v.clone() for k, v in tr.model.state_dict().items()}
    rows = [tr.train_step() for _ in range(2)]
    assert tr.method.name == "capped_pg" and tr.method.p["adv_cap"] == 0.5
    assert all("loss/policy" in r for r in rows if not r.get("skipped_no_signal"))
    assert tr.policy_version >= 1  # at least one of the two batches had a mixed group
    moved = max(float((v - start[k]).abs().max()) for k, v in tr.model.state_dict().items())
    assert moved > 0


def test_a_received_run_naming_it_is_refused_without_the_trust_flag(example_on_path, small_model_dir, tmp_path):
    from policylab.trainer.resume import load_received_run

    run = tmp_path / "received"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"method": PATH, "model": str(small_model_dir),
                                                     "run_dir": str(run), "task": {"reward": "exact_numeric"}}))
    with pytest.raises(UntrustedImportError, match=r"`my_methods\.family` \(method = 'my_methods\.family:CAPPED_PG'\)"):
        load_received_run(run, allow_imports=False)
    assert "my_methods.family" not in sys.modules  # refused before anything was imported
    assert "capped_pg" not in registry.REGISTRY
    cfg = load_received_run(run, allow_imports=True)
    assert cfg.method == PATH


def test_an_installed_entry_point_is_found_by_name_and_gated_like_an_import_path(example_on_path, monkeypatch):
    monkeypatch.setattr(registry, "entry_points", lambda: {"capped": PATH})
    assert registry.outside_module("capped") == "my_methods.family"
    assert registry.outside_module("grpo") is None  # built-in: nothing to import
    assert methods.get("capped").name == "capped_pg"
    with pytest.raises(registry.UnknownMethodError, match="Did you mean: capped"):
        methods.get("cappd")
