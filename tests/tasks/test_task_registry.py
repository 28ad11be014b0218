import pytest

from policylab.errors import PolicylabError
from policylab.tasks import TASKS, ArithmeticTask, get_task


def test_registry_builds_tasks(tmp_path):
    assert sorted(TASKS) == ["arithmetic", "jsonl", "reasoning_gym"]
    task = get_task("arithmetic", ops=("+",), seed=4)
    assert isinstance(task, ArithmeticTask) and task.ops == ("+",) and task.seed == 4
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "p", "answer": "a"}\n')
    assert get_task("jsonl", path=path)[0].prompt == "p"


def test_reasoning_gym_name_keyword_passes_through():
    pytest.importorskip("reasoning_gym")
    examples, _ = get_task("reasoning_gym", name="basic_arithmetic", size=2, seed=0)
    assert len(examples) == 2


def test_unknown_task_suggests_close_matches():
    with pytest.raises(PolicylabError, match=r"unknown task 'arithmetc'.*Did you mean 'arithmetic'\?"):
        get_task("arithmetc")
    with pytest.raises(PolicylabError, match=r"unknown task 'reasoning-gym'.*Did you mean 'reasoning_gym'\?"):
        get_task("reasoning-gym")
    with pytest.raises(PolicylabError, match=r"known tasks: arithmetic, jsonl, reasoning_gym\.$"):
        get_task("zzz")  # nothing close: no suggestion
