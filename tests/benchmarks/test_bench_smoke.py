"""Smoke tests of the benchmark scripts at tiny sizes (a random 2-layer Llama, a few
hundred sequences): they run end to end, check their own answers, write their reports.
The TRL half of benchmarks/vs_trl.py runs only when trl is installed (`make bench`)."""

from __future__ import annotations

import json

import pytest
import torch
from bench_scripts import load as _load

from policylab.trainer.allocator import glibc


def test_kernels_benchmark_tiny(tmp_path):
    kernels = _load("kernel_speed")
    runs = kernels.main(["--B", "256", "--T", "16", "--G", "16", "--reps", "1", "--allocators", "system",
                         "--out", str(tmp_path / "k")])
    rows = runs["system"]
    assert [r["kernel"] for r in rows] == ["grpo", "rloo", "tis", "icepop", "gmc", "ppo_clip", "gspo", "cispo"]
    assert all(r["kernel_ms"] > 0 and r["naive_ms"] > 0 for r in rows)
    md = (tmp_path / "k.md").read_text()
    assert "## Allocator: system" in md and "| `ppo_clip` | objective |" in md and "4,096 tokens" in md
    assert json.loads((tmp_path / "k.json").read_text())["meta"]["B"] == 256


def test_kernels_benchmark_refuses_allocators_out_of_order():
    kernels = _load("kernel_speed")
    with pytest.raises(SystemExit, match="in that order"):
        kernels.main(["--allocators", "keep,system", "--out", ""])


def test_kernels_benchmark_refuses_a_wrong_kernel(monkeypatch):
    """The equality check before timing can fail: a naive loop with another formula."""
    kernels = _load("kernel_speed")
    monkeypatch.setattr(kernels, "naive_rloo", lambda r, g: kernels.naive_grpo(r, g))
    with pytest.raises(AssertionError, match="rloo: kernel != naive loop"):
        kernels.run(64, 4, 8, reps=1)


def _vs_trl_args(model_dir, out, sides):
    return ["--model", str(model_dir), "--steps", "1", "--prompts", "2", "--group", "4", "--max-new-tokens", "4",
            "--micro-batch", "4", "--sides", sides, "--out", str(out)]


def test_vs_trl_policylab_half_tiny(tmp_path, small_model_dir):
    vs_trl = _load("vs_trl")
    report = vs_trl.main(_vs_trl_args(small_model_dir, tmp_path / "v", "policylab,policylab-system"))
    p, sys_side = report["sides"]["policylab"], report["sides"]["policylab-system"]
    assert p["engine"] == "fast-fp32" and len(p["steps"]) == 1 and p["steps"][0]["completions"] == 8
    assert p["summary"]["completions_per_s"] > 0 and p["peak_rss_mb"] > 100
    # each side in its own process: the trainer's allocator setting on one, glibc's defaults on the other,
    # and the same samples and rewards (the setting changes no value)
    assert p["allocator"].startswith("keep freed blocks" if glibc() else "glibc default")
    assert sys_side["allocator"] == "glibc default"
    assert sys_side["steps"][0]["reward"] == p["steps"][0]["reward"]
    md = (tmp_path / "v.md").read_text()
    assert "| completions/s |" in md and "| peak RSS (MB) |" in md and "| allocator |" in md


NATIVE_BF16 = __import__("policylab.engines.cpu", fromlist=["x"]).bf16_training_native()


def test_vs_trl_leaves_the_fast_side_out_without_native_bf16(tmp_path, small_model_dir, monkeypatch):
    """On a CPU without native bf16 the trainer refuses the fast mode: the benchmark runs the
    other sides and its report says why the fast side is missing."""
    from policylab.engines import cpu

    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: frozenset({"avx2", "fma"}))
    vs_trl = _load("vs_trl")
    report = vs_trl.main(_vs_trl_args(small_model_dir, tmp_path / "v", "policylab,policylab-fast"))
    assert set(report["sides"]) == {"policylab"} and "no native bf16" in report["skipped"]["policylab-fast"]
    assert "policylab-fast: not run, this CPU has no native bf16" in (tmp_path / "v.md").read_text()


@pytest.mark.skipif(not NATIVE_BF16, reason="the fast mode needs native bf16 (avx512_bf16 / amx_bf16); this CPU "
                    "has none, and the trainer refuses it (the side-skipping test above runs here)")
def test_vs_trl_fast_side_tiny(tmp_path, small_model_dir):
    """The fast-mode side samples with the bf16 engine and trains GRPO paired with TIS."""
    vs_trl = _load("vs_trl")
    report = vs_trl.main(_vs_trl_args(small_model_dir, tmp_path / "v", "policylab-fast"))
    f = report["sides"]["policylab-fast"]
    from policylab.methods.fast_mode import train_dtype

    want = train_dtype("fast-bf16")  # train.dtype: auto, the fast mode's choice on this host's CPU
    assert f["engine"] == "fast-bf16" and f["corrections"] == ["tis"] and f["train_dtype"] == want
    assert f"| train dtype / corrections | {want} / tis |" in (tmp_path / "v.md").read_text()


def test_fast_mode_error_tiny(tmp_path, tiny_model_dir, monkeypatch):
    """The numerics benchmark on the tiny model: every engine and training forward is
    measured, the trainer's bf16 forward equals the hand-computed bf16 body + fp32 head,
    the step gradients are compared, and both verdicts are the stated rules applied to the
    numbers. (A random tiny model answers nothing right, so the rewards' advantages are
    replaced by fixed ±1 ones to give the gradient comparison a signal.)"""
    err = _load("fast_mode_error")
    monkeypatch.setattr(err, "_advantages", lambda tok, batch, answers, group: torch.tensor(
        [1.0 if i % 2 else -1.0 for i in range(batch.size)]))
    r = err.main(["--model", str(tiny_model_dir), "--batches", "1", "--prompts", "2", "--group", "2",
                  "--max-new", "4", "--out", str(tmp_path / "e")])
    assert set(r["engines"]) == {"fast-bf16", "fast-int8-g32", "fast-fp32"}
    tf = r["train_forward"]
    assert set(tf) == {"trainer-bf16", "bf16-backward", "bf16-body", "bf16-all"} and tf["trainer-bf16"]["tokens"] > 0
    assert tf["bf16-backward"]["max_abs_dlogp"] == 0.0  # its forward is the fp32 forward
    assert abs(tf["trainer-bf16"]["mean_abs_dlogp"] - tf["bf16-body"]["mean_abs_dlogp"]) < 1e-5
    assert r["engines"]["fast-fp32"]["max_abs_dlogp"] < 1e-3 < r["engines"]["fast-bf16"]["max_abs_dlogp"]
    v, e, t = r["bf16_training"], r["engines"]["fast-bf16"], tf["trainer-bf16"]
    assert v["allowed"] == (t["mean_abs_dlogp"] <= e["mean_abs_dlogp"] and t["max_abs_dlogp"] <= e["max_abs_dlogp"]
                            and t["frac_outside_clip_log1.2"] < 0.01)
    md = (tmp_path / "e.md").read_text()
    assert "## The fast mode's bf16 training rule" in md and "**Allowed: " in md
    g = r["gradients"]["batches"]
    assert len(g) == 1
    b = g[0]
    assert b["rows_with_signal"] == 4  # (which of the two is nearer fp32 is a measurement, not a property)
    assert 0.0 < b["bf16-backward"]["rel_err"] < 0.05 and 0.0 < b["bf16"]["rel_err"] < 0.2
    assert b["noise_rel"] > 0 and b["bf16-backward"]["cosine"] > 0.99
    assert 0.0 < b["bf16-backward"]["adam_rel_err"] < b["noise_adam_rel"] and 0.0 <= b["bf16"]["sign_flips"] < 0.5
    assert "The same under AdamW" in md
    v = r["bf16_backward"]
    assert v["allowed"] == (v["logprobs_identical"] and v["error_below_tenth_of_noise"])
    assert "## The fast mode's bf16-backward rule" in md


def test_reward_vs_trl_hand_worked():
    vs_trl = _load("vs_trl")
    steps = lambda rs: [{"reward": r} for r in rs]  # noqa: E731
    # step differences 0.1, 0.0, -0.1, 0.2: mean 0.05, sd 0.1291, t(3) = 3.182 -> half 0.2054
    c = vs_trl.reward_vs_trl({"steps": steps([0.3, 0.2, 0.1, 0.4])}, {"steps": steps([0.2, 0.2, 0.2, 0.2])})
    t = c["training"]
    assert t["steps"] == 4 and t["diff"] == pytest.approx(0.05)
    assert t["hi"] - t["diff"] == pytest.approx(3.182 * 0.129099 / 2, rel=1e-4)
    assert t["lower"] is False and "heldout" not in c
    # every step lower by 0.1 +- 0.01: the interval lies below 0
    c = vs_trl.reward_vs_trl({"steps": steps([0.1, 0.11, 0.09])}, {"steps": steps([0.2, 0.2, 0.2])})
    assert c["training"]["lower"] is True
    # held-out: 0.30 +- 0.03 vs 0.40 +- 0.04 -> -0.10 +- 1.96 * 0.05
    h = vs_trl.reward_vs_trl({"steps": [], "heldout": {"accuracy": 0.3, "accuracy_stderr": 0.03, "n_prompts": 128}},
                             {"steps": [], "heldout": {"accuracy": 0.4, "accuracy_stderr": 0.04, "n_prompts": 128}})
    assert "training" not in h
    assert h["heldout"]["lo"] == pytest.approx(-0.198) and h["heldout"]["hi"] == pytest.approx(-0.002)
    assert h["heldout"]["lower"] is True
    assert vs_trl._fmt_vs_trl(h["heldout"]) == "-0.100 [-0.198, -0.002] lower"


@pytest.mark.slow  # ~20 s: TRL import and trainer set-up; runs with `make test-all` when trl is installed
def test_vs_trl_both_halves_tiny(tmp_path, small_model_dir, capsys):
    pytest.importorskip("trl")
    vs_trl = _load("vs_trl")
    report = vs_trl.main(_vs_trl_args(small_model_dir, tmp_path / "v", "trl,policylab"))
    assert report["same_prompts"] is True
    assert report["sides"]["trl"]["steps"][0]["completions"] == 8
    assert report["sides"]["policylab"]["reward_vs_trl"] == {}  # one step: no interval is claimed
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"ratio_vs_trl={report['ratio_vs_trl']:.3f}"


def test_utilization_benchmark_tiny(tmp_path, small_model_dir):
    """Runs end to end on the tiny model; the shared-prefix path gives the full forward's
    log-probs (fp32 vs fp32: rounding only) and its FLOP counts are consistent."""
    util = _load("utilization")
    r = util.main(["--model", str(small_model_dir), "--prompts", "2", "--group", "3", "--max-new-tokens", "6",
                   "--micro-batch", "2", "--allocator", "system", "--out", str(tmp_path / "u")])
    full, pre = r["train"]["fp32"], r["train"]["fp32-prefix"]
    assert pre["distinct_prompts"] == 2 and pre["real_tokens"] == full["real_tokens"]
    assert pre["fed_positions"] < full["fed_positions"]  # each prompt once instead of 3 times
    assert pre["logp_vs_fp32_full_abs_max"] < 1e-4
    assert 0 < pre["flops_executed"] < full["flops_executed"]
    md = (tmp_path / "u.md").read_text()
    assert "Through the shared prompt prefix" in md and "| fp32 |" in md
