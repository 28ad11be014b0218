"""The comparison's statistics and budget rules on hand-worked numbers (no model, no run)."""

from __future__ import annotations

import math

import pytest

from policylab.experiments.compare.budget import apply_budget, parse_budget
from policylab.experiments.compare.plan import DEFAULT_MAX_STEPS, Budget
from policylab.experiments.compare.stats import add_vs_first, aggregate, mean_point, same_prompts, time_to


def pt(step, acc, se=0.1, seconds=0.0, tokens=0):
    return {"step": step, "accuracy": acc, "stderr": se, "seconds": seconds, "tokens": tokens}


def test_mean_point_takes_the_larger_of_binomial_and_between_seed_error():
    # two seeds at 0.5 and 0.7, each ± 0.1: binomial sqrt(0.01 + 0.01) / 2 = 0.0707;
    # between seeds sqrt(((0.1)² + (0.1)²) / 1 / 2) = 0.1, the larger
    m = mean_point(None, [pt(4, 0.5, seconds=10, tokens=100), pt(6, 0.7, seconds=20, tokens=300)])
    assert m["accuracy"] == pytest.approx(0.6) and m["step"] == 5 and m["per_seed"] == [0.5, 0.7]
    assert m["stderr_binomial"] == pytest.approx(math.sqrt(0.02) / 2)
    assert m["stderr_seeds"] == pytest.approx(0.1) and m["stderr"] == pytest.approx(0.1)
    assert m["seconds"] == 15 and m["tokens"] == 200
    # one seed: no between-seed error, the binomial one stands
    one = mean_point(3, [pt(3, 0.25, se=0.05)])
    assert one["step"] == 3 and one["stderr"] == 0.05 and one["stderr_seeds"] is None


def test_time_to_is_the_first_point_at_or_above_the_target():
    points = [pt(0, 0.1, seconds=0), pt(5, 0.3, seconds=12, tokens=40), pt(10, 0.5, seconds=30)]
    assert time_to(points, 0.3) == {"step": 5, "seconds": 12, "tokens": 40}
    assert time_to(points, 0.6) is None and time_to(points, None) is None


def test_aggregate_keeps_only_steps_every_seed_evaluated():
    a = {"seed": 0, "points": [pt(0, 0.2), pt(2, 0.4), pt(4, 0.6)], "diagnostics": {"correction/tis/ess": 0.8},
         "tokens_per_s": 10.0, "peak_rss_mb": 500, "clip_frac": None, "train_seconds": 3.0, "steps": 4,
         "optimizer_steps": 4, "sampled_tokens": 30}
    b = {**a, "seed": 1, "points": [pt(0, 0.2), pt(4, 0.4)], "diagnostics": {"correction/tis/ess": 0.6},
         "tokens_per_s": 20.0, "peak_rss_mb": 700}
    m = aggregate([a, b], target=0.5)
    assert [p["step"] for p in m["curve"]] == [0]  # step 2: only seed 0 evaluated there
    assert m["final"]["accuracy"] == pytest.approx(0.5)
    assert m["time_to_target"] == {"reached": 1, "of": 2, "seconds_mean": 0.0, "steps_mean": 4.0}
    assert m["tokens_per_s"] == 15.0 and m["peak_rss_mb"] == 700 and m["clip_frac"] is None
    assert m["diagnostics"] == {"correction/tis/ess": pytest.approx(0.7)}


def test_vs_first_is_the_difference_over_its_standard_error():
    # a exact, b ± 0.05: b - a = 0.1, z = 2; c and a both exact: no error, no z
    methods = {"a": {"final": pt(4, 0.5, se=0.0)}, "b": {"final": pt(4, 0.6, se=0.05)},
               "c": {"final": pt(4, 0.5, se=0.0)}}
    add_vs_first(methods)
    b = methods["b"]["vs_first"]
    assert b["reference"] == "a" and b["difference"] == pytest.approx(0.1) and b["z"] == pytest.approx(2.0)
    assert methods["c"]["vs_first"] == {"reference": "a", "difference": 0.0, "stderr": 0.0, "z": None}
    # both with errors: s.e. of the difference sqrt(0.03² + 0.04²) = 0.05
    methods = {"a": {"final": pt(4, 0.5, se=0.03)}, "b": {"final": pt(4, 0.6, se=0.04)}}
    add_vs_first(methods)
    assert methods["b"]["vs_first"]["stderr"] == pytest.approx(0.05)
    assert methods["b"]["vs_first"]["z"] == pytest.approx(2.0)


def test_same_prompts_compares_the_common_prefix_per_seed():
    runs = [{"seed": 0, "prompt_digests": ["p", "q", "r"]}, {"seed": 0, "prompt_digests": ["p", "q"]},
            {"seed": 1, "prompt_digests": ["x"]}, {"seed": 1, "prompt_digests": ["y"]},
            {"seed": 2, "prompt_digests": []}]
    assert same_prompts(runs) == {"0": {"runs": 2, "common_prefix": 2, "agree": True},
                                  "1": {"runs": 2, "common_prefix": 1, "agree": False},
                                  "2": {"runs": 1, "common_prefix": 0, "agree": False}}


def test_a_budget_is_written_into_each_run_and_checked_against_train():
    problems: list[str] = []
    train = {"steps": 9, "lr": 1e-5}
    b = parse_budget({"tokens": 500.0, "max_steps": 40}, train, problems)
    assert b == Budget("tokens", 500, 40) and "steps" not in train
    assert problems == ["`run.train.steps` is set with a tokens budget: runs would stop at different budgets; the "
                        "step cap of a seconds or tokens budget is `budget.max_steps`"]
    t: dict = {}
    apply_budget(t, b)
    assert t == {"steps": 40, "budget_tokens": 500}
    t = {}
    apply_budget(t, parse_budget({"seconds": 2}, {}, problems))
    assert t == {"steps": DEFAULT_MAX_STEPS, "budget_seconds": 2.0}
    refused = parse_budget({"steps": 0}, {}, problems)
    assert refused.kind is None and problems[-1] == "`budget.steps` must be a positive integer, got 0"
