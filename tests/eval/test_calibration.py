"""Decision-token calibration: temperature on the val split, metrics on the test split."""

from __future__ import annotations

import math

import pytest
import torch

from policylab.eval.calibration import calib_rl, calibration_metrics, fit_temperature, nll, reliability_bins
from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.metrics import ece


def test_hand_worked_ece():
    # conf [0.9, 0.8, 0.6, 0.3], correct [1, 1, 0, 0], bins [0, 0.5), [0.5, 1]:
    # low bin {0.3}: |0 − 0.3| · 1/4 = 0.075; high bin {0.9, 0.8, 0.6}: acc 2/3, conf 2.3/3,
    # |0.6667 − 0.7667| · 3/4 = 0.075; ECE = 0.15
    conf, correct = torch.tensor([0.9, 0.8, 0.6, 0.3], dtype=torch.float64), torch.tensor([1, 1, 0, 0])
    assert math.isclose(float(ece(conf, correct, n_bins=2)), 0.15, abs_tol=1e-12)
    bins = reliability_bins(conf, correct, n_bins=2)
    assert [b["count"] for b in bins] == [1, 3]
    assert math.isclose(bins[1]["acc"], 2 / 3) and math.isclose(bins[1]["conf"], 2.3 / 3)


def test_reliability_bins_and_ece_share_the_bin_of_every_decimal_edge():
    # q = 0.0, 0.1, ..., 1.0 as float32 (a stated confidence as it is stored): one reply per
    # bin 0..8 and two (0.9, 1.0) in bin 9; correct iff q >= 0.7; ECE = 2.7/11 (hand-worked in
    # tests/kernels/test_metrics.py::test_ece_hand_case_at_every_decimal_edge)
    q = torch.tensor([k / 10 for k in range(11)], dtype=torch.float32)
    correct = torch.tensor([k >= 7 for k in range(11)])
    bins = reliability_bins(q, correct, n_bins=10)
    assert [b["count"] for b in bins] == [1] * 9 + [2]
    assert [b["acc"] for b in bins] == [0.0] * 7 + [1.0] * 3
    assert math.isclose(bins[9]["conf"], 0.95, abs_tol=1e-7) and math.isclose(bins[7]["conf"], 0.7, abs_tol=1e-7)
    assert math.isclose(float(ece(q, correct, n_bins=10)), 2.7 / 11, abs_tol=1e-7)


def _data(seed=0, n=400, C=10, sharp=3.0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    z = torch.randn(n, C, generator=g, dtype=torch.float64)
    z[torch.arange(n), y] += 1.0  # informative but over-confident after scaling by `sharp`
    return z * sharp, y


def test_fitted_temperature_matches_a_grid_search_and_lowers_val_nll():
    z, y = _data()
    T, info = fit_temperature(z, y, ["val"] * len(y))
    grid = torch.exp(torch.linspace(math.log(0.05), math.log(20), 4001))
    best = min(grid.tolist(), key=lambda t: nll(z, y, t))
    assert abs(math.log(T) - math.log(best)) < 2e-3
    assert T > 1 and info["nll_after"] < info["nll_before"] and not info["at_bound"]


def test_accuracy_is_unchanged_by_temperature_and_brier_matches_a_loop():
    z, y = _data(1, n=50, C=4)
    a = calibration_metrics(z, y, temperature=1.0)
    b = calibration_metrics(z, y, temperature=3.7)
    assert a["accuracy"] == b["accuracy"]
    p = torch.softmax(z / 3.7, -1)
    brier = sum(sum((float(p[i, c]) - (1.0 if c == int(y[i]) else 0.0)) ** 2 for c in range(4))
                for i in range(50)) / 50
    assert math.isclose(b["brier"], brier, rel_tol=1e-12)


def test_fitting_on_a_test_tagged_split_raises():
    z, y = _data(n=8)
    with pytest.raises(PolicylabError, match="1 row\\(s\\) tagged 'test'.*validation split only"):
        fit_temperature(z, y, ["val"] * 7 + ["test"])
    with pytest.raises(PolicylabError, match="split tags must be one of val, test"):
        fit_temperature(z, y, ["train"] * 8)


def test_calib_rl_fits_on_val_and_measures_on_test_only():
    z, y = _data(2, n=200)
    tags = ["val" if i % 2 else "test" for i in range(200)]
    out = calib_rl(z, y, tags, n_bins=10)
    val = torch.tensor([t == "val" for t in tags])
    T, _ = fit_temperature(z[val], y[val], ["val"] * int(val.sum()))
    assert out["temperature"] == T and out["n_val"] == out["n_test"] == 100
    want = calibration_metrics(z[~val], y[~val], temperature=T, n_bins=10)
    assert out["scaled"]["ece"] == want["ece"] and out["raw"]["temperature"] == 1.0
    assert out["scaled"]["accuracy"] == out["raw"]["accuracy"]
    assert out["scaled"]["ece"] < out["raw"]["ece"]  # over-confident logits: scaling helps on held-out rows


def test_splits_must_be_disjoint_and_both_present():
    z, y = _data(n=6)
    with pytest.raises(PolicylabError, match="appear in both the val and the test split"):
        calib_rl(z, y, ["val", "val", "val", "test", "test", "test"], ids=["a", "b", "c", "a", "d", "e"])
    with pytest.raises(PolicylabError, match="rows tagged 'val'.*and rows tagged 'test'"):
        calib_rl(z, y, ["val"] * 6)


def test_separable_logits_hit_the_bound_and_say_so():
    z = torch.tensor([[5.0, 0.0], [0.0, 5.0]], dtype=torch.float64)
    T, info = fit_temperature(z, torch.tensor([0, 1]), ["val", "val"])
    assert info["at_bound"] and T == pytest.approx(0.05)


def test_bad_input():
    with pytest.raises(ShapeError, match="C >= 2 choices"):
        calibration_metrics(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long))
    with pytest.raises(PolicylabError, match="index the 3 choices"):
        calibration_metrics(torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(PolicylabError, match="`temperature` must be finite and > 0"):
        calibration_metrics(torch.zeros(2, 3), torch.tensor([0, 1]), temperature=0.0)
    with pytest.raises(PolicylabError, match="must be finite"):
        calibration_metrics(torch.tensor([[float("nan"), 0.0]]), torch.tensor([0]))
