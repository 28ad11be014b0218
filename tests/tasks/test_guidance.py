"""Guidance from the task's solver (hints, demonstrations, gold, expert traces): correct,
and never built from the held-out split."""

import pytest

from policylab.kernels.rewards.verifiers import exact_numeric_reward
from policylab.tasks import ArithmeticTask, guidance
from policylab.tasks.example import Example


def test_every_worked_solution_and_demonstration_verifies():
    task = ArithmeticTask(ops=("+", "-", "*"), digits=1, seed=0)
    train = task.train_prompts(300)
    for ex in train:
        for text in (guidance.worked_solution(ex), guidance.demonstration(ex, "answer"),
                     guidance.demonstration(ex, "worked"), guidance.gold_answer(ex)):
            assert exact_numeric_reward([text], [ex.answer]) == [1.0], (ex.prompt, text)
    ex = next(e for e in train if e.meta["op"] == "*" and e.meta["b"] >= 5 and e.meta["a"] >= 2)
    a, b = ex.meta["a"], ex.meta["b"]
    assert guidance.worked_solution(ex) == f"{a} × {b} = {a} × {b - 1} + {a} = {a * (b - 1)} + {a} = {a * b}"
    # the "worked" hint holds the steps, not the final result
    assert guidance.hint(ex, "worked") == f"Hint: {a} × {b} = {a} × {b - 1} + {a} = {a * (b - 1)} + {a}."
    assert guidance.hint(ex, "answer") == f"Hint: the answer is {a * b}." and guidance.hint(ex, "none") == ""
    two = ArithmeticTask(ops=("+", "*"), digits=2, seed=0).train_prompts(50)
    for ex in two:
        assert exact_numeric_reward([guidance.worked_solution(ex)], [ex.answer]) == [1.0]


def test_heldout_examples_get_no_guidance_of_any_kind():
    task = ArithmeticTask(seed=0)
    for ex in task.heldout(20):
        for fn in (guidance.gold_answer, guidance.worked_solution, guidance.demonstration, guidance.hint):
            with pytest.raises(guidance.GuidanceError, match="train split only"):
                fn(ex)
    marked = Example("What is 1 + 1?", "2", {"op": "+", "a": 1, "b": 1, "split": "train", "heldout_overlap": True})
    with pytest.raises(guidance.GuidanceError, match="also appears in the held-out split"):
        guidance.hint(marked)
    with pytest.raises(guidance.GuidanceError, match="no solver"):
        guidance.gold_answer(Example("Name a colour.", "red", {"split": "train"}))


def test_jsonl_splits_are_tagged_and_an_overlapping_prompt_is_marked(tmp_path):
    import json

    from policylab.trainer.config import TaskConfig
    from policylab.tasks.source import build_task

    train = tmp_path / "train.jsonl"
    held = tmp_path / "held.jsonl"
    train.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "p1", "answer": "1", "solution": "so 1"}, {"prompt": "p2", "answer": "2", "solution": "so 2"}]))
    held.write_text(json.dumps({"prompt": "p2", "answer": "2"}))
    src = build_task(TaskConfig(name="jsonl", path=str(train), heldout_path=str(held)), seed=0)
    got = {e.prompt: e for e in src.next_train(4)}
    assert guidance.worked_solution(got["p1"]) == "so 1"
    with pytest.raises(guidance.GuidanceError, match="held-out"):
        guidance.worked_solution(got["p2"])
    assert all(e.meta["split"] == "heldout" for e in src.heldout(1))


@pytest.mark.parametrize("method", ["luffy", "off_context_grpo", "grin", "moer"])
def test_nothing_from_the_heldout_split_reaches_a_method(method, tiny_model_dir, tmp_path, monkeypatch):
    # every example any guidance function is asked about, over several training steps of
    # each method that uses guidance, is a train problem of the task's own split rule
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    asked = []
    for name in ("gold_answer", "worked_solution", "demonstration", "hint"):
        real = getattr(guidance, name)

        def spy(ex, *a, _real=real, **kw):
            asked.append(ex)
            return _real(ex, *a, **kw)

        monkeypatch.setattr(guidance, name, spy)
    cfg = tiny_config(tiny_model_dir, tmp_path / method, method=method, task={"reward": "exact_numeric"},
                      method_params={"grin_schedule": "constant"} if method == "grin" else {},
                      rollout={"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 4}, train={"steps": 2})
    tr = Trainer(cfg)
    texts = []
    for _ in range(2):
        batch, _ = tr.collect()
        texts += [tr.tokenizer.decode(t) for t in batch.tokens.tolist()]
    assert asked, f"{method} asked for no guidance"
    task = ArithmeticTask(seed=cfg.seed)
    for ex in asked:
        m = ex.meta
        assert m["split"] == "train" and not task.is_heldout(m["op"], m["a"], m["b"])
    held = {e.prompt for e in tr.task.heldout(200)}
    assert not any(p in t for p in held for t in texts)
