"""MaD-RL: detached group class frequencies (invalid replies in the denominator) matched
to a smoothed target."""

import math

import pytest
import torch

from policylab.errors import ShapeError
from policylab.kernels.rewards import distribution as dist


def naive_match(class_ids, group, target, eps, form):
    out = []
    for i, (c, g) in enumerate(zip(class_ids, group)):
        members = [j for j, h in enumerate(group) if h == g]
        f = sum(class_ids[j] == c for j in members) / len(members)
        K = len(target[i])
        p = (1 - eps) * target[i][c] + eps / K
        out.append(math.log(p / f) if form == "log_ratio" else p - f)
    return out


def test_invalid_replies_stay_in_the_denominator():
    # group [heads, heads, tails, invalid], classes (heads, tails, invalid):
    # f̂ = [2/4, 1/4, 1/4]; dropping the invalid reply would give [2/3, 1/3]
    ids = torch.tensor([0, 0, 1, 2])
    f = dist.group_frequencies(ids, torch.zeros(4, dtype=torch.long), 3)
    torch.testing.assert_close(f[0], torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64))
    dropped = dist.group_frequencies(ids[:3], torch.zeros(3, dtype=torch.long), 3)
    torch.testing.assert_close(dropped[0], torch.tensor([2 / 3, 1 / 3, 0.0], dtype=torch.float64))
    assert not torch.allclose(f[0], dropped[0])


def test_hand_case_log_ratio():
    # target p* = [0.5, 0.5, 0], ε = 0.03, K = 3: p̃* = 0.97·p* + 0.01 = [0.495, 0.495, 0.01]
    # f̂ = [0.5, 0.25, 0.25]
    # heads: log(0.495 / 0.5) = −0.01005; tails: log(0.495 / 0.25) = 0.68310; invalid: log(0.01 / 0.25) = −3.21888
    ids = torch.tensor([0, 0, 1, 2])
    tgt = torch.tensor([[0.5, 0.5, 0.0]] * 4, dtype=torch.float64)
    r, info = dist.match_rewards(ids, torch.zeros(4, dtype=torch.long), tgt, smoothing=0.03, form="log_ratio")
    want = torch.tensor([math.log(0.495 / 0.5)] * 2 + [math.log(0.495 / 0.25), math.log(0.01 / 0.25)],
                        dtype=torch.float64)
    torch.testing.assert_close(r, want, rtol=0, atol=1e-12)
    # a group's summed log-ratio reward is −G·KL(f̂ ‖ p̃*)
    torch.testing.assert_close(r.sum(), -4 * info["kl"][0], rtol=0, atol=1e-12)
    # TV = ½(|0.5 − 0.495| + |0.25 − 0.495| + |0.25 − 0.01|) = ½(0.005 + 0.245 + 0.24) = 0.245
    assert abs(float(info["tv"][0]) - 0.245) < 1e-12


def test_matches_naive_loop_over_several_groups():
    g = torch.Generator().manual_seed(0)
    group = torch.tensor([5, 5, 5, 9, 9, 9, 9, 2, 2])
    ids = torch.randint(0, 4, (9,), generator=g)
    rows = {5: [0.2, 0.3, 0.5, 0.0], 9: [0.25, 0.25, 0.25, 0.25], 2: [0.0, 0.0, 1.0, 0.0]}
    tgt = torch.tensor([rows[int(x)] for x in group], dtype=torch.float64)
    for form in dist.MATCH_FORMS:
        got, _ = dist.match_rewards(ids, group, tgt, smoothing=0.1, form=form)
        want = naive_match(ids.tolist(), group.tolist(), tgt.tolist(), 0.1, form)
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)


def test_zero_target_without_smoothing_raises():
    with pytest.raises(ValueError, match="p\\*\\(c\\) = 0"):
        dist.smooth_target(torch.tensor([0.5, 0.5, 0.0]), 0.0)
    # with smoothing the same target is fine
    torch.testing.assert_close(dist.smooth_target(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64), 0.3),
                               torch.tensor([0.45, 0.45, 0.1], dtype=torch.float64))


def test_frequencies_have_no_gradient_path():
    ids = torch.tensor([0, 1, 1])
    tgt = torch.tensor([[0.3, 0.6, 0.1]] * 3, dtype=torch.float64, requires_grad=True)
    r, info = dist.match_rewards(ids, torch.zeros(3, dtype=torch.long), tgt, smoothing=0.0, form="log_ratio")
    assert not r.requires_grad and not info["freq"].requires_grad


def test_unsampled_classes_get_nothing():
    # class 2 is never sampled: no reply carries its reward; only sampled classes appear
    ids = torch.tensor([0, 1, 0, 1])
    tgt = torch.tensor([[0.25, 0.25, 0.5, 0.0]] * 4, dtype=torch.float64)
    r, info = dist.match_rewards(ids, torch.zeros(4, dtype=torch.long), tgt, smoothing=0.01, form="gap")
    assert r.shape == (4,) and float(info["freq"][0, 2]) == 0.0


def test_reward_adds_correctness():
    # correct [1, 1, 0, 1] + 0.5 · match
    ids = torch.tensor([0, 0, 1, 2])
    tgt = torch.tensor([[0.5, 0.5, 0.0]] * 4, dtype=torch.float64)
    match, _ = dist.match_rewards(ids, torch.zeros(4, dtype=torch.long), tgt, smoothing=0.03, form="log_ratio")
    r, _ = dist.mad_rl_rewards(torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64), ids,
                               torch.zeros(4, dtype=torch.long), tgt, coef=0.5, smoothing=0.03, form="log_ratio")
    torch.testing.assert_close(r, torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64) + 0.5 * match)


def test_bad_input_is_refused():
    z = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="sum to 1"):
        dist.smooth_target(torch.tensor([0.5, 0.6]), 0.1)
    with pytest.raises(ShapeError, match="class_ids"):
        dist.group_frequencies(torch.tensor([0, 3]), z, 3)
    with pytest.raises(ValueError, match="different targets"):
        dist.match_rewards(torch.tensor([0, 1]), z, torch.tensor([[0.5, 0.5], [0.4, 0.6]]), smoothing=0.1,
                           form="gap")
    with pytest.raises(ValueError, match="form"):
        dist.match_rewards(torch.tensor([0, 1]), z, torch.tensor([[0.5, 0.5]] * 2), smoothing=0.1, form="kl")


@pytest.mark.parametrize("reply,cls", [("Heads", 0), ("  tails.", 1), ("**heads**", 0), ("'Tails'", 1),
                                       ("heads or tails", 2), ("", 2), ("I got heads", 2)])
def test_class_mapper(reply, cls):
    assert dist.map_class(reply, ["heads", "tails"]) == cls
    assert dist.valid_outcome_reward([reply], ["heads|tails"]) == [float(cls < 2)]


@pytest.mark.parametrize("reply,cls", [("The coin lands heads.", 0), ("Heads", 0), ("tails, tails!", 1),
                                       ("heads or tails", 2), ("I got HEADS", 0), ("no idea", 2), ("", 2),
                                       ("headset", 2)])
def test_single_mention_mapper(reply, cls):
    # exactly one distinct class named as a whole word; "headset" is not the word "heads"
    assert dist.map_class(reply, ["heads", "tails"], "single_mention") == cls
    assert dist.valid_outcome_reward([reply], ["heads|tails"], mapper="single_mention") == [float(cls < 2)]


def test_single_mention_mapper_on_dice_and_bad_input():
    faces = [str(k) for k in range(1, 5)]
    assert dist.map_class("I rolled a 3.", faces, "single_mention") == 2
    # the prompt's own number restated next to the draw: two classes named -> invalid (documented)
    assert dist.map_class("A 4-sided die shows 3", faces, "single_mention") == 4
    assert dist.map_class("I rolled a 3.", faces, "exact") == 4
    with pytest.raises(ValueError, match="mapper"):
        dist.map_class("heads", ["heads", "tails"], "first_word")
    with pytest.raises(ValueError, match="one-word class names"):
        dist.map_class("light blue", ["light blue", "red"], "single_mention")


def test_distribution_task_carries_its_mapper_to_the_reward_and_mad_rl():
    from policylab.trainer.config import TaskConfig
    from policylab.tasks.source import build_task

    src = build_task(TaskConfig(name="distribution", class_mapper="single_mention"), seed=0)
    ex = src.next_train(1)[0]
    assert ex.meta["mapper"] == "single_mention"
    classes = ex.meta["classes"]
    assert src.reward_fn([f"It is {classes[0]}.", "none of them"], [ex.answer] * 2) == [1.0, 0.0]
    strict = build_task(TaskConfig(name="distribution"), seed=0)
    assert strict.reward_fn([f"It is {classes[0]}."], [ex.answer]) == [0.0]
