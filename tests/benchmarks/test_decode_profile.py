"""Smoke test of benchmarks/decode_profile.py on the tiny random model (the timed run is
for an idle machine), and its per-step byte / FLOP budget, hand-worked."""

from __future__ import annotations

import pytest
from bench_scripts import load as _load


def test_step_budget_hand_worked(tiny_model):
    prof = _load("decode_profile")
    cfg = tiny_model.config
    L, H, nh, nkv, I, V = (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                           cfg.intermediate_size, cfg.vocab_size)
    d = H // nh
    # per layer: q, o (H x H), k, v (H x nkv*d), gate, up, down (H x I); the head V x H (tied or not: read once)
    matrix = L * (2 * H * H + 2 * H * nkv * d + 3 * H * I)
    b = prof.step_budget(tiny_model, rows=4, columns=10, weight_bytes=4)
    assert b["weight_bytes"] == (matrix + V * H) * 4
    assert b["kv_bytes"] == 2 * L * 4 * nkv * 10 * d * 4
    assert b["flops"] == 2.0 * (matrix + V * H) * 4 + 4.0 * L * 4 * nh * 10 * d


def test_decode_profile_tiny(tmp_path, small_model_dir):
    prof = _load("decode_profile")
    r = prof.main(["--model", str(small_model_dir), "--engines", "fast-fp32,fast-bf16,hf-fp32", "--prompts", "2",
                   "--group", "2", "--max-new", "3", "--reps", "1", "--out", str(tmp_path / "d")])
    assert set(r["engines"]) == {"fast-fp32", "fast-bf16", "hf-fp32"}
    for name, e in r["engines"].items():
        assert e["rows"] == 4 and e["steps"] == 3 and e["ms_per_step"] > 0 and e["bound"] in ("memory", "compute")
        assert e["fraction_of_bound"] > 0 and e["tokens_per_s_sampling"] > 0
    f, b = r["engines"]["fast-fp32"], r["engines"]["fast-bf16"]
    assert b["weight_bytes"] * 2 == f["weight_bytes"] and b["compute_dtype"] == "bfloat16"
    assert f["ms_layers"] > 0 and f["ms_head"] > 0 and "ms_layers" not in r["engines"]["hf-fp32"]
    assert "flags" in r["machine"] and "| fast-bf16 | bfloat16 |" in (tmp_path / "d.md").read_text()
    with pytest.raises(SystemExit, match="unknown engine"):
        prof.main(["--model", str(small_model_dir), "--engines", "nope", "--out", ""])


def test_decode_profile_leaves_emulated_bf16_out(tmp_path, small_model_dir, monkeypatch):
    """On a CPU without native bf16 the default engine list skips fast-bf16 and says why."""
    prof = _load("decode_profile")
    monkeypatch.setattr("policylab.engines.cpu.bf16_training_native", lambda *a, **k: False)
    r = prof.main(["--model", str(small_model_dir), "--prompts", "1", "--group", "2", "--max-new", "2",
                   "--reps", "1", "--out", str(tmp_path / "d")])
    assert set(r["engines"]) == {"fast-fp32", "fast-int8-g32", "hf-fp32"} and r["limits"]["bf16_native"] is False
    md = (tmp_path / "d.md").read_text()
    assert "fast-bf16 was not measured: no native bf16" in md and "(emulated:" in md
