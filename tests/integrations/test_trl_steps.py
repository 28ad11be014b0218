"""The step extension in TRL: for cord, gcpo and iso, two optimizer steps of TRL's own
training loop (PolicylabGRPOTrainer.train(): generation by a fixed rollout_func, its
scoring, policylab's advantages and loss, transformers' AdamW with its clipping) end at the
weights policylab's trainer reaches with two optimizer steps on the same batch (the
trainer's model with its model stages applied by its own build, its advantage stage, its
`optimizer_step` with the hooks `Trainer._hooks` makes, its per-run state and task).

Precision: the weights, the backbone's forward and both optimizers run in fp64, on the
same tokens and starting weights. Two parts of TRL's path are fp32 by design: its
chunked log-prob head (TRL's `ChunkedLogProbFunction` computes in fp32: its log-probs
differ from policylab's fp64 ones by ~1e-6 here) and the rewards it scores (fp32, so the
GRPO advantages round at ~1e-7). AdamW's g/√v carries those relative errors of the
gradient into the update, most on entries whose gradient is near zero: the measured
relative error of the two-step update is 1.0e-6 (cord), 6.6e-6 (gcpo: B starts at 0, so
its first Adam step is nearly sign(g)) and 1.5e-6 (iso); with policylab's fp64 log-probs
put in place of TRL's head the same runs agree to 1.5e-7 (the fp32 advantages alone).
The tolerance is 3e-5. A missing hook changes the update by 10 to 100 percent: each
negative control below (policylab's trainer without the gradient or the post-step
stages) is checked to be more than 1e3 times the tolerance away from TRL's result.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engines import require

require("trl")
pytest.importorskip("peft")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from policylab.backends.update import StepHooks  # noqa: E402
from policylab.batch import RolloutBatch  # noqa: E402
from policylab.errors import PolicylabError  # noqa: E402
from policylab.integrations import hosting  # noqa: E402
from policylab.integrations import trl as PT  # noqa: E402
from policylab.methods.families.gradient_geometry import RETENTION_STATE, _lora_layers, iso_layers  # noqa: E402
from policylab.models.loading import load_policy  # noqa: E402
from policylab.tasks.source import build_task  # noqa: E402
from policylab.trainer.loop import Trainer  # noqa: E402

from trainer_utils import tiny_config  # noqa: E402

G, B, T = 4, 8, 6  # group size, rows (2 groups), completion width
PROMPT = [1, 28, 300, 41, 7]  # every row's prompt ids (one width: no left padding on either side)
EPS = 1e-8  # AdamW's epsilon on both sides
LR, CLIP = 5e-3, 0.5  # clipping is active (the gradient norms here are ~1 to 10): it must follow the gradient stage
RTOL = 3e-5
LORA = {"lora_rank": 4, "lora_alpha": 8.0}
PARAMS = {"cord": {"retention_size": 3}, "gcpo": {"protected_rank": 8}, "iso": {}}
TRAIN = {"gcpo": LORA}


def _completions():
    g = torch.Generator().manual_seed(11)
    lengths = [6, 3, 5, 4, 2, 6, 4, 5]
    return [torch.randint(10, 500, (n,), generator=g).tolist() for n in lengths]


COMPLETIONS = _completions()
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.5]  # both groups mixed: nonzero advantages


def _rollout(prompts, trainer):
    """The fixed generation batch (TRL's rollout_func hook): completions by position (a
    generation batch of several micro-batches repeats them)."""
    assert len(prompts) % B == 0
    return {"prompt_ids": [list(PROMPT) for _ in prompts],
            "completion_ids": [list(COMPLETIONS[i % B]) for i in range(len(prompts))], "logprobs": None}


def _reward(completion_ids, **kw):
    return [REWARDS[COMPLETIONS.index(list(c))] for c in completion_ids]


def _batch() -> RolloutBatch:
    P = len(PROMPT)
    tokens = torch.zeros((B, P + T), dtype=torch.long)
    att = torch.zeros((B, P + T), dtype=torch.bool)
    for i, c in enumerate(COMPLETIONS):
        tokens[i, :P] = torch.tensor(PROMPT)
        tokens[i, P:P + len(c)] = torch.tensor(c)
        att[i, :P + len(c)] = True
    return RolloutBatch(tokens=tokens, attention_mask=att, loss_mask=att[:, P:].clone(), prompt_width=P,
                        group=torch.arange(B) // G, policy_version=torch.zeros(B, dtype=torch.long),
                        batch_id="fixed", rewards=torch.tensor(REWARDS, dtype=torch.float64)).validate()


def _policylab(tiny_model_dir, run_dir, name, method=None):
    """policylab's trainer: its model (stages applied by its build), two optimizer steps on
    the fixed batch with the hooks it makes. `method` replaces the trainer's method for the
    step (the negative controls). Returns (trainer, start state, end state)."""
    train = {"dtype": "fp64", "lr": LR, "grad_clip": CLIP, "micro_batch_size": B, "shared_prefix": False,
             "weight_decay": 0.0, **TRAIN.get(name, {})}
    tr = Trainer(tiny_config(tiny_model_dir, run_dir, method=name, method_params=PARAMS[name], train=train,
                             rollout={"group_size": G, "prompts_per_step": B // G, "max_new_tokens": T}))
    start = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    for group in tr.optimizer.param_groups:
        group["eps"] = EPS
    batch, A, _ = tr.round_inputs(_batch())
    if method is not None:
        tr.method = method
    for _ in range(2):
        ctx = tr.context(batch.batch_id)
        hooks = StepHooks(grad=tr._hooks(ctx, "grad"), post=tr._hooks(ctx, "poststep"))
        m = tr.worker.optimizer_step(tr.method, batch, A.adv.detach(), old_from_same_forward=True, hooks=hooks)
        assert not m.get("skipped_nonfinite") and not m.get("skipped_no_signal")
        tr.policy_version += 1
    return tr, start, {k: v.detach().clone() for k, v in tr.model.state_dict().items()}


def _trl_model(tiny_model_dir, name, tr, start):
    """TRL's starting model: the base weights (fp64); for gcpo with the LoRA adapter of
    policylab's trainer plus a component inside each layer's protected right subspace
    (A + N V Vᵀ): TRL's gcpo_setup must project it away to start where policylab's
    trainer starts (a missing model stage would keep it)."""
    model = load_policy(str(tiny_model_dir), dtype=torch.float64)[0]
    if "lora_rank" in TRAIN.get(name, {}):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=LORA["lora_rank"], lora_alpha=LORA["lora_alpha"],
                                                 target_modules="all-linear", lora_dropout=0.0))
        frames = {n: layer for n, layer in _lora_layers(tr.model)}
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for k, v in model.state_dict().items():
                if "lora_" in k:
                    v.copy_(start[k])
            for n, layer in _lora_layers(model):
                V = frames[n].gcpo_V
                for a in layer.lora_A:
                    A = layer.lora_A[a].weight
                    A.add_(torch.randn(A.shape, generator=g, dtype=A.dtype) @ V @ V.T)
    return model


def _examples(tr, n):
    """The training examples policylab's trainer draws for its retention set (its task
    stream from the start), for TRL's train_examples."""
    probe = build_task(tr.cfg.task, seed=tr.cfg.seed)
    return [{"prompt": e.prompt, "answer": e.answer} for e in probe.next_train(n)]


def _trl(tmp_path, tiny_model_dir, name, tr, start, **kw):
    cfg = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, fp16=False,
                     per_device_train_batch_size=B, gradient_accumulation_steps=1, num_generations=G,
                     max_completion_length=T, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
                     weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=EPS, optim="adamw_torch",
                     max_grad_norm=CLIP, max_steps=2, logging_steps=1, report_to="none", save_strategy="no",
                     gradient_checkpointing=False, seed=0, remove_unused_columns=False, disable_tqdm=True,
                     log_completions=False, use_bias_correction_kl=False)
    from transformers import AutoTokenizer

    if name == "cord":
        kw.setdefault("train_examples", _examples(tr, PARAMS["cord"]["retention_size"]))
    return PT.PolicylabGRPOTrainer(method=name, method_params=PARAMS[name], model=_trl_model(tiny_model_dir, name, tr, start),
                                   processing_class=AutoTokenizer.from_pretrained(str(tiny_model_dir)),
                                   reward_funcs=[_reward], args=cfg, rollout_func=_rollout,
                                   train_dataset=Dataset.from_list([{"prompt": f"p{i}"} for i in range(2 * B // G)]),
                                   **kw)


def _delta(end, start):
    keys = sorted(k for k in end if end[k].is_floating_point() and k in start)
    return torch.cat([(end[k] - start[k]).reshape(-1) for k in keys])


def _without(method, kind):
    """The method with its stages of `kind` ("grad" or "poststep") removed."""
    return dataclasses.replace(method, **{kind: ()})


STAGE_METRIC = {"cord": "policylab/cord/dot", "gcpo": "policylab/gcpo/overlap/max", "iso": "policylab/iso/layers"}


@pytest.mark.parametrize("name", ["cord", "gcpo", "iso"])
def test_two_trl_steps_equal_two_policylab_trainer_steps(name, tiny_model_dir, tmp_path):
    tr, start, want = _policylab(tiny_model_dir, tmp_path / "ours", name)
    t = _trl(tmp_path, tiny_model_dir, name, tr, start)
    assert hosting.plan(name, PT.ENGINE).step and t._policylab_steps is not None
    model = t.accelerator.unwrap_model(t.model)
    assert next(model.parameters()).dtype == torch.float64
    # the model stages ran on TRL's model before training: the same parameters (ISO's frames
    # in place of the weights, GCPO's adapter with its protected component projected away)
    got0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert set(got0) == set(start)
    for k in start:
        torch.testing.assert_close(got0[k], start[k], rtol=0, atol=1e-13, msg=k)
    if name == "gcpo":
        assert all(hasattr(layer, "gcpo_U") for _, layer in _lora_layers(model))
    if name == "iso":
        assert len(iso_layers(model)) == len(iso_layers(tr.model)) > 0
    t.train()
    got = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ours, theirs = _delta(want, start), _delta(got, start)
    scale = float(ours.norm())
    assert scale > 1e-3  # two AdamW steps at lr 5e-3: the update is not a rounding
    err = float((theirs - ours).norm()) / scale
    assert err < RTOL, err
    assert any(STAGE_METRIC[name] in h for h in t.state.log_history)  # the stages' metrics reach TRL's log
    if name == "cord":  # the same retention set (the trainer's task stream, TRL's train_examples)
        ret_trl, ret_ours = t._policylab_state[RETENTION_STATE], tr.controllers[RETENTION_STATE]
        assert ret_trl.built and torch.equal(ret_trl.tokens, ret_ours.tokens)
    # negative controls: policylab's trainer without the method's gradient or post-step stages
    # reaches other weights, far outside the tolerance: a missing hook would fail the check above
    for kind in sorted({s.kind for s in hosting.learner_stages(tr.method)} - {"model"}):
        _, start_k, end_k = _policylab(tiny_model_dir, tmp_path / f"no-{kind}", name, method=_without(tr.method, kind))
        off = float((_delta(end_k, start_k) - theirs).norm()) / scale
        assert off > 1e3 * RTOL, (kind, off)


# ----------------------------------------------------------------------------- where the hooks run


def _recording_grpo(seen):
    """GRPO with a gradient stage that records the accumulated gradient's norm and scales
    it by 10, and a post-step stage that records whether the weights moved since."""
    from policylab.methods import get
    from policylab.methods.spec import Stage

    def scale(model, ctx):
        params = [p for p in model.parameters() if p.grad is not None]
        seen.append(("grad", float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))),
                     [p.detach().clone() for p in params], ctx.policy_version))
        for p in params:
            p.grad.mul_(10.0)
        return {"test/scaled": 1.0}

    def after(model, ctx):
        before = seen[-1][2]
        params = [p for p in model.parameters() if p.grad is not None]
        seen.append(("post", any(not torch.equal(a, b.detach()) for a, b in zip(before, params)), None,
                     ctx.policy_version))
        return {}

    return dataclasses.replace(get("grpo"), grad=(Stage("grad", scale, name="scale10"),),
                               poststep=(Stage("poststep", after, name="moved"),))


@pytest.mark.parametrize("clip", [CLIP, 0.0])
def test_gradient_stages_run_before_transformers_clips_and_post_step_stages_after_the_step(clip, tiny_model_dir,
                                                                                            tmp_path):
    seen: list = []
    cfg = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, fp16=False,
                     per_device_train_batch_size=B, gradient_accumulation_steps=2, num_generations=G,
                     max_completion_length=T, learning_rate=LR, max_grad_norm=clip, max_steps=2, logging_steps=1,
                     report_to="none", save_strategy="no", gradient_checkpointing=False, seed=0,
                     remove_unused_columns=False, disable_tqdm=True, log_completions=False,
                     use_bias_correction_kl=False)
    t = PT.PolicylabGRPOTrainer(method=_recording_grpo(seen), method_params={"kl_coef": 0.0}, model=str(tiny_model_dir),
                                reward_funcs=[_reward], args=cfg, rollout_func=_rollout,
                                train_dataset=Dataset.from_list([{"prompt": f"p{i}"} for i in range(8)]))
    t.train()
    # once per optimizer step (two micro-batches accumulated each), grad then post, at versions 0 and 1
    assert [(k, v) for k, _, _, v in seen] == [("grad", 0), ("post", 0), ("grad", 1), ("post", 1)]
    assert seen[1][1] and seen[3][1]  # the post-step stage saw the weights after optimizer.step()
    norms = [h["grad_norm"] for h in t.state.log_history if "grad_norm" in h]
    # transformers' gradient norm (and its clip, when on) is of the gradient the stage left: 10x
    for logged, (_, raw, _, _) in zip(norms, seen[::2]):
        assert float(logged) == pytest.approx(10 * raw, rel=1e-5)
    assert any("policylab/test/scaled" in h for h in t.state.log_history)


def _iso_trainer(tmp_path, tiny_model_dir, name="iso", **kw):
    cfg_kw = kw.pop("cfg", {})
    cfg = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, fp16=False,
                     per_device_train_batch_size=B, num_generations=G, max_completion_length=T, max_steps=1,
                     report_to="none", save_strategy="no", remove_unused_columns=False, disable_tqdm=True,
                     use_bias_correction_kl=False, **cfg_kw)
    return PT.PolicylabGRPOTrainer(method=name, model=kw.pop("model", str(tiny_model_dir)), reward_funcs=[_reward],
                                   args=cfg, rollout_func=_rollout,
                                   train_dataset=Dataset.from_list([{"prompt": "p"}] * 4), **kw)


def test_step_extension_refusals(tmp_path, tiny_model_dir):
    with pytest.raises(PolicylabError, match="draws training examples itself \\(cord_project\\).*train_examples="):
        _iso_trainer(tmp_path, tiny_model_dir, "cord")
    with pytest.raises(PolicylabError, match="train_examples is read only by methods whose stages draw"):
        _iso_trainer(tmp_path, tiny_model_dir, train_examples=[{"prompt": "a", "answer": "b"}])
    model = load_policy(str(tiny_model_dir))[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(PolicylabError, match="optimizers=\\(...\\) holds the parameters it replaces"):
        _iso_trainer(tmp_path, tiny_model_dir, model=model, optimizers=(opt, None))
    with pytest.raises(PolicylabError, match="no LoRA adapter"):  # gcpo's own refusal, on TRL's model
        _iso_trainer(tmp_path, tiny_model_dir, "gcpo")
    with pytest.raises(PolicylabError, match="train_examples\\[0\\] is 42"):
        _iso_trainer(tmp_path, tiny_model_dir, "cord", train_examples=[42])
    # the hooks are armed only for methods that have such stages: GRPO's trainer has none
    plain = _iso_trainer(tmp_path, tiny_model_dir, "grpo", method_params={"kl_coef": 0.0})
    assert plain._policylab_steps is None


def test_use_vllm_is_refused_for_a_reparameterized_model():
    from policylab.integrations.trl_steps import check_step_args

    vllm = type("Cfg", (), {"use_vllm": True})()
    plan = hosting.plan("iso", PT.ENGINE)
    with pytest.raises(PolicylabError, match="vLLM weight sync sends the model's parameters by name"):
        check_step_args(plan.method, plan, vllm, None, PT.ENGINE)
    cord = hosting.plan("cord", PT.ENGINE)  # a gradient stage only: the model's parameters keep their names
    check_step_args(cord.method, cord, vllm, [("q", "a")], PT.ENGINE)
