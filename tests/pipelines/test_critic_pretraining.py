"""RFPO's critic: trained on the base model's own labelled rollouts, written as a checkpoint,
rebuilt from it; its values are per prefix state and ignore padding; the CLI command."""

import json

import pytest
import torch

from policylab.models import loading as models
from policylab.trainer.config import config_from_dict
from policylab.pipelines.critic_pretraining import CriticBudget, train_frozen_critic
from policylab.models.frozen_critic import CriticError, FrozenCritic, prefix_positions

from cli_utils import write_config
from cli_utils import cli_inprocess as cli  # the subprocess is not what these tests check


# its tests share the module fixture `critic_dir`: one worker under xdist
pytestmark = pytest.mark.xdist_group("test_critic_pretraining")


@pytest.fixture(scope="module")
def critic_dir(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("critic") / "c"
    cfg = config_from_dict({"model": str(tiny_model_dir), "run_dir": str(out.parent / "run"), "seed": 0,
                            "task": {"reward": "trainer_utils:parity_reward"}, "rollout": {"max_new_tokens": 5}})
    train_frozen_critic(cfg, out, CriticBudget(prompts=6, group_size=3, epochs=120), say=lambda *_: None)
    return out


def test_checkpoint_records_what_the_critic_is(critic_dir, tiny_model_dir):
    meta = json.loads((critic_dir / "critic.json").read_text())
    assert meta["format"] == "policylab-frozen-critic/1"
    assert meta["base_model"] == str(tiny_model_dir.resolve())
    st = meta["calibration"]
    # 6 prompts x 3 replies; a quarter of the prompts (2) calibrate: 12 fitted, 6 calibration rollouts
    assert st["rollouts_fit"] == 12 and st["rollouts_calibration"] == 6
    assert 0.0 <= st["brier_critic"] <= 1.0 and len(meta["length_bias"]) == 2
    assert st["bce_curve"][-1] < st["bce_curve"][0]  # the head did fit its training states
    assert (critic_dir / "head.safetensors").is_file()


def test_values_are_probabilities_per_prefix_state_and_ignore_padding(critic_dir, tokenizer):
    c = FrozenCritic(critic_dir)
    g = torch.Generator().manual_seed(0)
    P, T = 5, 4
    tokens = torch.randint(0, 1000, (2, P + T), generator=g)
    am = torch.ones(2, P + T, dtype=torch.bool)
    lm = torch.ones(2, T, dtype=torch.bool)
    am[1, :2] = False  # row 1: two columns of leading padding
    lm[1, 2:] = False  # and a reply of 2 tokens
    am[:, P:] = lm
    v, final = c.values(tokens, am, lm, P)
    assert bool(((v > 0) & (v < 1))[lm].all()) and bool((v[~lm] == 0).all())
    # row 1 alone, without its padding: the same values
    t1 = torch.cat([tokens[1, 2:P], tokens[1, P:P + 2]]).unsqueeze(0)
    v1, f1 = c.values(t1, torch.ones_like(t1, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool), P - 2)
    torch.testing.assert_close(v[1, :2], v1[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(final[1], f1[0], rtol=1e-5, atol=1e-6)


def test_prefix_positions():
    # P = 3: states before tokens 0..3 are columns 2..5; the state after the last counted token:
    # row 0 (3 tokens) column 5, row 1 (empty reply) column 2 (the prompt's last token)
    before, last = prefix_positions(torch.tensor([[True, True, True, False], [False] * 4]), 3)
    assert before.tolist() == [2, 3, 4, 5] and last.tolist() == [5, 2]


def test_a_critic_needs_its_own_base_weights(critic_dir, tokenizer, tmp_path):
    with pytest.raises(CriticError, match="other base weights"):
        FrozenCritic(critic_dir, base=models.tiny_llama(tokenizer, seed=7))
    with pytest.raises(CriticError, match="train-critic"):
        FrozenCritic(tmp_path)


def test_train_critic_command(tiny_model_dir, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny_model_dir, tmp_path / "run")
    out = tmp_path / "critic"
    r = cli("train-critic", cfg, "--out", out, "--prompts", 2, "--group-size", 2, "--epochs", 5)
    assert r.returncode == 0, r.stderr
    assert f"method_params.critic_path={out}" in r.stdout and (out / "critic.json").is_file()
    again = cli("train-critic", cfg, "--out", out, "--prompts", 2)
    assert again.returncode == 2 and "already holds a critic" in again.stderr
