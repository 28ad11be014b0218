import sys

import pytest

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.rewards import combine_rewards
from policylab.tasks import answer_tag_or_reply, load_reasoning_gym


def test_missing_package_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import now fails
    with pytest.raises(ImportError, match="pip install reasoning-gym"):
        load_reasoning_gym("basic_arithmetic", size=2, seed=0)


def test_answer_tag_or_reply():
    assert answer_tag_or_reply("think... <answer> 1 </answer> then <answer>-4</answer>") == "-4"
    assert answer_tag_or_reply("  12 \n") == "12"
    assert answer_tag_or_reply("") is None


def test_real_dataset_examples_and_scorer():
    pytest.importorskip("reasoning_gym")
    examples, score = load_reasoning_gym("basic_arithmetic", size=4, seed=1)
    assert len(examples) == 4
    assert all(ex.prompt and ex.answer and ex.meta["dataset"] == "basic_arithmetic" for ex in examples)
    right = [f"<answer>{ex.answer}</answer>" for ex in examples]
    wrong = ["<answer>not a number</answer>", "", "<answer>0.5x</answer>", "?"]
    metas = [ex.meta for ex in examples]
    answers = [ex.answer for ex in examples]
    assert score(right, answers, metas=metas) == [1.0] * 4
    assert score(wrong, answers, metas=metas) == [0.0] * 4
    # through combine_rewards, metas given as context
    total, _ = combine_rewards([("rg", score, 1.0)], right[:2] + wrong[:2], answers, context={"metas": metas})
    assert total.tolist() == [1.0, 1.0, 0.0, 0.0]
    # same seed -> same examples
    again, _ = load_reasoning_gym("basic_arithmetic", size=4, seed=1)
    assert [e.prompt for e in again] == [e.prompt for e in examples]


def test_real_dataset_bad_inputs():
    pytest.importorskip("reasoning_gym")
    with pytest.raises(PolicylabError, match=r"unknown reasoning-gym dataset 'basic_arithmetik'; did you mean 'basic_arithmetic'"):
        load_reasoning_gym("basic_arithmetik", size=2, seed=0)
    examples, score = load_reasoning_gym("basic_arithmetic", size=2, seed=0)
    with pytest.raises(ShapeError, match="differ in length"):
        score(["1"], ["1"], metas=[ex.meta for ex in examples])
    with pytest.raises(PolicylabError, match=r"metas\[0\] is not an example meta"):
        score(["1"], ["1"], metas=[{"jsonl_line": 1}])
