"""Trainer invariants on a tiny random Llama with the SmolLM2 tokenizer."""

import dataclasses
import json
import math

import pytest
import torch

from policylab.experiments.exercise import exercise_settings
from policylab import methods
from policylab.trainer.loop import Trainer
from policylab.backends.update import Learner, UpdateSettings, optimizer_step

from trainer_utils import tiny_config


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_lr_zero_gives_ratio_exactly_one_and_unchanged_weights(tiny_model_dir, tmp_path):
    # two passes over the batch force a separate old-logprob pass; with lr = 0 the weights
    # never move, so the recomputed logp equals logp_old bit for bit and every ratio is 1
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", train={"lr": 0.0, "epochs": 2, "steps": 1})
    tr = Trainer(cfg)
    before = _params(tr.model)
    m = tr.train_step()
    assert m["policy/ratio/min"] == 1.0 and m["policy/ratio/max"] == 1.0
    assert m["policy/clip_frac"] == 0.0
    for k, v in _params(tr.model).items():
        assert torch.equal(v, before[k]), k
    # memory is logged: resident now (more than the model's fp32 weights) and its peak
    weights_mb = sum(v.numel() * v.element_size() for v in before.values()) / 2**20
    assert weights_mb < m["sys/rss_mb"] <= m["sys/peak_rss_mb"] + 1.0


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_same_update_for_every_micro_batch_split(tiny_model_dir, tmp_path, shared_prefix):
    # fp64 model, SGD: the summed gradient must not depend on the micro-batch size because
    # each micro-batch divides by the normalizer of the whole optimizer step
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", train={"dtype": "fp64"},
                      rollout={"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 5})
    tr = Trainer(cfg)
    batch, _ = tr.collect()
    batch = tr.prepare(batch)
    adv = torch.linspace(-1, 1, batch.size, dtype=torch.float64)
    start = _params(tr.model)
    deltas = {}
    for mode in ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]:
        # dr_grpo declares L_norm (the constant of seq_mean_token_sum_norm); only the mode changes
        recipe = dataclasses.replace(methods.get("dr_grpo").with_params({"L_norm": 5.0}), aggregation=mode)
        for mbs in [1, 2, 4, 8]:
            tr.model.load_state_dict(start)
            opt = torch.optim.SGD(tr.model.parameters(), lr=1.0)
            settings = UpdateSettings(micro_batch_size=mbs, dtype="fp64", grad_clip=0.0, shared_prefix=shared_prefix)
            optimizer_step(Learner(tr.model, opt, settings=settings), recipe, batch, adv, old_from_same_forward=True)
            deltas[(mode, mbs)] = {k: v - start[k] for k, v in tr.model.state_dict().items()}
        ref = deltas[(mode, 8)]
        assert max(float(d.abs().max()) for d in ref.values()) > 1e-6  # the update is not trivially zero
        for mbs in [1, 2, 4]:
            for k in ref:
                torch.testing.assert_close(deltas[(mode, mbs)][k], ref[k], rtol=1e-9, atol=1e-12)


def test_resume_equals_uninterrupted_run(tiny_model_dir, tmp_path):
    full = Trainer(tiny_config(tiny_model_dir, tmp_path / "a", train={"steps": 4}))
    rows_full = [full.train_step() for _ in range(4)]

    first = Trainer(tiny_config(tiny_model_dir, tmp_path / "b", train={"steps": 4}))
    for _ in range(2):
        first.train_step()
    first.save()
    second = Trainer(tiny_config(tiny_model_dir, tmp_path / "b", train={"steps": 4}))
    assert second.restore() and second.step == 2
    rows_resumed = [second.train_step() for _ in range(2)]

    for k, v in _params(full.model).items():
        torch.testing.assert_close(_params(second.model)[k], v, rtol=1e-5, atol=1e-6)
    for a, b in zip(rows_full[2:], rows_resumed):
        assert a["reward/mean"] == b["reward/mean"]
        assert a["response/length_mean"] == b["response/length_mean"]
        assert math.isclose(a["loss/policy"], b["loss/policy"], rel_tol=1e-4, abs_tol=1e-6)


@pytest.mark.parametrize("name", methods.names())
def test_every_method_runs_one_real_step(name, tiny_model_dir, tmp_path):
    # under the settings the method needs to do anything (its spec's `exercise`, plus what
    # must be made first for this model, e.g. RFPO's critic)
    exercise = exercise_settings(name, model=str(tiny_model_dir), workdir=tmp_path / "prepared")
    sections = {"method": name, "method_params": {}, **exercise}
    cfg = tiny_config(tiny_model_dir, tmp_path / name, **sections)
    tr = Trainer(cfg)
    m = tr.train_step()
    assert m.get("skipped_nonfinite", 0.0) == 0.0
    assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)), m
    warm = m.get("staleness/warming_up") or m.get("value/pretraining")  # a stale queue filling; vapo's critic first
    if not m.get("skipped_no_signal") and not warm:
        assert tr.policy_version >= 1


def test_vapo_value_pretraining_moves_only_the_critic(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "v", method="vapo", method_params={"value_pretrain_steps": 1},
                      train={"steps": 2})
    tr = Trainer(cfg)
    policy_before = _params(tr.model)
    critic_before = _params(tr.critic)
    m = tr.train_step()
    assert m["value/pretraining"] == 1.0 and tr.policy_version == 0
    for k, v in _params(tr.model).items():
        assert torch.equal(v, policy_before[k]), k
    assert any(not torch.equal(v, critic_before[k]) for k, v in _params(tr.critic).items())
    m = tr.train_step()
    assert m["value/pretraining"] == 0.0 and tr.policy_version >= 1


def test_fused_adamw_matches_the_reference_loop(tokenizer):
    # the trainer's AdamW uses the fused kernel; three steps on the same gradients must give
    # the per-tensor reference's weights up to fp32 rounding
    from policylab.models import loading as models
    from policylab.backends.build import adamw as _adamw

    a, b = models.tiny_llama(tokenizer), models.tiny_llama(tokenizer)
    opt_a = _adamw(a.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, foreach=False)
    assert opt_a.defaults.get("fused") is True
    g = torch.Generator().manual_seed(0)
    start = _params(a)
    for _ in range(3):
        for pa, pb in zip(a.parameters(), b.parameters()):
            grad = torch.randn(pa.shape, generator=g)
            pa.grad, pb.grad = grad.clone(), grad.clone()
        opt_a.step()
        opt_b.step()
    for (k, va), vb in zip(_params(a).items(), _params(b).values()):
        assert float((va - start[k]).abs().max()) > 1e-3  # the weights moved
        torch.testing.assert_close(va, vb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_zero_advantage_rows_left_out_give_the_same_update(tiny_model_dir, tmp_path, shared_prefix):
    # rows with A = 0 everywhere add exactly 0 to a PPO-clip loss and its gradient; they
    # still count in the normalizer, so leaving them out of the forward changes nothing
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", train={"dtype": "fp64"},
                      rollout={"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 5})
    tr = Trainer(cfg)
    batch = tr.prepare(tr.collect()[0])
    adv = torch.linspace(-1, 1, batch.size, dtype=torch.float64)
    adv[[0, 1, 2, 3, 7]] = 0.0  # a whole group and one more row
    start = _params(tr.model)
    recipe = methods.get("grpo").with_params({"kl_coef": 0.0})
    deltas, metrics = {}, {}
    for skip in (False, True):
        tr.model.load_state_dict(start)
        opt = torch.optim.SGD(tr.model.parameters(), lr=1.0)
        settings = UpdateSettings(micro_batch_size=3, dtype="fp64", grad_clip=0.0, shared_prefix=shared_prefix,
                                  skip_zero_adv=skip)
        metrics[skip] = optimizer_step(Learner(tr.model, opt, settings=settings), recipe, batch, adv,
                                       old_from_same_forward=True)
        deltas[skip] = {k: v - start[k] for k, v in _params(tr.model).items()}
    assert metrics[True]["train/rows_zero_adv_skipped"] == 5.0 and metrics[False]["train/rows_zero_adv_skipped"] == 0.0
    assert metrics[True]["tokens"] == metrics[False]["tokens"]  # the normalizer's token count
    assert metrics[True]["loss/policy"] == pytest.approx(metrics[False]["loss/policy"], rel=1e-12, abs=1e-15)
    for k, d in deltas[False].items():
        torch.testing.assert_close(deltas[True][k], d, rtol=1e-9, atol=1e-12)
    assert max(float(d.abs().max()) for d in deltas[False].values()) > 1e-6


def test_zero_advantage_rows_kept_when_another_term_needs_them(tiny_model_dir, tmp_path):
    # a KL term in the loss has a gradient on every row: nothing may be left out
    kl = methods.get("grpo").with_params({"kl_coef": 0.04})
    assert not kl.zero_adv_rows_inert
    assert methods.get("grpo").with_params({"kl_coef": 0.0}).zero_adv_rows_inert
    assert not methods.get("dapo").with_params({"entropy_coef": 0.01}).zero_adv_rows_inert
    # every row flat: a no-signal step, weights untouched (not an optimizer step on zero grads)
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", rollout={"prompts_per_step": 2, "group_size": 2,
                                                                  "max_new_tokens": 4})
    tr = Trainer(cfg)
    batch = tr.prepare(tr.collect()[0])
    start = _params(tr.model)
    learner = Learner(tr.model, tr.optimizer, settings=UpdateSettings(micro_batch_size=2, dtype="fp32", grad_clip=1.0))
    m = optimizer_step(learner, methods.get("grpo").with_params({"kl_coef": 0.0}), batch, torch.zeros(batch.size),
                       old_from_same_forward=True)
    assert m["skipped_no_signal"] == 1.0 and m["train/rows_zero_adv_skipped"] == batch.size
    for k, v in _params(tr.model).items():
        assert torch.equal(v, start[k]), k
