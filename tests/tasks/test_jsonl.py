import json

import pytest

from policylab.errors import PolicylabError
from policylab.tasks import Example, load_jsonl


def write(tmp_path, text):
    path = tmp_path / "data.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


def test_loads_examples_meta_and_numbers(tmp_path):
    path = write(tmp_path, '{"prompt": "1+1?", "answer": 2, "level": 1}\n\n{"prompt": "half?", "answer": "0.5"}\n')
    got = load_jsonl(path)
    assert got == [
        Example("1+1?", "2", {"level": 1, "jsonl_line": 1}),  # number answer -> its text
        Example("half?", "0.5", {"jsonl_line": 3}),  # blank line 2 skipped, line numbers kept
    ]


def test_custom_field_names(tmp_path):
    path = write(tmp_path, '{"question": "q", "solution": "s"}\n')
    assert load_jsonl(path, prompt_field="question", answer_field="solution") == [Example("q", "s", {"jsonl_line": 1})]


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="JSONL task file not found: .*nope.jsonl"):
        load_jsonl(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    "text, match",
    [
        ('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": \n', r"data.jsonl:2: invalid JSON"),
        ('{"prompt": "a", "answer": "1"}\n\n{"prompt": "c"}\n', r"data.jsonl:3: missing field 'answer' \(fields present: \['prompt'\]\)"),
        ('{"answer": "1"}\n', r"data.jsonl:1: missing field 'prompt'"),
        ('{"prompt": "a", "answer": null}\n', r"data.jsonl:1: missing field 'answer'"),
        ('["prompt", "answer"]\n', r"data.jsonl:1: expected a JSON object, got list"),
        ('{"prompt": 5, "answer": "1"}\n', r"data.jsonl:1: field 'prompt' must be a string"),
        ('{"prompt": "a", "answer": [1]}\n', r"data.jsonl:1: field 'answer' must be a string or a number"),
        ("\n\n", "no examples"),
        ('{"prompt": "a", "answer": "1", "jsonl_line": 9}\n', "'jsonl_line' is reserved"),
    ],
)
def test_bad_files(tmp_path, text, match):
    with pytest.raises(PolicylabError, match=match):
        load_jsonl(write(tmp_path, text))


# ---- gold answers are validated at load (issue 25.10) ----------------------------------
@pytest.mark.parametrize("raw, what", [('{"prompt": "p", "answer": NaN}', "NaN is not a JSON value"),
                                       ('{"prompt": "p", "answer": -Infinity}', "-Infinity is not a JSON value"),
                                       ('{"prompt": "p", "answer": 1e400}', "too large to be a finite float"),
                                       ('{"prompt": "p", "answer": "1", "w": Infinity}', "Infinity is not")])
def test_non_finite_numbers_are_refused_at_load(tmp_path, raw, what):
    # before: json.loads took bare NaN, the answer became the text "nan" and training
    # crashed when the example was drawn
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "ok", "answer": 1}\n' + raw + "\n")
    with pytest.raises(PolicylabError, match=f"d.jsonl:2: .*{what}"):
        load_jsonl(p)


def _jsonl_task(tmp_path, reward, answer):
    from policylab.tasks.source import build_task
    from policylab.trainer.config import TaskConfig

    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt": "What is 2 + 2?", "answer": 4}) + "\n"
                 + json.dumps({"prompt": "And 1 / 0?", "answer": answer}) + "\n")
    return build_task(TaskConfig(name="jsonl", path=str(p), reward=reward), seed=0)


def test_a_word_answer_is_refused_when_an_exact_numeric_task_is_built(tmp_path):
    from policylab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"d.jsonl:2: answer 'forty-two' cannot be scored by task.reward=exact_numeric"):
        _jsonl_task(tmp_path, "exact_numeric", "forty-two")
    assert _jsonl_task(tmp_path, "exact_numeric", "42").reward_fn(["42"], ["42"]) == [1.0]


def test_an_undefined_math_gold_is_refused_at_load_and_when_scored(tmp_path):
    pytest.importorskip("math_verify")
    from policylab.errors import ConfigError
    from policylab.kernels.rewards.verifiers import math_verify_reward

    # before: gold \frac{1}{0} (complex infinity) made the reply "\frac{1}{0}" correct
    for gold in (r"\frac{1}{0}", "0/0", r"\log(0)"):
        with pytest.raises(PolicylabError, match="is undefined"):
            math_verify_reward([gold], [gold])
        with pytest.raises(ConfigError, match="d.jsonl:2: .*is undefined"):
            _jsonl_task(tmp_path, "math_verify", gold)
    assert math_verify_reward([r"\boxed{\infty}"], [r"\infty"]) == [1.0]  # infinity is a value (a limit), kept
