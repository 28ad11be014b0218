import math
import random
from fractions import Fraction

import pytest
import torch

from policylab.errors import NonFiniteError, PolicylabError, ShapeError
from policylab.kernels.metrics import ECE_EDGE_TOL, brier, ece, ece_bins, pass_at_k


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


EDGES = [k / 10 for k in range(11)]  # 0.0, 0.1, ..., 1.0 as decimal literals


def _edge_inputs():
    """The stated confidences 0.0, 0.1, ..., 1.0 as they reach the ECE: parsed to float32
    (RLCR's confidence tensor), as fp64 literals, and as fp64 values computed another way
    (1 − (10 − k)/10 lands one ulp below the literal for k = 1: 0.09999999999999998)."""
    f32 = torch.tensor(EDGES, dtype=torch.float32)
    f64 = torch.tensor(EDGES, dtype=torch.float64)
    computed = torch.tensor([1 - (10 - k) / 10 for k in range(11)], dtype=torch.float64)
    return {"float32": f32, "float32->fp64": f32.double(), "fp64": f64, "fp64 computed": computed}


def test_ece_bins_are_exact_at_every_decimal_edge():
    # M = 10: the confidence k/10 belongs to bin k ([k/10, (k+1)/10)); 1.0 to the last bin, 9.
    # float32 0.7 is 0.699999988..., float32 0.9 is 0.899999976...: floor(10·q) put them in
    # bins 6 and 8 (RLCR's logged ECE); an edge is an edge whatever the dtype that carried it
    want = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9]
    for name, q in _edge_inputs().items():
        assert ece_bins(q, n_bins=10).tolist() == want, name
    assert float(torch.tensor(0.7, dtype=torch.float32).double()) < 0.7  # the trap, for the record
    # the tolerance snaps representation error only: 1e-4 below an edge is the bin below it,
    # 1e-7 below it (float32 rounding is <= 3e-8 at q <= 1) is the edge's bin
    near = torch.tensor([0.7 - 1e-4, 0.7 - 1e-7, 0.7 + 1e-4, 1.0 - 1e-4], dtype=torch.float64)
    assert ece_bins(near, n_bins=10).tolist() == [6, 7, 7, 9]
    assert ECE_EDGE_TOL == 1e-6
    # other M: 1/3 as float32 (0.3333333432...) is the edge of bin 1 of 3; 2/3 of bin 2
    thirds = torch.tensor([0.0, 1 / 3, 2 / 3, 1.0], dtype=torch.float32)
    assert ece_bins(thirds, n_bins=3).tolist() == [0, 1, 2, 2]
    assert ece_bins(torch.tensor([0.0, 0.5, 1.0]), n_bins=1).tolist() == [0, 0, 0]


def test_ece_hand_case_at_every_decimal_edge():
    # q = 0.0, 0.1, ..., 1.0 (11 replies, M = 10), correct iff q >= 0.7:
    #   bins 0..6 hold one wrong reply each: |0 − q| = 0, 0.1, ..., 0.6   (sum 2.1)
    #   bin 7 {0.7 right}: |1 − 0.7| = 0.3; bin 8 {0.8 right}: 0.2
    #   bin 9 {0.9, 1.0 both right}: acc 1, conf 0.95: |1 − 0.95| = 0.05, weight 2/11
    #   ECE = (2.1 + 0.3 + 0.2)/11 + (2/11)(0.05) = 2.6/11 + 0.1/11 = 2.7/11 = 0.245454...
    # (with 0.7 and 0.9 one bin low: bins 0..5 sum 1.5; bin 6 {0.6 wrong, 0.7 right}: 2 × 0.15;
    #  bin 8 {0.8, 0.9 right}: 2 × 0.15; bin 9 {1.0 right}: 0 → 2.1/11 = 0.1909)
    correct = torch.tensor([k >= 7 for k in range(11)])
    for name, q in _edge_inputs().items():
        assert ece(q, correct, n_bins=10).item() == pytest.approx(2.7 / 11, abs=1e-7), name
        assert ece(q, correct, n_bins=10).dtype == q.dtype


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
