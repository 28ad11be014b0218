"""Hosting refuses every method that changes the learner outside its loss (gradient,
post-step and learner model stages): an engine running only its loss would train it as
plain GRPO under another name. Checked on the engine descriptions alone (no engine
installed), for both engines and for every registered method."""

import dataclasses

import pytest

from policylab.integrations import hosting
from policylab.methods import REGISTRY
from policylab.methods.stage import Stage

ENGINES = {
    "verl-like": hosting.Engine("verl-like", loss_fields=frozenset({"logp", "logp_old", "logp_behavior", "logp_ref",
                                                                    "entropy", "values"}),
                                advantage_fields=frozenset({"rewards", "group"}), round_hook="a round hook",
                                batch_fields=frozenset({"logp", "logp_old", "logp_current", "logp_behavior",
                                                        "logp_ref", "rewards", "group", "values"})),
    "plain": hosting.Engine("plain", loss_fields=frozenset({"logp", "logp_old"}),
                            advantage_fields=frozenset({"rewards", "group"})),
}


def _changes_learner(m):
    return bool(m.active("grad") or m.active("poststep") or any(s.learner for s in m.active("model")))


def test_the_geometry_methods_are_the_ones_that_change_the_learner():
    assert {n for n, m in REGISTRY.items() if _changes_learner(m)} == {"cord", "gcpo", "iso", "tasco"}


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("name", sorted(n for n, m in REGISTRY.items() if _changes_learner(m)))
def test_a_method_changing_the_learner_is_refused_naming_the_stage(engine, name):
    p = hosting.plan(name, ENGINES[engine])
    assert not p.hostable
    m = REGISTRY[name]
    for s in [*m.active("grad"), *m.active("poststep"), *(s for s in m.active("model") if s.learner)]:
        assert any(f"`{s.name}`" in r for r in p.reasons), (s.name, p.reasons)


def test_grpo_with_a_gradient_stage_added_is_refused_and_without_it_is_not():
    e = ENGINES["verl-like"]
    grpo = REGISTRY["grpo"]
    assert hosting.plan(grpo, e).hostable
    touched = []
    grad = Stage("grad", lambda model, ctx: touched.append(1) or {}, name="scale_grads")
    p = hosting.plan(dataclasses.replace(grpo, grad=(grad,)), e)
    assert not p.hostable and "gradient stage `scale_grads`" in p.refusal()
    post = Stage("poststep", lambda model, ctx: {}, name="renorm")
    assert "post-step stage `renorm`" in hosting.plan(dataclasses.replace(grpo, poststep=(post,)), e).refusal()
    frozen = Stage("model", lambda model, ctx: model, name="build_helper")
    assert hosting.plan(dataclasses.replace(grpo, model=(frozen,)), e).hostable  # a frozen companion changes nothing
    wrap = Stage("model", lambda model, ctx: model, name="wrap_learner", learner=True)
    assert "model stage `wrap_learner` changes the learner" in hosting.plan(dataclasses.replace(grpo, model=(wrap,)), e).refusal()
    assert not touched


def test_learner_is_only_for_model_stages():
    with pytest.raises(ValueError, match="learner=True is for model stages"):
        Stage("grad", lambda model, ctx: {}, name="g", learner=True)
