"""The package's own topics (learn/topics.yaml) and each method's anatomy (its kernels, their
source lines and formulas, the comparison table) against the registry. That every shipped
method has its four questions in both languages is checked in test_shipped_lessons.py."""

from __future__ import annotations

import inspect

import pytest

from policylab import methods
from policylab.learn import anatomy, bank
from policylab.learn.bank import LANGS


def test_topics_file_is_valid():
    t = bank.topics()  # empty when learn/topics.yaml does not exist yet
    for q in t.questions:
        assert len(q.methods) == 2 and all(m in methods.REGISTRY for m in q.methods)


@pytest.mark.parametrize("name", methods.names())
def test_kernels_resolve_to_source_lines(name):
    """The formula and the source link of every method: each kernel of its active stages
    (taken from the spec) is a policylab function whose `def` is at the recorded line of the
    recorded file, in pipeline order; the advantage's and the objective's are always there."""
    method = methods.get(name)
    ks = anatomy.kernels(method)
    kinds = [k.stage for k in ks]
    assert "advantage" in kinds and "objective" in kinds
    order = list(anatomy.MATH_KINDS)
    assert kinds == sorted(kinds, key=order.index)
    for stage in method.active("correction"):  # a composed method shows its correction's kernels too
        assert {f"{fn.__module__}.{fn.__name__}" for fn in stage.kernels} <= {k.qualname for k in ks}
    for k in ks:
        line = (anatomy.PACKAGE_ROOT / k.path).read_text(encoding="utf-8").splitlines()[k.line - 1]
        assert line.lstrip().startswith(f"def {k.qualname.rsplit('.', 1)[1]}("), (k, line)
    text = anatomy.formula_text(method)
    assert all(f"{k.stage}: {k.qualname}" in text for k in ks)


def test_sis_shows_its_own_kernel_not_only_the_host():
    # the rejection test is SIS's math: its card and formula name corrections.sis beside the PPO host
    names = [k.qualname for k in anatomy.kernels(methods.get("sis"))]
    assert "policylab.kernels.corrections.sis.sis" in names and "policylab.kernels.objectives.ppo.ppo_clip" in names


def test_formula_comes_from_the_docstring():
    kernels = {k.stage: k for k in anatomy.kernels(methods.get("rloo"))}
    adv, obj = kernels["advantage"], kernels["objective"]
    assert adv.qualname == "policylab.kernels.advantages.rloo.rloo"
    assert adv.formula.splitlines()[0] in inspect.getdoc(__import__("policylab.kernels.advantages.rloo", fromlist=["x"]).rloo)
    assert obj.qualname == "policylab.kernels.objectives.reinforce.reinforce"


def test_comparison_table_covers_the_registry():
    rows = anatomy.comparison_table()
    assert [r["method"] for r in rows] == methods.names()
    for r in rows:
        method = methods.get(r["method"])
        assert set(r) == {k for k, _ in anatomy.COMPARISON_COLUMNS}
        assert r["inputs"] == (", ".join(method.required_fields) or "rewards only")
        assert r["changes"] == method.card.summary and r["samples"] == method.card.samples
    ppo = next(r for r in rows if r["method"] == "ppo")
    assert ppo["inputs"] == "logp_old, logp_ref, values"  # KL in the reward needs the sampler's logp_old
    assert all(lang in label for _, label in anatomy.COMPARISON_COLUMNS for lang in LANGS)
