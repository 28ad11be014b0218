"""Built-in tasks and dataset loaders, found by name with `get_task`.

    get_task("arithmetic", ops=("+", "*"), digits=1, seed=0) -> ArithmeticTask
    get_task("jsonl", path="data.jsonl")                     -> list[Example]
    get_task("reasoning_gym", name="basic_arithmetic", size=100, seed=0)
                                                             -> (list[Example], scorer)
"""

from __future__ import annotations

import difflib
from typing import Any, Callable

from policylab.errors import PolicylabError
from policylab.tasks.arithmetic import PROMPT, ArithmeticTask
from policylab.tasks.example import Example, Gold, as_messages
from policylab.tasks.jsonl import load_jsonl
from policylab.tasks.reasoning_gym import ReasoningGymTask, answer_tag_or_reply, load_reasoning_gym

TASKS: dict[str, Callable[..., Any]] = {
    "arithmetic": ArithmeticTask,
    "jsonl": load_jsonl,
    "reasoning_gym": load_reasoning_gym,
}


def get_task(name: str, /, **kwargs: Any) -> Any:
    """Build the task registered as `name` with `kwargs` (see the module docstring)."""
    if name not in TASKS:
        close = difflib.get_close_matches(str(name), list(TASKS), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise PolicylabError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}.{hint}")
    return TASKS[name](**kwargs)


__all__ = [
    "TASKS",
    "get_task",
    "Example",
    "Gold",
    "ReasoningGymTask",
    "as_messages",
    "ArithmeticTask",
    "PROMPT",
    "load_jsonl",
    "load_reasoning_gym",
    "answer_tag_or_reply",
]
