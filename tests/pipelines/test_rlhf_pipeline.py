"""The ppo_rlhf pipeline end to end on the tiny random model: each stage's checkpoint,
the report, the frozen reward model in the PPO run, resume with the RM fingerprint, no
held-out prompt in SFT or RM training, and bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from policylab.models import loading as models
from policylab.cli import main
from policylab.errors import ConfigError
from policylab.errors import PolicylabError, RunDirError
from policylab.pipelines import rlhf
from policylab.models.reward_model import RewardModel, load_reward_model
from policylab.tasks.arithmetic import ArithmeticTask
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def _tiny_pipeline(model_dir, run_dir) -> dict:
    return {"pipeline": "ppo_rlhf", "run_dir": str(run_dir), "model": str(model_dir), "seed": 1,
            "sft": {"steps": 2, "batch_size": 4, "lr": 1e-3},
            "reward_model": {"steps": 2, "prompts_per_step": 2, "lr": 1e-3, "heldout_prompts": 4},
            "ppo": {"rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
                    "train": {"steps": 2, "lr": 1e-3, "micro_batch_size": 2}},
            "eval": {"prompts": 4, "samples": 2, "max_new_tokens": 4}}


def test_the_pipeline_writes_each_stage_and_the_report(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    cfg = rlhf.load_config(_write(tmp_path / "p.yaml", _tiny_pipeline(tiny_model_dir, run_dir)))
    report = rlhf.run(cfg)
    # stage 1 -> 2 -> 3: each wrote what the next one loads
    assert (run_dir / "sft" / "config.json").is_file() and (run_dir / "sft" / "model.safetensors").is_file()
    rm_dir = run_dir / "reward_model"
    assert (rm_dir / "reward_model.json").is_file() and (rm_dir / "head.safetensors").is_file()
    assert (rm_dir / "backbone" / "config.json").is_file()
    ckpts = sorted((run_dir / "ppo" / "checkpoints").glob("step_*"))
    assert ckpts and (ckpts[-1] / "model.safetensors").is_file()
    ppo_cfg = yaml.safe_load((run_dir / "ppo" / "config.yaml").read_text())
    assert ppo_cfg["method"] == "ppo_rlhf" and ppo_cfg["model"] == str(run_dir / "sft")
    assert ppo_cfg["method_params"]["reward_model"] == str(rm_dir)
    # the PPO run logged the RM score and the KL penalty from its reward
    rows = [json.loads(x) for x in (run_dir / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert any("rlhf/rm_score_mean" in r and "kl/reward_penalty_mean" in r for r in rows)
    # the report (json and md) has the fields
    on_disk = json.loads((run_dir / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(report))
    assert 0.0 <= report["rm_heldout_pair_accuracy"] <= 1.0
    assert report["stages"]["reward_model"]["heldout_pairs"] == 4 * 6
    ev = report["evaluation"]
    for when in ("before_ppo", "after_ppo"):
        for key in ("rm_score_mean", "true_score_mean", "true_preference_win_rate_vs_sft", "accuracy"):
            assert isinstance(ev[when][key], float), (when, key)
        assert 0.0 <= ev[when]["true_preference_win_rate_vs_sft"] <= 1.0
    assert ev["heldout_prompts_in_sft_or_rm_training"] == 0
    md = (run_dir / "report.md").read_text()
    assert "held-out pair accuracy" in md and "| after PPO |" in md and "| before PPO (SFT) |" in md
    # a second pipeline into the same directory is refused without --overwrite
    with pytest.raises(RunDirError, match="--overwrite"):
        rlhf.run(cfg)


def test_no_heldout_prompt_reaches_sft_demonstrations_or_rm_pairs(tiny_model, tokenizer):
    task = ArithmeticTask(seed=5)
    heldout = {e.prompt for e in task.heldout(task.heldout_size())}
    out = rlhf.sft(tiny_model, tokenizer, task, steps=2, batch_size=40, lr=1e-4)
    rm = RewardModel(models.tiny_llama(tokenizer))
    out_rm = rlhf.train_reward_model(rm, tokenizer, task, steps=2, prompts_per_step=40, lr=1e-4)
    seen = set(out["prompts"]) | set(out_rm["prompts"])
    assert len(out["prompts"]) == 80 and len(out_rm["prompts"]) == 80
    assert seen and not seen & heldout
    # the train stream covers a good part of the train split in 160 draws: the check is not vacuous
    assert len(seen) > 40


def test_the_reward_model_is_frozen_in_the_ppo_run(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "r", method="ppo_rlhf", method_params={"reward_model": "untrained"})
    tr = Trainer(cfg)
    rm = tr.controllers["reward_model"].model
    rm_params = {id(p) for p in rm.parameters()}
    in_opt = {id(p) for g in tr.optimizer.param_groups for p in g["params"]}
    if tr.critic_opt is not None:
        in_opt |= {id(p) for g in tr.critic_opt.param_groups for p in g["params"]}
    assert rm_params and not rm_params & in_opt  # no optimizer group holds an RM weight
    assert not any(p.requires_grad for p in rm.parameters()) and not rm.training
    before = {k: v.clone() for k, v in rm.state_dict().items()}
    policy_before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    m = tr.train_step()
    assert "rlhf/rm_score_mean" in m
    assert all(p.grad is None for p in rm.parameters())
    for k, v in rm.state_dict().items():
        assert torch.equal(v, before[k]), k
    if tr.policy_version:  # the policy did move: the RM is not just an alias of it
        assert any(not torch.equal(v, policy_before[k]) for k, v in tr.model.state_dict().items())


def test_a_ppo_run_without_a_reward_model_is_refused(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "r", method="ppo_rlhf", method_params={})
    with pytest.raises(PolicylabError, match="needs a trained reward model"):
        Trainer(cfg)
    cfg = tiny_config(tiny_model_dir, tmp_path / "r2", method="ppo_rlhf", method_params={"reward_model": str(tmp_path)})
    with pytest.raises(PolicylabError, match="not a reward model directory"):
        Trainer(cfg)


def _rm_dir(tokenizer, path: Path) -> Path:
    rm = RewardModel(models.tiny_llama(tokenizer, seed=4), seed=2)
    return rm.save(path, tokenizer, {"steps": 0})


def test_resume_checks_the_reward_models_fingerprint(tiny_model_dir, tokenizer, tmp_path):
    from policylab.trainer.run import resume
    from policylab.trainer.run import train

    rm_dir = _rm_dir(tokenizer, tmp_path / "rm")
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", method="ppo_rlhf", method_params={"reward_model": str(rm_dir)},
                      train={"steps": 1})
    train(cfg, overwrite=True)
    state = json.loads(next((tmp_path / "run" / "checkpoints").glob("step_*/state.json")).read_text())
    assert "reward_model" in json.dumps(state)  # its spec and fingerprint are checkpointed, not its weights
    # same reward model: the run resumes and trains on
    resume(tmp_path / "run", ["train.steps=2"], allow_imports=True)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))[-1].endswith("2")
    # the RM directory now holds other weights: resuming against it is refused
    w = load_file(str(rm_dir / "head.safetensors"))
    save_file({"weight": w["weight"] + 1.0, "bias": w["bias"]}, str(rm_dir / "head.safetensors"))
    with pytest.raises(PolicylabError, match="other weights"):
        resume(tmp_path / "run", ["train.steps=3"], allow_imports=True)


def test_reward_model_directory_round_trip_and_refusals(tokenizer, tmp_path):
    rm_dir = _rm_dir(tokenizer, tmp_path / "rm")
    rm, tok, summary = load_reward_model(rm_dir)
    again, _, _ = load_reward_model(rm_dir)
    ids = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 2]])
    att = torch.tensor([[True, True, True, True], [True, True, True, False]])
    torch.testing.assert_close(rm.score(ids, att), again.score(ids, att))
    # the score reads the last attended token: padding after it changes nothing
    wider = torch.cat([ids, torch.full((2, 3), 2)], 1)
    torch.testing.assert_close(rm.score(wider, torch.cat([att, torch.zeros(2, 3, dtype=torch.bool)], 1)),
                               rm.score(ids, att))
    with pytest.raises(PolicylabError, match="not a reward model directory"):
        load_reward_model(tmp_path)


def test_bad_pipeline_configs_are_refused_with_the_reason(tiny_model_dir, tmp_path):
    base = _tiny_pipeline(tiny_model_dir, tmp_path / "run")

    def bad(change, match):
        cfg = json.loads(json.dumps(base))
        change(cfg)
        with pytest.raises(ConfigError, match=match):
            rlhf.load_config(_write(tmp_path / "bad.yaml", cfg))

    bad(lambda c: c["sft"].update(stpes=3), "unknown key `sft.stpes`. Did you mean: steps")
    bad(lambda c: c.update(rm={}), "unknown key")
    bad(lambda c: c["sft"].update(steps=0), "sft.steps must be >= 1")
    bad(lambda c: c["sft"].update(lr="fast"), "must be like")
    bad(lambda c: c["ppo"].update(task={"name": "gsm"}), "ppo.task cannot be set")
    bad(lambda c: c["ppo"].update(method_params={"reward_model": "x"}), "set by the pipeline")
    bad(lambda c: c.update(pipeline="fusion"), "not 'ppo_rlhf'")
    bad(lambda c: c["task"].update(ops=["/"]) if "task" in c else c.update(task={"ops": ["/"]}), "task:")
    with pytest.raises(ConfigError, match="not found"):
        rlhf.load_config(tmp_path / "missing.yaml")
    # a PPO section the run config refuses fails before any stage runs (nothing written)
    cfg = json.loads(json.dumps(base))
    cfg["ppo"]["method_params"] = {"kl_placement": "loss"}
    loaded = rlhf.load_config(_write(tmp_path / "late.yaml", cfg))
    with pytest.raises(PolicylabError, match="kl_placement"):
        rlhf.run(loaded)
    assert not (tmp_path / "run" / "sft").exists()


def test_the_cli_reports_a_bad_pipeline_config_in_one_line(tmp_path, capsys):
    p = _write(tmp_path / "p.yaml", {"pipeline": "ppo_rlhf", "sft": {"stpes": 1}})
    assert main(["pipeline", "ppo_rlhf", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("policylab: error:") and "sft.stpes" in err


def test_the_shipped_pipeline_configs_load():
    for path in sorted((REPO / "configs" / "pipelines").glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["pipeline"]
        mod = {"ppo_rlhf": rlhf}.get(name)
        if mod is None:
            from policylab.pipelines import fusion as mod
        cfg = mod.load_config(path)
        assert cfg["run_dir"]
