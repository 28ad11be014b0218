"""Smoke test of benchmarks/busy_machine.py on the tiny random model (the timed run is
for an idle machine); the share-proportional expectation, hand-worked."""

from __future__ import annotations

import pytest
from bench_scripts import load as _load


def test_expectation_is_the_fair_share_of_runnable_threads():
    busy = _load("busy_machine")
    # 2 cores: 2 threads + 8 spinners -> each of 10 threads gets 0.2 core, the worker 0.4 of
    # its 2: 5x; 2 + 2 -> 2x; 1 thread + 2 spinners -> 3 threads on 2 cores: 1.5x;
    # 1 + 1 fits on 2 cores: 1x; alone: 1x
    assert busy.expectation(8, 2, 2) == 5.0
    assert busy.expectation(2, 2, 2) == 2.0
    assert busy.expectation(2, 1, 2) == 1.5
    assert busy.expectation(1, 1, 2) == 1.0
    assert busy.expectation(0, 2, 2) == 1.0


def test_policy_environments():
    busy = _load("busy_machine")
    base = {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "7", "PATH": "/bin"}
    assert busy.policy_env("openmp", 2, base) == {"PATH": "/bin"}
    assert busy.policy_env("passive", 2, base) == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    assert busy.policy_env("one", 2, base)["OMP_NUM_THREADS"] == "1"
    assert busy.policy_env("spin:1000", 2, base) == {"PATH": "/bin", "GOMP_SPINCOUNT": "1000"}
    with pytest.raises(SystemExit, match="unknown policy"):
        busy.policy_env("spin", 2, base)
    with pytest.raises(SystemExit, match="integer N >= 0"):
        busy.policy_env("spin:fast", 2, base)
    with pytest.raises(SystemExit, match="starting with 0"):
        busy.parse(["--loads", "2,8"])


def test_busy_machine_tiny(tmp_path, small_model_dir):
    busy = _load("busy_machine")
    report = busy.main(["--model", str(small_model_dir), "--loads", "0,1", "--policies", "one,passive",
                        "--steps", "1", "--warmup", "0", "--prompts", "2", "--group", "2", "--max-new-tokens", "2",
                        "--micro-batch", "4", "--out", str(tmp_path / "b")])
    one, passive = report["policies"]["one"], report["policies"]["passive"]
    assert one["threads"] == 1 and passive["wait_policy"] == "passive" and one["wait_policy"].startswith("default")
    assert passive["threads"] == report["cores"]  # the available cores
    for r in (one, passive):
        assert set(r["levels"]) == {"0", "1"} and r["levels"]["0"]["slowdown"] == 1.0
        assert r["levels"]["1"]["expected_slowdown"] == busy.expectation(1, r["threads"], report["cores"])
    md = (tmp_path / "b.md").read_text()
    assert "| one | 1 |" in md and "flags" in report["machine"]
