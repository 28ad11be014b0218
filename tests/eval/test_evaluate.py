"""policylab.eval.evaluate.evaluate with verifiers that give partial credit or broken scores:
accuracy and pass@k count full credit only, the mean score keeps partial credit, and a
non-finite score is refused. Tiny random Llama."""

from __future__ import annotations

import math

import pytest

from policylab.engines.fast import FastEngine
from policylab.errors import PolicylabError
from policylab.eval.evaluate import evaluate


def _scores(pattern):
    """A verifier that scores the i-th reply it sees pattern[i % len(pattern)]."""
    seen = []

    def fn(responses, answers, **_):
        out = [pattern[(len(seen) + i) % len(pattern)] for i in range(len(responses))]
        seen.extend(out)
        return out

    return fn, seen


def _run(tiny_model, tokenizer, reward_fn, **kw):
    prompts = [tokenizer.encode(f"What is {i} + 1?") for i in range(3)]
    return evaluate(FastEngine(tiny_model, tokenizer), prompts, ["1", "2", "3"], reward_fn, samples=2, k=(1, 2),
                    max_new_tokens=3, batch_size=2, **kw)


def test_partial_credit_counts_in_the_mean_score_not_in_accuracy(tiny_model, tokenizer):
    # replies in order: prompt 0 -> (1.0, 0.5), prompt 1 -> (0.0, 1.0), prompt 2 -> (0.5, 0.5)
    fn, seen = _scores([1.0, 0.5, 0.0, 1.0, 0.5, 0.5])
    res = _run(tiny_model, tokenizer, fn)
    assert seen == [1.0, 0.5, 0.0, 1.0, 0.5, 0.5]
    # by hand: 2 of 6 samples at full credit; scores sum to 3.5 over 6
    assert res["accuracy"] == pytest.approx(2 / 6)
    assert res["mean_reward"] == pytest.approx(3.5 / 6)
    # pass@2 per prompt with c full-credit samples of n = 2: 1, 1, 0 -> mean 2/3
    assert res["pass@2"] == pytest.approx(2 / 3)
    assert res["pass@1"] == pytest.approx(res["accuracy"])
    assert res["accuracy_stderr"] == pytest.approx(math.sqrt((2 / 6) * (4 / 6) / 6))
    # a lower bar: 0.5 counts as solved
    fn, _ = _scores([1.0, 0.5, 0.0, 1.0, 0.5, 0.5])
    assert _run(tiny_model, tokenizer, fn, solved_at=0.5)["accuracy"] == pytest.approx(5 / 6)


def test_binary_scores_are_unchanged(tiny_model, tokenizer):
    fn, _ = _scores([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    res = _run(tiny_model, tokenizer, fn)
    assert res["accuracy"] == pytest.approx(0.5) and res["mean_reward"] == pytest.approx(0.5)
    assert res["pass@2"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_score_is_refused_with_the_reply(tiny_model, tokenizer, bad):
    fn, _ = _scores([1.0, bad])
    with pytest.raises(PolicylabError, match=r"scored \d+ held-out reply\(ies\) non-finite, e\.g\. (nan|inf) for reply"):
        _run(tiny_model, tokenizer, fn)


def test_a_verifier_returning_the_wrong_number_of_scores_is_refused(tiny_model, tokenizer):
    with pytest.raises(PolicylabError, match=r"returned \(1,\) scores for 4 held-out replies"):
        _run(tiny_model, tokenizer, lambda r, a, **_: [1.0])
