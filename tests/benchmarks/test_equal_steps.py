"""benchmarks/equal_steps.py: the late-window statistic, Welch's interval (hand-worked and
against a naive reference), pooling parts directories, and the report end to end on
synthetic parts (no model)."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from bench_scripts import load as _load


def _points(accs, every=25):
    return [{"step": every * i, "seconds": float(i), "accuracy": a, "accuracy_stderr": 0.03} for i, a in enumerate(accs)]


def _part(directory, side, seed, accs, reward=0.5, **extra):
    directory.mkdir(parents=True, exist_ok=True)
    run = {"side": side, "seed": seed, "engine": "fast-bf16", "train_dtype": "bf16-backward", "corrections": ["tis"],
           "points": _points(accs), "steps": [{"reward": reward} for _ in range(25 * (len(accs) - 1))], **extra}
    (directory / f"{side}-seed{seed}.json").write_text(json.dumps(run))


def test_window_mean_and_the_step_it_must_reach():
    eq = _load("equal_steps")
    # steps 0..200 every 25: the window 100-200 holds the last five, (0.5+0.6+0.7+0.8+0.9)/5 = 0.7
    pts = _points([0.0, 0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9])
    assert eq.window_mean(pts, 100, 200) == pytest.approx(0.7)
    assert eq.at_step(pts, 200) == 0.9 and eq.at_step(pts, 210) is None
    # a run that stopped at step 175 is not compared in a window ending at 200
    assert eq.window_mean(pts[:-1], 100, 200) is None
    assert eq.window_mean([], 100, 200) is None
    # training reward over steps 101..200: entries 100..199 of the run's steps
    steps = [{"reward": 0.0}] * 100 + [{"reward": 1.0}] * 50 + [{"reward": 0.5}] * 50
    assert eq.train_reward_mean(steps, 100, 200) == pytest.approx(0.75)
    assert eq.train_reward_mean(steps[:199], 100, 200) is None
    assert eq.train_reward_mean(steps[:150] + [{"reward": None}] + steps[151:], 100, 200) is None
    # the engine gap: bf16 evaluation 0.02 above fp32 at steps 100 and 200, 0.05 at 150: mean 0.03
    both = [dict(p, accuracy_bf16=p["accuracy"] + (0.05 if p["step"] == 150 else 0.02)) for p in pts]
    assert eq.engine_gap(both, 100, 200) == pytest.approx(0.026)  # (0.02 + 0.02 + 0.05 + 0.02 + 0.02) / 5
    assert eq.engine_gap(pts, 100, 200) is None  # a run without --eval-bf16


def test_welch_hand_worked_and_naive_reference():
    eq = _load("equal_steps")
    a, b = [0.7, 0.8, 0.9], [0.6, 0.7]
    w = eq.welch(a, b)
    # hand-worked: means 0.8 and 0.65; s.e.^2 0.01/3 and 0.005/2; se = sqrt(0.0058333) = 0.076376;
    # df = 0.0058333^2 / ((0.0033333^2)/2 + 0.0025^2) = 2.88 -> 2, t = 4.303
    assert w["diff"] == pytest.approx(0.15)
    assert w["se"] == pytest.approx(0.0763763, rel=1e-5)
    assert w["df"] == pytest.approx(2.8824, rel=1e-3) and w["t_crit"] == 4.303
    assert w["lo"] == pytest.approx(0.15 - 4.303 * 0.0763763, rel=1e-5) and w["contains_0"] is True
    # naive reference: the textbook formulas from the statistics module
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    assert w["se"] == pytest.approx(math.sqrt(va + vb))
    assert w["df"] == pytest.approx((va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 1))
    # a clear difference: the interval excludes 0
    far = eq.welch([0.80, 0.81, 0.82, 0.80], [0.70, 0.71, 0.69, 0.70])
    assert far["contains_0"] is False and far["lo"] > 0
    # one seed in an arm: no spread, no interval (not a zero-width one)
    assert eq.welch([0.8], [0.7, 0.6])["diff"] is None


def test_arms_pool_directories_and_refuse_a_seed_twice(tmp_path):
    eq = _load("equal_steps")
    accs = [0.0] * 4 + [0.5] * 5
    _part(tmp_path / "a", "policylab", 0, accs)
    _part(tmp_path / "a", "policylab", 1, accs)
    _part(tmp_path / "b", "policylab", 3, accs)
    _part(tmp_path / "b", "policylab-fast", 3, accs)  # another side: not this arm's
    arms = eq.load_arms([f"exact={tmp_path / 'a'}:policylab", f"exact={tmp_path / 'b'}:policylab",
                         f"fast={tmp_path / 'missing'}:policylab-fast"])
    assert [r["seed"] for r in arms["exact"]] == [0, 1, 3] and arms["fast"] == []
    _part(tmp_path / "c", "policylab", 1, accs)
    with pytest.raises(SystemExit, match="seed 1 found twice"):
        eq.load_arms([f"exact={tmp_path / 'a'}:policylab", f"exact={tmp_path / 'c'}:policylab"])
    with pytest.raises(SystemExit, match="NAME=DIR:SIDE"):
        eq.parse_arm("exact-without-a-side")


def test_report_end_to_end(tmp_path):
    eq = _load("equal_steps")
    ramp = [0.0, 0.2, 0.4, 0.5]
    for seed, late in enumerate([0.80, 0.82, 0.78]):
        _part(tmp_path / "e", "policylab", seed, ramp + [late] * 5, reward=late, engine="fast-fp32",
              train_dtype="fp32", corrections=[])
    for seed, late in enumerate([0.70, 0.71, 0.69]):
        _part(tmp_path / "f", "policylab-fast", seed, ramp + [late] * 5)
    out = tmp_path / "r"
    rep = eq.main(["--arm", f"exact={tmp_path / 'e'}:policylab", "--arm", f"fast={tmp_path / 'f'}:policylab-fast",
                   "--out", str(out)])
    (c,) = [c for c in rep["comparisons"] if (c["a"], c["b"]) == ("fast", "exact")]
    assert c["window"]["diff"] == pytest.approx(-0.10) and c["window"]["contains_0"] is False
    md = out.with_suffix(".md").read_text()
    assert "| exact | 0, 1, 2 | fast-fp32 / fp32 / none | 80.0, 82.0, 78.0 | 80.0 ± 1.2 | 80.0 | 80.0, 82.0, 78.0 |" in md
    # fast's training reward 0.5 on every step: 50.0 - 80.0 = -30.0
    assert c["train_reward"]["diff"] == pytest.approx(-0.30)
    assert "| fast − exact | -10.0 ± 1.3" in md and "| no |" in md
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "Runs evaluated by both engines" not in md  # none of these runs has --eval-bf16
    with pytest.raises(SystemExit, match="no finished run"):
        eq.main(["--arm", f"x={tmp_path / 'nothing'}:policylab", "--out", str(tmp_path / "n")])
    with pytest.raises(SystemExit, match="--window"):
        eq.main(["--window", "200,100", "--out", str(tmp_path / "w")])


def test_engine_gap_between_arms(tmp_path):
    """Runs evaluated by both engines: each arm's mean bf16 − fp32 gap and the difference of
    the arms' gaps (fast +4, +5, +6 points; exact -1, 0, +1: difference +5)."""
    eq = _load("equal_steps")
    ramp = [0.0, 0.2, 0.4, 0.5]
    for name, side, gaps in (("e", "policylab", (-0.01, 0.0, 0.01)), ("f", "policylab-fast", (0.04, 0.05, 0.06))):
        for seed, gap in enumerate(gaps):
            _part(tmp_path / name, side, seed, ramp + [0.7] * 5)
            f = tmp_path / name / f"{side}-seed{seed}.json"
            run = json.loads(f.read_text())
            run["points"] = [dict(p, accuracy_bf16=p["accuracy"] + gap) for p in run["points"]]
            f.write_text(json.dumps(run))
    rep = eq.main(["--arm", f"exact={tmp_path / 'e'}:policylab", "--arm", f"fast={tmp_path / 'f'}:policylab-fast",
                   "--out", str(tmp_path / "g")])
    assert rep["arms"]["fast"]["engine_gap"]["mean"] == pytest.approx(0.05)
    (c,) = [c for c in rep["comparisons"] if (c["a"], c["b"]) == ("fast", "exact")]
    assert c["engine_gap"]["diff"] == pytest.approx(0.05) and c["engine_gap"]["se"] == pytest.approx(
        math.sqrt(2 * statistics.variance([0.04, 0.05, 0.06]) / 3))
    md = (tmp_path / "g.md").read_text()
    assert "| fast | 0, 1, 2 | +4.0, +5.0, +6.0 | +5.0 ± 0.6 |" in md and "fast − exact: +5.0 ± 0.8" in md
