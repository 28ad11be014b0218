"""`policylab compare`: methods x seeds on one task and budget, one run directory each,
resumable, one report; refusals before any run starts. Tiny random Llama throughout."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from policylab.experiments.compare import compare, feed_problems, load_plan, plan_from_dict
from policylab.errors import ConfigError


def config(tmp_path, model_dir, methods=("grpo", "rloo"), seeds=(0,), budget=None, **run):
    base = {
        "model": str(model_dir),
        "task": {"name": "arithmetic", "digits": 2, "reward": "trainer_utils:gold_or_even"},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "train": {"lr": 1e-3, "micro_batch_size": 4},
        "eval": {"n": 4, "every": 1, "max_new_tokens": 4},
        "log": {"tensorboard": False, "plot_every": 0},
    }
    for k, v in run.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return {"out_dir": str(tmp_path / "cmp"), "methods": list(methods), "seeds": list(seeds),
            "budget": budget or {"steps": 2}, "target_accuracy": 0.5, "common_method_params": {"kl_coef": 0.0},
            "run": base}


def write(tmp_path, data, name="compare.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def stream_digests(cfg, n):
    from policylab.tasks.source import build_task

    return [hashlib.sha256(e.prompt.encode()).hexdigest()[:12] for e in build_task(cfg.task, seed=cfg.seed).next_train(n)]


def test_compare_runs_writes_the_report_and_every_method_sees_the_same_prompts(tmp_path, small_model_dir):
    data = config(tmp_path, small_model_dir, methods=("grpo", "rloo", "dapo"), seeds=(0, 1))
    report = compare(write(tmp_path, data))
    out = tmp_path / "cmp"
    assert (out / "compare.md").is_file() and (out / "curves.png").stat().st_size > 1000
    assert json.loads((out / "compare.json").read_text())["runs_finished"] == 6
    assert set(report["methods"]) == {"grpo", "rloo", "dapo"}
    for lab, m in report["methods"].items():
        # base, step 1 (eval.every=1; the last step's evaluation is the final one), final
        assert [p["step"] for p in m["curve"]] == [0, 1] and m["final"]["step"] == 2
        assert 0 <= m["final"]["accuracy"] <= 1 and m["final"]["stderr"] > 0 and m["seeds"] == [0, 1]
        assert m["tokens_per_s"] > 0 and m["peak_rss_mb"] > 100
    assert report["methods"]["rloo"]["vs_first"]["reference"] == "grpo"
    # same prompts in the same order: per seed, every run's recorded stream is a prefix of
    # the task's own training stream (DAPO may draw further along it: refills)
    for seed in (0, 1):
        runs = [json.loads((out / "runs" / f"{lab}-seed{seed}" / "report.json").read_text())
                for lab in ("grpo", "rloo", "dapo")]
        plan_cfg = next(r.cfg for r in load_plan(tmp_path / "compare.yaml").runs if r.seed == seed)
        longest = max(len(r["prompt_digests"]) for r in runs)
        want = stream_digests(plan_cfg, longest)
        for r in runs:
            assert len(r["prompt_digests"]) >= 4 and r["prompt_digests"] == want[: len(r["prompt_digests"])]
        assert runs[0]["prompt_digests"] == runs[1]["prompt_digests"]  # grpo and rloo: identical streams
    assert all(v["agree"] and v["runs"] == 3 for v in report["same_prompts"].values())
    assert report["same_prompts"]["0"]["common_prefix"] >= 4
    seed0 = stream_digests(load_plan(tmp_path / "compare.yaml").runs[0].cfg, 4)
    assert seed0 != stream_digests(next(r.cfg for r in load_plan(tmp_path / "compare.yaml").runs if r.seed == 1), 4)
    md = (out / "compare.md").read_text()
    assert "| `grpo` | 2 |" in md and "Same prompts in the same order: seed 0: 3 runs agree" in md
    # everything is finished: a second call runs nothing and rewrites the same numbers
    stamp = (out / "runs" / "grpo-seed0" / "metrics.jsonl").stat().st_mtime_ns
    again = compare(write(tmp_path, data))
    assert (out / "runs" / "grpo-seed0" / "metrics.jsonl").stat().st_mtime_ns == stamp
    assert again["methods"]["dapo"]["final"] == report["methods"]["dapo"]["final"]


def test_an_interrupted_comparison_resumes_and_equals_the_uninterrupted_one(tmp_path, small_model_dir, monkeypatch):
    from policylab.trainer import loop as trainer_mod
    from policylab.errors import RunInterrupted

    def data_in(d):
        d.mkdir()
        return config(d, small_model_dir, budget={"steps": 3},
                      log={"tensorboard": False, "plot_every": 0, "checkpoint_every": 1})

    ref = compare(write(tmp_path / "a", data_in(tmp_path / "a")))
    path = write(tmp_path / "b", data_in(tmp_path / "b"))
    real = trainer_mod.Trainer.train_step
    calls = {"n": 0}

    def flaky(self):
        calls["n"] += 1
        if calls["n"] == 5:  # grpo's 3 steps, then rloo's second step
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", flaky)
    with pytest.raises(RunInterrupted, match=r"stopped at run rloo seed 0: run `policylab compare .*` again"):
        compare(path)
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", real)
    states = {r.label: r.state for r in load_plan(path).runs}
    assert states == {"grpo": "done", "rloo": "resume"}
    out = compare(path)
    rloo_log = (tmp_path / "b" / "cmp" / "runs" / "rloo-seed0" / "metrics.jsonl").read_text()
    assert '"event": "resumed_from"' in rloo_log
    for lab in ("grpo", "rloo"):
        assert out["methods"][lab]["final"]["accuracy"] == ref["methods"][lab]["final"]["accuracy"]
        assert [p["accuracy"] for p in out["methods"][lab]["curve"]] == \
            [p["accuracy"] for p in ref["methods"][lab]["curve"]]
    assert [r["resumed"] for r in out["runs"]] == [False, True]


def test_seconds_and_tokens_budgets_stop_the_runs(tmp_path, small_model_dir):
    rep = compare(write(tmp_path, config(tmp_path, small_model_dir, methods=("grpo",),
                                         budget={"seconds": 1e-6, "max_steps": 50})))
    run = rep["runs"][0]
    assert run["stopped_by"] == "budget_seconds" and run["steps"] == 1  # checked after each step
    data = config(tmp_path, small_model_dir, methods=("grpo",), budget={"tokens": 10, "max_steps": 50})
    data["out_dir"] = str(tmp_path / "tok")
    rep = compare(write(tmp_path, data, "tok.yaml"))
    run = rep["runs"][0]
    # 2 prompts x 2 samples x <= 4 tokens per step: 10 tokens take 1 to 3 steps (at most 16 per step)
    assert run["stopped_by"] == "budget_tokens" and run["sampled_tokens"] >= 10
    assert run["sampled_tokens"] - 16 < 10


def test_keep_checkpoints_false_deletes_only_finished_runs_checkpoints(tmp_path, small_model_dir):
    data = config(tmp_path, small_model_dir, methods=("grpo",), seeds=(0, 1), log={"checkpoint_every": 1})
    kept = compare(write(tmp_path, data))
    runs = tmp_path / "cmp" / "runs"
    assert all(any((runs / f"grpo-seed{s}" / "checkpoints").iterdir()) for s in (0, 1))  # default: kept
    data["out_dir"] = str(tmp_path / "drop")
    data["keep_checkpoints"] = False
    dropped = compare(write(tmp_path, data, "drop.yaml"))
    runs = tmp_path / "drop" / "runs"
    assert not any((runs / f"grpo-seed{s}" / "checkpoints").exists() for s in (0, 1))
    # the report needs only report.json and metrics.jsonl: the same numbers, and a second
    # call still counts both runs as finished (nothing re-runs)
    a, b = dropped["methods"]["grpo"]["final"], kept["methods"]["grpo"]["final"]
    assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}
    assert all(r.state == "done" for r in load_plan(tmp_path / "drop.yaml").runs)


def _refused(tmp_path, data, match):
    with pytest.raises(ConfigError, match=match):
        plan_from_dict(data, source="c.yaml")
    assert not (tmp_path / "cmp").exists()  # nothing ran, nothing was written


def test_bad_compare_configs_are_refused_before_any_run(tmp_path, small_model_dir):
    good = config(tmp_path, small_model_dir)
    _refused(tmp_path, {**good, "methods": ["grpo", "dr_grpoo"]}, r"unknown method 'dr_grpoo'\. Did you mean: dr_grpo")
    _refused(tmp_path, {**good, "methods": ["grpo", "grpo"]}, r"label\(s\) \['grpo'\] appear more than once")
    _refused(tmp_path, {**good, "methods": [{"name": "grpo", "train": {"lr": 1}}]},
             r"unknown key\(s\) \['train'\]; a method entry takes name, label and method_params")
    _refused(tmp_path, {**good, "methods": [{"name": "dapo", "method_params": {"eps_hi": 0.3}}]},
             r"dapo: method `dapo` has no parameter `eps_hi`")
    _refused(tmp_path, {**good, "seeds": [0, 0]}, "distinct integers")
    _refused(tmp_path, {**good, "report_dir": ""}, "`report_dir` must name a directory")
    _refused(tmp_path, {**good, "keep_checkpoints": "no"}, "`keep_checkpoints` must be true or false, got 'no'")
    _refused(tmp_path, {**good, "methodz": []}, r"unknown key `methodz`\. Did you mean: methods")
    # incompatible budgets
    _refused(tmp_path, {**good, "budget": {"steps": 2, "seconds": 60}}, "exactly one of steps, seconds, tokens")
    _refused(tmp_path, {**good, "budget": {"seconds": -1}}, "must be a positive number")
    bad = config(tmp_path, small_model_dir, budget={"seconds": 60}, train={"decay": "cosine"})
    _refused(tmp_path, bad, "decay` is 'cosine' with a seconds budget")
    bad = config(tmp_path, small_model_dir, budget={"steps": 5}, train={"steps": 7})
    _refused(tmp_path, bad, r"`run.train.steps` \(7\) and `budget.steps` \(5\) disagree")
    bad = config(tmp_path, small_model_dir, budget={"tokens": 1000}, train={"steps": 7})
    _refused(tmp_path, bad, "is set with a tokens budget")
    _refused(tmp_path, config(tmp_path, small_model_dir, methods=("grpo", "vapo"), budget={"steps": 2}),
             r"vapo: value_pretrain_steps=\d+ critic-only steps use the whole budget of 2 steps")
    # every problem at once, numbered
    with pytest.raises(ConfigError, match=r"\(1\) `budget` must be one of .*; \(2\) unknown method 'nope'"):
        plan_from_dict({**good, "methods": ["nope"], "budget": {}}, source="c.yaml")


def test_a_task_whose_base_accuracy_cannot_be_measured_is_refused(tmp_path, small_model_dir):
    train_file = tmp_path / "t.jsonl"
    train_file.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    _refused(tmp_path, config(tmp_path, small_model_dir, task={"name": "jsonl", "path": str(train_file)}),
             "base accuracy cannot be measured: evaluation needs task.heldout_path")
    _refused(tmp_path, config(tmp_path, small_model_dir, eval={"n": 0}), r"run.eval.n=0: the base accuracy")
    _refused(tmp_path, config(tmp_path, small_model_dir, task={"reward": "trainer_utils:zero_reward"}),
             r"the verifier `trainer_utils:zero_reward` gives the reference answer itself 0 on 4 of 4")
    _refused(tmp_path, config(tmp_path, small_model_dir, eval={"before": False}), "reports the base")
    _refused(tmp_path, config(tmp_path, small_model_dir, model=str(tmp_path)), "is a directory but not a model")


@pytest.mark.parametrize("name", ["code", "distribution"])
def test_a_task_whose_gold_is_not_a_reply_checks_its_verifier_on_a_reference_reply(name):
    # the gold of a code example is the function's name and of a distribution example its outcome
    # set: neither is a reply the verifier accepts; the task's reference reply (the reference
    # solution in a code block, one outcome alone) is, and a wrong reply still is not
    from policylab.experiments.compare.checks import _rejected
    from policylab.tasks.config import TaskConfig
    from policylab.tasks.source import build_task

    task = build_task(TaskConfig(name=name), seed=0)
    held = task.heldout(4)
    assert _rejected(task.reward_fn, held, name, task.reference_reply) == []
    assert _rejected(task.reward_fn, held, name) == [0, 1, 2, 3]
    assert _rejected(task.reward_fn, held, name, lambda e: "no idea") == [0, 1, 2, 3]
    if name == "code":
        assert task.reference_reply(held[0]).startswith("```python\n")
    else:
        assert task.reference_reply(held[0]) == held[0].meta["classes"][0]


def test_a_method_the_task_cannot_feed_is_refused(tmp_path, small_model_dir):
    pytest.importorskip("reasoning_gym")
    # spell_backward's answers are words: Range-GRPO's interval judge reads numbers
    words = config(tmp_path, small_model_dir, methods=("grpo", "range_grpo", "gprl"),
                   task={"name": "reasoning_gym", "dataset": "spell_backward", "reward": "auto"})
    _refused(tmp_path, words, r"range_grpo: range_grpo gets reward_intervals from stage `interval_judge` "
                              r"\(policylab.kernels.rewards.graded.numeric_interval\), which needs numeric gold answers")
    with pytest.raises(ConfigError, match=r"gprl: gprl gets reward_vectors"):
        plan_from_dict(words, source="c.yaml")
    # the same methods on a numeric task are fed
    plan = plan_from_dict(config(tmp_path, small_model_dir, methods=("range_grpo", "gprl")), source="c.yaml")
    assert [r.label for r in plan.runs] == ["range_grpo", "gprl"]


def test_feed_problems_reads_the_spec():
    import dataclasses

    from policylab import methods
    from policylab.methods.spec import Stage

    rg = methods.get("range_grpo")
    assert feed_problems(rg, numeric_answers=True) == []
    # without its judge stage nothing writes the intervals its advantage reads
    no_judge = dataclasses.replace(rg, rewards=tuple(s for s in rg.rewards if "reward_intervals" not in s.writes))
    assert feed_problems(no_judge, numeric_answers=True) == [
        "range_grpo reads `reward_intervals` (stage `range_grpo`), which neither its stages nor the trainer produce: "
        "no task can feed it"]
    assert isinstance(rg.advantage, Stage)


def test_a_run_directory_made_with_another_config_is_refused(tmp_path, small_model_dir):
    data = config(tmp_path, small_model_dir, methods=("grpo",))
    compare(write(tmp_path, data))
    data["run"]["train"]["lr"] = 5e-4
    with pytest.raises(ConfigError, match=r"grpo-seed0 holds a run made with another config \(differs in train.lr\)"):
        load_plan(write(tmp_path, data))
    # the same runs copied to another out_dir (another checkout, restored logs) are the same runs:
    # done there, not refused for the run_dir their config recorded
    import shutil

    data["run"]["train"]["lr"] = config(tmp_path, small_model_dir, methods=("grpo",))["run"]["train"]["lr"]
    shutil.copytree(data["out_dir"], tmp_path / "moved")
    data["out_dir"] = str(tmp_path / "moved")
    assert [r.state for r in load_plan(write(tmp_path, data)).runs] == ["done"]


def test_cli_compare(tmp_path, small_model_dir):
    from cli_utils import cli_inprocess as cli  # the subprocess is not what this checks

    data = config(tmp_path, small_model_dir, methods=("grpo",))
    path = write(tmp_path, data)
    res = cli("compare", path, "--plan")
    assert res.returncode == 0, res.stderr
    assert "1 method(s) x 1 seed(s) = 1 runs" in res.stdout and "new" in res.stdout
    res = cli("compare", path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "cmp" / "compare.md").is_file()
    res = cli("compare", path, "--report-only")
    assert res.returncode == 0 and "1 of 1 runs" in res.stdout
    # the report (not the run directories) can go elsewhere
    other = write(tmp_path, {**data, "report_dir": str(tmp_path / "report")}, "other.yaml")
    res = cli("compare", other, "--report-only")
    assert res.returncode == 0 and "1 of 1 runs" in res.stdout, res.stderr
    assert sorted(x.name for x in (tmp_path / "report").iterdir()) == ["compare.json", "compare.md", "curves.png"]
    bad = write(tmp_path, {**data, "methods": ["nope"]}, "bad.yaml")
    res = cli("compare", bad)
    assert res.returncode == 2
    assert res.stderr.startswith("policylab: error: ") and "unknown method 'nope'" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["harder_task", "smoke_real", "reasoning_gym_basic_arith"])
def test_the_shipped_compare_configs_load(name, tmp_path, monkeypatch):
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "configs" / "compare" / f"{name}.yaml"
    monkeypatch.chdir(tmp_path)  # their run directories are relative: none exists here
    plan = load_plan(path)
    assert plan.runs and all(r.state == "new" for r in plan.runs)
    assert plan.report_to.parts[:2] == ("benchmarks", "results") and plan.out_dir.parts[0] == "runs"
    if name == "harder_task":
        assert {r.method for r in plan.runs} == {"grpo", "dr_grpo", "dapo", "gspo", "cispo", "gppo", "rloo",
                                                 "reinforce_pp_baseline", "vapo"}
        assert len(plan.runs) == 18 and plan.seeds == [0, 1]
