"""RFPO: length debiasing, the ≥ threshold, forecasts for truncated replies."""

import pytest
import torch

from policylab.errors import ShapeError
from policylab.kernels.rewards import critic_reward as cr


def test_threshold_tie_goes_to_one_and_truncated_is_a_forecast():
    # τ = 0.5, no bias: values [0.5, 0.49, 0.9 (truncated)]
    # finished 0.5 >= 0.5 -> 1 (tie to 1); 0.49 -> 0; truncated -> its value 0.9 as a forecast, never a verdict
    r, verdict, forecast = cr.rfpo_rewards(torch.tensor([0.5, 0.49, 0.9]), torch.tensor([3, 3, 8]),
                                           torch.tensor([True, True, False]), bias=(0.0, 0.0), tau=0.5)
    torch.testing.assert_close(r, torch.tensor([1.0, 0.0, 0.9]))
    assert verdict.tolist() == [True, False, False]
    assert forecast.tolist() == [False, False, True]


def test_linear_length_bias_is_removed():
    # synthetic: at every length 1..50, 4 of 10 replies succeed (no true length effect); the
    # critic says 0.4 + 0.01·L, a linear length bias. The fit recovers β = 0.01 and a = 0
    # (mean error 0.01·mean(L) − 0 around the line), and the debiased values have no trend.
    L = torch.arange(1, 51, dtype=torch.float64).repeat_interleave(10)
    labels = torch.tensor([1.0] * 4 + [0.0] * 6, dtype=torch.float64).repeat(50)
    values = 0.4 + 0.01 * L
    a, beta = cr.fit_length_bias(values, labels, L)
    assert abs(beta - 0.01) < 1e-12 and abs(a) < 1e-12
    v = cr.debias(values, L, (a, beta))

    def slope(y):
        return float(((L - L.mean()) * (y - y.mean())).sum() / ((L - L.mean()) ** 2).sum())

    assert abs(slope(values) - 0.01) < 1e-12 and abs(slope(v)) < 1e-12
    torch.testing.assert_close(v, torch.full_like(v, 0.4), rtol=0, atol=1e-12)


def test_fit_length_bias_hand_case():
    # errors e = v − y = [0.1, 0.3, 0.5] at L = [1, 2, 3]: e = −0.1 + 0.2·L exactly
    a, beta = cr.fit_length_bias(torch.tensor([0.1, 1.3, 0.5], dtype=torch.float64), torch.tensor([0.0, 1.0, 0.0]),
                                 torch.tensor([1, 2, 3]))
    assert abs(a + 0.1) < 1e-12 and abs(beta - 0.2) < 1e-12
    # one length only: no slope, the mean error
    assert cr.fit_length_bias(torch.tensor([0.2, 0.4]), torch.tensor([0.0, 0.0]), torch.tensor([5, 5])) == \
        pytest.approx((0.3, 0.0))


def test_debiased_rewards_matching_a_loop():
    g = torch.Generator().manual_seed(1)
    v = torch.rand(32, generator=g, dtype=torch.float64)
    L = torch.randint(1, 20, (32,), generator=g)
    fin = torch.rand(32, generator=g) > 0.2
    r, verdict, _ = cr.rfpo_rewards(v, L, fin, bias=(0.05, 0.01), tau=0.4)
    for i in range(32):
        vh = float(v[i]) - (0.05 + 0.01 * int(L[i]))
        want = (1.0 if vh >= 0.4 else 0.0) if bool(fin[i]) else vh
        assert abs(float(r[i]) - want) < 1e-12
        assert bool(verdict[i]) == (bool(fin[i]) and vh >= 0.4)


def test_bad_input_is_refused():
    with pytest.raises(ShapeError, match="bool"):
        cr.rfpo_rewards(torch.ones(2), torch.ones(2), torch.ones(2), bias=(0, 0), tau=0.5)
    with pytest.raises(ShapeError):
        cr.rfpo_rewards(torch.ones(2), torch.ones(3), torch.ones(2, dtype=torch.bool), bias=(0, 0), tau=0.5)
    with pytest.raises(ValueError, match="tau"):
        cr.rfpo_rewards(torch.ones(2), torch.ones(2), torch.ones(2, dtype=torch.bool), bias=(0, 0),
                        tau=float("nan"))
    with pytest.raises(ShapeError):
        cr.fit_length_bias(torch.ones(0), torch.ones(0), torch.ones(0))
