import math
import random
from fractions import Fraction

import pytest
import torch

from policylab.errors import NonFiniteError, PolicylabError, ShapeError
from policylab.kernels.metrics import brier, ece, pass_at_k


def exact_pass_at_k(n, c, k):
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def test_pass_at_k_hand_cases():
    # n = 4, c = 1, k = 2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    #   product form: 1 - (1 - 1/4)(1 - 1/3) = 1 - (3/4)(2/3) = 0.5
    assert pass_at_k(4, 1, 2).item() == pytest.approx(0.5, rel=1e-14)
    # n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2).item() == pytest.approx(0.7, rel=1e-14)
    # c = 0 -> exactly 0; n - c < k (4 - 3 = 1 < 2) -> exactly 1
    assert pass_at_k(4, 0, 2).item() == 0.0
    assert pass_at_k(4, 3, 2).item() == 1.0


def test_pass_at_k_vectorized_matches_exact_reference():
    rng = random.Random(0)
    n = [rng.randint(5, 60) for _ in range(200)]
    c = [rng.randint(0, x) for x in n]
    got = pass_at_k(torch.tensor(n), torch.tensor(c), 5)
    want = torch.tensor([exact_pass_at_k(a, b, 5) for a, b in zip(n, c)], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_pass_at_k_large_n_small_value_keeps_relative_precision():
    # n = 100000, c = 1, k = 2: 1 - C(99999,2)/C(100000,2) = 1 - 99998/100000 = 2e-5;
    # n = 10**6, c = 3, k = 2: about 6e-6. Small values must keep 10 significant digits.
    got = pass_at_k(torch.tensor([100_000, 10**6]), torch.tensor([1, 3]), 2)
    want = torch.tensor([exact_pass_at_k(100_000, 1, 2), exact_pass_at_k(10**6, 3, 2)], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=0)
    # many correct samples (c = 90000) cost nothing extra: memory is [tasks, k]
    assert pass_at_k(100_000, 90_000, 3).item() == pytest.approx(exact_pass_at_k(100_000, 90_000, 3), rel=1e-12)


@pytest.mark.parametrize(
    "n, c, k, match",
    [
        (3, 1, 4, "n >= k"),  # n < k
        (torch.tensor([5, 2]), torch.tensor([1, 1]), 3, "smallest n = 2"),
        (4, 5, 2, "0 <= c <= n"),
        (4, -1, 2, "0 <= c <= n"),
        (4, 1, 0, "`k` must be an int >= 1"),
        (4.5, 1, 2, "`n` must hold integer counts"),
    ],
)
def test_pass_at_k_bad_inputs(n, c, k, match):
    with pytest.raises(PolicylabError, match=match):
        pass_at_k(n, c, k)


def naive_ece(conf, correct, n_bins):
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        idx = [i for i, p in enumerate(conf) if lo <= p < hi or (b == n_bins - 1 and p == 1.0)]
        if idx:
            acc = sum(correct[i] for i in idx) / len(idx)
            mean_conf = sum(conf[i] for i in idx) / len(idx)
            total += len(idx) / len(conf) * abs(acc - mean_conf)
    return total


def test_ece_hand_case():
    # bins [0, 0.5) and [0.5, 1]
    #   bin 0: {0.3}, acc 0, conf 0.3 -> |0 - 0.3| = 0.3, weight 1/4 -> 0.075
    #   bin 1: {0.9, 0.8, 0.6}, acc 2/3, conf 2.3/3 -> |2/3 - 2.3/3| = 0.1, weight 3/4 -> 0.075
    #   ECE = 0.15
    conf = torch.tensor([0.9, 0.8, 0.6, 0.3], dtype=torch.float64)
    got = ece(conf, torch.tensor([1, 1, 0, 0]), n_bins=2)
    assert got.item() == pytest.approx(0.15, abs=1e-12)


def test_ece_matches_naive_reference_and_edges():
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(500, generator=g, dtype=torch.float64)
    conf[:4] = torch.tensor([0.0, 1.0, 0.5, 0.7], dtype=torch.float64)  # on bin edges for M = 10
    correct = torch.rand(500, generator=g) < conf
    for m in (1, 2, 7, 10):
        want = naive_ece(conf.tolist(), correct.long().tolist(), m)
        assert ece(conf, correct, n_bins=m).item() == pytest.approx(want, abs=1e-12)
    # 0.5 belongs to the upper bin: one sample, conf 0.5, correct -> bin [0.5, 1]: |1 - 0.5| = 0.5
    assert ece(torch.tensor([0.5]), torch.tensor([True]), n_bins=2).item() == pytest.approx(0.5)


def test_brier_hand_case():
    # ((0.9-1)^2 + (0.8-1)^2 + (0.6-0)^2 + (0.3-0)^2) / 4 = (0.01 + 0.04 + 0.36 + 0.09) / 4 = 0.125
    got = brier(torch.tensor([0.9, 0.8, 0.6, 0.3], dtype=torch.float64), torch.tensor([1, 1, 0, 0]))
    assert got.item() == pytest.approx(0.125, abs=1e-12)


@pytest.mark.parametrize(
    "conf, correct, err, match",
    [
        (torch.tensor([1.2, 0.5]), torch.tensor([1, 0]), PolicylabError, r"must lie in \[0, 1\]"),
        (torch.tensor([float("nan"), 0.5]), torch.tensor([1, 0]), NonFiniteError, "`conf`"),
        (torch.tensor([0.2, 0.5]), torch.tensor([0.5, 0.0]), PolicylabError, "0/1 or bool"),
        (torch.tensor([0.2, 0.5]), torch.tensor([1, 0, 1]), ShapeError, "`correct` has shape"),
        (torch.tensor([], dtype=torch.float32), torch.tensor([]), ShapeError, "`conf` is empty"),
        (torch.tensor([1, 0]), torch.tensor([1, 0]), ShapeError, "floating tensor"),
    ],
)
def test_calibration_bad_inputs(conf, correct, err, match):
    with pytest.raises(err, match=match):
        ece(conf, correct, n_bins=2)
    with pytest.raises(err, match=match):
        brier(conf, correct)


def test_ece_bad_bins():
    with pytest.raises(PolicylabError, match="`n_bins` must be an int >= 1"):
        ece(torch.tensor([0.5]), torch.tensor([1]), n_bins=0)


def test_float_mask_count_true_and_check_finite_result():
    from policylab.kernels.checks import check_finite, count_true, float_mask

    m = torch.tensor([[True, False, True], [False, False, True]])
    f = float_mask(m, torch.float64)
    assert f.dtype == torch.float64 and f.tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]
    assert float_mask(m.t(), torch.float32).tolist() == m.t().float().tolist()  # non-contiguous view
    assert int(count_true(m, f)) == 3 and int(count_true(m)) == 3
    t = torch.tensor([[0.0, float("nan"), 1.0], [float("inf"), 2.0, 3.0]])
    assert check_finite(t, "t", m) is False  # NaN/inf only where the mask is False
    assert check_finite(torch.ones(2, 3), "t", m) is True


def test_masked_mean_hand_case_padding_and_empty():
    from policylab.kernels.checks import masked_mean

    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    m = torch.tensor([[True, True, False], [True, False, True]])
    got = masked_mean(x, m)
    assert got.item() == (1 + 2 + 4 + 6) / 4 and got.dtype == torch.float64 and got.dim() == 0
    naive = sum(float(v) for v, k in zip(x.flatten(), m.flatten()) if k) / int(m.sum())
    assert got.item() == naive
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0
    z = torch.where(m, x, torch.zeros(()))
    assert masked_mean(z, m, zero_outside=True).item() == got.item()
