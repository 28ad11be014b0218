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
