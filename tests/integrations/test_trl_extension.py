"""The round extension in TRL: for every method PolicylabGRPOTrainer hosts through it,
the trainer's round on a generation batch (`_policylab_round`, on the tensors TRL holds
after scoring, with the user's rows' policylab columns as a rollout_func's extra fields)
and its `_compute_loss` give the loss and gradient (w.r.t. the learner's log-probs) of
policylab's own trainer (`Trainer.round_inputs` + the step's normalizers) on the batch
that trainer collected, fp64."""

from __future__ import annotations

import pytest
import torch
from engines import require

require("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from extension_batches import reference, trainer_and_batch, user_columns  # noqa: E402
from policylab.integrations import hosting  # noqa: E402
from policylab.integrations import trl as PT  # noqa: E402

EXTENSION = sorted(n for n, p in hosting.plans(PT.ENGINE).items() if p.hostable and p.extension)
TIGHT = dict(rtol=1e-10, atol=1e-12)


def _rollout(prompts, trainer):  # never called here: its presence is the logp_behavior requirement
    raise AssertionError("not called")


def _trl(tmp_path, model_dir, name, params, G, B, L):
    cfg = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, fp16=False,
                     per_device_train_batch_size=B, gradient_accumulation_steps=1, num_generations=G,
                     max_completion_length=L, max_steps=1, report_to="none", save_strategy="no", seed=0,
                     remove_unused_columns=False, disable_tqdm=True, log_completions=False)
    return PT.PolicylabGRPOTrainer(method=name, method_params=params, model=str(model_dir),
                                   reward_funcs=[lambda completions, **kw: [0.0] * len(completions)], args=cfg,
                                   train_dataset=Dataset.from_list([{"prompt": "x"}] * B), rollout_func=_rollout)


@pytest.mark.parametrize("name", EXTENSION)
def test_extension_loss_equals_policylab_trainer(name, tiny_model_dir, tmp_path):
    tr, batch = trainer_and_batch(name, tiny_model_dir, tmp_path)
    ref_loss, ref_grad, logp0, rb, A, state = reference(tr, batch)
    m = tr.method
    params = {q.name: m.p[q.name] for q in m.params if m.p[q.name] is not None}
    G, B, P = tr.shape.group_size, batch.size, batch.prompt_width
    blocks = [tuple(batch.group[i:i + G].unique().tolist()) for i in range(0, B, G)]
    if B % G or any(len(b) != 1 for b in blocks) or len(set(blocks)) != len(blocks):
        pytest.skip(f"`{name}`'s batch here is not TRL's layout (groups of {G} consecutive rows)")
    t = _trl(tmp_path, tiny_model_dir, name, params, G, B, batch.loss_mask.shape[1])
    t._policylab_state = state
    pm = batch.attention_mask[:, :P]
    cm = batch.attention_mask[:, P:]
    out = {"prompt_ids": batch.tokens[:, :P], "prompt_mask": pm.long(), "completion_ids": batch.tokens[:, P:],
           "completion_mask": cm.long(), "num_items_in_batch": batch.loss_mask.sum()}
    if not bool((batch.loss_mask == cm).all()):
        out["tool_mask"] = batch.loss_mask.long()
    for role, key in (("logp_old", "old_per_token_logps"), ("logp_ref", "ref_per_token_logps"),
                      ("logp_behavior", "sampling_per_token_logps")):
        if getattr(batch, role) is not None:
            out[key] = getattr(batch, role)
    if batch.logp_old is None and rb.logp_current is not None:
        out["old_per_token_logps"] = rb.logp_current  # TRL's old pass is the forward at the round's start
    t._policylab_rewards = batch.rewards.unsqueeze(-1).float()
    t._policylab_extra = user_columns(m, batch)
    t.model.train()
    t.current_gradient_accumulation_steps = 1  # set by the training loop; one micro-batch = the step
    t._policylab_round(out, "train")
    want = A.adv if A.adv.dim() == 1 else A.adv
    torch.testing.assert_close(out["advantages"].to(want.dtype), want, **TIGHT)
    logp = logp0.clone().requires_grad_()
    needs_entropy = any("entropy" in s.reads for k in ("objective", "correction", "term") for s in m.active(k))
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logp, (0.5 + logp.abs()) if needs_entropy else None, None)
    loss = t._compute_loss(t.model, out)
    grad, = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(loss.detach(), ref_loss, **TIGHT)
    torch.testing.assert_close(grad, ref_grad, **TIGHT)


def _rollout_with_logprobs(batch_prompts, trainer):
    """Fixed completions (TRL's rollout_func) with the sampler's log-probs: a perturbation
    of no model, so GMC's weights (ratio of the learner to the sampler) are not all 1."""
    tok = trainer.processing_class
    comps, logps = [], []
    for i, p in enumerate(batch_prompts):
        g = torch.Generator().manual_seed(sum(map(ord, p)) + 7 * i)
        n = 3 + i % 3
        comps.append(torch.randint(10, 500, (n,), generator=g).tolist())
        logps.append((-1.0 - torch.rand(n, generator=g)).tolist())
    return {"prompt_ids": [tok(p)["input_ids"] for p in batch_prompts], "completion_ids": comps, "logprobs": logps}


@pytest.mark.parametrize("name", ["gmc", "ggpo"])
def test_a_short_real_training_run_through_the_extension(tmp_path, tiny_model_dir, name):
    """TRL's own loop (generation, scoring, its split of the generation batch into two
    accumulated micro-batches, the optimizer) with a round-extension method: the columns
    travel with TRL's tensors (a column TRL failed to split would fail the loss's shape
    checks), the weights move and stay finite, each step logs a finite loss."""
    cfg = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, fp16=False,
                     per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,
                     max_completion_length=6, learning_rate=1e-3, max_steps=2, logging_steps=1, report_to="none",
                     save_strategy="no", seed=0, remove_unused_columns=False, disable_tqdm=True,
                     log_completions=False, use_bias_correction_kl=False)
    reward = lambda completion_ids, **kw: [float(len(c) % 3) for c in completion_ids]  # noqa: E731
    t = PT.PolicylabGRPOTrainer(method=name, model=str(tiny_model_dir), reward_funcs=[reward], args=cfg,
                                train_dataset=Dataset.from_list([{"prompt": f"What is {a} + {a}?"} for a in range(8)]),
                                rollout_func=_rollout_with_logprobs)
    assert t._policylab_extension
    before = {k: v.detach().clone() for k, v in t.model.named_parameters()}
    t.train()
    assert [k for k, v in t.model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert all(torch.isfinite(v).all() for v in t.model.parameters())
    logged = [h for h in t.state.log_history if "policylab/loss" in h]
    assert len(logged) == 2 and all(torch.isfinite(torch.tensor(h["policylab/loss"])) for h in logged)


def test_the_docs_count_the_extension_methods():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    assert f"for each of the {len(EXTENSION)} methods" in (docs / "integrations.md").read_text()
    assert f"and {len(EXTENSION)} (TRL) of them" in (docs / "running-at-scale.md").read_text()
