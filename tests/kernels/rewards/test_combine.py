import math
import random

import pytest
import torch

from policylab.errors import MissingQuantityError, NonFiniteError, ShapeError
from policylab.kernels.rewards import RewardFnError, combine_rewards, exact_numeric_reward


def const(values):
    return lambda completions, answers, **_: list(values)


def test_hand_case_with_not_applicable():
    # weights a = 1.0, b = 0.5, so sum |w| = 1.5
    #   sample 0: both apply: 1*1 + 0.5*1                   = 1.5
    #   sample 1: only a applies: (1.5 / 1.0) * (1 * 1)     = 1.5
    #   sample 2: both apply: 1*0 + 0.5*1                   = 0.5
    #   sample 3: only b applies: (1.5 / 0.5) * (0.5 * 0.4) = 0.6
    fns = [("a", const([1, 1, 0, None]), 1.0), ("b", const([1, None, 1, 0.4]), 0.5)]
    total, per_fn = combine_rewards(fns, ["w", "x", "y", "z"], [0, 0, 0, 0], dtype=torch.float64)
    torch.testing.assert_close(total, torch.tensor([1.5, 1.5, 0.5, 0.6], dtype=torch.float64))
    assert torch.isnan(per_fn["b"][1]) and torch.isnan(per_fn["a"][3])
    # None is excluded from that function's mean: b = mean(1, 1, 0.4) = 0.8
    assert torch.nanmean(per_fn["b"]).item() == pytest.approx(0.8)


def naive_combine(table, weights):
    full = sum(abs(w) for w in weights)
    out = []
    for i in range(len(table[0])):
        app = [(w, col[i]) for w, col in zip(weights, table) if col[i] is not None]
        mass = sum(abs(w) for w, _ in app)
        out.append(0.0 if mass == 0 else full / mass * sum(w * r for w, r in app))
    return out


def test_matches_naive_reference_random():
    rng = random.Random(1)
    weights = [1.0, -0.3, 2.0]
    table = [[rng.choice([None, rng.uniform(-1, 1)]) for _ in range(64)] for _ in weights]
    table[0] = [1.0 if all(col[i] is None for col in table[1:]) and v is None else v for i, v in enumerate(table[0])]
    fns = [(f"f{j}", const(col), w) for j, (col, w) in enumerate(zip(table, weights))]
    total, _ = combine_rewards(fns, ["c"] * 64, [0] * 64, dtype=torch.float64)
    torch.testing.assert_close(total, torch.tensor(naive_combine(table, weights), dtype=torch.float64))


def test_all_applicable_is_plain_weighted_sum():
    fns = [("correct", exact_numeric_reward, 1.0), ("len", const([-0.5, 0.0]), 0.2)]
    total, per_fn = combine_rewards(fns, ["It is 4", "5"], [4, 4], dtype=torch.float64)
    # sample 0: 1*1 + 0.2*(-0.5) = 0.9 ; sample 1: 1*0 + 0.2*0 = 0
    torch.testing.assert_close(total, torch.tensor([0.9, 0.0], dtype=torch.float64))
    assert per_fn["correct"].tolist() == [1.0, 0.0]


def test_raising_function_names_function_sample_and_prompt():
    def picky(completions, answers, **_):
        return [1 / len(c) for c in completions]  # ZeroDivisionError on the empty reply

    with pytest.raises(RewardFnError, match=r"'picky' raised on sample 2 \(prompt 'What is 1 \+ 1\?'\).*ZeroDivisionError") as exc:
        combine_rewards([("picky", picky, 1.0)], ["a", "b", ""], [1, 1, 1], prompts=["p0", "p1", "What is 1 + 1?"])
    assert isinstance(exc.value.__cause__, ZeroDivisionError)


def test_raising_only_on_the_whole_batch():
    def batchy(completions, answers, **_):
        if len(completions) > 1:
            raise RuntimeError("batch too big")
        return [0.0]

    with pytest.raises(RewardFnError, match="'batchy' raised on the batch of 2 samples but on no single sample"):
        combine_rewards([("batchy", batchy, 1.0)], ["a", "b"], [1, 1])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), torch.tensor([0.0, 0.0, float("nan")])])
def test_nan_or_inf_reward_raises_never_zero_filled(bad):
    out = bad if isinstance(bad, torch.Tensor) else [0.0, 0.0, bad]
    with pytest.raises(NonFiniteError, match=r"'judge' returned (nan|inf) for sample 2 \(prompt 'q2'\)"):
        combine_rewards([("judge", const(out), 1.0)], ["a", "b", "c"], [0, 0, 0], prompts=["q0", "q1", "q2"])


def test_wrong_output_shape_or_type():
    with pytest.raises(ShapeError, match="'short' must return 3 values"):
        combine_rewards([("short", const([1.0]), 1.0)], ["a", "b", "c"], [0, 0, 0])
    with pytest.raises(TypeError, match="'texty' returned str 'yes' for sample 0"):
        combine_rewards([("texty", const(["yes"]), 1.0)], ["a"], [0])


def test_sample_without_any_applicable_reward_raises():
    with pytest.raises(MissingQuantityError, match="a reward for sample 1"):
        combine_rewards([("a", const([1.0, None]), 1.0), ("b", const([None, None]), 1.0)], ["x", "y"], [0, 0])


def test_context_and_prompts_reach_the_functions():
    seen = {}

    def spy(completions, answers, *, prompts, metas, **_):
        seen.update(prompts=prompts, metas=metas)
        return [0.0] * len(completions)

    combine_rewards([("spy", spy, 1.0)], ["a"], [0], prompts=["p"], context={"metas": [{"k": 1}]})
    assert seen == {"prompts": ["p"], "metas": [{"k": 1}]}


def test_bad_arguments():
    f = ("f", const([0.0]), 1.0)
    with pytest.raises(ShapeError, match="names must be unique"):
        combine_rewards([f, f], ["a"], [0])
    with pytest.raises(NonFiniteError, match="weight of reward function 'f'"):
        combine_rewards([("f", const([0.0]), math.nan)], ["a"], [0])
    with pytest.raises(ShapeError, match="`fns` is empty"):
        combine_rewards([], ["a"], [0])
    with pytest.raises(ShapeError, match="`answers` has 2"):
        combine_rewards([f], ["a"], [0, 1])
    with pytest.raises(ShapeError, match="context `metas`"):
        combine_rewards([f], ["a"], [0], context={"metas": []})
