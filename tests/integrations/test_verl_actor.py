"""verl's own actor update (its FSDP2 engine, mini-/micro-batching, `ppo_loss`, gradient
accumulation, optimizer step) with policylab methods selected through verl's config,
on CPU, against policylab's own update (`policylab.backends.update.optimizer_step`, the
trainer's step) on the same batch; and a two-process (gloo) data-parallel run equal to
one process. The verl side runs in `verl_actor_run.py` (a subprocess: its process group
and platform are its own); `verl_cpu.py` says why verl needs a CPU platform registered.

Precision: fp32. verl's FSDP engine takes its dtypes from `PrecisionType.to_dtype`, which
knows fp16, bf16 and fp32 only, so no fp64 run is possible. Both sides run the same HF
Llama forward in fp32 on the same tokens and weights; what differs is summation order
(padding layout, micro-batch grouping, the FSDP reduction), a few ulps per value. The
update tolerance is 1e-5 relative to the update's norm (measured: 3e-7 to 1e-6); any
real disagreement (a normalizer off by a micro-batch or a rank, a missing correction
weight, a clip bound moved) changes the update by percents."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from engines import require

require("verl")

from safetensors.torch import load_file  # noqa: E402

import verl_actor_run as R  # noqa: E402
from policylab.backends.update import Learner, UpdateSettings, optimizer_step  # noqa: E402
from policylab.batch import RolloutBatch, SamplingSettings  # noqa: E402
from policylab.integrations import hosting, rounds  # noqa: E402
from policylab.integrations.verl import engine as VE  # noqa: E402
from policylab.kernels import advantages as A  # noqa: E402
from policylab.methods.spec import RunShape  # noqa: E402
from policylab.models import loading  # noqa: E402
from policylab.models.logprobs import model_logprobs  # noqa: E402

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "verl_actor_run.py")
# token mean; an engine-mismatch correction (its requirement: verl's raw rollout weights);
# a constant-length sum normalizer
METHODS = {"cispo": {"eps_high": 0.28}, "tis": {}, "dr_grpo": {"L_norm": float(R.T)},
           "gmc": {}}  # a round stage (GMC's group-capped weights) through the round extension
REL = 1e-5


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(model_dir, out, methods, world):
    env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port()),
           "OMP_NUM_THREADS": "1", "VERL_PLATFORM": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    procs = [subprocess.Popen([sys.executable, SCRIPT, str(model_dir), str(out), *methods],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = [p.communicate(timeout=1200)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    return {m: torch.load(f"{out}.{m}.pt", weights_only=False) for m in methods}


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, tmp_path_factory):
    return _launch(tiny_model_dir, tmp_path_factory.mktemp("verl-one") / "run", list(METHODS), 1)


def _delta(state, start):
    return torch.cat([(state[k].float() - start[k].float()).flatten() for k in start])


def _policylab_update(model_dir, name, params, rollout_logp):
    """policylab's trainer step on the batch verl trained on: the method with verl's forced
    parameters (hosting.plan), policylab's own old-logprob pass, GRPO advantages, two
    optimizer steps (verl's ppo_epochs=2) over the whole batch in micro-batches of 2, SGD."""
    t = R.batch_tensors()
    model = loading.load_policy(str(model_dir))[0]
    tokens = torch.cat([t["prompts"], t["responses"]], 1)
    attn = torch.cat([t["prompt_mask"], t["response_mask"]], 1)
    mask = t["response_mask"]
    with torch.no_grad():
        logp_old = model_logprobs(model, tokens, attn, R.P, sampling=SamplingSettings())
    group = torch.arange(R.B) // R.N
    adv = A.grpo(t["rewards"], group, std="unbiased", eps=1e-6)
    m = hosting.with_run(hosting.plan(name, VE.ENGINE, params).method, RunShape(group_size=R.N, epochs=2))
    behavior = None if rollout_logp is None else torch.where(mask, rollout_logp, torch.zeros(()))
    batch = RolloutBatch(tokens=tokens, attention_mask=attn, loss_mask=mask, prompt_width=R.P, group=group,
                         policy_version=torch.zeros(R.B, dtype=torch.long), batch_id="verl-batch", logp_old=logp_old,
                         logp_behavior=behavior, rewards=t["rewards"])
    if m.active("round"):  # policylab's round (as Trainer.round_inputs): logp_current is the old pass here
        batch = batch.replace(logp_current=logp_old,
                              extras={"logp_old_version": torch.zeros(R.B, dtype=torch.long)}).validate()
        batch, A_, _ = rounds.run_round(m, batch, m.state_objects(0), RunShape(group_size=R.N, epochs=2))
        adv = A_.adv
        # the round matters here: GMC's weights (0.54 to 1.16 on this batch) are far from 1, so
        # verl training without them (or with another row's) would not give this update
        assert float((batch.extras["gmc_weight"] - 1).abs().max()) > 0.1
    learner = Learner(model, torch.optim.SGD(model.parameters(), lr=R.LR),
                      settings=UpdateSettings(micro_batch_size=2, grad_clip=0.0, skip_zero_adv=False))
    for _ in range(2):
        optimizer_step(learner, m, batch, adv, old_from_same_forward=False)
    return logp_old, adv, model.state_dict()


@pytest.mark.parametrize("name", list(METHODS))
def test_verl_actor_update_equals_policylab_trainer_update(one_process, tiny_model_dir, name):
    got = one_process[name]
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    start = {k: v for k, v in start.items() if k in got["state"]}
    logp_old, adv, end = _policylab_update(tiny_model_dir, name, METHODS[name], got["rollout"])
    ours = _delta(end, start)  # the saved weights: lm_head is tied to the embedding
    mask = R.batch_tensors()["response_mask"]
    # verl's old-logprob pass and advantage estimator agree with policylab's
    torch.testing.assert_close(torch.where(mask, got["old"], 0.0), torch.where(mask, logp_old, 0.0),
                               rtol=0, atol=1e-5)
    torch.testing.assert_close(got["advantages"], adv.unsqueeze(-1) * mask, rtol=0, atol=1e-6)
    theirs = _delta(got["state"], start)
    assert float(ours.norm()) > 0.1  # lr 0.5: the update is not a rounding
    assert float((theirs - ours).norm() / ours.norm()) < REL
    # the comparison can fail: half the update (a normalizer twice too large) is far outside it
    assert float((theirs - ours / 2).norm() / ours.norm()) > 100 * REL
    assert any(k.startswith("actor/policylab/") for k in got["metrics"])


@pytest.mark.distributed
def test_two_process_data_parallel_actor_update_equals_one_process(one_process, tiny_model_dir, tmp_path):
    two = _launch(tiny_model_dir, tmp_path / "run", ["cispo", "tis"], 2)
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    for name in ("cispo", "tis"):
        keys = {k: v for k, v in start.items() if k in two[name]["state"]}
        a, b = _delta(one_process[name]["state"], keys), _delta(two[name]["state"], keys)
        assert float(a.norm()) > 0.1
        assert float((a - b).norm() / a.norm()) < REL, name
        torch.testing.assert_close(two[name]["old"], one_process[name]["old"], rtol=0, atol=1e-5)
