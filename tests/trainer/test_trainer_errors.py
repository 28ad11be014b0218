"""Bad input to the trainer: each gets a clear error, and nothing written is lost."""

import pytest
import torch

from policylab.trainer.checkpoint import latest_checkpoint
from policylab.errors import NonFiniteError
from policylab.kernels.rewards import RewardFnError
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config


def test_reward_function_that_raises_names_function_and_sample(small_model_dir, tmp_path):
    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r", task={"reward": "trainer_utils:raising_reward"}))
    with pytest.raises(RewardFnError, match=r"'raising_reward' raised on sample \d+ \(prompt 'What is"):
        for _ in range(5):  # a response of odd length appears quickly
            tr.train_step()


def test_nan_reward_is_refused_not_zero_filled(small_model_dir, tmp_path):
    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r", task={"reward": "trainer_utils:nan_reward"}))
    with pytest.raises(NonFiniteError, match="nan_reward.*sample 0"):
        tr.train_step()


def test_interrupted_checkpoint_write_keeps_previous_latest(small_model_dir, tmp_path, monkeypatch):
    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r"))
    tr.train_step()
    good = tr.save()
    tr.train_step()

    import errno

    import policylab.trainer.checkpoint as ck
    from policylab.errors import CheckpointError

    def boom(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck.safestate, "save_state", boom)
    with pytest.raises(CheckpointError, match="no space left on device.*step_000001 is intact"):
        tr.save()
    assert latest_checkpoint(tr.run_dir) == good
    assert not any(p.name.startswith(".tmp") for p in (tr.run_dir / "checkpoints").iterdir())


def test_prompt_longer_than_context(small_model_dir, tmp_path):
    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r"))
    tr.model.config.max_position_embeddings = 20
    with pytest.raises(ValueError, match="exceeds the model's context"):
        tr.encode("What is 1 + 1? " * 10)


def test_group_size_too_small_for_rloo(small_model_dir, tmp_path):
    with pytest.raises(ValueError, match="`rloo` needs rollout.group_size >= 2"):
        Trainer(tiny_config(small_model_dir, tmp_path / "r", method="rloo", method_params={},
                            rollout={"group_size": 1}))


def test_extra_reward_terms_shape_the_reward_but_not_the_outcome(small_model_dir, tmp_path):
    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r",
                             task={"extra_rewards": ["trainer_utils:short_bonus=0.5"]}))
    batch, info = tr.collect()
    assert "reward/trainer_utils:short_bonus" in info
    # outcome stays the raw verifier value (0/1); the shaped reward adds 0.5 x bonus
    assert set(batch.outcome["correct"].tolist()) <= {0.0, 1.0}
    assert not torch.equal(batch.rewards, batch.outcome["correct"])


def test_bad_extra_reward_spec(small_model_dir, tmp_path):
    with pytest.raises(ValueError, match="module:function=weight"):
        Trainer(tiny_config(small_model_dir, tmp_path / "r", task={"extra_rewards": ["trainer_utils:short_bonus"]}))
