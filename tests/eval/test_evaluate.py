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


def test_the_tasks_own_held_out_measures_see_every_reply_and_its_correctness(tiny_model, tokenizer):
    fn, _ = _scores([1.0, 0.5, 0.0, 1.0, 0.5, 0.5])
    got = {}

    def measures(replies, correct):
        got["replies"], got["correct"] = list(replies), list(correct)
        return {"mine/count": len(replies), "mine/right": sum(correct)}

    res = _run(tiny_model, tokenizer, fn, task_metrics=measures)
    # 6 replies (3 prompts x 2 samples, in order); correct at full credit only
    assert got["correct"] == [True, False, False, True, False, False]
    assert len(got["replies"]) == 6 and all(isinstance(r, str) for r in got["replies"])
    assert res["mine/count"] == 6 and res["mine/right"] == 2
    fn, _ = _scores([1.0])
    with pytest.raises(PolicylabError, match=r"would overwrite \['accuracy'\]"):
        _run(tiny_model, tokenizer, fn, task_metrics=lambda r, c: {"accuracy": 0.0})


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_score_is_refused_with_the_reply(tiny_model, tokenizer, bad):
    fn, _ = _scores([1.0, bad])
    with pytest.raises(PolicylabError, match=r"scored \d+ held-out reply\(ies\) non-finite, e\.g\. (nan|inf) for reply"):
        _run(tiny_model, tokenizer, fn)


def test_a_verifier_returning_the_wrong_number_of_scores_is_refused(tiny_model, tokenizer):
    with pytest.raises(PolicylabError, match=r"returned \(1,\) scores for 4 held-out replies"):
        _run(tiny_model, tokenizer, lambda r, a, **_: [1.0])


def test_the_verifier_sees_each_replys_own_prompt_as_in_training(tiny_model, tokenizer):
    # the prompts reach the verifier as `prompts=`, repeated per sample, so an echo-only reply is
    # judged as the training reward judges it; without prompt_texts the verifier gets no prompts
    got = []

    def fn(responses, answers, prompts=None, **_):
        got.append(prompts)
        return [0.0] * len(responses)

    texts = [f"What is {i} + 1?" for i in range(3)]
    _run(tiny_model, tokenizer, fn, prompt_texts=texts)
    assert got == [[texts[0], texts[0], texts[1], texts[1]], [texts[2], texts[2]]]
    got.clear()
    _run(tiny_model, tokenizer, fn)
    assert got == [None, None]
    with pytest.raises(PolicylabError, match="prompt_texts has 2 entries for 3 prompts"):
        _run(tiny_model, tokenizer, fn, prompt_texts=texts[:2])


def test_an_echo_only_reply_scores_zero_in_evaluation(tokenizer):
    # an engine whose every reply is its prompt: "What is 0 + 42?" ends with the gold 42; the
    # exact-numeric verifier removes the echo when it knows the prompt (training does), so the
    # evaluator must hand it the prompt too
    import torch

    from policylab.kernels.rewards.verifiers import exact_numeric_reward

    class Echo:
        def generate(self, prompts, *, group_size, **_):
            self.prompts = [p for p in prompts for _ in range(group_size)]
            return type("B", (), {"response_lengths": torch.ones(len(self.prompts), dtype=torch.long)})()

        def decode_responses(self, batch):
            return [tokenizer.decode(p) for p in self.prompts]

    text = "What is 0 + 42?"
    ids = [tokenizer.encode(text)]
    assert evaluate(Echo(), ids, ["42"], exact_numeric_reward)["accuracy"] == 1.0  # the hole without prompts
    assert evaluate(Echo(), ids, ["42"], exact_numeric_reward, prompt_texts=[text])["accuracy"] == 0.0
