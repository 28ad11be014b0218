"""The pipeline registry: `policylab pipeline NAME` finds NAME in policylab.pipelines.PIPELINES
(the command line names no pipeline itself); an unknown name is one clear error line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from policylab.cli import build_parser, main
from policylab.errors import ConfigError
from policylab.pipelines import PIPELINES, Pipeline, get_pipeline

from cli_utils import cli_inprocess as cli  # the subprocess is not what this checks

REPO = Path(__file__).resolve().parents[2]


def test_an_unknown_pipeline_is_one_line_with_the_close_match(tmp_path):
    missing = tmp_path / "never-read.yaml"
    res = cli("pipeline", "ppo_rlh", missing)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines == ["policylab: error: unknown pipeline 'ppo_rlh'. Did you mean: ppo_rlhf? "
                     "The pipelines: ppo_rlhf, fusion."]
    assert res.stdout == ""


def test_a_name_close_to_nothing_gets_the_list(capsys):
    assert main(["pipeline", "sft_only", "c.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["policylab: error: unknown pipeline 'sft_only'. The pipelines: ppo_rlhf, fusion."]


def test_get_pipeline_refuses_with_config_error():
    assert get_pipeline("fusion") is PIPELINES["fusion"]
    with pytest.raises(ConfigError, match=r"unknown pipeline 'fusoin'\. Did you mean: fusion\?"):
        get_pipeline("fusoin")


def test_the_cli_runs_whatever_the_registry_holds(monkeypatch, tmp_path, capsys):
    calls = []

    def toy(path, overrides, *, console, overwrite):
        calls.append((path, list(overrides), overwrite, console is not None))
        return tmp_path / "toy-run"

    monkeypatch.setitem(PIPELINES, "toy", Pipeline(toy, "one stage that does nothing"))
    assert main(["pipeline", "toy", "t.yaml", "--set", "a.b=1", "--overwrite"]) == 0
    assert calls == [("t.yaml", ["a.b=1"], True, True)]
    assert capsys.readouterr().err.strip() == f"policylab: wrote {tmp_path / 'toy-run' / 'report.json'} and report.md"
    # the help lists the registered pipelines with their descriptions
    text = " ".join(build_parser().format_help().split())
    assert "toy: one stage that does nothing" in text and "ppo_rlhf: SFT -> reward model -> PPO" in text


def test_every_registered_pipeline_has_a_shipped_config_and_back():
    shipped = {yaml.safe_load(p.read_text())["pipeline"]: p.stem for p in (REPO / "configs" / "pipelines").glob("*.yaml")}
    assert set(shipped) == set(PIPELINES)
    assert all(stem == name for name, stem in shipped.items())  # configs/pipelines/NAME.yaml
    for p in PIPELINES.values():
        assert callable(p.entry) and p.description and "\n" not in p.description
