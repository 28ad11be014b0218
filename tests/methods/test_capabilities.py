"""Optional backend calls are capabilities: a stage declares the ones it calls
(`Stage.needs`), a backend lists the ones it has, a method that needs one the backends lack
is refused when the run is built, and a stage reaches only what it declared."""

from __future__ import annotations

import inspect
import re
from types import SimpleNamespace

import pytest

from policylab import methods
from policylab.backends import missing_capabilities, require_capabilities
from policylab.errors import PolicylabError
from policylab.methods.context import ROLLOUT_CORE, WORKER_CORE, StageContext, UndeclaredCapability
from policylab.methods.spec import CAPABILITIES, RunShape, Stage


def _stages():
    seen = {}
    for name in methods.names():
        for s in methods.get(name).stages():
            seen[id(s)] = s
    return list(seen.values())


@pytest.mark.parametrize("stage", _stages(), ids=lambda s: s.name)
def test_a_stage_declares_every_optional_backend_call_its_function_makes(stage):
    src = inspect.getsource(stage.fn)
    called = {f"{kind}.{attr}" for kind, attr in re.findall(r"ctx\.(rollout|worker)\.([a-z_]+)", src)}
    optional = {c for c in called if c in CAPABILITIES}
    assert optional <= set(stage.needs), f"{stage.name} calls {sorted(optional - set(stage.needs))} undeclared"


def test_an_unknown_capability_is_refused_when_the_stage_is_made():
    with pytest.raises(ValueError, match="unknown capabilities \\['worker.telepathy'\\]"):
        Stage("round", lambda b, c: ({}, {}), needs=("worker.telepathy",))


def test_missing_capabilities_name_the_stage_and_the_call():
    zcpo = methods.get("zcpo")
    assert missing_capabilities(zcpo, {"worker.vocab_stats", "worker.vocab_kl"}) == []
    assert missing_capabilities(zcpo, set()) == ["stage `zcpo_drift` needs `worker.vocab_stats`",
                                                 "stage `zcpo_drift` needs `worker.vocab_kl`"]
    # an engine whose old pass gives the entropy (verl's) does not give ZCPO the full-vocabulary KL
    assert missing_capabilities(zcpo, {"worker.vocab_stats"}) == ["stage `zcpo_drift` needs `worker.vocab_kl`"]
    with pytest.raises(PolicylabError, match="method `zcpo` cannot run on a bare backend: stage `zcpo_drift` needs"):
        require_capabilities(zcpo, frozenset(), "a bare backend")
    assert missing_capabilities(methods.get("grpo"), set()) == []  # the core calls suffice


def _context(worker, rollout):
    return StageContext(p=None, state={}, run=RunShape(), policy_version=0, sampling=None, rollout=rollout,
                        worker=worker, score=None, next_train=None, encode=None, new_groups=None, decode=None,
                        task_reward=None)


def test_a_stage_sees_only_the_core_calls_and_what_it_declared():
    worker = SimpleNamespace(role_logprobs=lambda *a: "lp", values=lambda *a: "v", vocab_stats=lambda *a: "stats",
                             optimizer_step=lambda *a: "step")
    rollout = SimpleNamespace(generate=lambda *a: "g", decode=lambda *a: "d", greedy=lambda *a: "greedy",
                              sync_weights=lambda *a: None, engine_name="e", same_numerics_as_trainer=True,
                              tokenizer="tok")
    grpo = methods.get("grpo")
    plain = _context(worker, rollout).for_stage(grpo, grpo.advantage)
    assert plain.worker.role_logprobs() == "lp" and plain.rollout.generate() == "g"
    for kind, view, name in [("worker", plain.worker, "vocab_stats"), ("worker", plain.worker, "optimizer_step"),
                             ("rollout", plain.rollout, "greedy"), ("rollout", plain.rollout, "sync_weights")]:
        with pytest.raises(UndeclaredCapability, match=f"stage `grpo` uses {kind}.{name} without declaring it"):
            getattr(view, name)
        assert not hasattr(view, name)  # an AttributeError too: hasattr-style probes see "absent"
    zcpo = methods.get("zcpo")
    drift = next(s for s in zcpo.round if s.name == "zcpo_drift")
    ctx = _context(worker, rollout).for_stage(zcpo, drift)
    assert ctx.worker.vocab_stats() == "stats"
    # a context made for one stage, then for another, does not keep the first stage's grants
    again = ctx.for_stage(grpo, grpo.advantage)
    with pytest.raises(UndeclaredCapability):
        again.worker.vocab_stats
    assert {"generate", "decode"} <= ROLLOUT_CORE and WORKER_CORE == {"role_logprobs", "values"}


def test_the_trainer_refuses_a_method_its_backends_cannot_host(small_model_dir, tmp_path):
    from trainer_utils import tiny_config

    from policylab.backends.build import build_local
    from policylab.trainer.loop import Trainer

    def bare(method, controllers, trainer):  # the local backends, claiming no optional call
        b = build_local(method, model_name=trainer.cfg.model, train=trainer.cfg.train, rollout=trainer.cfg.rollout,
                        shape=trainer.shape, controllers=controllers)
        b.capabilities = frozenset()
        return b

    cfg = tiny_config(small_model_dir, tmp_path / "run", method="zcpo", method_params={"kl_coef": 0.0})
    with pytest.raises(PolicylabError, match="method `zcpo` cannot run on these backends: stage `zcpo_drift`"):
        Trainer(cfg, backends=bare)
    assert Trainer(cfg).backends.capabilities >= {"worker.vocab_stats", "rollout.greedy"}
