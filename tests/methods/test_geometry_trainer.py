"""cord, gcpo and iso in the trainer, on real tensors of a tiny random Llama: the
invariants of the specification after real optimizer steps, checkpoints, sampling, refusals."""

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from policylab.backends.update import StepHooks
from torch.testing import assert_close

from policylab import methods
from policylab.errors import MissingQuantityError, PolicylabError
from policylab.kernels.geometry import FixedSpectrumLinear, principal_frames
from policylab.models.logprobs import model_logprobs
from policylab.methods.retention import RetentionSet
from policylab.methods.families.gradient_geometry import RETENTION_STATE, _lora_layers, iso_layers
from policylab.tasks.example import Example
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config

pytest.importorskip("peft")


def _trainer(small_model_dir, run_dir, name, method_params=None, **sections):
    sections = {k: {**methods.get(name).exercise.get(k, {}), **sections.get(k, {})}
                for k in {*methods.get(name).exercise, *sections}}
    return Trainer(tiny_config(small_model_dir, run_dir, method=name, method_params=method_params or {}, **sections))


def _round(tr):
    """One round's batch and advantages (seeded nonzero advantages if every reply scored alike)."""
    batch, _ = tr.collect()
    batch, A, _ = tr.round_inputs(tr.prepare(batch))
    adv = A.adv
    if not bool((adv != 0).any()):
        adv = torch.randn(adv.shape, generator=torch.Generator().manual_seed(0), dtype=adv.dtype)
    return batch, adv


def _flat(grads):
    return torch.cat([g.reshape(-1) for g in grads])


# ----------------------------------------------------------------------------- cord


@pytest.mark.parametrize("mode", ["conflict_only", "always"])
def test_cord_projects_the_accumulated_rl_gradient_off_the_retention_gradient(mode, small_model_dir, tmp_path):
    tr = _trainer(small_model_dir, tmp_path / mode, "cord", {"cord_mode": mode},
                  train={"dtype": "fp64", "grad_clip": 0.0, "micro_batch_size": 2}, rollout={"group_size": 4})
    batch, adv = _round(tr)
    stage = tr.method.grad[0]
    ctx = tr.context(batch.batch_id).for_stage(tr.method, stage)
    params = [p for p in tr.model.parameters() if p.requires_grad]
    start = {k: v.clone() for k, v in tr.model.state_dict().items()}
    seen = []
    for sign in (1.0, -1.0):  # −A gives exactly −g_rl: one of the two conflicts with g_retention
        rec = {}

        def hook(model):
            rec["rl"] = [p.grad.clone() for p in params]
            rec["out"] = stage.fn(model, ctx)
            rec["final"] = [p.grad.clone() for p in params]
            for p in params:  # the protected gradient alone, at the same weights
                p.grad = None
            ctx.state[RETENTION_STATE].nll(model).backward()
            rec["ret"] = [p.grad.clone() for p in params]
            for p, g in zip(params, rec["final"]):
                p.grad = g.clone()
            return rec["out"]

        tr.model.load_state_dict(start)
        tr.worker.optimizer_step(tr.method, batch, sign * adv, old_from_same_forward=True, hooks=StepHooks(grad=hook))
        rl, ret, final = _flat(rec["rl"]), _flat(rec["ret"]), _flat(rec["final"])
        d, n = float(rl @ ret), float(ret @ ret)
        other = final - ret  # λ = 1, β = 1: what is left of the RL gradient in .grad
        assert rec["out"]["cord/dot"] == pytest.approx(d, rel=1e-9)
        if mode == "always" or d < 0:
            # the projected RL gradient is orthogonal to the protected one, and it is g_rl − (d/n) g_ret
            assert abs(float(other @ ret)) <= 1e-10 * float(other.norm()) * math.sqrt(n)
            assert_close(other, rl - (d / n) * ret, rtol=1e-9, atol=1e-12)
            assert rec["out"]["cord/projected"] == 1.0
        else:
            assert_close(final, ret + rl, rtol=0, atol=1e-15)  # no conflict: the plain sum, nothing else
            assert rec["out"]["cord/projected"] == 0.0
        seen.append(d < 0)
    assert sorted(seen) == [False, True]


def test_cord_retention_set_is_gold_answers_of_the_training_stream(small_model_dir, tmp_path):
    tr = _trainer(small_model_dir, tmp_path / "g", "cord", {"retention_size": 3}, rollout={"group_size": 4})
    position = tr.task.state_dict()
    tr.train_step()
    ret = tr.controllers[RETENTION_STATE]
    assert ret.built and ret.tokens.shape[0] == 3
    # the answers are the gold answers of 3 training examples, each followed by eos
    from policylab.tasks.source import build_task

    probe = build_task(tr.cfg.task, seed=tr.cfg.seed)
    probe.load_state_dict(position)
    drawn = probe.next_train(2 + 3)[2:]  # the step drew its 2 prompts first, then the retention set
    tok = tr.tokenizer
    for i, ex in enumerate(drawn):
        ids = ret.tokens[i, ret.prompt_width :][ret.loss_mask[i]].tolist()
        assert ids == tok.encode(ex.answer, add_special_tokens=False) + [tok.eos_token_id]
        assert ex.meta["split"] == "train"


def test_cord_base_greedy_retention_is_the_base_policys_reply(small_model_dir, tmp_path):
    tr = _trainer(small_model_dir, tmp_path / "b", "cord", {"retention_source": "base_greedy", "retention_size": 2},
                  rollout={"group_size": 4})
    base = copy.deepcopy(tr.model)
    tr.train_step()
    ret = tr.controllers[RETENTION_STATE]
    prompts = [row[m].tolist() for row, m in zip(ret.tokens[:, : ret.prompt_width],
                                                 ret.attention_mask[:, : ret.prompt_width])]
    from policylab.engines.hf import HFEngine

    greedy = HFEngine(base, tr.tokenizer).greedy(prompts, tr.cfg.rollout.max_new_tokens)
    for i, g in enumerate(greedy):
        assert ret.tokens[i, ret.prompt_width :][ret.loss_mask[i]].tolist() == g
    fresh = RetentionSet(2, "base_greedy")
    ctx = SimpleNamespace(tokenizer=tr.tokenizer, next_train=tr.task.next_train, encode=tr.encode, policy_version=3)
    with pytest.raises(PolicylabError, match="base policy \\(version 0\\).*version 3"):
        fresh.build(ctx)


def test_cord_refuses_a_projection_without_its_protected_loss(small_model_dir, tmp_path, small_tokenizer):
    tokenizer = small_tokenizer
    tr = _trainer(small_model_dir, tmp_path / "e", "cord", rollout={"group_size": 4})
    stage = tr.method.grad[0]
    ctx = tr.context("x").for_stage(tr.method, stage)
    ctx.state = {}
    with pytest.raises(MissingQuantityError, match="protected loss.*cord_retention"):
        stage.fn(tr.model, ctx)
    empty = RetentionSet(2, "base_greedy")
    empty.pack([[5, 6], [7]], [[], []], pad_id=tokenizer.pad_token_id)
    with pytest.raises(MissingQuantityError, match="every reply of the base_greedy retention set is empty"):
        empty.nll(tr.model)
    with pytest.raises(MissingQuantityError, match="its retention set"):
        RetentionSet(2, "gold").nll(tr.model)
    no_answers = SimpleNamespace(tokenizer=tokenizer, next_train=lambda n: [Example("What?", "")] * n,
                                 encode=lambda s: tokenizer.encode(s), policy_version=0)
    with pytest.raises(MissingQuantityError, match="no answer text.*retention_source: base_greedy"):
        RetentionSet(2, "gold").build(no_answers)
    saved = RetentionSet(3, "gold").state_dict()
    with pytest.raises(PolicylabError, match="size 3 .* asks for 2"):
        RetentionSet(2, "gold").load_state_dict(saved)


# ----------------------------------------------------------------------------- gcpo


def _updates(model):
    """(name, ΔW = scale·B A, layer) of every LoRA layer."""
    out = []
    with torch.no_grad():
        for name, layer in _lora_layers(model):
            for a in layer.lora_A:
                out.append((name, layer.scaling[a] * layer.lora_B[a].weight @ layer.lora_A[a].weight, layer))
    return out


def test_gcpo_top_k_subspaces_receive_no_update(small_model_dir, tmp_path):
    tr = _trainer(small_model_dir, tmp_path / "g", "gcpo", {"protected_rank": 8},
                  train={"dtype": "fp64", "lr": 1e-2, "lora_rank": 4, "steps": 3}, rollout={"group_size": 4})
    base = {k: v.clone() for k, v in tr.model.state_dict().items() if "lora_" not in k}
    opt_ids = {id(p) for g in tr.optimizer.param_groups for p in g["params"]}
    for _, layer in _lora_layers(tr.model):
        assert id(layer.gcpo_U) not in opt_ids and not layer.gcpo_U.requires_grad
    assert not any("gcpo" in k for k in tr.model.state_dict())  # rebuilt from W_0, never stored
    moved = 0
    for _ in range(3):
        m = tr.train_step()
        for name, dW, layer in _updates(tr.model):
            U, V = layer.gcpo_U, layer.gcpo_V
            scale = float(dW.norm())
            moved += scale > 1e-6
            assert float((U.T @ dW).norm()) <= 1e-12 * max(scale, 1.0), name
            assert float((dW @ V).norm()) <= 1e-12 * max(scale, 1.0), name
            # what the layer does on its protected input directions is exactly the base weight's
            x = V.T.unsqueeze(0)  # [1, k, in]
            with torch.no_grad():
                assert_close(layer(x), layer.base_layer(x), rtol=1e-12, atol=1e-12)
        if not m.get("skipped_no_signal"):
            assert m["gcpo/overlap/max"] < 1e-12
    assert moved > 0 and tr.policy_version >= 1
    after = tr.model.state_dict()
    for k, v in base.items():
        assert torch.equal(after[k], v), k


def test_plain_lora_does_update_the_protected_subspaces(small_model_dir, tmp_path):
    # the same run without gcpo's stages: the test above could fail
    tr = _trainer(small_model_dir, tmp_path / "p", "grpo", {"kl_coef": 0.0},
                  train={"dtype": "fp64", "lr": 1e-2, "lora_rank": 4}, rollout={"group_size": 4})
    for _ in range(3):
        tr.train_step()
    worst = 0.0
    for _, dW, layer in _updates(tr.model):
        U, V, _ = principal_frames(layer.base_layer.weight, 8)
        if float(dW.norm()) > 0:
            worst = max(worst, float((U.T @ dW).norm() / dW.norm()))
    assert worst > 1e-3


def test_gcpo_refuses_runs_it_cannot_constrain(small_model_dir, tmp_path):
    with pytest.raises(PolicylabError, match="no LoRA adapter: set train.lora_rank > 0"):
        _trainer(small_model_dir, tmp_path / "a", "gcpo", train={"lora_rank": 0})
    # k_proj of the tiny model is 32×64: with k = 8 a LoRA rank of at most 24 fits
    with pytest.raises(PolicylabError, match="LoRA rank r = 30 .*k_proj.*train.lora_rank to <= 24"):
        _trainer(small_model_dir, tmp_path / "b", "gcpo", train={"lora_rank": 30})
    with pytest.raises(PolicylabError, match="leaves no direction to train"):
        _trainer(small_model_dir, tmp_path / "c", "gcpo", {"protected_rank": 32})


# ----------------------------------------------------------------------------- iso


def test_iso_spectrum_stays_bit_identical_while_the_weights_change(small_model_dir, tmp_path):
    tr = _trainer(small_model_dir, tmp_path / "i", "iso", train={"lr": 1e-2, "steps": 3}, rollout={"group_size": 4})
    layers = iso_layers(tr.model)
    assert len(layers) == 14  # 7 projections × 2 layers; the tied head is left alone
    sigma = {n: l.sigma.clone() for n, l in layers}
    W0 = {n: l.weight.detach().clone() for n, l in layers}
    opt_ids = {id(p) for g in tr.optimizer.param_groups for p in g["params"]}
    assert all(id(l.sigma) not in opt_ids and not l.sigma.requires_grad for _, l in layers)
    for _ in range(3):
        tr.train_step()
    assert tr.policy_version >= 1
    changed = 0.0
    for n, l in layers:
        assert torch.equal(l.sigma, sigma[n]), n  # the frozen spectrum, bit for bit
        W = l.weight.detach()
        changed = max(changed, float((W - W0[n]).abs().max()))
        assert_close(torch.linalg.svdvals(W.double()), sigma[n].double(), rtol=2e-6, atol=1e-7)
        for frame in (l.U, l.V):
            eye = torch.eye(frame.shape[1])
            assert_close(frame.detach().T @ frame.detach(), eye, rtol=0, atol=2e-6)
    assert changed > 1e-3  # the weights did move


def test_iso_sampling_follows_the_updated_frames(small_model_dir, tmp_path):
    tr = _trainer(small_model_dir, tmp_path / "s", "iso", train={"lr": 1e-2}, rollout={"group_size": 4})
    assert tr.engine.engine_name == "fast-fp32"  # the fast engine runs the reparametrized layers as modules
    initial = copy.deepcopy(tr.model)
    for _ in range(4):
        tr.train_step()
        if tr.policy_version >= 1:
            break
    assert tr.policy_version >= 1
    batch, _ = tr.collect()
    now = tr.worker.role_logprobs("logp_old", batch)
    mask = batch.loss_mask
    assert_close(batch.logp_behavior[mask], now[mask], rtol=1e-4, atol=1e-4)  # sampled at the current weights
    with torch.no_grad():
        before = model_logprobs(initial, batch.tokens, batch.attention_mask, batch.prompt_width,
                                sampling=batch.sampling)
    assert float((before[mask] - batch.logp_behavior[mask]).abs().max()) > 1e-3  # not at the initial ones


def test_iso_refuses_what_it_cannot_reparametrize(small_model_dir, tmp_path):
    with pytest.raises(PolicylabError, match="train.lora_rank: 0"):
        _trainer(small_model_dir, tmp_path / "a", "iso", train={"lora_rank": 4})
    with pytest.raises(PolicylabError, match="matches no linear layer.*model.layers.0"):
        _trainer(small_model_dir, tmp_path / "b", "iso", {"iso_targets": "*.attn_typo"})
    with pytest.raises(PolicylabError, match="output head.*tied"):
        _trainer(small_model_dir, tmp_path / "c", "iso", {"iso_targets": "lm_head"})
    tr = _trainer(small_model_dir, tmp_path / "d", "iso", {"iso_targets": "*.q_proj", "retraction": "qr"})
    (name, layer), *rest = iso_layers(tr.model)
    assert name.endswith("q_proj") and len(rest) == 1 and isinstance(layer, FixedSpectrumLinear)
    with pytest.raises(PolicylabError, match="cannot be assigned"):
        layer.weight = torch.zeros(layer.out_features, layer.in_features)


# ----------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("name", ["cord", "gcpo", "iso"])
def test_resume_equals_the_uninterrupted_run(name, small_model_dir, tmp_path):
    kw = dict(train={"steps": 4, "lr": 1e-2}, rollout={"group_size": 4})
    full = _trainer(small_model_dir, tmp_path / "a", name, **kw)
    rows_full = [full.train_step() for _ in range(4)]
    first = _trainer(small_model_dir, tmp_path / "b", name, **kw)
    for _ in range(2):
        first.train_step()
    first.save()
    second = _trainer(small_model_dir, tmp_path / "b", name, **kw)
    assert second.restore() and second.step == 2
    rows = [second.train_step() for _ in range(2)]
    assert full.policy_version >= 2
    want, got = full.model.state_dict(), second.model.state_dict()
    assert set(want) == set(got)
    for k, v in want.items():
        assert_close(got[k], v, rtol=1e-5, atol=1e-6, msg=k)
    for a, b in zip(rows_full[2:], rows):
        assert a["reward/mean"] == b["reward/mean"]
        if "loss/policy" in a:
            assert math.isclose(a["loss/policy"], b["loss/policy"], rel_tol=1e-4, abs_tol=1e-6)


class _ZeroGradientRetention:
    """A built retention set whose NLL reaches every trainable parameter with a gradient of
    exactly zero (0·Σθ): the protected direction does not exist at this step."""

    built = True

    def nll(self, model):
        return 0.0 * sum(q.sum() for q in model.parameters() if q.requires_grad)


class _DetachedRetention:
    """A retention loss that reaches no trainable parameter at all (a wiring error)."""

    built = True

    def nll(self, model):
        return torch.zeros((), requires_grad=True)


@pytest.mark.parametrize("protect", ["retention", "rl"])
def test_cord_skips_the_projection_when_the_protected_gradient_is_exactly_zero(protect, small_model_dir, tmp_path):
    # g_ret = 0 exactly: nothing to project on (‖g_p‖² = 0), so the step keeps λ·g_rl + β·g_ret = g_rl
    # (λ = β = 1) and logs the skip; it must not raise
    tr = _trainer(small_model_dir, tmp_path / protect, "cord", {"protect": protect},
                  train={"dtype": "fp64", "grad_clip": 0.0}, rollout={"group_size": 4})
    stage = tr.method.grad[0]
    ctx = tr.context("z").for_stage(tr.method, stage)
    ctx.state = {RETENTION_STATE: _ZeroGradientRetention()}
    params = [q for q in tr.model.parameters() if q.requires_grad]
    g = torch.Generator().manual_seed(3)
    rl = [torch.randn(q.shape, generator=g, dtype=q.dtype) for q in params]
    for q, r in zip(params, rl):
        q.grad = r.clone()
    out = stage.fn(tr.model, ctx)
    for q, r in zip(params, rl):
        assert torch.equal(q.grad, r)  # g = g_rl + 0 exactly: no projection, nothing rescaled
    # counted: the retention gradient was zero at this step; when it is the protected one, the
    # projection was skipped for want of a direction (protected_zero)
    assert out["cord/retention_zero"] == 1.0 and out["cord/projected"] == 0.0
    assert out["cord/protected_zero"] == float(protect == "retention")
    assert (out["cord/protected_norm"] == 0.0) == (protect == "retention")
    # a retention loss that reaches no trainable parameter is a wiring error, still refused
    ctx.state = {RETENTION_STATE: _DetachedRetention()}
    with pytest.raises(MissingQuantityError, match="reaches no trainable parameter"):
        stage.fn(tr.model, ctx)


def test_cord_logs_no_skip_when_the_protected_gradient_is_nonzero():
    from policylab.kernels.geometry import cord_combine

    # g_p = (0, 0) → skipped (protected_zero 1); g_p = (1, 0) → not (protected_zero 0)
    one = [torch.tensor([1.0, 0.0], dtype=torch.float64)]
    zero = [torch.zeros(2, dtype=torch.float64)]
    other = [torch.tensor([-1.0, 1.0], dtype=torch.float64)]
    for scope in ("global", "per_tensor"):
        _, skipped = cord_combine(zero, other, weight=1.0, mode="conflict_only", scope=scope)
        _, kept = cord_combine(one, other, weight=1.0, mode="conflict_only", scope=scope)
        assert skipped["protected_zero"] == 1.0 and kept["protected_zero"] == 0.0
