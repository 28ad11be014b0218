"""The lessons of the methods the project ships (those the modules of
policylab.methods.families register), strict on purpose: each has its four questions in
both languages with worked examples that run, and its figure in both languages; the
whole bank and the whole set of figure definitions build. Until a shipped method has
them, its test here fails naming the file to write. A method registered anywhere else
is not held to this (test_no_lesson.py)."""

from __future__ import annotations

import math

import pytest

from policylab import methods
from policylab.learn import figures, lessons
from policylab.learn.bank import CATEGORIES, LANGS, build_bank
from policylab.learn.figures import render

SHIPPED = sorted(lessons.shipped_names())


def test_the_shipped_methods_are_the_families_registrations():
    assert {"grpo", "ppo", "tis", "rlid", "fusion"} <= set(SHIPPED)  # one of each kind of family module
    assert "orl" not in SHIPPED  # a literature-only card is not a method
    assert set(SHIPPED) <= set(methods.REGISTRY)
    assert all(lessons.is_shipped(n) for n in SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_method_has_four_questions_in_both_languages(name):
    (entry,) = build_bank(only=[name])  # strict: file present, examples run, placeholders resolve
    assert entry.name == name
    assert [q.category for q in entry.questions] == list(CATEGORIES)
    for q in entry.questions:
        assert q.id == f"{name}-{q.category}"
        for lang in LANGS:
            assert q.question[lang].strip() and q.answer[lang].strip() and q.example.text[lang].strip(), (q.id, lang)
        if q.category == "comparison":
            assert q.compare_with in methods.REGISTRY and q.compare_with != name


def test_whole_bank_builds():
    """Every shipped method, no file for an unknown method, ids unique across files."""
    assert [e.name for e in build_bank()] == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_method_has_a_figure_in_both_languages(name):
    fig = figures.figure(name)  # strict: definition present and valid, every view runs
    assert fig.key == name and fig.panels
    for p in fig.panels:
        assert p.series and p.source
        for s in p.series:
            assert all(math.isfinite(v) for v in s.x + s.y)
    for lang in figures.LANGS:
        assert fig.caption[lang].strip()
        text = render.svg(fig, lang)
        assert f"<title>{fig.caption[lang][:20]}" in text.replace("&amp;", "&")
        assert "<desc>" in text and "<text" in text  # the alt text, and labels kept as text
        assert len(text) < 80_000, len(text)  # small


def test_every_shipped_method_has_a_definition():
    figures.check_complete()
    assert sorted(figures.definitions()) == SHIPPED
