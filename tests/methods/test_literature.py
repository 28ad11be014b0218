"""Literature-only cards (orl): the entry exists, every execution path refuses quoting
the card, and nothing is ever written or logged under its id."""

from __future__ import annotations

import pytest
import yaml

from policylab import methods
from policylab.trainer.config import ConfigError, config_from_dict
from policylab.methods.registry import LiteratureOnlyError


def test_orl_is_a_card_and_not_a_runnable_method():
    c = methods.card("orl")
    assert c.title == "On-Policy Residual Learning for Diffusion Language Models"
    assert c.status.startswith("literature-only")
    assert "orl" in methods.literature_names()
    assert "orl" not in methods.names()  # the generic runners never see it


def test_get_refuses_quoting_the_card():
    with pytest.raises(LiteratureOnlyError, match="literature-only card.*On-Policy Residual Learning"):
        methods.get("orl")
    with pytest.raises(NotImplementedError):  # also a NotImplementedError, as the card promises
        methods.get("orl")


def test_a_config_naming_it_is_refused_before_any_run_dir_exists(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(LiteratureOnlyError, match="orl"):
        config_from_dict({"method": "orl", "run_dir": str(run_dir)})
    assert not run_dir.exists()


def test_train_command_refuses_and_logs_nothing(tmp_path, capsys):
    from policylab.cli import main

    run_dir = tmp_path / "run"
    cfg = tmp_path / "orl.yaml"
    cfg.write_text(yaml.safe_dump({"method": "orl", "model": "embedded", "run_dir": str(run_dir)}))
    code = main(["train", str(cfg)])
    err = capsys.readouterr().err
    assert code != 0
    assert "literature-only card" in err and "On-Policy Residual Learning" in err
    assert not run_dir.exists()  # no config.yaml, metrics.jsonl or event under its id


def test_methods_command_prints_the_card(capsys):
    from policylab.cli import main

    assert main(["methods", "orl"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("orl: On-Policy Residual Learning for Diffusion Language Models")
    assert "literature-only" in out
    assert main(["methods"]) == 0
    assert "literature-only (a card, nothing runs): orl" in capsys.readouterr().out


def test_registering_a_name_twice_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        methods.registry.register_literature("orl", methods.card("orl"))
    with pytest.raises(ValueError, match="already registered"):
        methods.registry.register_literature("grpo", methods.card("orl"))


def test_config_error_is_not_what_refuses(tmp_path):
    # the refusal is specific (LiteratureOnlyError), not a generic bad-config error
    with pytest.raises(LiteratureOnlyError) as info:
        config_from_dict({"method": "orl", "run_dir": str(tmp_path / "r")})
    assert not isinstance(info.value, ConfigError)
