"""verdict_polarity (advantages/verdict.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages import verdict_polarity
from policylab.errors import NonFiniteError


def test_threshold_is_inclusive_and_rows_are_independent():
    # threshold 0.5: 1 → +1, 0 → −1, 0.5 (exactly at the threshold) → +1, 0.49 → −1
    out = verdict_polarity(torch.tensor([1.0, 0.0, 0.5, 0.49]), 0.5)
    assert_close(out, torch.tensor([1.0, -1.0, 1.0, -1.0]), rtol=0, atol=0)
    assert out.dtype == torch.float32 and not out.requires_grad
    # no group statistic: changing the other rows leaves row 0 unchanged
    assert verdict_polarity(torch.tensor([1.0, 1.0, 1.0, 1.0]), 0.5)[0] == out[0]


def test_matches_a_loop_and_is_detached():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(17, generator=g, dtype=torch.float64).requires_grad_(True)
    expected = torch.tensor([1.0 if float(v) >= 0.3 else -1.0 for v in x.detach()])
    out = verdict_polarity(x, 0.3)
    assert_close(out, expected, rtol=0, atol=0)
    assert out.grad_fn is None


def test_non_finite_outcome_is_refused():
    with pytest.raises(NonFiniteError, match="outcome"):
        verdict_polarity(torch.tensor([1.0, float("nan")]), 0.5)
