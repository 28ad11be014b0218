"""The step extension in verl: for cord, gcpo and iso, verl's own actor update (its FSDP2
engine built by policylab's actor worker class, verl's old-logprob pass, the policylab
GRPO estimator, mini-/micro-batching, `ppo_loss`, gradient accumulation, verl's clipping
and AdamW; two optimizer steps: ppo_epochs=2 over one mini-batch) ends at the weights
policylab's trainer reaches on the same batch: the trainer's model with its model stages
applied by its own build, its old-logprob pass and advantage stage, two
`optimizer_step`s with the hooks `Trainer._hooks` makes, its per-run state and task. The
verl side runs in `verl_actor_run.py` (a subprocess; `verl_cpu.py` says why verl needs a
CPU platform registered).

Precision: fp32 on both sides (verl's FSDP engine knows fp16, bf16 and fp32 only), the
same tokens and starting weights. What differs is summation order (padding layout,
micro-batch grouping, the FSDP engine's reductions), a few ulps per value, which AdamW's
g/√v carries into the update, most on entries whose gradient is near zero: the measured
relative error of the two-step update is 1.4e-6 (cord), 2.7e-6 (gcpo) and 3.0e-6 (iso);
the tolerance is 2e-5. A missing hook changes the update by 10 to 100 percent: each
negative control (policylab's trainer without the gradient or the post-step stages) is
checked to be more than 100 times the tolerance away from verl's result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from engines import require

require("verl")
pytest.importorskip("peft")

import verl_actor_run as R  # noqa: E402
from policylab.backends.update import StepHooks  # noqa: E402
from policylab.batch import RolloutBatch  # noqa: E402
from policylab.errors import PolicylabError  # noqa: E402
from policylab.integrations import hosting  # noqa: E402
from policylab.integrations.verl import engine as VE  # noqa: E402
from policylab.methods.families.gradient_geometry import RETENTION_STATE, _lora_layers, iso_layers  # noqa: E402
from policylab.tasks.source import build_task  # noqa: E402
from policylab.trainer.loop import Trainer  # noqa: E402

from trainer_utils import tiny_config  # noqa: E402

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "verl_actor_run.py")
METHODS = ("cord", "gcpo", "iso")
PARAMS = {"cord": {"retention_size": 3}, "gcpo": {"protected_rank": 8}, "iso": {}}
LORA = {"lora_rank": 4, "lora_alpha": 8.0}
TRAIN = {"gcpo": LORA}
REL = 2e-5  # relative to the update's norm (see the module doc)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch() -> RolloutBatch:
    t = R.batch_tensors()
    tokens = torch.cat([t["prompts"], t["responses"]], 1)
    attn = torch.cat([t["prompt_mask"], t["response_mask"]], 1)
    return RolloutBatch(tokens=tokens, attention_mask=attn, loss_mask=t["response_mask"], prompt_width=R.P,
                        group=torch.arange(R.B) // R.N, policy_version=torch.zeros(R.B, dtype=torch.long),
                        batch_id="verl-batch", rewards=t["rewards"]).validate()


def _trainer(model_dir, run_dir, name) -> Trainer:
    train = {"dtype": "fp32", "lr": R.STEP_LR, "grad_clip": R.STEP_CLIP, "micro_batch_size": 2, "epochs": 2,
             "shared_prefix": False, "weight_decay": 0.0, **TRAIN.get(name, {})}
    return Trainer(tiny_config(model_dir, run_dir, method=name, method_params=PARAMS[name], train=train,
                               rollout={"group_size": R.N, "prompts_per_step": R.B // R.N, "max_new_tokens": R.T}))


def _policylab(tr: Trainer, method=None):
    """Two optimizer steps of policylab's trainer on verl's batch (its old-logprob pass at
    the starting weights, its advantage stage, the hooks it makes); `method` replaces the
    trainer's method for the steps (the negative controls). Returns (start, end, batch, adv)."""
    start = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    batch, A, _ = tr.round_inputs(tr.prepare(_batch()))
    if method is not None:
        tr.method = method
    for _ in range(2):
        ctx = tr.context(batch.batch_id)
        hooks = StepHooks(grad=tr._hooks(ctx, "grad"), post=tr._hooks(ctx, "poststep"))
        m = tr.worker.optimizer_step(tr.method, batch, A.adv.detach(), old_from_same_forward=False, hooks=hooks)
        assert not m.get("skipped_nonfinite") and not m.get("skipped_no_signal")
        tr.policy_version += 1
    return start, {k: v.detach().clone() for k, v in tr.model.state_dict().items()}, batch, A.adv


def _adapter(tr: Trainer, where: Path) -> Path:
    """policylab's trainer's LoRA adapter (factors already projected) plus a component
    inside each layer's protected right subspace (A + N V Vᵀ), saved for verl's
    lora_adapter_path: verl's gcpo_setup must project it away to start where policylab's
    trainer starts (a missing model stage would keep it)."""
    import copy

    model = copy.deepcopy(tr.model)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, layer in _lora_layers(model):
            for a in layer.lora_A:
                A = layer.lora_A[a].weight
                A.add_(torch.randn(A.shape, generator=g, dtype=A.dtype) @ layer.gcpo_V @ layer.gcpo_V.T)
    model.save_pretrained(str(where))
    return where


def _examples(tr: Trainer, n: int, where: Path) -> Path:
    """The training examples policylab's trainer draws for its retention set (its task
    stream from the start), as the JSON-lines file verl's train_examples names."""
    probe = build_task(tr.cfg.task, seed=tr.cfg.seed)
    where.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in probe.next_train(n)))
    return where


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """Per method: (policylab's trainer after its steps, its start and end states, verl's output)."""
    work = tmp_path_factory.mktemp("verl-steps")
    trainers = {n: _trainer(tiny_model_dir, work / n, n) for n in METHODS}
    extra = {
        "cord": [f"+actor_rollout_ref.actor.policy_loss.method_params.retention_size={PARAMS['cord']['retention_size']}",
                 "+actor_rollout_ref.actor.policy_loss.train_examples="
                 f"{_examples(trainers['cord'], PARAMS['cord']['retention_size'], work / 'examples.jsonl')}"],
        "gcpo": [f"actor_rollout_ref.model.lora_rank={LORA['lora_rank']}",
                 f"actor_rollout_ref.model.lora_alpha={int(LORA['lora_alpha'])}",
                 "actor_rollout_ref.model.target_modules=all-linear",
                 f"actor_rollout_ref.model.lora_adapter_path={_adapter(trainers['gcpo'], work / 'adapter')}",
                 f"+actor_rollout_ref.actor.policy_loss.method_params.protected_rank={PARAMS['gcpo']['protected_rank']}"],
        "iso": [],
    }
    env = {**os.environ, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_port()), "OMP_NUM_THREADS": "1", "VERL_PLATFORM": "cpu",
           "TOKENIZERS_PARALLELISM": "false", "POLICYLAB_VERL_STEP_OVERRIDES": json.dumps(extra)}
    out = work / "run"
    proc = subprocess.run([sys.executable, SCRIPT, str(tiny_model_dir), str(out), *METHODS], env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    results = {}
    for n in METHODS:
        start, end, batch, adv = _policylab(trainers[n])
        results[n] = (trainers[n], start, end, batch, adv, torch.load(f"{out}.{n}.pt", weights_only=False))
    return results


def _delta(end, start):
    keys = sorted(k for k in start if start[k].is_floating_point() and k in end)
    return torch.cat([(end[k].float() - start[k].float()).reshape(-1) for k in keys])


@pytest.mark.parametrize("name", METHODS)
def test_two_verl_steps_equal_two_policylab_trainer_steps(runs, tiny_model_dir, tmp_path, name):
    tr, start, want, batch, adv, got = runs[name]
    assert hosting.plan(name, VE.ENGINE).hostable and hosting.plan(name, VE.ENGINE).step
    # verl's actor started from the model the trainer built: the model stages ran on it
    # (ISO's frames in place of the weights, GCPO's adapter with its protected part projected away)
    assert set(got["start"]) == set(start), sorted(set(got["start"]) ^ set(start))[:6]
    for k in start:
        torch.testing.assert_close(got["start"][k], start[k], rtol=0, atol=2e-6, msg=k)
    mask = batch.loss_mask
    torch.testing.assert_close(torch.where(mask, got["old"], 0.0), torch.where(mask, batch.logp_old, 0.0),
                               rtol=0, atol=1e-5)
    torch.testing.assert_close(got["advantages"], adv.unsqueeze(-1) * mask, rtol=0, atol=1e-6)
    ours, theirs = _delta(want, start), _delta(got["state"], start)
    scale = float(ours.norm())
    assert scale > 1e-3  # two AdamW steps at lr 5e-3: not a rounding
    err = float((theirs - ours).norm()) / scale
    assert err < REL, err
    assert any(k.startswith("actor/policylab/" + {"cord": "cord/", "gcpo": "gcpo/", "iso": "iso/"}[name])
               for k in got["metrics"])
    # negative controls: the trainer without the gradient or the post-step stages
    for kind in sorted({s.kind for s in hosting.learner_stages(tr.method)} - {"model"}):
        fresh = _trainer(tiny_model_dir, tmp_path / f"no-{kind}", name)
        s0, e0, _, _ = _policylab(fresh, method=dataclasses.replace(fresh.method, **{kind: ()}))
        off = float((_delta(e0, s0) - theirs).norm()) / scale
        assert off > 100 * REL, (kind, off)


def test_cords_retention_set_in_verl_is_the_trainers(runs):
    """Built by the step extension at verl's first optimizer step from train_examples (the
    examples the trainer's task gave its own): the same tokens and masks."""
    tr, *_, got = runs["cord"]
    ours, theirs = tr.controllers[RETENTION_STATE], got["step_state"][RETENTION_STATE]
    assert ours.built and theirs["tokens"] is not None
    assert torch.equal(theirs["tokens"], ours.tokens) and torch.equal(theirs["loss_mask"], ours.loss_mask)


def test_iso_reaches_verls_rollout_as_plain_hf_weights(runs):
    """verl's weight sync (get_per_tensor_param) sends each fixed-spectrum layer as the
    nn.Linear weight it replaced, W = U Σ₀ Vᵀ at the trained frames, under its HF name."""
    tr, _, _, _, _, got = runs["iso"]
    exported, state = got["exported"], got["state"]
    assert not [k for k in exported if k.endswith((".U", ".V", ".sigma"))]
    names = [n for n, _ in iso_layers(tr.model)]
    assert names and all(f"{n}.weight" in exported for n in names)
    for n in names:
        W = (state[f"{n}.U"] * state[f"{n}.sigma"]) @ state[f"{n}.V"].T
        torch.testing.assert_close(exported[f"{n}.weight"].float(), W.float(), rtol=0, atol=1e-6)
    assert "model.embed_tokens.weight" in exported


def test_a_method_with_step_stages_is_refused_without_the_step_extension():
    """verl's own worker (no step extension in this process): the registered loss refuses
    to train cord, gcpo or iso, naming the worker class to use."""
    from policylab.integrations.verl import make_loss

    loss = make_loss("iso")
    cfg = type("Cfg", (), {"policy_loss": {"method_params": {}}, "get": lambda self, k, d=None: d})()
    z = torch.zeros(2, 3)
    with pytest.raises(PolicylabError, match="changes the learner outside its loss.*policylab.integrations.verl.steps"):
        loss(z, z, z, torch.ones(2, 3, dtype=torch.bool), config=cfg)


def test_train_examples_is_refused_for_a_method_that_draws_none():
    from policylab.integrations.verl import PolicylabLossConfig

    with pytest.raises(PolicylabError, match="train_examples is read only by methods"):
        PolicylabLossConfig(loss_mode="policylab_iso", train_examples="x.jsonl")
    PolicylabLossConfig(loss_mode="policylab_cord", train_examples="x.jsonl")
