"""Real mismatch (bf16 behavior engine vs fp32 trainer) and real staleness in the trainer."""

import pytest

from policylab.errors import BatchReuseError
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config


@pytest.mark.parametrize("engine", ["hf", "fast", "auto"])
def test_bf16_engine_produces_real_mismatch_and_tis_sees_it(small_model_dir, tmp_path, engine):
    cfg = tiny_config(small_model_dir, tmp_path / "r", method="tis", method_params={},
                      rollout={"engine_dtype": "bf16", "engine": engine, "group_size": 4})
    tr = Trainer(cfg)
    assert tr.engine.engine_name == ("hf-bf16" if engine == "hf" else "fast-bf16")
    m = tr.train_step()
    # the behavior (bf16) and the fp32 recompute at the same weights differ: k != 1
    assert m["mismatch/old_vs_behavior_abs_dlogp_mean"] > 1e-4
    assert any(k.startswith("correction/tis/") for k in m)


def test_fp32_engine_has_no_mismatch(small_model_dir, tmp_path):
    # four groups of four: a step with a mixed group trains, so its forward (π_old in value
    # in a single on-policy update) logs the mismatch; a step with no signal runs no forward
    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r", method="tis", method_params={},
                             rollout={"prompts_per_step": 4, "group_size": 4}))
    m = tr.train_step()
    assert not m.get("skipped_no_signal")
    assert 0.0 <= m["mismatch/old_vs_behavior_abs_dlogp_mean"] < 1e-5
    assert m["mismatch/old_vs_behavior_abs_dlogp_max"] < 1e-4


def test_staleness_trains_on_batches_sampled_k_versions_ago(small_model_dir, tmp_path):
    # groups of 4: a batch whose every group has one outcome trains no row (zero advantages)
    cfg = tiny_config(small_model_dir, tmp_path / "r", method="missing_old_logits", method_params={},
                      rollout={"staleness": 2, "group_size": 4}, train={"steps": 4})
    tr = Trainer(cfg)
    rows = [tr.train_step() for _ in range(4)]
    assert rows[0].get("staleness/warming_up") == 1.0 and rows[1].get("staleness/warming_up") == 1.0
    # step 3 trains on the batch sampled at version 0 while the weights are at version 0
    # (nothing trained yet), step 4 on the batch of version 0 ... each lag is logged
    assert "staleness/versions_behind_mean" in rows[2] and "staleness/versions_behind_mean" in rows[3]
    assert rows[3]["staleness/versions_behind_mean"] >= 1.0
    # the old log-probs were taken at the sampling weights, so the first update of a stale
    # batch already sees a policy ratio != 1
    # (the PPO host's ratio π_θ/π_old is the staleness factor s of the decomposition)
    assert rows[3]["policy/ratio/mean"] != 1.0
    assert rows[2]["policy/ratio/mean"] == pytest.approx(1.0, abs=1e-6)  # lag 0


def test_single_use_method_refuses_a_stale_batch(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "r", method="online_icepop", method_params={},
                      rollout={"staleness": 1}, train={"steps": 4})
    tr = Trainer(cfg)
    tr.train_step()
    tr.train_step()  # trains the version-0 batch at version 0: fine
    with pytest.raises(BatchReuseError):
        tr.train_step()  # the version-1 batch... sampled before the last update: stale


def test_single_use_method_refuses_multiple_epochs(small_model_dir, tmp_path):
    with pytest.raises(ValueError, match="exactly one update"):
        Trainer(tiny_config(small_model_dir, tmp_path / "r", method="online_icepop", method_params={},
                            train={"epochs": 2}))


def test_sis_draws_acceptance_from_recorded_topk(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "r", method="sis", method_params={},
                      rollout={"staleness": 1}, train={"steps": 3})
    tr = Trainer(cfg)
    rows = [tr.train_step() for _ in range(3)]
    acc = [r["correction/sis/accepted_frac"] for r in rows if "correction/sis/accepted_frac" in r]
    assert acc and all(0.0 <= a <= 1.0 for a in acc)


@pytest.mark.parametrize("engine_correction", ["tis", "icepop", "kpop"])
def test_missing_old_logits_with_each_engine_correction(engine_correction, small_model_dir, tmp_path):
    cfg = tiny_config(small_model_dir, tmp_path / "r", method="missing_old_logits",
                      method_params={"engine_correction": engine_correction},
                      rollout={"engine_dtype": "bf16", "group_size": 4})
    m = Trainer(cfg).train_step()
    assert m["skipped_nonfinite"] == 0.0 and any(k.startswith(f"correction/{engine_correction}/") for k in m)
