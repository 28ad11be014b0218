"""Building the in-process backends of a run: the policy (and, when the method reads
them, a frozen reference and a critic), the method's model stages, the rollout engine,
the optimizer and its schedule, wrapped as a `LocalRollout` and a `LocalWorker`.

The trainer receives what this returns (`Trainer(cfg, backends=...)`); another
implementation of the two protocols of `policylab.backends` (a vLLM rollout, a sharded
worker) is built elsewhere and handed over the same way.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch

from policylab.backends.local import LocalRollout, LocalWorker
from policylab.backends.update import Learner, UpdateSettings
from policylab.errors import ConfigError
from policylab.methods.context import SetupContext


def lr_lambda(train, total_steps: int):
    """The learning-rate multiplier per optimizer step: linear warm-up over
    `train.warmup_steps`, then constant, linear or cosine decay to 0 at `total_steps`."""
    warm, decay = train.warmup_steps, train.decay

    def f(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if decay == "constant" or total_steps <= warm:
            return 1.0
        frac = min(1.0, (step - warm) / max(1, total_steps - warm))
        return 1.0 - frac if decay == "linear" else 0.5 * (1 + math.cos(math.pi * frac))

    return f


def adamw(params, **kw) -> torch.optim.AdamW:
    """AdamW with the fused kernel (one pass over each tensor: ~0.07 s instead of ~0.37 s
    per step for 135M fp32 parameters on the reference CPU; the same update up to float
    rounding); the per-tensor loop where the fused kernel does not support the parameters."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(params, **kw)


def build_engine(model, tokenizer, rollout):
    """rollout.engine: "fast" (FastEngine; refuses non-Llama models), "hf" (HF generate),
    "auto" (FastEngine when it supports the model, else HFEngine). engine_dtype "bf16":
    FastEngine keeps a bf16 weight copy (re-synced when the weights change), HFEngine
    runs under bf16 autocast; either way a behavior engine that differs from training.
    engine_dtype "int8" / "int4": FastEngine with a weight-quantized copy (FastEngine only).
    "fast-bf16" (the fast mode, `methods.fast_mode`): FastEngine with a bf16 copy, only on
    a CPU with native bf16 (`engines.cpu.fast_dtype` refuses elsewhere)."""
    from policylab.engines.fast import FastEngine, UnsupportedModel
    from policylab.engines.hf import HFEngine

    if rollout.engine == "fast-bf16":
        from policylab.engines.cpu import fast_dtype

        dtype = fast_dtype()  # refuses a host without native bf16, naming its flags
        try:
            return FastEngine(model, tokenizer, dtype=dtype, engine_name="fast-bf16")
        except UnsupportedModel as exc:
            raise ConfigError(f"rollout.engine=fast-bf16: {exc}") from exc

    bf16 = rollout.engine_dtype == "bf16"
    quant = rollout.engine_dtype if rollout.engine_dtype in ("int8", "int4") else None
    if quant and rollout.engine == "hf":
        raise ConfigError(f"rollout.engine_dtype={quant} (a weight-quantized behavior engine) is a FastEngine "
                          "setting: use rollout.engine=fast or auto (Llama-architecture models)")
    if rollout.engine in ("fast", "auto"):
        try:
            if quant:
                return FastEngine(model, tokenizer, weights=quant, quant_group=rollout.engine_quant_group)
            return FastEngine(model, tokenizer, dtype=torch.bfloat16 if bf16 else None)
        except UnsupportedModel as exc:
            if rollout.engine == "fast" or quant:
                raise ConfigError(f"rollout.engine {rollout.engine!r} with engine_dtype={rollout.engine_dtype}: "
                                  f"{exc}") from exc
    if bf16:
        return HFEngine(model, tokenizer, engine_name="hf-bf16", autocast_dtype=torch.bfloat16)
    return HFEngine(model, tokenizer, engine_name="hf-fp32")


def wrap_lora(model, train):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError("train.lora_rank > 0 needs peft: pip install 'policylab[lora]'") from exc
    lcfg = LoraConfig(r=train.lora_rank, lora_alpha=train.lora_alpha, target_modules="all-linear", lora_dropout=0.0)
    return get_peft_model(model, lcfg)


def update_settings(train) -> UpdateSettings:
    """The update fields of a run's `train:` section."""
    return UpdateSettings(micro_batch_size=train.micro_batch_size, dtype=train.dtype, device=train.device,
                          grad_clip=train.grad_clip, skip_nonfinite=train.skip_nonfinite,
                          shared_prefix=train.shared_prefix)


@dataclass
class LocalBackends:
    """What the trainer runs on: the two protocol objects, plus the local pieces it
    checkpoints and evaluates with (the modules and optimizers, the tokenizer, the engine)."""

    rollout: LocalRollout
    worker: LocalWorker
    model: torch.nn.Module
    tokenizer: object
    engine: object
    learner: Learner
    ref_model: torch.nn.Module | None = None
    critic: torch.nn.Module | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    capabilities: frozenset = field(default_factory=frozenset)

    def modules(self) -> dict[str, torch.nn.Module]:
        """The trained modules a checkpoint holds, by name."""
        return {"model": self.model, **({"critic": self.critic} if self.critic is not None else {})}


def _policy(method, model_name: str, train, shape, controllers):
    """The policy (dtype, device, LoRA), its frozen reference when the method reads
    logp_ref, and the method's model stages applied before any optimizer exists."""
    from policylab.models.loading import load_policy

    dtype = torch.float64 if train.dtype == "fp64" else torch.float32
    model, tokenizer = load_policy(model_name, dtype=dtype)
    model.to(torch.device(train.device)).train()
    model.config.use_cache = True
    if train.recompute_elementwise:
        from policylab.models.recompute import recompute_elementwise

        recompute_elementwise(model)
    ref = copy.deepcopy(model).eval().requires_grad_(False) if "logp_ref" in method.roles else None
    if train.lora_rank > 0:
        model = wrap_lora(model, train)
    setup = SetupContext(p=None, run=shape, state=controllers, tokenizer=tokenizer)
    model = apply_model_stages(method, model, setup)  # e.g. a reparametrization, before the optimizer exists
    return model, tokenizer, ref


def apply_model_stages(method, model: torch.nn.Module, setup: SetupContext, *, learner_only: bool = False):
    """The method's active model stages on `model`, in declaration order, each with its own
    view of `setup`; returns the model the last one returned. With `learner_only` only
    the stages that change the learner itself (`Stage.learner`): what an engine's step
    extension runs on the engine's own model (`policylab.integrations.steps`)."""
    for stage in method.active("model"):
        if learner_only and not stage.learner:
            continue
        model = stage.fn(model, setup.for_stage(method, stage))
    return model


def build_local(method, *, model_name: str, train, rollout, shape, controllers, before_generate=None) -> LocalBackends:
    """The in-process backends of a run (`train` and `rollout`: the run config's sections;
    `before_generate(prompts)` may refuse a sampling request, e.g. a memory check)."""
    model, tokenizer, ref = _policy(method, model_name, train, shape, controllers)
    critic = critic_opt = None
    if method.critic is not None:
        from policylab.models.critic import ValueModel

        critic = ValueModel(model).to(torch.device(train.device))
        critic_opt = adamw(critic.parameters(), lr=train.critic_lr)
    engine = build_engine(model, tokenizer, rollout)
    local_rollout = LocalRollout(engine, same_numerics_as_trainer=not shape.engine_differs,
                                 before_generate=before_generate)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(params, lr=train.lr, betas=tuple(train.betas), weight_decay=train.weight_decay)
    total = train.steps * train.epochs * train.minibatches
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(train, total))
    learner = Learner(model, optimizer, scheduler, update_settings(train))
    worker = LocalWorker(learner, ref_model=ref, critic=critic, critic_optimizer=critic_opt)
    return LocalBackends(rollout=local_rollout, worker=worker, model=model, tokenizer=tokenizer, engine=engine,
                         learner=learner, ref_model=ref, critic=critic, critic_optimizer=critic_opt,
                         capabilities=local_rollout.capabilities | worker.capabilities)
