"""Smoke tests, on the tiny random model, of the benchmark scripts of the method
comparison: base accuracy of candidate tasks, learning speed against TRL (the policylab
half; the TRL half needs trl, `make learn-vs-trl`), off-policy stress."""

from __future__ import annotations

import json

import pytest
from bench_scripts import load as _load


def test_base_accuracy_tiny(tmp_path, small_model_dir):
    base = _load("base_accuracy")
    res = base.main(["--model", str(small_model_dir), "--n", "4", "--only", "arith2_add", "chain_sum_3x1",
                     "--out", str(tmp_path / "b")])
    assert set(res) == {"arith2_add", "chain_sum_3x1"}
    for r in res.values():
        assert r["n_prompts"] == 4 and 0 <= r["accuracy"] <= 1 and r["distinct_prompts"] == 4
    assert res["chain_sum_3x1"]["verifier"] == "dataset" and res["arith2_add"]["verifier"] == "exact_numeric"
    md = (tmp_path / "b.md").read_text()
    assert "| arith2_add | arithmetic digits=2 ops=+ | exact_numeric | 16 |" in md
    with pytest.raises(SystemExit, match="unknown candidate"):
        base.main(["--only", "nope", "--out", ""])


def _learn_args(model_dir, out, sides="policylab"):
    return ["--model", str(model_dir), "--task", "arith2_add", "--budget-s", "3", "--eval-every-s", "1",
            "--eval-n", "4", "--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--micro-batch", "4",
            "--sides", sides, "--seeds", "0", "--out", str(out)]


def test_learn_vs_trl_policylab_half_tiny(tmp_path, small_model_dir):
    learn = _load("learn_vs_trl")
    report = learn.main(_learn_args(small_model_dir, tmp_path / "l"))
    side = report["runs"]["policylab"][0]
    pts = side["points"]
    # no timed bound: the base point is taken before the first step, the points follow
    # the training clock in order, and the run stops only once its budget is spent (the
    # loop's stopping rule; 3 s here) or the step cap is reached
    assert pts[0]["step"] == 0
    assert len(pts) >= 2 and [p["seconds"] for p in pts] == sorted(p["seconds"] for p in pts)
    assert [p["step"] for p in pts] == sorted(p["step"] for p in pts) and pts[-1]["step"] >= 1
    assert side["train_seconds"] >= 3
    assert side["prompts_seen"] == 2 * pts[-1]["step"]  # the task's stream, 2 prompts per step
    assert (tmp_path / "l.png").stat().st_size > 1000 and "| policylab | 0 |" in (tmp_path / "l.md").read_text()


@pytest.mark.skipif(not __import__("policylab.engines.cpu", fromlist=["x"]).bf16_training_native(),
                    reason="the fast mode needs native bf16 (avx512_bf16 / amx_bf16), which this CPU has not")
def test_learn_vs_trl_fast_side_and_step_schedule_tiny(tmp_path, small_model_dir):
    """The fast mode's side trains with the bf16 engine and TIS; --eval-every-steps puts the
    evaluations at step multiples; both policylab sides give the equal-steps comparison."""
    learn = _load("learn_vs_trl")
    args = _learn_args(small_model_dir, tmp_path / "f", "policylab,policylab-fast")
    args[args.index("--eval-every-s") + 1] = "0"
    report = learn.main(args + ["--eval-every-steps", "2"])
    fast = report["runs"]["policylab-fast"][0]
    assert fast["engine"] == "fast-bf16" and fast["corrections"] == ["tis"]
    assert report["runs"]["policylab"][0]["corrections"] == []
    steps = [p["step"] for p in fast["points"]]
    assert all(s % 2 == 0 for s in steps[1:-1]) and steps[0] == 0
    eq = report["fast_vs_exact"][0]
    assert eq["step"] == min(fast["points"][-1]["step"], report["runs"]["policylab"][0]["points"][-1]["step"])


@pytest.mark.skipif(not __import__("policylab.engines.cpu", fromlist=["x"]).bf16_training_native(),
                    reason="the fast mode needs native bf16 (avx512_bf16 / amx_bf16), which this CPU has not")
def test_learn_vs_trl_fast_side_without_its_correction_tiny(tmp_path, small_model_dir):
    """--fast-correction none: the same bf16 sampler and training dtype as the fast mode, no
    correction stage, and the report says so."""
    from policylab.methods.fast_mode import train_dtype

    learn = _load("learn_vs_trl")
    report = learn.main(_learn_args(small_model_dir, tmp_path / "u", "policylab-fast") + ["--fast-correction", "none"])
    run = report["runs"]["policylab-fast"][0]
    assert run["engine"] == "fast-bf16" and run["corrections"] == []
    assert run["train_dtype"] == train_dtype("fast-bf16")
    assert "WITHOUT the correction" in (tmp_path / "u.md").read_text()
    # --eval-bf16: every point also scored by the bf16 engine on the same prompts
    report = learn.main(_learn_args(small_model_dir, tmp_path / "b", "policylab") + ["--eval-bf16"])
    pts = report["runs"]["policylab"][0]["points"]
    assert all(0.0 <= p["accuracy_bf16"] <= 1.0 and p["accuracy_bf16_stderr"] >= 0.0 for p in pts)


def test_learn_vs_trl_without_native_bf16_runs_the_exact_side_alone(tmp_path, small_model_dir, monkeypatch):
    from policylab.engines import cpu

    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: frozenset({"avx2"}))
    learn = _load("learn_vs_trl")
    report = learn.main(_learn_args(small_model_dir, tmp_path / "s", "policylab,policylab-fast"))
    assert set(report["runs"]) == {"policylab"} and "fast_vs_exact" not in report
    assert "policylab-fast: not run, this CPU has no native bf16" in (tmp_path / "s.md").read_text()


def test_learn_vs_trl_spread_and_equal_steps_rules():
    learn = _load("learn_vs_trl")
    # two seeds with ratios 2.0 and 1.5: mean 1.75, spread [1.5, 2.0]
    s = learn.spread({0: {"value": 2.0, "text": "2.000"}, 1: {"value": 1.5, "text": "1.500"}})
    assert s["mean"] == 1.75 and s["min"] == 1.5 and s["max"] == 2.0 and s["text"] == "1.750 [1.500, 2.000]"
    # a bounded seed: no mean, every seed's text
    s = learn.spread({0: {"value": 2.0, "text": "2.000"}, 1: {"value": None, "text": "<0.500"}})
    assert "mean" not in s and s["text"] == "2.000, <0.500"
    # equal steps: exact evaluated at steps 0, 10, 20 (0.2, 0.4, 0.6), fast at 0, 16 (0.2, 0.5):
    # at step 16, exact = 0.4 + 0.6 * (0.6 - 0.4) = 0.52; fast 0.5; difference -0.02;
    # se: exact 0.02 + 0.6 * (0.04 - 0.02) = 0.032, fast 0.03 -> sqrt(0.032^2 + 0.03^2) = 0.04386
    def pts(*rows):
        return {"points": [{"step": st, "accuracy": acc, "accuracy_stderr": se} for st, acc, se in rows]}
    eq = learn.equal_steps(pts((0, 0.2, 0.01), (10, 0.4, 0.02), (20, 0.6, 0.04)), pts((0, 0.2, 0.01), (16, 0.5, 0.03)))
    assert eq["step"] == 16 and eq["exact"] == pytest.approx(0.52) and eq["fast"] == 0.5
    assert eq["diff"] == pytest.approx(-0.02) and eq["diff_se"] == pytest.approx(0.0438634, rel=1e-5)
    assert eq["within_2se"] is True
    clock = learn.Clock(0.0, every_steps=3)
    assert [clock.due(k) for k in range(7)] == [False, False, False, True, False, False, True]


def test_learn_vs_trl_per_step_against_trl_and_report_rewrite(tmp_path):
    """Every policylab side against TRL at the last step both reached, hand-worked, and
    `--report-from` rewriting a finished run's report from its JSON alone."""
    learn = _load("learn_vs_trl")

    def run(*rows):
        return {"points": [{"step": st, "seconds": 10.0 * st, "accuracy": acc, "accuracy_stderr": se}
                           for st, acc, se in rows], "train_seconds": 10.0 * rows[-1][0], "peak_rss_mb": 1.0,
                "load_before": 0.1, "load_after": 0.2, "engine": "e", "prompts_seen": 8}

    # TRL reaches step 4 (0.1 -> 0.5); policylab evaluated at 0, 3, 6 (0.1, 0.4, 0.7): at step 4,
    # 0.4 + (1/3) * 0.3 = 0.5, se 0.03 + (1/3) * 0.03 = 0.04; TRL se 0.03 -> diff 0 ± 0.05
    report = {"command": "c", "machine": "m", "config": "cfg",
              "runs": {"trl": {"0": run((0, 0.1, 0.02), (4, 0.5, 0.03))},
                       "policylab": {"0": run((0, 0.1, 0.02), (3, 0.4, 0.03), (6, 0.7, 0.06))}}}
    learn.add_vs_trl_equal_steps(report)
    eq = report["vs_trl_equal_steps"]["policylab"]["0"]
    assert eq["step"] == 4 and eq["trl"] == 0.5 and eq["policylab"] == pytest.approx(0.5)
    assert eq["policylab_se"] == pytest.approx(0.04) and eq["diff_se"] == pytest.approx(0.05)
    assert eq["within_2se"] is True
    path = tmp_path / "r.json"
    del report["vs_trl_equal_steps"]
    path.write_text(json.dumps(report))
    learn.main(["--report-from", str(path)])
    md = (tmp_path / "r.md").read_text()
    assert "policylab, seed 0, step 4: 50.0% ± 4.0 vs TRL 50.0% ± 3.0 (difference +0.0 ± 5.0" in md
    assert "vs_trl_equal_steps" in json.loads(path.read_text()) and (tmp_path / "r.png").stat().st_size > 1000


def test_learn_vs_trl_clock_without_a_schedule():
    learn = _load("learn_vs_trl")
    clock = learn.Clock(0.0)  # the base evaluation's clock: no schedule, never due
    clock.evaluated(0.01)
    assert not clock.due() and clock.paused == 0.01


def test_learn_vs_trl_ratio_rules():
    learn = _load("learn_vs_trl")

    def side(*pairs):
        return {"points": [{"seconds": s, "accuracy": acc} for s, acc in pairs]}

    # TRL: 0.1 -> 0.3 (first at 0.3 at 200 s); policylab reaches 0.3 at 100 s: ratio 2
    r = learn.ratio({"trl": side((0, 0.1), (100, 0.2), (200, 0.3), (300, 0.3)),
                     "policylab": side((0, 0.1), (100, 0.35), (300, 0.4))}, budget=300)
    assert r["value"] == 2.0 and r["text"] == "2.000"
    # policylab never reaches it: an upper bound t_trl / budget
    r = learn.ratio({"trl": side((0, 0.1), (150, 0.3)), "policylab": side((0, 0.1), (300, 0.2))}, budget=300)
    assert r["value"] is None and r["text"] == "<0.500"
    # TRL did not learn: no ratio
    r = learn.ratio({"trl": side((0, 0.2), (300, 0.2)), "policylab": side((0, 0.2), (300, 0.5))}, budget=300)
    assert r["text"] == "nan"


@pytest.mark.slow  # TRL import and trainer set-up; runs with `make test-all` when trl is installed
def test_learn_vs_trl_both_halves_tiny(tmp_path, small_model_dir, capsys):
    pytest.importorskip("trl")
    learn = _load("learn_vs_trl")
    report = learn.main(_learn_args(small_model_dir, tmp_path / "l", "trl,policylab"))
    assert report["same_prompts"] is True and "policylab" in report["ratios"]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("time_to_trl_accuracy_ratio=")


def test_offpolicy_stress_tiny(tmp_path, small_model_dir):
    stress = _load("offpolicy_stress")
    # a reward with mixed outcomes on a random model, so that updates happen and staleness is real
    task = json.dumps({"name": "arithmetic", "digits": 1, "reward": "trainer_utils:parity_reward"})
    report = stress.main(["--model", str(small_model_dir), "--task", task, "--steps", "5", "--eval-n", "4",
                          "--prompts", "2", "--group", "4", "--micro-batch", "4", "--max-new-tokens", "4",
                          "--lr", "1e-3", "--levels", "onpolicy,int4+stale1-mb2",
                          "--methods", "grpo,tis,gmc,missing_old_logits", "--smoke", "--out", str(tmp_path / "s")])
    assert report["corrections_level"] == "int4+stale1-mb2"
    assert set(report["runs"]) == {"grpo@onpolicy", "grpo@int4+stale1-mb2", "tis@int4+stale1-mb2",
                                   "gmc@int4+stale1-mb2", "missing_old_logits@int4+stale1-mb2"}
    stressed = report["runs"]["grpo@int4+stale1-mb2"]
    d = stressed["diagnostics"]
    # the int4 engine differs from the fp32 learner
    assert d["engine/kl_k3"] > 0 and 0 < d["engine/ess"] <= 1
    # step 1 only fills the queue; every later step trains the batch sampled one step earlier, which
    # is 2 versions behind (1 step x 2 minibatches) when the step in between updated (the first
    # trained batch is 0 behind): the mean lag is positive and the total mismatch adds staleness
    assert stressed["versions_behind_mean"] > 0
    assert d["total/kl_k3"] > d["engine/kl_k3"]
    assert report["runs"]["grpo@onpolicy"]["diagnostics"] == {}  # one engine, one update: nothing to measure
    assert "correction/tis/frac_capped" in report["runs"]["tis@int4+stale1-mb2"]["correction_diagnostics"]
    md = (tmp_path / "s.md").read_text()
    assert "smoke run" in md and "| int4+stale1-mb2 |" in md
    assert json.loads((tmp_path / "s.json").read_text())["verdict"] == report["verdict"]
    assert not (tmp_path / "s.partial.json").exists()  # the report is written: the partial file goes
    assert (tmp_path / "s.png").stat().st_size > 1000
    (tmp_path / "s.png").unlink()
    assert stress.main(["--replot", str(tmp_path / "s.json")])["verdict"] == report["verdict"]
    assert (tmp_path / "s.png").stat().st_size > 1000 and (tmp_path / "s.md").read_text() == md
    # an interrupted run: the finished runs were saved one by one; the same command reuses them
    saved = {"fingerprint": None, "runs": {}}
    args = ["--model", str(small_model_dir), "--task", task, "--steps", "2", "--eval-n", "4", "--prompts", "2",
            "--group", "4", "--micro-batch", "4", "--max-new-tokens", "4", "--lr", "1e-3",
            "--levels", "onpolicy,int4", "--methods", "grpo,tis", "--smoke", "--out", str(tmp_path / "r")]
    orig = stress.run_one
    calls = []

    def interrupted(task_, max_new, method, level, a, seed):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(f"{method}@{level}")
        return orig(task_, max_new, method, level, a, seed)

    stress.run_one = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            stress.main(args)
        saved = json.loads((tmp_path / "r.partial.json").read_text())
        assert sorted(saved["runs"]) == ["grpo@int4", "grpo@onpolicy"]
        calls.clear()
        stress.run_one = lambda *x: (calls.append(f"{x[2]}@{x[3]}"), orig(*x))[1]
        again = stress.main(args)
    finally:
        stress.run_one = orig
    assert calls == ["tis@int4"]  # only the run that had not finished
    assert again["runs"]["grpo@onpolicy"] == saved["runs"]["grpo@onpolicy"]
    assert not (tmp_path / "r.partial.json").exists()
    # another configuration: the saved runs are not reused
    (tmp_path / "r.partial.json").write_text(json.dumps(saved))
    calls.clear()
    stress.run_one = lambda *x: (calls.append(f"{x[2]}@{x[3]}"), orig(*x))[1]
    try:
        stress.main([*args[:-2], "--lr", "2e-3", "--out", str(tmp_path / "r")])
    finally:
        stress.run_one = orig
    assert calls[0] == "grpo@onpolicy"
    with pytest.raises(SystemExit, match="unknown level part"):
        stress.main(["--levels", "onpolicy,int9", "--out", ""])
    with pytest.raises(SystemExit, match="unknown --task"):
        stress.main(["--task", "nope", "--out", ""])


def test_learn_vs_trl_parts_are_reused_only_with_the_same_arguments(tmp_path, monkeypatch):
    learn = _load("learn_vs_trl")
    calls = []

    def fake_worker(side, argv):
        calls.append((side, list(argv)))
        return {"side": side, "points": [{"seconds": 0.0, "accuracy": 0.1, "step": 0}], "n": len(calls)}

    monkeypatch.setattr(learn, "run_worker", fake_worker)
    argv = ["--task", "arith2_add", "--seed", "0"]
    first = learn.run_part("policylab", argv, str(tmp_path), 0)
    assert calls == [("policylab", argv)] and first["part_argv"] == argv
    saved = json.loads((tmp_path / "policylab-seed0.json").read_text())
    assert saved["n"] == 1 and not list(tmp_path.glob("*.tmp"))
    again = learn.run_part("policylab", argv, str(tmp_path), 0)  # resumed: no second run
    assert len(calls) == 1 and again == saved
    with pytest.raises(SystemExit, match="other arguments"):  # a part of another configuration is never reused
        learn.run_part("policylab", ["--task", "arith2_sub", "--seed", "0"], str(tmp_path), 0)
    learn.run_part("policylab", argv, "", 0)  # no --parts: always a fresh run, nothing saved
    assert len(calls) == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["policylab-seed0.json"]
    assert learn._without(["--parts", "d", "--seed", "1", "--parts=e", "--lr", "1"], ("--parts", "--seed")) == \
        ["--lr", "1"]
