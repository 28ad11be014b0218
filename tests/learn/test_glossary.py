"""Chinese everywhere a learner reads a card: every prose text of every shipped card, the
literature-only cards and the metric cards has a translation in learn/glossary_zh.yaml,
each uses the glossary's rendering of the terms of art, and `explain --lang zh`, the
method pages and the comparison table show it."""

from __future__ import annotations

import re

import pytest

from policylab import methods
from policylab.learn import explain, glossary, lessons, site
from policylab.methods.cards import card_text

CJK = re.compile(r"[\u3400-\u9fff]")


def test_every_card_text_has_a_translation():
    missing = glossary.missing()
    assert not missing, f"{len(missing)} card text(s) without Chinese in {glossary.GLOSSARY_PATH.name}, e.g. " \
        + "; ".join(f"{w}: {t[:60]!r}" for w, t in missing[:5])


def test_translations_are_chinese_and_use_the_terms():
    for where, en in glossary.card_texts():
        zh = glossary.zh(en)
        if re.search(r"\b[a-z]{4,}\b", en):  # prose, not a bare symbol such as "β" or "K"
            assert CJK.search(zh), (where, zh)
    assert glossary.term_problems() == []


def test_a_changed_card_text_shows_as_untranslated():
    assert glossary.zh("a card sentence nobody translated") is None
    assert glossary.field("a card sentence nobody translated", "zh") == \
        glossary.UNTRANSLATED + "a card sentence nobody translated"
    assert glossary.field("π_θ (the only differentiable policy)", "zh") == "π_θ（唯一可微的策略）"


@pytest.mark.parametrize("name", sorted(lessons.shipped_names()))
def test_explain_zh_card_is_all_chinese(name):
    text = glossary.card_text_zh(card_text(methods.get(name)))
    assert glossary.UNTRANSLATED not in text
    for label in ("  类别", "  作用", "  谁采样", "  状态", "  参数", "  阶段"):
        assert label in text, (name, label)
    for line in text.splitlines():  # no English label is left at the start of a field line
        assert not re.match(r"^  (family|what it does|samples|learns|status|not shown|parameters|stages)\b", line)


@pytest.mark.parametrize("name", ["orl", "calib_rl", "pass@k"])
def test_explain_zh_of_the_other_subjects(name):
    text = explain.explain_text(name, "zh")
    assert glossary.UNTRANSLATED not in text and "问题:" in text


def test_method_page_and_comparison_cells_carry_both_languages():
    entry = site.MethodEntry("dapo", methods.get("dapo"), (), "")
    page = site.method_page(entry, {"dapo"})
    summary = methods.get("dapo").card.summary
    assert f'<span class="zh" lang="zh">{site.esc(glossary.zh(summary))}</span>' in page
    assert glossary.UNTRANSLATED not in page
    table = site.compare_page({"dapo"})
    assert site.esc(glossary.zh(methods.get("grpo").card.samples)) in table and glossary.UNTRANSLATED not in table


def test_a_status_with_levels_is_translated_part_by_part():
    # what was run, then each level, each from its own entry: a new level value needs only its own line
    run = "kernel verified; 3 real optimizer steps on SmolLM2-135M-Instruct through the trainer, finite metrics " \
          "(benchmarks/results/methods_real_graded_and_geometry.md); no learning claim"
    text = (f"{run}. Levels: formula kernel tests (hand-worked cases and naive references); mechanism not measurable "
            "here: needs a retention probe; capability not measured; scale no training inside verl or TRL, nothing at "
            "scale")
    assert glossary.status_parts(text) == [run, "kernel tests (hand-worked cases and naive references)",
                                           "needs a retention probe", "not measured",
                                           "no training inside verl or TRL, nothing at scale"]
    assert glossary.zh(text) == (glossary.zh(run).rstrip("。") + "。层级：公式 内核测试（手算用例与朴素参考实现）；"
                                 "机制 此处无法测量：需要一个保持能力的探针；能力 尚未测量；规模 未在 verl 或 TRL 内训练，没有规模化运行")
    # one untranslated part leaves the whole status untranslated (shown behind the marker, never half-Chinese)
    assert glossary.zh(text.replace("needs a retention probe", "needs a probe nobody translated")) is None
    assert glossary.status_parts("a plain status") is None


def test_a_not_measurable_reason_is_never_cut_inside_a_parenthesis():
    from policylab.methods.evidence import _short

    assert _short("a three-stage pipeline (SFT, reward model, PPO: `x`), not a run; more") == \
        "a three-stage pipeline (SFT, reward model, PPO: `x`), not a run"
    assert _short("needs a longer horizon: 200 steps") == "needs a longer horizon"
    assert _short("no clause at all") == "no clause at all"
