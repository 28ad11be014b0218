import pytest

from policylab.errors import PolicylabError
from policylab.tasks import PROMPT, ArithmeticTask, Example, as_messages


def solve(op, a, b):
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def key(meta):
    a, b = meta["a"], meta["b"]
    return (meta["op"], min(a, b), max(a, b)) if meta["op"] in "+*" else (meta["op"], a, b)


def test_prompt_wording_and_answers():
    assert PROMPT == "What is {a} {op} {b}? Reply with only the number."
    task = ArithmeticTask(ops=("+", "-", "*"), seed=3)
    for ex in task.train_prompts(200) + task.heldout(50):
        m = ex.meta
        shown = "×" if m["op"] == "*" else m["op"]
        assert ex.prompt == f"What is {m['a']} {shown} {m['b']}? Reply with only the number."
        assert ex.answer == str(solve(m["op"], m["a"], m["b"]))
        assert 0 <= m["a"] <= 9 and 0 <= m["b"] <= 9
    star = ArithmeticTask(ops=("*",), times_symbol="*").train_prompts(1)[0]
    assert star.prompt == f"What is {star.meta['a']} * {star.meta['b']}? Reply with only the number."


def test_train_and_heldout_disjoint_and_twins_on_one_side():
    task = ArithmeticTask()
    held = task.heldout(task.heldout_size())
    train = task.train_prompts(3000)
    held_keys = {key(ex.meta) for ex in held}
    assert not held_keys & {key(ex.meta) for ex in train}
    assert {ex.meta["split"] for ex in train} == {"train"} and {ex.meta["split"] for ex in held} == {"heldout"}
    # both ops and both operand orders of a held-out unordered pair are held out
    assert {ex.meta["op"] for ex in held} == {"+", "*"}
    for ex in held:
        assert task.is_heldout(ex.meta["op"], ex.meta["b"], ex.meta["a"])
    # single digits, + and x: 200 problems; with heldout_fraction 0.5 exactly 99 are held out
    # and the 3000 train draws cover the other 101
    assert len(held) == 99 == len({ex.prompt for ex in held})
    assert len({ex.prompt for ex in train}) == 200 - 99


def test_heldout_size_limit_and_repeat():
    task = ArithmeticTask()
    with pytest.raises(PolicylabError, match="only 99 distinct held-out problems exist"):
        task.heldout(200)
    held = task.heldout(200, repeat=True)
    assert len(held) == 200 and held[99].prompt == held[0].prompt and held[99].meta["repeat"] == 1
    more = ArithmeticTask(ops=("+", "-", "*"), heldout_fraction=0.7)
    assert more.heldout_size() >= 200  # 205 distinct single-digit held-out problems
    assert len({ex.prompt for ex in more.heldout(200)}) == 200


def test_split_independent_of_train_seed_and_stream_seeded():
    a, b = ArithmeticTask(seed=1), ArithmeticTask(seed=2)
    assert [e.prompt for e in a.heldout(50)] == [e.prompt for e in b.heldout(50)]
    assert [e.prompt for e in a.train_prompts(30)] != [e.prompt for e in b.train_prompts(30)]
    assert [e.prompt for e in ArithmeticTask(seed=1).train_prompts(30)] == [
        e.prompt for e in ArithmeticTask(seed=1).train_prompts(30)
    ]
    c = ArithmeticTask(split_seed=1)
    assert [e.prompt for e in c.heldout(50)] != [e.prompt for e in a.heldout(50)]


def test_state_dict_resume_equals_uninterrupted():
    full = ArithmeticTask(seed=7).train_prompts(12)
    first = ArithmeticTask(seed=7)
    first.train_prompts(5)
    state = first.state_dict()
    assert state["position"] == 5
    resumed = ArithmeticTask(seed=7)
    resumed.load_state_dict(state)
    assert resumed.train_prompts(7) == full[5:]
    stream = ArithmeticTask(seed=7).iter_train()
    assert [next(stream) for _ in range(12)] == full


def test_load_state_refuses_other_seed_or_config():
    state = ArithmeticTask(seed=7).state_dict()
    with pytest.raises(PolicylabError, match="task state was saved for seed=7"):
        ArithmeticTask(seed=8).load_state_dict(state)
    with pytest.raises(PolicylabError, match="task state was saved"):
        ArithmeticTask(seed=7, digits=2).load_state_dict(state)
    with pytest.raises(PolicylabError, match="invalid position"):
        ArithmeticTask(seed=7).load_state_dict({**state, "position": -1})


def test_multi_digit_ranges():
    two = ArithmeticTask(digits=2)
    for ex in two.train_prompts(100) + two.heldout(100):
        assert 10 <= ex.meta["a"] <= 99 and 10 <= ex.meta["b"] <= 99
    three = ArithmeticTask(digits=3)  # too large to list: held-out set is sampled
    assert three.heldout_size() is None
    held = three.heldout(300)
    assert len({ex.prompt for ex in held}) == 300
    assert all(three.is_heldout(ex.meta["op"], ex.meta["a"], ex.meta["b"]) for ex in held)
    assert not any(three.is_heldout(e.meta["op"], e.meta["a"], e.meta["b"]) for e in three.train_prompts(300))


def test_as_messages():
    ex = Example("What is 2 + 3? Reply with only the number.", "5")
    assert as_messages(ex) == [{"role": "user", "content": "What is 2 + 3? Reply with only the number."}]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(ops=("/",)), "`ops` must be distinct ops"),
        (dict(ops=()), "`ops` must be distinct ops"),
        (dict(ops=("+", "+")), "`ops` must be distinct ops"),
        (dict(digits=0), "`digits` must be an int in 1..18"),
        (dict(heldout_fraction=1.0), r"`heldout_fraction` must be in \(0, 1\)"),
        (dict(times_symbol="x"), "`times_symbol`"),
        (dict(ops=("+",), heldout_fraction=0.001), "held-out split is empty"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(PolicylabError, match=match):
        ArithmeticTask(**kwargs)


def test_bad_counts():
    task = ArithmeticTask()
    with pytest.raises(PolicylabError, match="`n` must be an int >= 0"):
        task.train_prompts(-1)
    with pytest.raises(PolicylabError, match="`n` must be an int >= 0"):
        task.heldout(2.5)
