"""Every text reward the project ships, against replies a policy would try: the prompt
echoed, several answers at once, an answer hidden in a comment or a nested \\boxed{}, huge
numbers, NaN/inf text, digits of another script, a confidence outside [0, 1], a menu label
plus free text, hedges over outcome classes, substring credit, one candidate per line.
The rule for each: a hostile reply earns no more than an honest wrong answer (the same
reward's value for a plainly wrong reply), computed through the reward the trainer calls
with the parameters of the registered method where a method owns it. The code rewards'
cases are in test_code_execution.py."""

from __future__ import annotations

import pytest
import torch

from policylab.kernels.advantages.range_grpo import range_grpo
from policylab.kernels.rewards import calibration as cal
from policylab.kernels.rewards import distribution as dist
from policylab.kernels.rewards import graded, verifiers
from policylab.kernels.rewards.length_gate import rlcpr_shaping
from policylab.kernels.rewards.process import line_steps
from policylab.kernels.rewards.shaping import overlong_penalty
from policylab.kernels.rewards.ttrl import ttrl_rewards
from policylab.methods.registry import get
from policylab.tasks.menu import MenuArithmeticTask, menu_label_reward

GOLD = "42"
PROMPT = "What is 0 + 42?"  # an echo of it ends with the gold: the hardest echo case
ODD = ["٤٢", "４２", "⁴²", "𝟒𝟐"]  # Arabic-Indic, full-width, superscript, mathematical bold digits
COMMON = {
    "echo": PROMPT,
    "echo twice": f"{PROMPT} {PROMPT}",
    "several answers, gold first": "42, 41",
    "gold in a comment, wrong last": "<!-- 42 -->\nThe answer is 41",
    "gold in a code comment": "# 42\nanswer = 41",
    "huge": "1" + "0" * 5000,
    "huge fraction": "42" + "0" * 3000 + ".5",
    "nan": "NaN", "inf": "inf", "infinity sign": "∞", "negative infinity": "-inf",
    **{f"digits {d}": d for d in ODD},
    "empty": "",
}


def exact(replies, prompts=None):
    return verifiers.exact_numeric_reward(replies, [GOLD] * len(replies),
                                          prompts=prompts or [PROMPT] * len(replies))


@pytest.mark.parametrize("name", list(COMMON))
def test_exact_numeric(name):
    (honest_wrong,) = exact(["The answer is 41."])
    assert honest_wrong == 0.0
    assert exact([COMMON[name]]) == [0.0]
    # the same reply is read the same way with or without the prompt given, except the echo
    if "echo" not in name:
        assert verifiers.exact_numeric_reward([COMMON[name]], [GOLD]) == [0.0]


def test_exact_numeric_listing_is_worth_one_guess():
    # only the last number is read: listing every candidate scores like naming the last one
    listing = " ".join(str(i) for i in range(100))
    assert exact([listing]) == exact(["99"]) == [0.0]
    assert exact([" ".join(str(i) for i in range(43)), "42"]) == [1.0, 1.0]  # the last is the answer given


MATH = {
    "several, gold first": "$42$ $41$",
    "a set of both": r"\boxed{41} or \boxed{42}",
    "a braced set": r"$\{41, 42\}$",
    "an interval holding the gold": r"\boxed{[0, 100]}",
    "the whole line": r"\boxed{(-\infty, \infty)}",
    "a free variable": r"\boxed{x}",
    "nested wrong inside": r"\boxed{\boxed{41}}",
    "gold then a boxed wrong": r"42 \boxed{41}",
    "infinity": r"\boxed{\infty}",
    "undefined": r"\boxed{\frac{1}{0}}",
    **{k: v for k, v in COMMON.items() if k not in ("echo", "echo twice")},
}


@pytest.mark.parametrize("name", list(MATH))
def test_math_verify(name):
    pytest.importorskip("math_verify")
    (honest_wrong,) = verifiers.math_verify_reward([r"\boxed{41}"], [GOLD])
    assert honest_wrong == 0.0
    assert verifiers.math_verify_reward([MATH[name]], [GOLD]) == [0.0]


def rlcr(replies):
    """The RLCR reward: correctness of the answer part (the confidence task's verifier,
    prompts given as the trainer's scorer gives them), Brier term of the stated
    confidence, the registered method's invalid penalty for an unparsed one."""
    p = get("rlcr").with_params().p
    parsed = [cal.parse_confidence(r) for r in replies]
    correct = torch.tensor(cal.confidence_answer_reward(replies, [GOLD] * len(replies), prompts=[PROMPT] * len(replies)),
                           dtype=torch.float64)
    q = torch.tensor([x.q if x.q is not None else float("nan") for x in parsed], dtype=torch.float64)
    valid = torch.tensor([x.q is not None for x in parsed])
    return cal.rlcr_rewards(correct, q, valid, invalid_penalty=p.invalid_confidence_penalty).tolist()


CONFIDENCE = ["42 confidence: 1.5", "42 confidence: -0.1", "42 confidence: 150%", "42 confidence: nan",
              "42 confidence: inf", "42 confidence: 1e0", "42 confidence: 0.9 confidence: 1", "42 confidence: ١",
              "42 confidence: ۱", "42", "confidence: 42", "confidence: 1 42", "42 confidence: 1 (I am sure)",
              "41 confidence: 0 42", *[f"{v} confidence: 1" for v in COMMON.values() if v != "42, 41"]]


@pytest.mark.parametrize("reply", CONFIDENCE)
def test_rlcr_confidence(reply):
    (honest_wrong,) = rlcr(["41 confidence: 0"])  # the best an honest wrong answer can get
    assert honest_wrong == 0.0
    assert rlcr([reply])[0] <= honest_wrong
    assert cal.confidence_answer_reward(["confidence: 42"], [GOLD]) == [0.0]  # the field is never the answer


def test_menu_label():
    ex = MenuArithmeticTask(seed=0).train_prompts(1)[0]
    gold = ex.answer
    wrong = next(x for x in ex.meta["menu"] if x != gold)
    others = [x for x in ex.meta["menu"] if x != gold]
    hostile = [ex.prompt, f"{ex.prompt}\n{gold}", " ".join(ex.meta["menu"]), f"{gold} or {wrong}",
               f"{gold}) {ex.meta['value']}, no wait, {wrong}", f"({wrong}) not ({gold})", f"{gold}{gold}",
               chr(ord(gold) + 0xFEE0), {"A": "А", "B": "В", "C": "С", "D": "Ԁ"}[gold], gold.lower(),
               str(ex.meta["value"]), " ".join(others + [gold])]
    kw = {"prompts": [ex.prompt], "metas": [ex.meta]}
    assert menu_label_reward([wrong], [gold], **kw) == [0.0]
    for h in hostile[:1] + hostile[2:]:
        assert menu_label_reward([h], [gold], **kw) == [0.0], h
    # an echo followed by the one label is a choice, like the label alone
    assert menu_label_reward([hostile[1]], [gold], **kw) == menu_label_reward([gold], [gold], **kw) == [1.0]


def test_valid_outcome_and_the_class_frequency_reward():
    classes = "heads|tails"
    hedges = ["heads or tails", "Heads. Tails.", "hеads", "HEADS/TAILS", "heads tails heads", "edge",
              "Flip a coin: heads or tails?", "", "NaN"]
    for mapper in dist.MAPPERS:
        assert dist.valid_outcome_reward(["edge"], [classes], mapper=mapper) == [0.0]  # honest wrong: no outcome
        assert dist.valid_outcome_reward(hedges, [classes] * len(hedges), mapper=mapper) == [0.0] * len(hedges)
    # MaD-RL with the registered method's parameters: in any group a hedge (the invalid
    # class) earns less than every reply that named an outcome, however crowded its class
    p = get("mad_rl").with_params().p
    target = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    for counts in [(7, 0, 1), (1, 0, 7), (4, 4, 0), (0, 1, 7), (8, 0, 0), (3, 1, 4)]:
        ids = torch.tensor([0] * counts[0] + [1] * counts[1] + [2] * counts[2])
        correct = (ids < 2).double()
        r, _ = dist.mad_rl_rewards(correct, ids, torch.zeros(8, dtype=torch.long), target.expand(8, 3),
                                   coef=p.match_coef, smoothing=p.target_smoothing, form=p.match_form)
        if counts[2] and counts[2] < 8:
            assert float(r[ids == 2].max()) < float(r[ids < 2].min()), counts
        if counts[2] == 0:  # no hedge: every valid reply is above the best a hedge could get alone
            alone, _ = dist.mad_rl_rewards(torch.tensor([0.0] + [1.0] * 7, dtype=torch.float64),
                                           torch.tensor([2] + [0] * 7), torch.zeros(8, dtype=torch.long),
                                           target.expand(8, 3), coef=p.match_coef, smoothing=p.target_smoothing,
                                           form=p.match_form)
            assert float(alone[0]) < float(r.min())


HOSTILE_NUMERIC = [v for k, v in COMMON.items() if "echo" not in k and "several" not in k]


def test_graded_interval_judge_under_range_grpo():
    # a group of one right reply, one honest near miss (41) and one hostile reply: the
    # hostile reply's Range-GRPO advantage is no higher than the honest wrong one's
    # (before: a reply without a number, [0, 0.3], beat a far miss)
    for h in HOSTILE_NUMERIC:
        iv = graded.numeric_interval(["42", "The answer is 41.", h], [GOLD] * 3)
        a = range_grpo(iv, torch.zeros(3, dtype=torch.long))
        assert float(a[2]) <= float(a[1]), (h, iv.tolist(), a.tolist())
    iv = graded.numeric_interval(["42", "The answer is 7.", "NaN"], [GOLD] * 3)  # a far miss still beats no answer
    a = range_grpo(iv, torch.zeros(3, dtype=torch.long))
    assert float(a[2]) < float(a[1])


def test_graded_reward_dimensions():
    honest = graded.reward_vectors(["41"], [GOLD], list(graded.DIMENSIONS))[0]
    for h in HOSTILE_NUMERIC:
        v = graded.reward_vectors([h], [GOLD], list(graded.DIMENSIONS))[0]
        assert bool((v <= honest).all()), (h, v.tolist(), honest.tolist())


def test_reasoning_gym_scorers_pay_no_substring_credit():
    pytest.importorskip("reasoning_gym")
    from policylab.tasks.reasoning_gym import ReasoningGymTask

    for name in ("leg_counting", "basic_arithmetic", "chain_sum"):
        task = ReasoningGymTask(name, seed=0, extract="answer_tag")
        ex = task.train_prompts(1)[0]
        oracle = str(ex.answer)
        wrong = str(int(float(oracle)) + 1) if oracle.lstrip("-").isdigit() else "wrong"
        (honest_wrong,) = task.score([f"<answer>{wrong}</answer>"], [ex.answer])
        hostile = [f"1{oracle}", f"{oracle}1", f"{oracle} {wrong}", f"{wrong} {oracle}", f"{oracle}{oracle}",
                   " ".join(str(i) for i in range(-300, 300)), f"{oracle}?", ex.prompt, "NaN"]
        for h in hostile:
            (got,) = task.score([f"<answer>{h}</answer>"], [ex.answer])
            assert got <= honest_wrong, (name, oracle, h, got)
        assert task.score([f"<answer>{oracle}</answer>"], [ex.answer]) == [1.0]


def test_process_steps_of_a_wrong_answer_earn_nothing(tokenizer):
    def steps(text):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out = line_steps(tokenizer, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool), [GOLD],
                         verifiers.exact_numeric_reward)
        return out["step_rewards"][0][out["step_mask"][0]]

    honest_wrong = steps("40 + 2 = 43\nso 43")
    assert honest_wrong.tolist() == [0.0, 0.0]
    for h in ["41\n42\n43", "42\n41", "so 42\nno, 41", "# 42\n41", "42\n" * 6 + "41"]:
        assert float(steps(h).sum()) <= float(honest_wrong.sum()), h
    # a right final answer keeps its steps' credit
    assert steps("40 + 2 = 42\nso 42").tolist() == [1.0, 1.0]


def test_ttrl_hostile_votes_never_win():
    # a group of 3 honest "41", one right "42" and hostile replies: the hostile ones are
    # unparseable (no ASCII number) and can never become the label nor earn its reward
    hostile = ["NaN", "inf", "∞", *ODD, ""]
    replies = ["41", "41", "41", "42", *hostile]
    r, eligible, info = ttrl_rewards(replies, [0] * len(replies))
    assert bool(eligible.all()) and info["labels"][0] == "41" if "labels" in info else True
    assert r[:3].tolist() == [1.0] * 3 and r[4:].tolist() == [0.0] * len(hostile)
    # all hostile: no label, no reward (ineligible), never a label made of nonsense
    r, eligible, _ = ttrl_rewards(hostile, [0] * len(hostile))
    assert not bool(eligible.any())


def test_shaping_never_raises_a_reward():
    # the length terms only take away: a reply cannot gain by length tricks
    lengths = torch.tensor([0, 3, 10, 20, 50, 10_000])
    assert bool((overlong_penalty(lengths, max_len=50, cache_len=10) <= 0).all())
    base = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    shaped, _, _ = rlcpr_shaping(base, lengths.double() + 5, torch.full((6,), 0.5, dtype=torch.float64),
                                 torch.zeros(6, dtype=torch.long), length_threshold=4.0, posterior_range=0.1,
                                 coef=0.2, eps=1e-6)
    assert bool((shaped <= base).all())
