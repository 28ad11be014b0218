"""Methods that change the learner outside their loss (gradient, post-step and learner
model stages) are hosted only by an engine whose step extension runs those stage kinds
(`Engine.step_kinds`, `policylab.integrations.steps`): an engine running only its loss
would train them as plain GRPO under another name, so it refuses them naming the stage.
Checked on engine descriptions (synthetic ones, and TRL's where TRL is installed; verl's
in tests/integrations/test_verl_steps.py, in verl's environment), for every registered
method."""

import dataclasses

import pytest

from policylab.integrations import hosting
from policylab.methods import REGISTRY
from policylab.methods.stage import REQUIREMENTS, Stage

_VERL_LIKE = hosting.Engine("verl-like", loss_fields=frozenset({"logp", "logp_old", "logp_behavior", "logp_ref",
                                                                 "entropy", "values"}),
                            advantage_fields=frozenset({"rewards", "group"}), round_hook="a round hook",
                            batch_fields=frozenset({"logp", "logp_old", "logp_current", "logp_behavior",
                                                    "logp_ref", "rewards", "group", "values"}))
ENGINES = {  # no step extension: refuse
    "verl-like": _VERL_LIKE,
    "plain": hosting.Engine("plain", loss_fields=frozenset({"logp", "logp_old"}),
                            advantage_fields=frozenset({"rewards", "group"})),
}
STEPPED = dataclasses.replace(
    _VERL_LIKE, name="stepped", step_hook="a step hook", step_kinds=frozenset(hosting.LEARNER_KINDS),
    step_services={"rollout.greedy": "greedy by the engine"},
    step_requires={"lora_adapter": "set the engine's LoRA", "train_examples": "pass the examples"})


def _changes_learner(m):
    return bool(m.active("grad") or m.active("poststep") or any(s.learner for s in m.active("model")))


LEARNER_METHODS = sorted(n for n, m in REGISTRY.items() if _changes_learner(m))


def test_the_geometry_methods_are_the_ones_that_change_the_learner():
    assert LEARNER_METHODS == ["cord", "gcpo", "iso", "tasco"]
    assert {n for n, m in REGISTRY.items() if hosting.learner_stages(m)} == set(LEARNER_METHODS)


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("name", LEARNER_METHODS)
def test_without_a_step_extension_a_method_changing_the_learner_is_refused_naming_the_stage(engine, name):
    p = hosting.plan(name, ENGINES[engine])
    assert not p.hostable
    for s in hosting.learner_stages(REGISTRY[name]):
        assert any(f"`{s.name}`" in r for r in p.reasons), (s.name, p.reasons)


@pytest.mark.parametrize("name", ["cord", "gcpo", "iso"])
def test_a_step_extension_hosts_them_with_their_declared_requirements(name):
    p = hosting.plan(name, STEPPED)
    assert p.hostable and p.step and not p.extension, p.reasons
    assert p.needs[0].startswith("the step extension (") and "a step hook" in p.needs[0]
    for s in hosting.learner_stages(p.method):
        assert f"`{s.name}`" in p.needs[0]
    want = {"cord": ["pass the examples"], "gcpo": ["set the engine's LoRA"], "iso": []}[name]
    assert p.requires == want
    assert p.status == ("hostable with a requirement" if want else "hostable")
    if name == "cord":  # its greedy decoder and its per-run state, as needs
        assert "greedy by the engine" in p.needs
        assert any("per-run state `cord_retention`" in n for n in p.needs)


def test_tasco_stays_refused_for_its_source_and_objective():
    p = hosting.plan("tasco", STEPPED)
    assert not p.hostable
    assert any("source `tasco_source`" in r for r in p.reasons)
    assert not any("soft_prefix" in r or "redraw_perturbations" in r for r in p.reasons)


def test_a_step_extension_refuses_the_kinds_services_and_conditions_it_lacks():
    grad_only = dataclasses.replace(STEPPED, step_kinds=frozenset({"grad"}))
    assert hosting.plan("cord", grad_only).hostable
    r = hosting.plan("gcpo", grad_only).refusal()
    assert "model stage `gcpo_setup`" in r and "post-step stage `gcpo_reproject`" in r
    assert "gcpo_project_grads" not in r
    no_greedy = dataclasses.replace(STEPPED, step_services={})
    assert "grad stage `cord_project` needs greedy decoding" in hosting.plan("cord", no_greedy).refusal()
    no_lora = dataclasses.replace(STEPPED, step_requires={"train_examples": "pass the examples"})
    r = hosting.plan("gcpo", no_lora).refusal()
    assert "model stage `gcpo_setup` requires a LoRA adapter on the learner" in r
    assert hosting.plan("iso", no_lora).hostable


def test_grpo_with_a_gradient_stage_added_is_refused_without_a_step_extension_and_hosted_with_one():
    e = ENGINES["verl-like"]
    grpo = REGISTRY["grpo"]
    assert hosting.plan(grpo, e).hostable and not hosting.plan(grpo, e).step
    touched = []
    grad = Stage("grad", lambda model, ctx: touched.append(1) or {}, name="scale_grads")
    with_grad = dataclasses.replace(grpo, grad=(grad,))
    p = hosting.plan(with_grad, e)
    assert not p.hostable and "gradient stage `scale_grads`" in p.refusal()
    assert hosting.plan(with_grad, STEPPED).hostable and hosting.plan(with_grad, STEPPED).step
    post = Stage("poststep", lambda model, ctx: {}, name="renorm")
    assert "post-step stage `renorm`" in hosting.plan(dataclasses.replace(grpo, poststep=(post,)), e).refusal()
    frozen = Stage("model", lambda model, ctx: model, name="build_helper")
    assert hosting.plan(dataclasses.replace(grpo, model=(frozen,)), e).hostable  # a frozen companion changes nothing
    assert not hosting.plan(dataclasses.replace(grpo, model=(frozen,)), e).step
    wrap = Stage("model", lambda model, ctx: model, name="wrap_learner", learner=True)
    assert "model stage `wrap_learner` changes the learner" in hosting.plan(dataclasses.replace(grpo, model=(wrap,)), e).refusal()
    assert hosting.plan(dataclasses.replace(grpo, model=(wrap,)), STEPPED).hostable
    assert not touched


def test_trl_hosts_cord_gcpo_and_iso_through_its_step_extension():
    pytest.importorskip("trl")
    from policylab.integrations import trl as PT

    assert set(PT.ENGINE.step_kinds) == set(hosting.LEARNER_KINDS)
    for name in ("cord", "gcpo", "iso"):
        p = hosting.plan(name, PT.ENGINE)
        assert p.hostable and p.step, p.reasons
        assert "_clip_grad_norm" in p.needs[0]
    assert "tasco" not in PT.methods()


def test_learner_and_requires_are_declarations_of_the_right_stage_kinds():
    with pytest.raises(ValueError, match="learner=True is for model stages"):
        Stage("grad", lambda model, ctx: {}, name="g", learner=True)
    with pytest.raises(ValueError, match="requires is for model, grad and poststep stages"):
        Stage("advantage", lambda batch, ctx: None, name="a", requires=("train_examples",))
    with pytest.raises(ValueError, match="unknown requirements \\['gpu'\\]"):
        Stage("grad", lambda model, ctx: {}, name="g", requires=("gpu",))
    assert set(REQUIREMENTS) == {"lora_adapter", "train_examples"}
    declared = {r for m in REGISTRY.values() for s in hosting.learner_stages(m) for r in s.requires}
    assert declared == set(REQUIREMENTS)
