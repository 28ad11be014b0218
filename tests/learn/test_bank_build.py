"""bank.py on fixture banks: rendering, a valid build, and one build error per kind of
mistake (each message must name the file, the method and the question)."""

from __future__ import annotations

import math

import pytest
import yaml

from policylab import methods
from policylab.learn import bank
from policylab.learn.bank import BankError, build_bank, render_value, topics

from .conftest import EXAMPLES, fx_group_advantages


# --------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("value, lang, shown", [
    (1.7320508, "en", "1.7321"),       # 4 decimals, rounded
    (-0.57734, "en", "-0.5773"),
    (-3e-9, "en", "-3e-09"),           # tiny non-zero: scientific, never a misleading 0.0000
    (1.4e-17, "en", "0.0000"),         # below 1e-12: float noise of an exact zero
    (-0.0, "en", "0.0000"),            # no negative zero
    (0.0003, "en", "0.0003"),
    (2.5e6, "en", "2.5e+06"),
    (3, "en", "3"),                    # ints stay ints
    (True, "en", "true"), (False, "zh", "否"),
    ([1.0, 0.5, [2, True]], "en", "[1.0000, 0.5000, [2, true]]"),  # element-wise, nested
    ("population", "zh", "population"),
    (None, "en", "none"),
    (math.inf, "en", "inf"),
])
def test_render_value(value, lang, shown):
    assert render_value(value, lang) == shown


def test_fill_leaves_other_braces_and_fills_names():
    assert bank.fill("{a} in {0,1} {not a name}", {"a": 0.5}, "en") == "0.5000 in {0,1} {not a name}"


# ---------------------------------------------------------------------- a valid bank


def test_fixture_bank_builds_with_live_numbers(fixture_bank):
    entries = build_bank(**fixture_bank.bank_kwargs)
    assert [e.name for e in entries] == ["grpo", "rloo"]
    grpo = entries[0]
    assert [q.category for q in grpo.questions] == list(bank.CATEGORIES)
    q = grpo.questions[1]  # grpo-mechanism
    fresh = fx_group_advantages([1, 0, 0, 0], std="population")
    assert q.example.values == fresh
    # population std of [1,0,0,0] is sqrt(3)/4 = 0.4330; (1 - 0.25) / 0.4330 = 1.7320 (eps 1e-6 shifts the 5th digit)
    adv = "[" + ", ".join(f"{a:.4f}" for a in fresh["advantages"]) + "]"
    assert adv == "[1.7320, -0.5773, -0.5773, -0.5773]"
    assert q.example.text["en"] == (f"Rewards [1.0000, 0.0000, 0.0000, 0.0000] give advantages {adv}. "
                                    "Largest: 1.7320; any positive: true.")
    assert q.example.text["zh"].endswith("最大值：1.7320；是否有正值：是。")
    assert q.answer["en"] == f"It computes advantages such as {adv} from a set {{0,1}}."
    assert grpo.questions[2].compare_with == "rloo"


def test_lang_keeps_one_language(fixture_bank):
    entries = build_bank("zh", **fixture_bank.bank_kwargs)
    q = entries[0].questions[0]
    assert set(q.question) == set(q.answer) == set(q.example.text) == {"zh"}
    with pytest.raises(ValueError, match="language must be one of en, zh, got 'fr'"):
        build_bank("fr", **fixture_bank.bank_kwargs)


def test_topics_valid_and_missing(fixture_bank, tmp_path):
    t = topics(path=fixture_bank.topics_path, examples=EXAMPLES)
    assert [q.id for q in t.questions] == ["x-grpo-rloo"]
    assert t.reading_order[0].methods == ("grpo", "rloo")
    # [1,0,0] with K=3: RLOO baseline of the correct answer is 0 -> advantage 1; others 0 - 1/2 = -0.5
    assert t.questions[0].example.text["en"].endswith("vs RLOO [1.0000, -0.5000, -0.5000].")
    assert topics(path=tmp_path / "absent.yaml") == bank.Topics()


# ------------------------------------------------------------------------ build errors


def _errors(fb, **kw) -> str:
    with pytest.raises(BankError) as info:
        build_bank(**{**fb.bank_kwargs, **kw})
    return str(info.value)


def test_method_without_bank_file(make_bank):
    fb = make_bank(lambda docs, t: docs.pop("rloo"))
    msg = _errors(fb, only=["grpo", "rloo"])
    assert "method 'rloo' has no bank file (expected " in msg and "rloo.yaml" in msg
    # complete=False leaves it out instead
    assert [e.name for e in build_bank(**{**fb.bank_kwargs, "only": ["grpo", "rloo"]}, complete=False)] == ["grpo"]


def test_failing_example_names_method_question_function(make_bank):
    def mutate(docs, t):
        docs["rloo"]["questions"][1]["example"]["function"] = "fx_broken"
    msg = _errors(make_bank(mutate))
    assert ("rloo.yaml (method rloo), question 'rloo-mechanism': example function 'fx_broken' raised "
            "ValueError: deliberately broken example") in msg


@pytest.mark.parametrize("lang, field, value, expected", [
    ("zh", "answer", None, "missing translation `zh.answer` (empty or absent)"),
    ("zh", "question", "  ", "missing translation `zh.question` (empty or absent)"),
    ("en", "question", "", "missing translation `en.question` (empty or absent)"),
    ("zh", "answer", "not translated", "`zh.answer` has no Chinese characters (untranslated?)"),
])
def test_missing_translation(make_bank, lang, field, value, expected):
    def mutate(docs, t):
        docs["grpo"]["questions"][0][lang][field] = value
    msg = _errors(make_bank(mutate))
    assert f"grpo.yaml (method grpo), question 'grpo-basics': {expected}" in msg


def test_missing_language_block_and_example_translation(make_bank):
    def mutate(docs, t):
        del docs["grpo"]["questions"][3]["zh"]
        docs["rloo"]["questions"][0]["example"]["en"] = ""
    msg = _errors(make_bank(mutate))
    assert "question 'grpo-implementation': missing translation `zh`" in msg
    assert "question 'rloo-basics': missing translation `example.en`" in msg


def test_unknown_placeholder(make_bank):
    def mutate(docs, t):
        docs["grpo"]["questions"][0]["zh"]["answer"] = "优势为 {advantage}。"
        docs["grpo"]["questions"][1]["example"]["en"] = "Total {xyz}."
    msg = _errors(make_bank(mutate))
    assert ("question 'grpo-basics': placeholder {advantage} in `zh.answer` is not returned by "
            "'fx_group_advantages' (did you mean advantages?)") in msg
    assert "question 'grpo-mechanism': placeholder {xyz} in `example.en`" in msg
    assert "it returns: advantages, any_positive, best, rewards" in msg


def test_unknown_method_file_with_close_matches(make_bank):
    def mutate(docs, t):
        docs["grpoo"] = docs.pop("grpo") | {"method": "grpoo"}
    fb = make_bank(mutate)
    with pytest.raises(BankError, match=r"grpoo.yaml: bank file for unknown method 'grpoo' \(did you mean: grpo"):
        build_bank(bank_dir=fb.bank_dir, examples=EXAMPLES, complete=False)


def test_structure_errors(make_bank):
    def mutate(docs, t):
        qs = docs["grpo"]["questions"]
        qs[1]["category"] = "basics"             # two basics, no mechanism
        qs[1]["id"] = "grpo-basics"              # and a duplicate id
        qs[2]["compare_with"] = "grop"           # not a method
        qs[3]["compare_with"] = "rloo"           # only comparison questions compare
        qs[3]["hint"] = "x"                      # unknown key
        docs["rloo"]["questions"][0]["example"]["function"] = "fx_leave_one_ou"
        docs["rloo"]["questions"][2]["compare_with"] = "rloo"
        docs["rloo"]["method"] = "grpo"
    msg = _errors(make_bank(mutate))
    for part in [
        "grpo.yaml (method grpo): needs exactly four questions, one per category (basics, mechanism, comparison, "
        "implementation); has 4, missing ['mechanism'], repeated ['basics']",
        "grpo.yaml: question id 'grpo-basics' is also used in grpo.yaml",
        "question 'grpo-comparison': compare_with 'grop' is not a registered method (did you mean: grpo",
        "question 'grpo-implementation': compare_with is only for comparison questions (got 'rloo')",
        "question 'grpo-implementation': unknown key(s) ['hint']",
        "question 'rloo-basics': example function 'fx_leave_one_ou' is not in learn.examples.EXAMPLES. "
        "Did you mean: fx_leave_one_out?",
        "question 'rloo-comparison': compare_with names the method itself ('rloo')",
        "rloo.yaml: `method: grpo` does not match the file name (expected `method: rloo`)",
    ]:
        assert part in msg, part


def test_unknown_category(make_bank):
    def mutate(docs, t):
        docs["rloo"]["questions"][1]["category"] = "history"
    msg = _errors(make_bank(mutate))
    assert "question 'rloo-mechanism': category 'history' is not one of basics, mechanism, comparison, implementation" in msg
    assert "rloo.yaml (method rloo): needs exactly four questions, one per category" in msg and "missing ['mechanism']" in msg


def test_wrong_id_and_non_plain_return(make_bank):
    examples = {**EXAMPLES, "fx_tensor": lambda rewards: {"advantages": __import__("torch").tensor(rewards)}}

    def mutate(docs, t):
        docs["grpo"]["questions"][0]["id"] = "grpo-1"
        docs["rloo"]["questions"][3]["example"]["function"] = "fx_tensor"
    fb = make_bank(mutate)
    msg = _errors(fb, examples=examples)
    assert "question 'grpo-1': id must be `grpo-basics`" in msg
    assert "question 'rloo-implementation': example function 'fx_tensor' returned non-plain value(s) for ['advantages']" in msg


def test_invalid_yaml(make_bank):
    fb = make_bank()
    (fb.bank_dir / "grpo.yaml").write_text("method: grpo\nquestions: [\n", encoding="utf-8")
    assert "grpo.yaml: not valid YAML" in _errors(fb)


def test_topics_errors(make_bank):
    def mutate(docs, t):
        q = t["questions"][0]
        q["methods"] = ["grpo", "rlooo"]
        q["zh"]["answer"] = ""
        t["reading_order"][0]["methods"].append("dapo_")
        t["reading_order"][0]["why"]["zh"] = "why"
    fb = make_bank(mutate)
    with pytest.raises(BankError) as info:
        topics(path=fb.topics_path, examples=EXAMPLES)
    msg = str(info.value)
    assert "topics.yaml, question 'x-grpo-rloo': 'rlooo' is not a registered method (did you mean: rloo" in msg
    assert "question 'x-grpo-rloo': id must be `x-grpo-rlooo`" in msg
    assert "topics.yaml (topics), question 'x-grpo-rloo': missing translation `zh.answer`" in msg
    assert "reading_order[0]: 'dapo_' is not a registered method (did you mean: dapo" in msg
    assert "reading_order[0]: `zh.why` has no Chinese characters" in msg


def test_unknown_only_method_raises_close_matches(fixture_bank):
    with pytest.raises(methods.UnknownMethodError, match="unknown method 'grpoo'. Did you mean: grpo"):
        build_bank(bank_dir=fixture_bank.bank_dir, examples=EXAMPLES, only=["grpoo"])


def test_fixture_yaml_is_the_documented_format(fixture_bank):
    """The fixture follows LEARN_FORMAT.md's keys exactly (so the tests exercise the real format)."""
    doc = yaml.safe_load((fixture_bank.bank_dir / "grpo.yaml").read_text(encoding="utf-8"))
    assert set(doc) == {"method", "boundary", "questions"}
    assert set(doc["boundary"]) == {"en", "zh"} and set(doc["boundary"]["zh"]) == {"shows", "not_shown", "needs"}
    assert set(doc["questions"][0]) == {"id", "category", "compare_with", "en", "zh", "example"}
    assert set(doc["questions"][0]["example"]) == {"function", "args", "en", "zh"}
