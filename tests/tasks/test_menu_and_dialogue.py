"""The menu task (pick the option label) and the two-turn dialogue: answers, disjoint
held-out splits, resumable streams, the task config wiring, the label verifier, and the
multi-turn source that plays the dialogue (turn ids, inserted user turns, behavior
log-probs equal to the trainer's at every counted token)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from policylab.trainer.config import ConfigError, TaskConfig
from policylab.errors import PolicylabError
from policylab.tasks.source import build_task
from policylab.tasks.dialogue import TwoTurnArithmeticTask
from policylab.tasks.menu import MenuArithmeticTask, chosen_label, menu_label_reward


def _solve(op, a, b):
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def test_menu_examples_show_the_correct_value_at_the_answer_label():
    task = MenuArithmeticTask(ops=("+", "-", "*"), seed=1)
    for ex in task.train_prompts(300) + task.heldout(40):
        m = ex.meta
        value = _solve(m["op"], m["a"], m["b"])
        assert m["menu"] == ["A", "B", "C", "D"] and len(set(m["options"])) == 4
        assert m["options"][m["menu"].index(ex.answer)] == value
        assert f"{ex.answer}) {value}" in ex.prompt and ex.prompt.endswith("letter of the correct option.")
    # a problem always shows the same menu
    again = MenuArithmeticTask(ops=("+", "-", "*"), seed=9)
    assert [e.prompt for e in task.heldout(10)] == [e.prompt for e in again.heldout(10)]
    positions = {MenuArithmeticTask(seed=s).train_prompts(1)[0].answer for s in range(40)}
    assert positions == {"A", "B", "C", "D"}  # the correct option is not always in one place


def test_menu_split_is_the_arithmetic_split_and_disjoint():
    task = MenuArithmeticTask()
    held = {(e.meta["op"], min(e.meta["a"], e.meta["b"]), max(e.meta["a"], e.meta["b"]))
            for e in task.heldout(task.heldout_size())}
    train = {(e.meta["op"], min(e.meta["a"], e.meta["b"]), max(e.meta["a"], e.meta["b"]))
             for e in task.train_prompts(2000)}
    assert held and train and not held & train


def test_menu_stream_resumes_and_refuses_another_menu():
    a = MenuArithmeticTask(seed=4)
    a.train_prompts(7)
    state = a.state_dict()
    b = MenuArithmeticTask(seed=4)
    b.load_state_dict(state)
    assert [e.prompt for e in a.train_prompts(5)] == [e.prompt for e in b.train_prompts(5)]
    with pytest.raises(PolicylabError, match="labels"):
        MenuArithmeticTask(seed=4, labels=("A", "B", "C")).load_state_dict(state)
    with pytest.raises(PolicylabError, match="uppercase letters"):
        MenuArithmeticTask(labels=("A", "bb"))


@pytest.mark.parametrize("reply, label", [("B", "B"), ("B) 7", "B"), ("(C)", "C"), ("The answer is D.", "D"),
                                          ("7", None), ("I think A", "A"), ("", None)])
def test_label_verifier(reply, label):
    assert chosen_label(reply) == label
    assert menu_label_reward([reply], ["B"]) == [float(label == "B")]


def test_dialogue_answers_and_disjoint_split():
    task = TwoTurnArithmeticTask(seed=2)
    for ex in task.train_prompts(300) + task.heldout(50):
        m = ex.meta
        first = m["a"] + m["b"]
        final = first + m["c"] if m["op2"] == "+" else first * m["c"]
        assert ex.prompt == f"What is {m['a']} + {m['b']}? Reply with only the number."
        assert m["turn_answers"] == [str(first), str(final)] and ex.answer == str(final)
        assert len(m["turns"]) == 1 and str(m["c"]) in m["turns"][0]

    def key(e):
        m = e.meta
        return (min(m["a"], m["b"]), max(m["a"], m["b"]), m["op2"], m["c"])

    pool = task.heldout(task.heldout_size())
    assert len({e.prompt + e.meta["turns"][0] for e in pool}) == task.heldout_size()  # distinct dialogues
    held = {key(e) for e in pool}  # 3 + 4 and 4 + 3 share a key: both are held out
    assert not held & {key(e) for e in task.train_prompts(3000)}
    assert [e.prompt for e in task.heldout(5)] == [e.prompt for e in TwoTurnArithmeticTask(seed=99).heldout(5)]
    state = task.state_dict()
    other = TwoTurnArithmeticTask(seed=2)
    other.load_state_dict(state)
    assert [e.meta for e in task.train_prompts(4)] == [e.meta for e in other.train_prompts(4)]
    with pytest.raises(PolicylabError, match="only .* distinct held-out"):
        task.heldout(task.heldout_size() + 1)


def test_task_config_wiring():
    t = build_task(TaskConfig(name="menu_arithmetic", reward="menu_label"), seed=0)
    ex = t.next_train(2)
    assert t.reward_fn([ex[0].answer], [ex[0].answer]) == [1.0] and "distinct held-out" in t.describe
    auto = build_task(TaskConfig(name="menu_arithmetic"), seed=0)  # task.reward=auto picks the label scorer
    assert auto.reward_fn([ex[0].answer], [ex[0].answer]) == [1.0]
    with pytest.raises(ConfigError, match="set task.reward=menu_label"):
        build_task(TaskConfig(name="menu_arithmetic", reward="exact_numeric"), seed=0)
    d = build_task(TaskConfig(name="two_turn_arithmetic"), seed=0)
    assert d.next_train(1)[0].meta["turns"] and d.heldout(3)


def test_multi_turn_source_plays_the_dialogue(tiny_model_dir, tmp_path):
    from policylab.models.logprobs import model_logprobs
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    cfg = tiny_config(tiny_model_dir, tmp_path / "d", method="tlm_dre", method_params={},
                      task={"name": "two_turn_arithmetic"}, rollout={"group_size": 2, "max_new_tokens": 3})
    tr = Trainer(cfg)
    batch, _ = tr.collect()
    tid = batch.extras["turn_ids"]
    assert torch.equal(batch.loss_mask, tid >= 0)
    resp = batch.response_tokens
    for i in range(batch.size):
        row = tid[i][batch.attention_mask[i, batch.prompt_width:]].tolist()
        # reply 1 (turn 0), the inserted user turn (-1), reply 2 (turn 1), in that order
        assert row[0] == 0 and 1 in row and -1 in row
        first_ins, last_ins = row.index(-1), len(row) - 1 - row[::-1].index(-1)
        assert all(x == 0 for x in row[:first_ins]) and all(x == 1 for x in row[last_ins + 1:])
        inserted = tr.tokenizer.decode(resp[i][: len(row)][torch.tensor(row) == -1].tolist())
        assert "<|im_start|>user" in inserted and "Reply with only the number." in inserted
        assert inserted.rstrip().endswith("<|im_start|>assistant")
    with torch.no_grad():  # the trainer's log-probs of every counted token are the engine's
        lp = model_logprobs(tr.model, batch.tokens, batch.attention_mask, batch.prompt_width,
                            sampling=batch.sampling, mask=batch.loss_mask)
    assert_close(lp, batch.logp_behavior, rtol=1e-5, atol=1e-5)
    m = tr.train_step()
    assert m.get("skipped_nonfinite", 0.0) == 0.0 and tr.policy_version == 1


def test_multi_turn_source_refuses_single_turn_examples_and_truncation(tiny_model_dir, tmp_path):
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "s", method="tlm_dre", method_params={}))
    with pytest.raises(PolicylabError, match="meta\\['turns'\\]"):
        tr.collect()
    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "k", method="tlm_dre", method_params={},
                             task={"name": "two_turn_arithmetic"}, rollout={"top_k": 5}))
    with pytest.raises(PolicylabError, match="top_k=0 and top_p=1.0"):
        tr.collect()
