"""The package's own bank (learn/bank/*.yaml, learn/topics.yaml) against the registry.

These are strict on purpose: until every registered method has its four questions in both
languages, `test_method_has_four_questions_in_both_languages[<name>]` fails for the
missing ones, naming the file it expected."""

from __future__ import annotations

import inspect

import pytest

from policylab import methods
from policylab.learn import anatomy, bank
from policylab.learn.bank import CATEGORIES, LANGS, build_bank


@pytest.mark.parametrize("name", methods.names())
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
    """Every registered method, no file for an unknown method, ids unique across files."""
    assert [e.name for e in build_bank()] == methods.names()


def test_topics_file_is_valid():
    t = bank.topics()  # empty when learn/topics.yaml does not exist yet
    for q in t.questions:
        assert len(q.methods) == 2 and all(m in methods.REGISTRY for m in q.methods)


@pytest.mark.parametrize("name", methods.names())
def test_kernels_resolve_to_source_lines(name):
    """The formula and the source link of every method: each stage kernel is a policylab
    function whose `def` is at the recorded line of the recorded file."""
    recipe = methods.get(name)
    ks = anatomy.kernels(recipe)
    assert [k.stage for k in ks] == ["advantage", "objective"] + (["correction"] if recipe.correction else [])
    for k in ks:
        line = (anatomy.PACKAGE_ROOT / k.path).read_text(encoding="utf-8").splitlines()[k.line - 1]
        assert line.lstrip().startswith(f"def {k.qualname.rsplit('.', 1)[1]}("), (k, line)
    text = anatomy.formula_text(recipe)
    assert all(f"{k.stage}: {k.qualname}" in text for k in ks)


def test_formula_comes_from_the_docstring():
    (adv, obj) = anatomy.kernels(methods.get("rloo"))
    assert adv.qualname == "policylab.advantages.rloo.rloo"
    assert adv.formula.splitlines()[0] in inspect.getdoc(__import__("policylab.advantages.rloo", fromlist=["x"]).rloo)
    assert obj.qualname == "policylab.objectives.reinforce.reinforce"


def test_comparison_table_covers_the_registry():
    rows = anatomy.comparison_table()
    assert [r["method"] for r in rows] == methods.names()
    for r in rows:
        recipe = methods.get(r["method"])
        assert set(r) == {k for k, _ in anatomy.COMPARISON_COLUMNS}
        assert r["inputs"] == (", ".join(recipe.required_fields) or "rewards only")
        assert r["changes"] == recipe.card.summary and r["samples"] == recipe.card.samples
    ppo = next(r for r in rows if r["method"] == "ppo")
    assert ppo["inputs"] == "values, logp_ref, logp_old"  # KL in the reward needs the sampler's logp_old
    assert all(lang in label for _, label in anatomy.COMPARISON_COLUMNS for lang in LANGS)
