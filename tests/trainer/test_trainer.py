"""Trainer invariants on a tiny random Llama (the small-vocabulary one, SmolLM2's BPE cut to 1024
ids; the lr = 0 bound on the real vocabulary)."""

import dataclasses
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


# |log ratio| allowed between two fp32 forwards of the same tokens at the same weights, from
# the rounding bound derived in `test_lr_zero_keeps_the_weights_and_the_ratio_at_one_up_to_fp32_rounding`
_FP32_LOG_RATIO_BOUND = 2.0**-14 + 2.0**-20


def test_lr_zero_keeps_the_weights_and_the_ratio_at_one_up_to_fp32_rounding(tiny_model_dir, tmp_path):
    # fp32, two epochs over the batch: a separate old-logprob pass, then two optimizer steps.
    #
    # Exact: with lr = 0 every AdamW step p <- p * (1 - lr * wd) - lr * m / (sqrt(v) + eps)
    # leaves p bit for bit (1 - 0 * wd == 1, 0 * finite == 0), so both epochs train at the
    # sampling weights and the weights after the step are the weights before.
    #
    # Not exact: logp_old (the role pass after sampling) and logp (the training forward, in
    # micro-batches of 2 rows) are two fp32 forwards over the same tokens at the same weights
    # that may batch the rows differently, and a GEMM may then split its dot products
    # differently (reductions along one row, RMSNorm's over H and the log-sum-exp over V, run
    # alike for any number of rows). On AVX-512 the two agree bit for bit here (ratio 1.0); on
    # AVX2 they differ by one fp32 spacing of logp (logp ~ -10.8 = -log V lies in [-16, -8),
    # where fp32 numbers are 2^-20 apart): ratios 1 -+ 2^-20.
    #
    # The bound. log ratio = (z_y - z_y') - (LSE(z) - LSE(z')) with z, z' the two passes'
    # logits; LSE is 1-Lipschitz in the max norm, so |log ratio| <= 2 max_k |z_k - z'_k| plus
    # the rounding of each pass's final subtraction (half a spacing, 2^-21, each). A logit is
    # a 64-term fp32 dot product of the final hidden state h (RMS-normalized with weight 1:
    # |h|_2 <= 8) with a head row (|w|_2 < 0.25, asserted below), so sum_i |w_i h_i| < 2, and two
    # summation orders give results within 2 * 64 * u * 2 = 2^-16 of each other (u = 2^-24,
    # the worst-case bound 64 u sum |terms| for each order). The two layers below reach h the
    # same way (64- and 128-term products of RMS-normalized inputs with 0.02-scale weights):
    # allowing them as much again gives max_k |dz_k| <= 2^-15, so
    #     |log ratio| <= 2 * 2^-15 + 2^-20 = 2^-14 + 2^-20 (6.2e-5),
    # and the ratio itself is exp of that rounded to fp32 (2^-23 relative more at most).
    # Far inside the clip range (0.2) and far below a real defect (an old-logprob pass on
    # other weights, tokens or temperature moves logp by 1e-3 and more).
    # (the real vocabulary: the bound's logp ~ -log V is SmolLM2's; test_same_update_avx2.py re-runs it)
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", train={"lr": 0.0, "epochs": 2, "steps": 1})
    tr = Trainer(cfg)
    assert cfg.train.micro_batch_size == 2 and cfg.train.dtype == "fp32"
    head = tr.model.get_output_embeddings().weight
    assert float(head.detach().norm(dim=1).max()) < 0.25  # the premise of the bound
    assert float(tr.model.model.norm.weight.detach().abs().max()) <= 1.0
    before = _params(tr.model)
    m = tr.train_step()
    assert m["optimizer_steps"] == 2  # both epochs stepped (with lr = 0)
    for k, v in _params(tr.model).items():
        assert torch.equal(v, before[k]), k
    for key in ("policy/ratio/min", "policy/ratio/max", "policy/ratio/mean"):
        assert abs(math.log(m[key])) <= _FP32_LOG_RATIO_BOUND + 2.0**-23, (key, m[key])
    assert m["policy/clip_frac"] == 0.0  # exact: every ratio is within 1e-4 of 1, the clip range is 0.2
    # memory is logged: resident now (more than the model's fp32 weights) and its peak
    weights_mb = sum(v.numel() * v.element_size() for v in before.values()) / 2**20
    assert weights_mb < m["sys/rss_mb"] <= m["sys/peak_rss_mb"] + 1.0


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_same_update_for_every_micro_batch_split(small_model_dir, tmp_path, shared_prefix):
    # fp64 model, SGD: the summed gradient must not depend on the micro-batch size because
    # each micro-batch divides by the normalizer of the whole optimizer step
    cfg = tiny_config(small_model_dir, tmp_path / "run", train={"dtype": "fp64"},
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


def test_resume_equals_uninterrupted_run(small_model_dir, tmp_path):
    full = Trainer(tiny_config(small_model_dir, tmp_path / "a", train={"steps": 4}))
    rows_full = [full.train_step() for _ in range(4)]

    first = Trainer(tiny_config(small_model_dir, tmp_path / "b", train={"steps": 4}))
    for _ in range(2):
        first.train_step()
    first.save()
    second = Trainer(tiny_config(small_model_dir, tmp_path / "b", train={"steps": 4}))
    assert second.restore() and second.step == 2
    rows_resumed = [second.train_step() for _ in range(2)]

    for k, v in _params(full.model).items():
        torch.testing.assert_close(_params(second.model)[k], v, rtol=1e-5, atol=1e-6)
    for a, b in zip(rows_full[2:], rows_resumed):
        assert a["reward/mean"] == b["reward/mean"]
        assert a["response/length_mean"] == b["response/length_mean"]
        assert math.isclose(a["loss/policy"], b["loss/policy"], rel_tol=1e-4, abs_tol=1e-6)


@pytest.mark.parametrize("name", methods.names())
def test_every_method_runs_one_real_step(name, small_model_dir, tmp_path, small_prepared_dir):
    # under the settings the method needs to do anything (its spec's `exercise`, plus what
    # must be made first for this model, e.g. RFPO's critic)
    exercise = exercise_settings(name, model=str(small_model_dir), workdir=small_prepared_dir)
    # four prompts (unless the method's exercise says otherwise): with two, a step had no group
    # of mixed outcomes, so no update to check, for 21 of the methods on the real-vocabulary model
    # at this seed; with four on the small-vocabulary one for 9, each also without one before
    exercise["rollout"] = {"prompts_per_step": 4, **exercise.get("rollout", {})}
    sections = {"method": name, "method_params": {}, **exercise}
    cfg = tiny_config(small_model_dir, tmp_path / name, **sections)
    tr = Trainer(cfg)
    m = tr.train_step()
    assert m.get("skipped_nonfinite", 0.0) == 0.0
    assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)), m
    warm = m.get("staleness/warming_up") or m.get("value/pretraining")  # a stale queue filling; vapo's critic first
    if not m.get("skipped_no_signal") and not warm:
        assert tr.policy_version >= 1


def test_vapo_value_pretraining_moves_only_the_critic(small_model_dir, tmp_path):
    cfg = tiny_config(small_model_dir, tmp_path / "v", method="vapo", method_params={"value_pretrain_steps": 1},
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


def test_fused_adamw_matches_the_reference_loop(small_tokenizer):
    # the trainer's AdamW uses the fused kernel; three steps on the same gradients must give
    # the per-tensor reference's weights up to fp32 rounding
    from policylab.models import loading as models
    from policylab.backends.build import adamw as _adamw

    a, b = models.tiny_llama(small_tokenizer), models.tiny_llama(small_tokenizer)
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
def test_zero_advantage_rows_left_out_give_the_same_update(small_model_dir, tmp_path, shared_prefix):
    # rows with A = 0 everywhere add exactly 0 to a PPO-clip loss and its gradient; they
    # still count in the normalizer, so leaving them out of the forward changes nothing
    cfg = tiny_config(small_model_dir, tmp_path / "run", train={"dtype": "fp64"},
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


def test_zero_advantage_rows_kept_when_another_term_needs_them(small_model_dir, tmp_path):
    # a KL term in the loss has a gradient on every row: nothing may be left out
    kl = methods.get("grpo").with_params({"kl_coef": 0.04})
    assert not kl.zero_adv_rows_inert
    assert methods.get("grpo").with_params({"kl_coef": 0.0}).zero_adv_rows_inert
    assert not methods.get("dapo").with_params({"entropy_coef": 0.01}).zero_adv_rows_inert
    # every row flat: a no-signal step, weights untouched (not an optimizer step on zero grads)
    cfg = tiny_config(small_model_dir, tmp_path / "run", rollout={"prompts_per_step": 2, "group_size": 2,
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
