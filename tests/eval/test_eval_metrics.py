"""`policylab eval --metrics`: coverage, sharpening tax and calibration for base vs trained,
in the JSON output, report.json and plots/reliability.png; its refusals are one line."""

from __future__ import annotations

import json
import shutil

import pytest

from cli_utils import assert_one_clear_error, write_config
from cli_utils import cli_inprocess as cli  # the subprocess is not what these tests check


# its tests share the module fixture `arith_run`: one worker under xdist
pytestmark = pytest.mark.xdist_group("test_eval_metrics")


@pytest.fixture(scope="module")
def arith_run(tiny_model_dir, tmp_path_factory):
    """A finished 1-step GRPO run on single-digit arithmetic (the real verifier)."""
    root = tmp_path_factory.mktemp("arith")
    cfg = write_config(root / "c.yaml", tiny_model_dir, root / "run", steps=1, task='{reward: exact_numeric}',
                       eval="{n: 12, before: false, after: false, max_new_tokens: 3, batch_size: 8}")
    res = cli("train", cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    return root / "run"


def test_eval_metrics_report_base_vs_trained(arith_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(arith_run, run)
    res = cli("eval", run, "--metrics", "pass@k,sharpening_tax,calibration", "--samples", "2", "--k", "1,2")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    em = out["eval_metrics"]
    assert set(out) == {"base", "trained", "eval_metrics"} and em["checkpoint"].startswith("step_")
    assert set(em["pass@k"]["base"]) == {"1", "2"} and set(em["pass@k"]["trained"]) == {"1", "2"}
    assert em["pass@k"]["tasks"] == 12 and em["pass@k"]["samples_per_task"] == [2]
    for k in ("1", "2"):
        t = em["sharpening_tax"][k]
        assert t["tax"] == pytest.approx(t["cov_base"] - t["cov_post"]) and t["tasks"] == 12
        assert em["pass@k"]["base"][k] == pytest.approx(t["cov_base"])
    cal = em["calibration"]
    for label in ("base", "trained"):
        c = cal[label]
        assert c["n_val"] + c["n_test"] == 12 and c["n_val"] > 0 and c["n_test"] > 0
        assert c["raw"]["accuracy"] == c["scaled"]["accuracy"] and c["raw"]["temperature"] == 1.0
        assert 0 <= c["scaled"]["ece"] <= 1 and 0 < c["digit_mass_mean"] < 1
    assert "first digit of the gold answer" in cal["decision"]
    report = json.loads((run / "report.json").read_text())
    assert report["eval_metrics"] == em
    png = (run / "plots" / "reliability.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in res.stderr and "reliability.png" in res.stderr


def test_eval_metrics_refusals_are_one_line(arith_run, tmp_path):
    res = cli("eval", arith_run, "--metrics", "pass@k,bleu")
    assert_one_clear_error(res, "--metrics: unknown metric 'bleu'")
    res = cli("eval", arith_run, "--metrics", "pass@k", "--samples", "2", "--k", "1,4")
    assert_one_clear_error(res, "eval.samples (2) must be >= every eval.k")
    res = cli("eval", arith_run, "--metrics", "pass@k", "--k", "one")
    assert_one_clear_error(res, "--k must be comma-separated integers")
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(arith_run / "config.yaml", bare / "config.yaml")
    res = cli("eval", bare, "--metrics", "sharpening_tax")
    assert_one_clear_error(res, "has no checkpoint: sharpening_tax compares the base and the trained model")


def test_sampled_equals_the_trainers_evaluation(tiny_model_dir, tmp_path):
    from policylab.eval import suite as eval_metrics
    from trainer_utils import tiny_config

    from policylab.trainer.loop import Trainer

    cfg = tiny_config(tiny_model_dir, tmp_path / "r", task={"reward": "exact_numeric"},
                      eval={"n": 6, "samples": 2, "k": [1, 2], "max_new_tokens": 3})
    tr = Trainer(cfg)
    a = tr.evaluate("base")
    b = eval_metrics.sampled(tr, "base")
    assert {k: b[k] for k in a} == a
    assert len(b["correct_per_prompt"]) == 6 and len(b["task_ids"]) == 6
    assert sum(b["correct_per_prompt"]) == round(a["accuracy"] * 12)


def test_parse_metrics():
    from policylab.eval.suite import parse_metrics

    assert parse_metrics("pass@k, calibration,calib_rl") == ["pass@k", "calib_rl"]
    with pytest.raises(Exception, match="names no metric"):
        parse_metrics(" , ")
