"""The method spec: typed parameters, declared stages, and a trainer that names no method."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from policylab import methods
from policylab.errors import PolicylabError
from policylab.methods import spec
from policylab.methods.spec import Method, Param, ParamError, RunShape, Stage
from policylab.methods.stages import advantages, losses, sources

SRC = Path(__file__).resolve().parents[2] / "src" / "policylab"


# ----------------------------------------------------------------------------- parameters


def test_unknown_and_wrongly_typed_parameters_are_refused_with_the_valid_names():
    with pytest.raises(ParamError, match="no parameter `eps_hi`. Did you mean: eps_high.*Parameters of dapo: eps_low"):
        methods.get("dapo").with_params({"eps_hi": 0.3})
    with pytest.raises(ParamError, match="`eps_high` must be a number, got 'big'"):
        methods.get("dapo").with_params({"eps_high": "big"})
    with pytest.raises(ParamError, match="`eps_high` must be a number, got True"):
        methods.get("dapo").with_params({"eps_high": True})
    with pytest.raises(ParamError, match="`eps_high` must be finite"):
        methods.get("dapo").with_params({"eps_high": float("inf")})
    with pytest.raises(ParamError, match="`sis_topk` must be an integer, got 2.5"):
        methods.get("sis").with_params({"sis_topk": 2.5})
    with pytest.raises(ParamError, match="`std` must be one of unbiased, population; got 'sample'"):
        methods.get("grpo").with_params({"std": "sample"})
    with pytest.raises(ParamError, match="`tis_cap` must be > 0; got -1.0"):
        methods.get("tis").with_params({"tis_cap": -1.0})
    # ints are accepted where floats are declared, and converted
    assert methods.get("tis").with_params({"tis_cap": 3}).p.tis_cap == 3.0


def test_none_defaults_resolve_from_the_run_and_are_documented():
    run = RunShape(max_new_tokens=48, group_size=4)
    dapo = methods.get("dapo").with_params({}, run)
    assert dapo.p.overlong_max == 48
    assert "rollout.max_new_tokens" in dapo.param("overlong_max").doc
    assert methods.get("dr_grpo").with_params({}, run).p.L_norm == 48.0
    assert methods.get("dr_grpo").with_params({"L_norm": 100}, run).p.L_norm == 100.0


def test_a_stage_reads_only_the_parameters_it_declares():
    m = methods.get("tis")
    view = m.view(losses.TIS)
    assert view.tis_cap == 2.0
    with pytest.raises(AttributeError, match="stage `tis.tis` reads parameter `eps_high` without declaring it"):
        view.eps_high
    with pytest.raises(AttributeError, match="read-only"):
        m.p.tis_cap = 3.0


def test_a_method_cannot_declare_a_stage_that_reads_an_undeclared_parameter():
    with pytest.raises(ValueError, match="stage `tis` reads undeclared parameters \\['tis_cap'\\]"):
        Method(name="x", card=methods.get("tis").card, params=(), source=sources.ON_POLICY,
               advantage=advantages.DR_GRPO, objective=losses.REINFORCE, corrections=(losses.TIS,),
               aggregation="token_mean")
    with pytest.raises(ValueError, match="needs a declared `L_norm`"):
        Method(name="x", card=methods.get("tis").card, params=(), source=sources.ON_POLICY,
               advantage=advantages.DR_GRPO, objective=losses.REINFORCE, aggregation="seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="kind 'objective' listed as correction"):
        Method(name="x", card=methods.get("tis").card, params=(), source=sources.ON_POLICY,
               advantage=advantages.DR_GRPO, objective=losses.REINFORCE, corrections=(losses.REINFORCE,),
               aggregation="token_mean")


def test_param_declaration_checks_its_own_default():
    with pytest.raises(ParamError, match="must be > 0"):
        Param("c", float, -1.0, "doc", check=spec.positive)
    with pytest.raises(TypeError, match="type must be"):
        Param("c", list, [], "doc")


# ----------------------------------------------------------------------------- the trainer names no method


def _method_words():
    words = set(methods.names())
    for m in methods.REGISTRY.values():
        words |= {q.name for q in m.params}
        words |= {st.name for st in m.state}
    return words


@pytest.mark.parametrize("module", sorted(str(p.relative_to(SRC)) for d in ("trainer", "backends")
                                          for p in (SRC / d).glob("*.py")))
def test_trainer_update_rollout_name_no_method_and_no_method_parameter(module):
    """The loop knows stage kinds, never which method runs: no method id and no method
    parameter appears as a string literal or attribute in these modules."""
    text = (SRC / module).read_text()
    code = re.sub(r'"""(.|\n)*?"""', "", text)  # docstrings may explain, code may not name
    code = "\n".join(line.split("#", 1)[0] for line in code.splitlines()
                     if not line.lstrip().startswith(("from ", "import ")))  # module paths are not names
    hits = []
    for word in sorted(_method_words()):
        if len(word) <= 2:
            continue
        if re.search(rf"""["']{re.escape(word)}["']""", code) or re.search(rf"\.{re.escape(word)}\b(?!\s*\()", code):
            hits.append(word)
    # generic batch fields that happen to share a name with a method parameter are allowed
    allowed = {"eps"} | ({"grpo"} if module == "trainer/config.py" else set())  # the documented default method
    assert set(hits) <= allowed, f"{module} names {sorted(set(hits) - allowed)}"


def test_no_hidden_parameter_default_anywhere_in_the_package():
    offenders = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py")
                 for i, line in enumerate(p.read_text().splitlines(), 1) if "params.get(" in line]
    assert offenders == []


# ----------------------------------------------------------------------------- stage contracts


def test_a_stage_that_writes_an_undeclared_field_is_refused(small_model_dir, tmp_path):
    from policylab.trainer.rollout import apply_changes
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r"))
    batch, _ = tr.collect()
    stage = Stage("reward", lambda s, ctx: None, name="sneaky", writes=("rewards",))
    with pytest.raises(PolicylabError, match="stage `sneaky` writes `greedy_rewards` without declaring it"):
        apply_changes(batch, {"greedy_rewards": batch.rewards}, stage)
    with pytest.raises(PolicylabError, match="writes \\['extras.secret'\\] without declaring them"):
        apply_changes(batch, {"extras": {"secret": 1}}, stage)
    out = apply_changes(batch, {"rewards": batch.rewards + 1}, stage)
    assert torch.equal(out.rewards, batch.rewards + 1) and out.extras == batch.extras


def test_every_registered_method_declares_its_roles_and_states():
    for name in methods.names():
        m = methods.get(name)
        assert set(m.roles) <= set(spec.ROLE_FIELDS)
        assert m.card.title and m.card.status
        for s in m.stages():
            assert s.where()[0][2] > 0, (name, s.name)  # every stage function has a source line


def test_composed_methods_reuse_the_host_objective():
    # corrections never re-implement a host: the objective of these compositions is the
    # very PPO-clip stage every other PPO-host method uses
    for name in ("tis", "icepop", "kpop", "mis", "minirl", "missing_old_logits", "sis", "gmc"):
        assert methods.get(name).objective is losses.PPO_CLIP, name
    assert methods.get("online_icepop").objective is losses.UNIT_POLICY_GRADIENT
    assert not (SRC / "kernels" / "corrections" / "_host.py").exists()


# ----------------------------------------------------------------------------- gradient stage seam


def test_gradient_stages_run_between_backward_and_the_step(small_model_dir, tmp_path):
    """A method with a gradient stage: it sees the accumulated gradient (after the last
    micro-batch's backward) and what it does to it is what the optimizer applies."""
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    seen = []

    def zero_embedding_grad(model, ctx):
        g = model.get_input_embeddings().weight.grad
        seen.append(float(g.abs().sum()))
        g.zero_()
        return {"grad/test_zeroed": 1.0}

    base = methods.get("grpo")
    probe = dataclasses.replace(base, name="grpo_probe", grad=(Stage("grad", zero_embedding_grad),))
    methods.register(probe)
    try:
        cfg = tiny_config(small_model_dir, tmp_path / "g", method="grpo_probe", train={"grad_clip": 0.0},
                          rollout={"group_size": 4})
        tr = Trainer(cfg)
        emb = tr.model.get_input_embeddings().weight
        before = emb.detach().clone()
        m = tr.train_step()
    finally:
        del methods.REGISTRY["grpo_probe"]
    assert seen and seen[0] > 0  # the stage saw a real gradient
    assert m["grad/test_zeroed"] == 1.0
    # AdamW with a zero gradient and no weight decay leaves the tensor exactly unchanged
    assert torch.equal(emb.detach(), before)


# ----------------------------------------------------------------------------- backend seam


def test_local_backends_implement_the_protocols(small_model_dir, tmp_path):
    from policylab.backends import PolicyWorker, RolloutBackend
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    tr = Trainer(tiny_config(small_model_dir, tmp_path / "b"))
    assert isinstance(tr.rollout, RolloutBackend) and isinstance(tr.worker, PolicyWorker)


def test_rollout_backend_refuses_a_version_it_was_not_synced_to(small_model_dir, tmp_path):
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    tr = Trainer(tiny_config(small_model_dir, tmp_path / "v", rollout={"group_size": 4}))
    tr.train_step()
    assert tr.policy_version >= 1 and tr.rollout.version == tr.policy_version  # synced after every update
    tr.rollout.sync_weights(tr.policy_version - 1)
    with pytest.raises(PolicylabError, match="call sync_weights"):
        tr.collect()


# ----------------------------------------------------------------------------- what a method adds to a run's header and report


def test_kl_header_states_estimator_coefficient_and_placement():
    m = methods.get("grpo").with_params({"kl_coef": 0.1, "kl_estimator": "k1", "kl_placement": "reward"})
    assert [line(m.p) for line in m.header] == [("KL", "k1 x 0.1 in the reward")]
    off = methods.get("grpo").with_params({"kl_coef": 0.0})
    assert [line(off.p) for line in off.header] == [("KL", "none (kl_coef = 0)")]


def test_test_time_methods_report_their_adaptation_budget_and_others_do_not():
    from policylab.methods.spec import RunShape

    shape = RunShape(prompts_per_step=4, group_size=8, max_new_tokens=16, epochs=2, minibatches=3)
    for name in ("ttpo", "probe_erpo", "tasco"):
        (key, section), = methods.get(name).report_sections
        # 5 rollout steps x 4 prompts = 20 prompts; at most 5 x 2 epochs x 3 minibatches = 30 optimizer steps
        assert key == "adaptation" and section(shape, 5) == {
            "adapted": True, "prompts": 20, "samples_per_prompt": 8, "max_new_tokens": 16, "rollout_steps": 5,
            "optimizer_steps_max": 30}
    assert methods.get("grpo").report_sections == ()
