import pytest
import torch

from policylab.errors import NonFiniteError, PolicylabError, ShapeError
from policylab.kernels.rewards import overlong_penalty


def naive_overlong(length: float, max_len: int, cache_len: int) -> float:
    start = max_len - cache_len
    if length <= start:
        return 0.0
    if length <= max_len:
        return (start - length) / cache_len
    return -1.0


def test_paper_defaults_hand_case():
    # L_max = 20480, L_cache = 4096, ramp starts at 20480 - 4096 = 16384
    #   16384: <= 16384                  -> 0
    #   18432: (16384 - 18432) / 4096 = -2048 / 4096 = -0.5
    #   20480: (16384 - 20480) / 4096 = -4096 / 4096 = -1
    #   20481: > L_max                   -> -1
    got = overlong_penalty(torch.tensor([16384, 18432, 20480, 20481]), max_len=20480, cache_len=4096)
    torch.testing.assert_close(got, torch.tensor([0.0, -0.5, -1.0, -1.0]), rtol=0, atol=0)


def test_continuous_at_knots_and_first_knot_inclusive():
    # one token past the first knot: (16384 - 16385) / 4096 = -1/4096
    got = overlong_penalty(torch.tensor([16383.0, 16384.0, 16385.0, 20479.0]), max_len=20480, cache_len=4096)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -1 / 4096, -4095 / 4096]), rtol=0, atol=1e-7)


def test_matches_naive_loop_random():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 140, (256,), generator=g).to(torch.float64)
    got = overlong_penalty(lengths, max_len=100, cache_len=30)
    want = torch.tensor([naive_overlong(x, 100, 30) for x in lengths.tolist()], dtype=torch.float64)
    assert got.dtype == torch.float64  # dtype follows a floating input
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_cache_equal_to_max_len():
    # L_cache = L_max = 10: ramp from 0; |y| = 5 -> (0 - 5) / 10 = -0.5
    got = overlong_penalty(torch.tensor([0, 5, 10, 11]), max_len=10, cache_len=10)
    torch.testing.assert_close(got, torch.tensor([0.0, -0.5, -1.0, -1.0]))


@pytest.mark.parametrize(
    "lengths, kwargs, err, match",
    [
        (torch.tensor([1, 2]), dict(max_len=10, cache_len=0), PolicylabError, "0 < cache_len <= max_len"),
        (torch.tensor([1, 2]), dict(max_len=10, cache_len=11), PolicylabError, "0 < cache_len <= max_len"),
        (torch.tensor([-1, 2]), dict(max_len=10, cache_len=4), PolicylabError, "`lengths` must be >= 0"),
        (torch.tensor([[1, 2]]), dict(max_len=10, cache_len=4), ShapeError, r"1-D tensor \[B\]"),
        (torch.tensor([1.0, float("nan")]), dict(max_len=10, cache_len=4), NonFiniteError, "`lengths`"),
        ([1, 2], dict(max_len=10, cache_len=4), ShapeError, "got list"),
    ],
)
def test_bad_inputs(lengths, kwargs, err, match):
    with pytest.raises(err, match=match):
        overlong_penalty(lengths, **kwargs)
