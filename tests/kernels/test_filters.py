import inspect

import pytest
import torch

from policylab.errors import GroupError, NonFiniteError, PolicylabError, ShapeError
from policylab.kernels.filters import dynamic_sampling_keep


def test_hand_case_dapo():
    # group 0: [1,1,1,1] #correct = 4 = G -> dropped
    # group 1: [0,0,0,0] #correct = 0     -> dropped
    # group 2: [1,0,0,0] 0 < 1 < 4        -> kept
    outcome = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0])
    group = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    keep, info = dynamic_sampling_keep(outcome, group)
    assert keep.tolist() == [False] * 8 + [True] * 4
    assert info["n_groups"].item() == 3 and info["n_kept"].item() == 1
    assert info["filtered_fraction"].item() == pytest.approx(2 / 3)


def test_decides_on_raw_outcome_not_shaped_reward():
    # all four correct, but overlong penalties differ: shaped = 1 + [0, -0.25, -0.5, 0]
    correct = torch.tensor([1.0, 1.0, 1.0, 1.0])
    shaped = correct + torch.tensor([0.0, -0.25, -0.5, 0.0])
    group = torch.tensor([3, 3, 3, 3])
    keep, _ = dynamic_sampling_keep(correct, group)
    assert not keep.any()  # dropped, as DAPO says
    # (the shaped reward varies, so feeding it would wrongly keep the group)
    assert dynamic_sampling_keep(shaped, group)[0].all()
    # the function has no reward / shaping argument at all
    assert list(inspect.signature(dynamic_sampling_keep).parameters) == ["outcome", "group", "tol"]


def naive_keep(outcome, group, tol):
    keep = []
    for g in group:
        vals = [o for o, h in zip(outcome, group) if h == g]
        keep.append(max(vals) - min(vals) > tol)
    return keep


def test_matches_naive_reference_noncontiguous_unsorted_ids():
    g = torch.Generator().manual_seed(0)
    group = torch.tensor([17, -4, 1000, 5, 17, 5, -4, 1000, 99])[torch.randint(0, 9, (200,), generator=g)]
    outcome = torch.randint(0, 2, (200,), generator=g).to(torch.float64)
    outcome[group == 99] = 1.0  # make one group constant for sure
    keep, info = dynamic_sampling_keep(outcome, group)
    assert keep.tolist() == naive_keep(outcome.tolist(), group.tolist(), 0.0)
    assert not keep[group == 99].any()
    assert info["n_groups"].item() == len(set(group.tolist()))


def test_tolerance_is_strict_and_real_valued_outcomes():
    outcome = torch.tensor([0.5, 0.5 + 1e-3, 0.2, 0.7])
    group = torch.tensor([0, 0, 1, 1])
    # spread of group 0 is 1e-3 (up to float32 rounding), of group 1 0.5
    assert dynamic_sampling_keep(outcome, group, tol=1e-2)[0].tolist() == [False, False, True, True]
    assert dynamic_sampling_keep(outcome, group, tol=1e-4)[0].tolist() == [True, True, True, True]
    # spread exactly equal to tol -> constant (strict >)
    exact = torch.tensor([0.0, 0.5], dtype=torch.float64)
    assert not dynamic_sampling_keep(exact, torch.tensor([0, 0]), tol=0.5)[0].any()


def test_singleton_group_dropped_and_bool_outcome():
    keep, info = dynamic_sampling_keep(torch.tensor([True, True, False]), torch.tensor([0, 1, 1]))
    assert keep.tolist() == [False, True, True] and info["n_kept"].item() == 1


@pytest.mark.parametrize(
    "outcome, group, kwargs, err, match",
    [
        (torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]), {}, NonFiniteError, "`outcome`"),
        (torch.tensor([[1.0, 0.0]]), torch.tensor([0, 0]), {}, ShapeError, r"1-D tensor \[B\]"),
        (torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), {}, GroupError, "integer tensor"),
        (torch.tensor([1.0, 0.0]), torch.tensor([0, 0, 1]), {}, ShapeError, "`group` has 3 entries"),
        (torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), {"tol": -0.1}, PolicylabError, "`tol` must be >= 0"),
        (torch.tensor([]), torch.tensor([], dtype=torch.long), {}, ShapeError, "`outcome` is empty"),
    ],
)
def test_bad_inputs(outcome, group, kwargs, err, match):
    with pytest.raises(err, match=match):
        dynamic_sampling_keep(outcome, group, **kwargs)
