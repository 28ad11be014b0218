"""Behaviours that an independent mutation run found unguarded (issue 30), one test each.

Each test states the behaviour it guards, with numbers worked by hand (fp64) where a
formula is involved; `scripts/mutation_check.py` applies the mutation each one answers
and checks that the test fails on the mutated code. Tests of the engine adapters (verl,
TRL) and of the sandbox live beside the other tests of those modules
(tests/integrations/, tests/sandbox/).
"""

from __future__ import annotations

import math
import shutil
from types import SimpleNamespace

import pytest
import torch

from policylab import methods
from policylab.errors import PolicylabError
from policylab.kernels.objectives.conspo import conspo
from policylab.kernels.rewards.runtime import speed_score
from policylab.kernels.testtime.ttpo import ttpo_split
from policylab.methods.families import borrowed_rollouts, hints_and_gold
from policylab.trainer.loop import Trainer

from method_loss import method_loss
from trainer_utils import tiny_config

F64 = torch.float64


# ----------------------------------------------------------------------------- ConSPO


def test_conspo_a_row_without_counted_tokens_is_not_a_negative():
    # group 0: positive p (lp -1, -1: s_p = -1), negative n (lp -2, -2: s_n = -2), and a
    # row with no counted token and verdict "wrong"; group 1: a positive and such an empty row.
    # τ = 1, m = 0. Group 0: ℓ_p = log(1 + e^{s_n − s_p}) = log(1 + e^{-1}) = 0.3132616875182228;
    # counting the empty row (s = 0) as a negative would give log(1 + e^{-1} + e^{1}) = 1.4076.
    # Group 1 has no negative with a token: ineligible, ℓ = 0 everywhere.
    lp = torch.tensor([[-1.0, -1.0], [-2.0, -2.0], [-5.0, -5.0], [-1.0, -1.0], [-3.0, -3.0]], dtype=F64)
    mask = torch.tensor([[1, 1], [1, 1], [0, 0], [1, 1], [0, 0]], dtype=torch.bool)
    group = torch.tensor([0, 0, 0, 1, 1])
    positive = torch.tensor([True, False, False, True, False])
    loss, m = conspo(lp, mask, group, positive, tau=1.0, margin=0.0)
    want = 0.3132616875182228
    assert loss[0].tolist() == pytest.approx([want, want], rel=1e-12)
    assert float(loss[1:].abs().sum()) == 0.0
    assert float(m["conspo/eligible_group_frac"]) == 0.5
    assert float(m["conspo/positives_count"]) == 1.0


def test_conspo_loss_in_the_trainer_is_the_mean_over_positives(tiny_model_dir, tmp_path):
    # Through the method's stages (round stage's row scale, objective, seq_mean_token_mean):
    # the step's policy loss is (1/N_pos)·Σ_p ℓ_p, recomputed here from the learner's own
    # log-probs with a naive loop over groups. Every group in the batch has a positive and
    # a negative (ConSPO's dynamic-sampling filter keeps only those), so "over the positives"
    # and "over the eligible positives" agree here.
    # NOTE(re-check): the fidelity work on issue 24 item 10 changes how the row scale counts.
    from policylab.models.logprobs import model_logprobs

    cfg = tiny_config(tiny_model_dir, tmp_path / "c", method="conspo",
                      method_params={"conspo_margin_ramp_steps": 0, "conspo_margin_max": 0.1, "conspo_tau": 0.5},
                      rollout={"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 4},
                      train={"dtype": "fp64", "minibatches": 1, "micro_batch_size": 12, "grad_clip": 0.0})
    tr = Trainer(cfg)
    batch, _ = tr.collect()
    assert batch is not None
    batch, A, _ = tr.round_inputs(tr.prepare(batch))
    with torch.no_grad():
        lp = model_logprobs(tr.model, batch.tokens, batch.attention_mask, batch.prompt_width, sampling=batch.sampling)
    mask = batch.loss_mask
    pos = batch.outcome["correct"] > 0.5
    s = [float(lp[i][mask[i]].double().mean()) for i in range(batch.size)]
    ells = []
    for g in torch.unique(batch.group).tolist():
        rows = (batch.group == g).nonzero().squeeze(-1).tolist()
        negs = [i for i in rows if not pos[i] and bool(mask[i].any())]
        for i in rows:
            if pos[i] and bool(mask[i].any()):
                zp = (s[i] - 0.1) / 0.5
                ells.append(-zp + math.log(math.exp(zp) + sum(math.exp(s[n] / 0.5) for n in negs)))
    n_pos = len(ells)
    assert 0 < n_pos < batch.size, "the check needs positives and negatives"
    want = sum(ells) / n_pos
    m = tr.worker.optimizer_step(tr.method, batch, A.adv, old_from_same_forward=not tr.needs_old_pass())
    # rel 1e-7: the round stage hands the margin and the row scale on as fp32 0-dim extras
    # (0.1 -> 0.10000000149), ~1e-9 here; a row scale of 1 instead of N_seq/N_pos >= 12/11
    # would move the loss by >= 9%
    assert m["loss/policy"] == pytest.approx(want, rel=1e-7)


# ----------------------------------------------------------------------------- RLiD


def test_rlid_marginal_term_has_the_gradient_of_its_estimator():
    # The regularizer's sampled estimator β·(c_a − b)·ρ, ρ = exp(lp − sg(lp_old)), on each
    # decision: at ρ = 1 its gradient with respect to lp is β·(c_a − b). With advantage 0
    # the clipped policy term has zero gradient, so the whole gradient is the regularizer's:
    # β = 0.3, coefficients (0.5, −0.25) -> (0.15, −0.075). A detached ρ would leave 0.
    lp = torch.log(torch.tensor([[0.4], [0.3]], dtype=F64)).requires_grad_(True)
    mask = torch.ones(2, 1, dtype=torch.bool)
    extras = {"rlid_marginal_coef": torch.tensor([0.5, -0.25], dtype=F64),
              "rlid_episode_weight": torch.ones(2, dtype=F64)}
    loss, _ = method_loss("rlid", {"marginal_coef": 0.3, "kl_coef": 0.0}, lp, torch.zeros(2, dtype=F64), mask,
                          extras=extras)
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.15], [-0.075]], dtype=F64), rtol=1e-12, atol=1e-15)


def _rlid_batch(tiny_model_dir, tmp_path):
    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "rl", method="rlid", method_params={},
                             task={"name": "menu_arithmetic", "reward": "menu_label"}, rollout={"group_size": 2}))
    return tr, tr.prepare(tr.collect()[0])


def test_rlid_refuses_a_decision_that_is_not_exactly_one_counted_token(tiny_model_dir, tmp_path):
    tr, batch = _rlid_batch(tiny_model_dir, tmp_path)
    assert batch.loss_mask.shape[1] == 1 and bool(batch.loss_mask.all())
    tr.round_inputs(batch)  # one counted token per decision: accepted
    lm = batch.loss_mask.clone()
    lm[0, 0] = False  # a row whose decision would not count
    with pytest.raises(PolicylabError, match="exactly one counted position"):
        tr.round_inputs(batch.replace(loss_mask=lm))


# ----------------------------------------------------------------------------- GRIN


@pytest.mark.parametrize("alpha,G,want", [(0.9, 4, 3), (0.875, 8, 7), (0.625, 4, 3), (0.5, 4, 2), (0.8, 2, 1),
                                          (0.1, 4, 0)])
def test_grin_leaves_at_least_one_own_sample_in_a_group(alpha, G, want):
    # round(α·G) gold rows, at most G − 1: α = 0.9 on G = 4 rounds to 4 -> 3 (a group of
    # gold alone has no own sample to learn from); 0.875·8 = 7 exactly; 0.625·4 = 2.5
    # rounds half up to 3; 0.8·2 = 1.6 -> 2 -> 1; 0.1·4 -> 0
    p = methods.get("grin").with_params({"grin_alpha": alpha, "grin_schedule": "constant"}).p
    assert hints_and_gold.gold_count(p, 0.0, G) == want


# ----------------------------------------------------------------------------- GRAFT


def test_graft_rows_below_the_compatibility_threshold_get_no_gradient():
    # The compatibility gate on borrowed rows: a peer row weighs min(c, cap) and 0 below
    # graft_min_compat (0.1); a native row weighs 1 whatever its extras say. Per-token loss
    # before aggregation at ratio 1 (π_old = sg(π_θ)): −A·w, so ∂/∂lp = −A·w per token:
    # native A = 1 -> −1; peer c = 0.5, A = 1 -> −0.5; peer c = 0.05 (below 0.1), A = −1 -> 0.
    import dataclasses

    from policylab import methods
    from policylab.batch.provenance import LEARNER
    from policylab.methods.loss import policy_loss, tensor_inputs

    lp = torch.full((3, 2), -1.0, dtype=F64, requires_grad=True)
    mask = torch.ones(3, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, 1.0, -1.0], dtype=F64)
    extras = {"graft_keep": torch.tensor([1.0, 1.0, 0.0], dtype=F64),
              "graft_compat": torch.tensor([0.05, 0.5, 0.05], dtype=F64)}  # the native row's 0.05 is ignored
    inp = tensor_inputs(lp, adv, mask, extras=extras)
    inp = dataclasses.replace(inp, batch=dataclasses.replace(
        inp.batch, source=["native", "peer:checkpoint", "peer:checkpoint"],
        producer=[LEARNER, "checkpoint", "checkpoint"]).validate())
    loss, _ = policy_loss(methods.get("graft").with_params({"kl_coef": 0.0}), inp)
    loss.sum().backward()
    want = torch.tensor([[-1.0, -1.0], [-0.5, -0.5], [0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(lp.grad, want, rtol=1e-12, atol=1e-15)


def test_graft_source_marks_every_row_below_the_threshold_dropped(tiny_model_dir, tmp_path):
    import dataclasses

    from policylab.models import loading as models

    def scripted(ctx, outcomes):  # the verifier answers from `outcomes`, call by call
        calls = iter(outcomes)

        def score(texts, examples):
            v = torch.tensor(next(calls), dtype=torch.float32)[: len(texts)]
            return v, {"v": v}, v

        return dataclasses.replace(ctx, score=score)

    def source_ctx(tr):
        return tr.context("t").for_stage(tr.method, tr.method.source)

    peer_dir = tmp_path / "peer"
    tok = models.embedded_tokenizer()
    models.tiny_llama(tok, seed=1).save_pretrained(peer_dir)
    tok.save_pretrained(peer_dir)
    # receiver prompt 1 all fails, the peer's group on it is mixed: the group is imported;
    # a threshold above every compatibility drops each of its rows, none above keeps them all
    for threshold, kept in ((1e9, 0.0), (0.0, 1.0)):
        tr = Trainer(tiny_config(tiny_model_dir, tmp_path / f"g{threshold}", method="graft",
                                 method_params={"peer_model": str(peer_dir), "graft_min_compat": threshold},
                                 task={"reward": "exact_numeric"},
                                 rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 5}))
        s = borrowed_rollouts.peer_exchange(2, scripted(source_ctx(tr), [[1, 0, 0, 0, 0, 0, 0, 0], [1, 0, 1, 0]]))
        peer = s.batch.source_rows("peer")
        assert int(peer.sum()) == 4
        assert s.batch.extras["graft_keep"][peer].tolist() == [kept] * 4


# ----------------------------------------------------------------------------- ERILS


def test_erils_normalizes_within_each_source_of_a_group():
    # one group: native rewards (1, 0), external rewards (1, 0.5). Per source, population
    # std: native mean 0.5 std 0.5 -> (1, −1); external mean 0.75 std 0.25 -> (1, −1)
    # (eps 1e-6 in the denominator: 0.5/(0.5 + 1e-6) = 0.999998000004). Pooled over the
    # group (mean 0.625, std 0.4146) the native failure would get −1.5076.
    from policylab.methods.loss import tensor_inputs

    r = torch.tensor([1.0, 0.0, 1.0, 0.5], dtype=F64)
    mask = torch.ones(4, 2, dtype=torch.bool)
    b = tensor_inputs(torch.zeros(4, 2, dtype=F64), torch.zeros(4, dtype=F64), mask, rewards=r,
                      group=torch.zeros(4, dtype=torch.long)).batch
    b = b.replace(source=("native", "native", "external", "external"), producer=("policy", "policy", "x", "x"))
    assert b.source_rows("external").tolist() == [False, False, True, True]
    ctx = SimpleNamespace(p=SimpleNamespace(std="population", eps=1e-6))
    got = borrowed_rollouts.erils(b, ctx).adv
    n, e = 0.5 / (0.5 + 1e-6), 0.25 / (0.25 + 1e-6)
    torch.testing.assert_close(got.double(), torch.tensor([n, -n, e, -e], dtype=F64), rtol=1e-9, atol=1e-12)


def test_missing_old_logits_refuses_old_log_probs_of_other_weights(tiny_model_dir, tmp_path):
    # π_old must be the trainer at exactly the version that sampled: a batch whose old-
    # logprob pass is recorded as another version, or not recorded at all, is refused
    # before the round's advantages (the round stage's check, not only the kernel's)
    from policylab.errors import MissingQuantityError

    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "m", method="missing_old_logits", method_params={},
                             rollout={"engine_dtype": "int8", "group_size": 2}))
    batch = tr.prepare(tr.collect()[0])
    v = int(torch.as_tensor(batch.extras["logp_old_version"]).reshape(-1)[0])
    assert v == int(batch.policy_version[0])
    tr.round_inputs(batch)  # the exact old pass: accepted
    other = batch.replace(extras={**batch.extras, "logp_old_version": torch.tensor(v + 1)})
    with pytest.raises(MissingQuantityError, match="tagged version 1 but .* sampled at version 0"):
        tr.round_inputs(other)
    unrecorded = batch.replace(extras={k: x for k, x in batch.extras.items() if k != "logp_old_version"})
    with pytest.raises(PolicylabError, match="does not record which weights computed logp_old"):
        tr.round_inputs(unrecorded)


# ----------------------------------------------------------------------------- the update


def _zero_adv_trainer(tiny_model_dir, run_dir, entropy_coef):
    cfg = tiny_config(tiny_model_dir, run_dir, method="grpo", method_params={"kl_coef": 0.0,
                                                                             "entropy_coef": entropy_coef},
                      task={"reward": "trainer_utils:zero_reward"},
                      rollout={"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
                      train={"dtype": "fp64", "grad_clip": 0.0, "minibatches": 1, "micro_batch_size": 4})
    tr = Trainer(cfg)
    batch, A, _ = tr.round_inputs(tr.prepare(tr.collect()[0]))
    assert float(A.adv.abs().sum()) == 0.0  # every reward 0: only the entropy bonus trains
    return tr, batch, A.adv


def test_the_entropy_bonus_reaches_the_gradient(tiny_model_dir, tmp_path):
    # With every advantage 0 the step's gradient is the entropy bonus's alone, −c·∇H̄: not
    # zero, and linear in c (c = 0.02 gives exactly twice the gradient of c = 0.01). An
    # entropy detached in the training forward leaves no gradient at all.
    norms = []
    for c in (0.01, 0.02):
        tr, batch, adv = _zero_adv_trainer(tiny_model_dir, tmp_path / f"e{c}", c)
        m = tr.worker.optimizer_step(tr.method, batch, adv, old_from_same_forward=not tr.needs_old_pass())
        assert m.get("skipped_no_signal", 0.0) == 0.0
        norms.append(m["grad_norm"])
    assert norms[0] > 1e-6
    assert norms[1] == pytest.approx(2 * norms[0], rel=1e-9)


def test_a_minibatch_without_a_counted_token_is_a_skipped_step(tiny_model_dir, tmp_path):
    # nothing counts: no optimizer step, no schedule step, the weights untouched (AdamW's
    # weight decay and momentum would move them on a zero-loss step), and the step says so.
    # The entropy bonus is on so that rows with advantage 0 are not inert (the other guard).
    tr, batch, adv = _zero_adv_trainer(tiny_model_dir, tmp_path / "s", 0.01)
    tr.worker.optimizer_step(tr.method, batch, adv, old_from_same_forward=True)  # Adam's state exists
    start = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    steps = [s["step"] for s in tr.optimizer.state_dict()["state"].values()]
    last = tr.scheduler.last_epoch
    empty = batch.replace(loss_mask=torch.zeros_like(batch.loss_mask))
    m = tr.worker.optimizer_step(tr.method, empty, adv, old_from_same_forward=True)
    assert m["skipped_no_signal"] == 1.0 and m["tokens"] == 0.0
    assert tr.scheduler.last_epoch == last
    assert [s["step"] for s in tr.optimizer.state_dict()["state"].values()] == steps
    for k, v in tr.model.state_dict().items():
        assert torch.equal(v, start[k]), k


def test_a_non_finite_gradient_skips_the_step_and_touches_nothing(tiny_model_dir, tmp_path):
    # a gradient with an inf in it (here put there by a gradient-stage hook, after a finite
    # loss): no optimizer step, the weights and Adam's state untouched, the step logged as
    # skipped; with train.skip_nonfinite off it raises instead
    import dataclasses

    from policylab.backends.update import StepHooks

    def corrupt(model):
        next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")
        return {}

    tr, batch, adv = _zero_adv_trainer(tiny_model_dir, tmp_path / "n", 0.01)
    tr.worker.optimizer_step(tr.method, batch, adv, old_from_same_forward=True)
    start = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    steps = [s["step"] for s in tr.optimizer.state_dict()["state"].values()]
    m = tr.worker.optimizer_step(tr.method, batch, adv, old_from_same_forward=True, hooks=StepHooks(grad=corrupt))
    assert m["skipped_nonfinite"] == 1.0 and not math.isfinite(m["grad_norm"])
    assert [s["step"] for s in tr.optimizer.state_dict()["state"].values()] == steps
    for k, v in tr.model.state_dict().items():
        assert torch.equal(v, start[k]), k
    learner = tr.worker.learner
    learner.settings = dataclasses.replace(learner.settings, skip_nonfinite=False)
    with pytest.raises(FloatingPointError, match="non-finite"):
        tr.worker.optimizer_step(tr.method, batch, adv, old_from_same_forward=True, hooks=StepHooks(grad=corrupt))


# ----------------------------------------------------------------------------- checkpoints


def _saved_run(tiny_model_dir, tmp_path):
    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "r"))
    tr.train_step()
    return tr, tr.save()


def test_a_checkpoint_with_an_unexpected_key_is_refused(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    from policylab.models.loading import load_model_or_checkpoint
    from policylab.trainer.checkpoint import CheckpointError

    tr, path = _saved_run(tiny_model_dir, tmp_path)
    (tr.run_dir / "config.yaml").write_text(f"model: {tiny_model_dir}\n")  # as `policylab train` writes it
    f = path / "model.safetensors"
    weights = load_file(str(f))
    weights["model.layers.9.extra.weight"] = torch.zeros(2)  # a weight the model does not have
    save_file(weights, str(f))
    with pytest.raises(CheckpointError, match="unexpected.*model.layers.9.extra.weight"):
        Trainer(tiny_config(tiny_model_dir, tmp_path / "r")).restore()
    with pytest.raises(PolicylabError, match="unexpected.*model.layers.9.extra.weight"):
        load_model_or_checkpoint(str(path))


def test_a_checkpoint_reached_through_a_link_is_refused(tiny_model_dir, tmp_path):
    from policylab.trainer.checkpoint import CheckpointError, latest_checkpoint

    tr, path = _saved_run(tiny_model_dir, tmp_path)
    root = path.parent
    # a step directory that is a link to another step directory of the same run
    (root / "step_000009").symlink_to(path, target_is_directory=True)
    (root / "LATEST").write_text("step_000009\n")
    with pytest.raises(CheckpointError, match="link"):
        latest_checkpoint(tr.run_dir)
    (root / "step_000009").unlink()
    (root / "LATEST").write_text(path.name + "\n")
    assert latest_checkpoint(tr.run_dir) == path
    # a checkpoint file that is a link (to an identical copy outside the run)
    copy = tmp_path / "copy.safetensors"
    shutil.copy(path / "model.safetensors", copy)
    (path / "model.safetensors").unlink()
    (path / "model.safetensors").symlink_to(copy)
    with pytest.raises(CheckpointError, match="is a link"):
        Trainer(tiny_config(tiny_model_dir, tmp_path / "r")).restore()


# ----------------------------------------------------------------------------- rewards, test-time


def test_runtime_noise_band_is_inclusive_at_both_edges():
    # reference runtimes all 10: quantiles 10, widened by min_rel_band 0.5 to [5, 15]. A
    # candidate at exactly 5 or 15 is inside the band: speed 0; just outside it is scored
    # (log form, cap 4: log(10/4.5)/log 4 = 0.5760; log(10/15.5)/log 4 = −0.3161).
    kw = dict(form="log_speedup", alpha=0.1, min_rel_band=0.5, n_min=3, speedup_cap=4.0, provenance="measured")
    ref = [10.0] * 5
    for edge in (5.0, 15.0):
        s = speed_score([edge] * 5, ref, **kw)
        assert s.band == (5.0, 15.0) and s.speed == 0.0
    assert speed_score([4.5] * 5, ref, **kw).speed == pytest.approx(math.log(10 / 4.5) / math.log(4), rel=1e-12)
    assert speed_score([15.5] * 5, ref, **kw).speed == pytest.approx(math.log(10 / 15.5) / math.log(4), rel=1e-12)


def test_ttpo_thresholds_keep_a_token_at_exactly_tau():
    # rule 10, kept side inclusive: a token with p == τ stays in its set. p = 1 (lp = 0) and
    # p = 0.5 (lp = log 0.5, exp of which is 0.5 exactly in fp64); τ_conv = 0.5, τ_err = 0.5.
    lp = torch.tensor([[0.0, math.log(0.5)], [0.0, math.log(0.5)]], dtype=F64)
    assert float(lp[0, 1].exp()) == 0.5
    mask = torch.ones(2, 2, dtype=torch.bool)
    agree, eligible = torch.tensor([True, False]), torch.tensor([True, True])
    distill, rl, info = ttpo_split(agree, eligible, lp, mask, tau_conv=0.5, tau_err=0.5, err_level="token")
    assert distill.tolist() == [[False, True], [False, False]]  # p = 1 > τ converged; p = τ kept
    assert rl.tolist() == [[False, False], [False, True]]  # p = 1 > τ filtered; p = τ kept
    # τ = 1 keeps everything (the documented "no filter" value), p = 1 included
    distill, rl, _ = ttpo_split(agree, eligible, lp, mask, tau_conv=1.0, tau_err=1.0, err_level="token")
    assert distill.tolist() == [[True, True], [False, False]] and rl.tolist() == [[False, False], [True, True]]
    _, rl, _ = ttpo_split(agree, eligible, lp, mask, tau_conv=1.0, tau_err=1.0, err_level="response")
    assert rl.tolist() == [[False, False], [True, True]]
