"""verl's own actor update with policylab methods, on CPU, one process of a (gloo)
data-parallel group: `python verl_actor_run.py MODEL_DIR OUT METHOD...`, with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (one process: RANK=0 WORLD_SIZE=1).

For each METHOD the config is composed from verl's own `ppo_trainer.yaml` with the
overrides a verl user writes (`OVERRIDES`), then verl's code runs as its Ray trainer
runs it, minus Ray and the rollout: `ActorRolloutRefWorker(role="actor").init_model()`
(verl's FSDP2 engine), `RayPPOTrainer._compute_old_log_prob` (the actor's old-logprob
pass), verl's rollout correction (`compute_rollout_correction_and_add_to_batch`),
`compute_advantage` with the policylab estimator, and `RayPPOTrainer._update_actor`
(mini-batches, micro-batches, the loss through `ppo_loss`, gradient accumulation, the
FSDP gradient reduction over ranks, the optimizer step); methods with learner-changing
stages (`STEP`) run with policylab's actor worker class
(`policylab.integrations.verl.steps`). The rollout is a fixed batch
(tokens, rewards and the sampler's log-probs, `BATCH`), split between ranks the way
verl's dispatch splits it (contiguous chunks). Rank 0 writes the full weights before and after the
update, verl's old log-probs, the advantages, the metrics and (`STEP`) the weights its
rollout would receive to OUT.METHOD.pt."""

from __future__ import annotations

import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import verl_cpu  # noqa: E402  (before verl.workers: the CPU platform and engines)

LR = 0.5
# methods run through the round extension (policylab.integrations.verl.rounds): the driver's
# compute_advantage after the old-logprob pass, the actor's loss_fn set on the worker
EXTENSION = ("gmc",)
# methods run through the step extension (policylab.integrations.verl.steps): policylab's
# actor worker class, AdamW (an elementwise optimizer: GCPO's gradient and post-step
# projections then do different things) with verl's clipping active; their extra overrides
# (adapter, training examples) come as a JSON mapping method -> [override] in
# POLICYLAB_VERL_STEP_OVERRIDES
STEP = ("cord", "gcpo", "iso")
STEP_LR, STEP_CLIP = 5e-3, 0.5
B, P, T, N = 8, 4, 6, 4  # 2 prompts x 4 responses; prompt and response widths


def overrides(model_dir: str, method: str) -> list[str]:
    """A verl user's command line for policylab method `method` (SGD without clipping or
    weight decay, so the update is -lr x the gradient and comparable in magnitude)."""
    out = [f"actor_rollout_ref.model.path={model_dir}",
           "actor_rollout_ref.model.use_remove_padding=False",
           "+actor_rollout_ref.model.override_config.attn_implementation=eager",  # no flash-attn on CPU
           "actor_rollout_ref.actor.strategy=fsdp2",
           f"actor_rollout_ref.actor.policy_loss.loss_mode=policylab_{method}",
           "actor_rollout_ref.actor.policy_loss._target_=policylab.integrations.verl.PolicylabLossConfig",
           "algorithm.adv_estimator=policylab_grpo",
           "actor_rollout_ref.rollout.n=4",
           "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # prompts: 8 rows, one mini-batch
           "actor_rollout_ref.actor.ppo_epochs=2",  # the second epoch sees moved weights: ratios != 1
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
           "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
           "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
           "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
           "actor_rollout_ref.actor.optim.weight_decay=0.0", "actor_rollout_ref.actor.use_kl_loss=False",
           "actor_rollout_ref.actor.entropy_coeff=0.0"]
    if method in STEP:
        import json

        out += ["actor_rollout_ref.actor.optim.optimizer=AdamW", f"actor_rollout_ref.actor.optim.lr={STEP_LR}",
                f"actor_rollout_ref.actor.optim.clip_grad={STEP_CLIP}"]
        out += json.loads(os.environ.get("POLICYLAB_VERL_STEP_OVERRIDES", "{}")).get(method, [])
    else:
        out += ["actor_rollout_ref.actor.optim.optimizer=SGD", f"actor_rollout_ref.actor.optim.lr={LR}",
                "actor_rollout_ref.actor.optim.clip_grad=1e9"]
    if method == "dr_grpo":
        out.append(f"+actor_rollout_ref.actor.policy_loss.method_params.L_norm={float(T)}")
    if method == "cispo":
        out.append("+actor_rollout_ref.actor.policy_loss.method_params.eps_high=0.28")
    if method in EXTENSION:  # the round extension reads rollout_log_probs itself
        out.append("actor_rollout_ref.rollout.calculate_log_probs=True")
    if method in ("tis", "icepop", "kpop", "mis", "minirl"):  # the raw engine ratio (the method's requirement)
        out += ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=1e9",
                "algorithm.rollout_correction.rollout_is_batch_normalize=False"]
    return out


def batch_tensors():
    """The fixed rollout: left-padded prompts, right-padded responses, 0/1 rewards at the
    last response token, and the sampler's log-probs (a perturbation of no model: the
    engine-mismatch corrections read the ratio to them)."""
    import torch

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, 500, (B // N, P), generator=g).repeat_interleave(N, 0)
    plen = torch.tensor([4, 4, 4, 4, 2, 2, 2, 2])
    resp = torch.randint(10, 500, (B, T), generator=g)
    rlen = torch.tensor([6, 3, 5, 2, 4, 6, 1, 3])
    pm = torch.arange(P).expand(B, P) >= (P - plen).unsqueeze(-1)
    rm = torch.arange(T).expand(B, T) < rlen.unsqueeze(-1)
    prompts = torch.where(pm, prompts, torch.zeros_like(prompts))
    resp = torch.where(rm, resp, torch.zeros_like(resp))
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 1])
    tlr = torch.zeros(B, T)
    tlr[torch.arange(B), rlen - 1] = rewards
    noise = 0.3 * torch.randn(B, T, generator=g)
    return dict(prompts=prompts, responses=resp, prompt_mask=pm, response_mask=rm, rewards=rewards,
                token_level_rewards=tlr, behavior_noise=noise)


def run(model_dir: str, out: str, method: str) -> None:
    import numpy as np
    import torch
    from hydra import compose, initialize_config_dir

    import verl.trainer.config as cfg_pkg
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
    from verl.workers.engine_workers import ActorRolloutRefWorker

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    with initialize_config_dir(config_dir=os.path.dirname(cfg_pkg.__file__), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides(model_dir, method))
    if method in STEP:
        from policylab.integrations.verl.steps import ActorRolloutRefWorker as StepWorker

        worker = StepWorker(cfg.actor_rollout_ref, role="actor")
    else:
        worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
    worker.init_model()
    start = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
             for k, v in worker.actor.engine.module.state_dict().items()}
    t = batch_tensors()
    attn = torch.cat([t["prompt_mask"], t["response_mask"]], 1).long()
    full = DataProto.from_dict(
        tensors={"prompts": t["prompts"], "responses": t["responses"],
                 "input_ids": torch.cat([t["prompts"], t["responses"]], 1), "attention_mask": attn,
                 "position_ids": (attn.cumsum(-1) - 1).clamp(min=0), "response_mask": t["response_mask"].long(),
                 "token_level_rewards": t["token_level_rewards"]},
        non_tensors={"uid": np.array([f"prompt-{i // N}" for i in range(B)], dtype=object)})
    # the driver's part, on the whole batch: advantages over whole groups
    if method not in EXTENSION:
        full = compute_advantage(full, adv_estimator=cfg.algorithm.adv_estimator, config=cfg.algorithm)
    # verl's dispatch: each data-parallel rank gets one contiguous chunk
    part = full.chunk(world)[rank]
    part.meta_info.update(temperature=1.0, global_token_num=part.batch["attention_mask"].sum(-1).tolist())
    trainer = types.SimpleNamespace(config=cfg, distillation_config=None, actor_rollout_wg=worker)
    old, _ = RayPPOTrainer._compute_old_log_prob(trainer, part)
    part = part.union(old)
    if cfg.algorithm.rollout_correction.rollout_is:
        rows = slice(rank * (B // world), (rank + 1) * (B // world))
        rm = part.batch["response_mask"].bool()
        behavior = (part.batch["old_log_probs"] + t["behavior_noise"][rows]).clamp(max=-1e-3)
        part.batch["rollout_log_probs"] = torch.where(rm, behavior, torch.zeros(()))
        part, _ = compute_rollout_correction_and_add_to_batch(part, cfg.algorithm.rollout_correction)
    if method in EXTENSION:  # (one process: the round needs the whole batch, here on rank 0's part = full)
        from functools import partial

        from policylab.integrations.verl import rounds as VR

        assert world == 1, "the extension's round runs in the driver on the whole batch"
        rm = part.batch["response_mask"].bool()
        behavior = (part.batch["old_log_probs"] + t["behavior_noise"]).clamp(max=-1e-3)
        part.batch["rollout_log_probs"] = torch.where(rm, behavior, torch.zeros(()))
        part.batch["token_level_scores"] = part.batch["token_level_rewards"].clone()
        VR.compute_advantage(part, method, rollout_n=N, epochs=2)
        full.batch["advantages"] = part.batch["advantages"]
        worker.set_loss_fn(partial(VR.loss_fn, config=worker.actor.loss_fn.keywords["config"]))
    result = RayPPOTrainer._update_actor(trainer, part)
    state = {}
    for k, v in worker.actor.engine.module.state_dict().items():  # full_tensor is collective: every rank
        state[k] = (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
    exported, step_state = None, None
    if method in STEP:  # the weights verl's rollout would receive; the extension's per-run state
        params, _ = worker.actor.engine.get_per_tensor_param()
        exported = {k: v.detach().clone() for k, v in params}
        step_state = {k: v.state_dict() for k, v in worker.policylab_steps.state.items() if hasattr(v, "state_dict")}
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, {"old": part.batch["old_log_probs"],
                                                   "rollout": part.batch.get("rollout_log_probs")})
    if rank == 0:
        torch.save({"state": state, "old": torch.cat([x["old"] for x in gathered]),
                    "rollout": (torch.cat([x["rollout"] for x in gathered]) if gathered[0]["rollout"] is not None
                                else None),
                    "advantages": full.batch["advantages"], "metrics": result.meta_info["metrics"],
                    "start": start, "exported": exported, "step_state": step_state},
                   f"{out}.{method}.pt")


def main() -> None:
    import torch

    torch.distributed.init_process_group("gloo")
    verl_cpu.register_engines()
    for method in sys.argv[3:]:
        run(sys.argv[1], sys.argv[2], method)
    torch.distributed.destroy_process_group()
    # every result is saved; end here rather than in the interpreter's teardown, where a
    # still-joinable thread of the gloo / Ray runtime sometimes aborts the process
    # ("terminate called without an active exception", exit -6: seen once in a clean-clone run)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
