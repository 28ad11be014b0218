"""The confidence task (arithmetic + a stated confidence) and the distribution task."""

import pytest

from policylab.trainer.config import ConfigError, TaskConfig
from policylab.tasks.source import build_task
from policylab.tasks.confidence import ConfidenceTask
from policylab.tasks.distribution import PROBLEMS, DistributionTask


def test_confidence_prompts_keep_the_arithmetic_split():
    t = ConfidenceTask(seed=0)
    train, held = t.train_prompts(50), t.heldout(t.heldout_size())
    assert all("Confidence:" in e.prompt and e.prompt.startswith("What is") for e in train + held)
    key = lambda e: (e.meta["op"], min(e.meta["a"], e.meta["b"]), max(e.meta["a"], e.meta["b"]))  # noqa: E731
    assert {key(e) for e in train}.isdisjoint({key(e) for e in held})


def test_confidence_task_needs_its_verifier():
    with pytest.raises(ConfigError, match="confidence_answer"):
        build_task(TaskConfig(name="confidence", reward="exact_numeric"), seed=0)
    src = build_task(TaskConfig(name="confidence", reward="confidence_answer"), seed=0)
    e = src.next_train(1)[0]
    assert src.reward_fn([f"{e.answer}\nConfidence: 0.3"], [e.answer]) == [1.0]


def test_distribution_targets_and_split():
    t = DistributionTask(seed=0)
    assert {p[0] for p in t.train}.isdisjoint({p[0] for p in t.held}) and len(t.train) + len(t.held) == len(PROBLEMS)
    for e in t.train_prompts(30) + t.heldout(t.heldout_size()):
        classes, target = e.meta["classes"], e.meta["target"]
        assert len(target) == len(classes) + 1 and target[-1] == 0.0
        assert abs(sum(target) - 1.0) < 1e-12
        assert e.answer == "|".join(classes)


def test_distribution_task_verifier():
    src = build_task(TaskConfig(name="distribution", reward="valid_outcome"), seed=0)
    e = src.next_train(1)[0]
    first = e.meta["classes"][0]
    assert src.reward_fn([first.upper() + ".", "no idea"], [e.answer, e.answer]) == [1.0, 0.0]
    with pytest.raises(ConfigError, match="valid_outcome"):
        build_task(TaskConfig(name="distribution", reward="math_verify"), seed=0)
