"""benchmarks/vs_trl_pool.py: several `make bench` runs pooled against TRL (hand-worked,
with a naive reference), and its refusals."""

from __future__ import annotations

import json
import statistics

import pytest
from bench_scripts import load as _load


def _report(seed, ratio, side_rewards, trl_rewards, side_acc, trl_acc):
    def side(rewards, acc, r):
        return {"steps": [{"reward": x} for x in rewards], "ratio_vs_trl": r,
                "heldout": {"accuracy": acc, "accuracy_stderr": 0.04, "n_prompts": 128}}
    return {"command": f"python benchmarks/vs_trl.py --seed {seed}",
            "sides": {"trl": side(trl_rewards, trl_acc, 1.0), "policylab-fast": side(side_rewards, side_acc, ratio)}}


def test_pool_hand_worked(tmp_path):
    pool = _load("vs_trl_pool")
    runs = [_report(0, 3.5, [0.5, 0.6], [0.4, 0.6], 0.30, 0.40),
            _report(1, 3.8, [0.7, None], [0.5, 0.9], 0.45, 0.40),
            _report(2, 3.2, [0.2, 0.3], [0.3, 0.3], 0.50, 0.45)]
    p = pool.pool(runs)
    e = p["sides"]["policylab-fast"]
    assert e["ratios"] == [3.5, 3.8, 3.2] and e["ratio_min"] == 3.2 and e["ratio_mean"] == pytest.approx(3.5)
    # held-out differences -0.10, +0.05, +0.05: mean 0; sd = sqrt((0.01 + 0.0025 + 0.0025) / 2) = 0.0866,
    # se 0.05, t(2) = 4.303 -> [-0.2152, +0.2152]
    assert e["heldout_per_run"] == pytest.approx([-0.10, 0.05, 0.05])
    assert e["heldout"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert e["heldout"]["hi"] == pytest.approx(4.303 * 0.05) and e["heldout"]["lower"] is False
    # training: paired steps with a reward on both sides: +0.1, 0, +0.2, -0.1, 0 (the None step left out)
    d = [0.1, 0.0, 0.2, -0.1, 0.0]
    assert e["training"]["n"] == 5 and e["training"]["mean"] == pytest.approx(statistics.mean(d))
    assert e["training"]["se"] == pytest.approx(statistics.stdev(d) / 5 ** 0.5)  # naive reference
    md = pool.to_markdown(p)
    assert "| policylab-fast | 3.50, 3.80, 3.20 | 3.50 / 3.20 | -10.0, +5.0, +5.0 |" in md


def test_pool_says_lower_only_beyond_noise_and_refuses_a_run_without_trl(tmp_path):
    pool = _load("vs_trl_pool")
    low = [_report(s, 3.0, [0.1, 0.1], [0.5, 0.5], 0.20 + 0.01 * s, 0.40) for s in range(3)]
    e = pool.pool(low)["sides"]["policylab-fast"]
    # held-out -0.20, -0.19, -0.18: mean -0.19, se 0.00577, interval [-0.2148, -0.1652], below 0
    assert e["heldout"]["lower"] is True and e["heldout"]["hi"] == pytest.approx(-0.19 + 4.303 * 0.01 / 3 ** 0.5)
    # every training step -0.4: a zero-width interval at -0.4, below 0
    assert e["training"]["lower"] is True and e["training"]["hi"] == pytest.approx(-0.4)
    # one run above TRL beyond noise is not "lower"
    high = [_report(s, 3.0, [0.6, 0.7], [0.5, 0.5], 0.5, 0.4) for s in range(2)]
    assert pool.pool(high)["sides"]["policylab-fast"]["training"]["lower"] is False
    bad = _report(0, 3.0, [0.1], [0.1], 0.2, 0.2)
    del bad["sides"]["trl"]
    with pytest.raises(SystemExit, match="no TRL side"):
        pool.pool([bad])
    f = tmp_path / "r.json"
    f.write_text(json.dumps(low[0]))
    out = tmp_path / "o"
    pool.main([str(f), "--out", str(out)])
    assert "one value: no interval" in out.with_suffix(".md").read_text()
    with pytest.raises(SystemExit, match="no such results file"):
        pool.main([str(tmp_path / "missing.json"), "--out", ""])
