"""Smoke test of benchmarks/prefix_share.py on the tiny model: it runs, compares the
shared-prefix forward with the full forward and writes its report."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_prefix_share_benchmark_tiny(tmp_path, small_model_dir):
    spec = importlib.util.spec_from_file_location("bench_prefix_share", BENCH / "prefix_share.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--model", str(small_model_dir), "--max-new-tokens", "6", "--mbs", "4,8", "--out", str(tmp_path / "p")])
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    shared = [r for r in rows if r["variant"].startswith("shared prefix")]
    assert len(shared) == 2 and all(r["seconds"] > 0 for r in rows)
    # fp32 model: log-probs and gradients agree at fp32 rounding, not merely "close"
    assert all(r["dlogp"] < 1e-4 and r["grad"] < 1e-4 for r in shared)
    assert "| 8 | shared prefix once per minibatch" in (tmp_path / "p.md").read_text()
