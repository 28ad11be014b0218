import pytest

from policylab.trainer.config import ConfigError, load_config


def test_defaults_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("method: dapo\nrollout:\n  group_size: 4\ntrain:\n  lr: 1.0e-5\n")
    cfg = load_config(p, ["train.steps=3", "model=/some/dir", "method_params.eps_high=0.3"])
    assert cfg.method == "dapo" and cfg.rollout.group_size == 4 and cfg.train.lr == 1e-5
    assert cfg.train.steps == 3 and cfg.model == "/some/dir" and cfg.method_params["eps_high"] == 0.3


def test_unknown_key_lists_close_matches():
    with pytest.raises(ConfigError, match=r"unknown config key `train.learning_rat`"):
        load_config(None, ["train.learning_rat=1"])
    with pytest.raises(ConfigError, match="Did you mean: rollout"):
        load_config(None, ["rollot.group_size=2"])


def test_type_and_range_errors():
    with pytest.raises(ConfigError, match="must be an integer"):
        load_config(None, ["rollout.group_size=two"])
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        load_config(None, ["rollout.temperature=0"])
    with pytest.raises(ConfigError, match="does not split"):
        load_config(None, ["rollout.prompts_per_step=3", "rollout.group_size=3", "train.minibatches=2"])


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_exponent_without_dot_is_a_number():
    # the README's own example: YAML 1.1 would read "2e-5" as a string
    assert load_config(None, ["train.lr=2e-5"]).train.lr == 2e-5
