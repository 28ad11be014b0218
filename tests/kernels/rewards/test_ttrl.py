import inspect
import math
import random
from collections import Counter

import pytest
import torch

from policylab.errors import NonFiniteError, ShapeError
from policylab.kernels.rewards import extract_last_number, majority_vote, pseudo_label_agreement, ttrl_rewards


def test_hand_case_majority_and_agreement():
    # answers [3,3,7,7,7,1,9,2]: votes 7:3, 3:2, 1:1, 9:1, 2:1 -> label 7 (unique top)
    completions = [f"The answer is {a}." for a in [3, 3, 7, 7, 7, 1, 9, 2]]
    rewards, eligible, info = ttrl_rewards(completions, [0] * 8)
    torch.testing.assert_close(rewards, torch.tensor([0.0, 0, 1, 1, 1, 0, 0, 0]), rtol=0, atol=0)
    assert eligible.all() and info["labels"] == ["7"]
    assert info["majority_fraction"].item() == pytest.approx(3 / 8)
    # evaluator only: true label 3 -> true rewards [1,1,0,0,0,0,0,0]
    # agreement: positions 0,1 (pseudo 0 vs true 1) and 2,3,4 (1 vs 0) differ,
    # positions 5,6,7 agree -> 3/8 = 0.375 (the two correct samples were pushed down)
    true = torch.tensor([1.0, 1, 0, 0, 0, 0, 0, 0])
    assert pseudo_label_agreement(rewards, true).item() == 0.375


def test_no_gold_parameter():
    gold_like = {"gold", "answer", "answers", "label", "labels", "target", "targets", "truth"}
    assert list(inspect.signature(ttrl_rewards).parameters) == ["completions", "group", "extract", "normalize"]
    assert not gold_like & set(inspect.signature(ttrl_rewards).parameters)
    assert not gold_like & set(inspect.signature(majority_vote).parameters)


def test_tie_makes_group_ineligible_with_nan_rewards():
    # group 5: 2 votes for "1", 2 for "2" -> tie -> no label; group 9: "4" x2 vs "5" -> label 4
    completions = ["1", "1", "2", "2", "4", "4", "5"]
    rewards, eligible, info = ttrl_rewards(completions, torch.tensor([5, 5, 5, 5, 9, 9, 9]))
    assert eligible.tolist() == [False] * 4 + [True] * 3
    assert torch.isnan(rewards[:4]).all()  # never a made-up 0
    assert rewards[4:].tolist() == [1.0, 1.0, 0.0]
    assert info["labels"] == [None, "4"] and info["n_ties"] == 1 and info["n_eligible"] == 1


def test_none_bucket_never_the_label():
    # three unparseable replies (including an empty one) outvote "4", but None cannot win
    label, info = majority_vote([None, None, None, "4"])
    assert label == "4" and info["n_none"] == 3 and info["top_count"] == 1
    rewards, eligible, _ = ttrl_rewards(["no idea", "", "hmm", "4"], [1, 1, 1, 1])
    assert rewards.tolist() == [0.0, 0.0, 0.0, 1.0] and eligible.all()
    # nothing parseable -> ineligible
    label, info = majority_vote([None, None])
    assert label is None and info["top_count"] == 0 and not info["tie"]
    rewards, eligible, info = ttrl_rewards(["", "none"], [3, 3])
    assert not eligible.any() and info["n_no_answer"] == 1


def test_normalizer_merges_equivalent_answers():
    canon = lambda s: str(int(float(s)))  # "07", "7.0" and "7" are one answer
    label, info = majority_vote(["07", "7.0", "3", "3", "7"], normalize=canon)
    assert label == "7" and info["counts"] == {"7": 3, "3": 2}
    label, _ = majority_vote(["07", "7.0", "3", "3", "7"])  # without it: "3" wins 2 to 1
    assert label == "3"


def naive_ttrl(completions, group):
    out = [None] * len(completions)
    for g in set(group):
        idx = [i for i, x in enumerate(group) if x == g]
        answers = [extract_last_number(completions[i]) for i in idx]
        counts = Counter(a for a in answers if a is not None).most_common()
        if not counts or (len(counts) > 1 and counts[0][1] == counts[1][1]):
            continue
        for i, a in zip(idx, answers):
            out[i] = float(a == counts[0][0])
    return out


def test_matches_naive_reference_with_unsorted_noncontiguous_groups():
    rng = random.Random(0)
    ids = [rng.choice([40, -3, 7, 1000, 12]) for _ in range(300)]
    completions = [rng.choice(["1", "2", "3", "x", ""]) for _ in ids]
    rewards, eligible, info = ttrl_rewards(completions, ids)
    want = naive_ttrl(completions, ids)
    assert eligible.tolist() == [w is not None for w in want]
    assert [r for r, w in zip(rewards.tolist(), want) if w is not None] == [w for w in want if w is not None]
    assert all(math.isnan(r) for r, w in zip(rewards.tolist(), want) if w is None)
    assert info["n_groups"] == 5


def test_bad_inputs():
    with pytest.raises(ShapeError, match="`group` has 2 entries but there are 3 sequences"):
        ttrl_rewards(["1", "2", "3"], [0, 0])
    with pytest.raises(TypeError, match="single str"):
        ttrl_rewards("123", [0, 0, 0])
    with pytest.raises(ShapeError, match="`completions` is empty"):
        ttrl_rewards([], [])
    with pytest.raises(TypeError, match="votes must be str or None"):
        majority_vote([1, 2])


def test_agreement_mask_and_bad_inputs():
    pseudo = torch.tensor([1.0, 0.0, float("nan"), float("nan")])
    true = torch.tensor([1.0, 1.0, 0.0, 1.0])
    mask = torch.tensor([True, True, False, False])
    # masked: sample 0 agrees, sample 1 does not -> 1/2
    assert pseudo_label_agreement(pseudo, true, mask).item() == 0.5
    with pytest.raises(NonFiniteError, match="`pseudo_rewards`"):
        pseudo_label_agreement(pseudo, true)  # NaN inside the (full) mask
    with pytest.raises(ShapeError, match="`true_rewards` has shape"):
        pseudo_label_agreement(pseudo, true[:3])
    with pytest.raises(ShapeError, match="selects no sample"):
        pseudo_label_agreement(pseudo, true, torch.zeros(4, dtype=torch.bool))
