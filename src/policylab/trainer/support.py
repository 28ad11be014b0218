"""Helpers of the trainer that are not the loop itself: learning-rate schedule, seeding,
metric summaries, engine and LoRA construction, run-config files."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import torch
import yaml

from policylab.batch import RolloutBatch
from policylab.trainer.config import ConfigError, RunConfig, config_from_dict


def lr_lambda(cfg, total_steps: int):
    warm, decay = cfg.warmup_steps, cfg.decay

    def f(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if decay == "constant" or total_steps <= warm:
            return 1.0
        frac = min(1.0, (step - warm) / max(1, total_steps - warm))
        return 1.0 - frac if decay == "linear" else 0.5 * (1 + math.cos(math.pi * frac))

    return f


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def mean_dicts(rows: list[dict]) -> dict:
    out: dict = {}
    for k in {k for r in rows for k in r}:
        vals = [r[k] for r in rows if k in r]
        if k.endswith("/min"):
            out[k] = min(vals)
        elif k.endswith("/max"):
            out[k] = max(vals)
        elif k.startswith("skipped") or k == "tokens":
            out[k] = sum(vals)
        else:
            out[k] = sum(vals) / len(vals)
    out["optimizer_steps"] = len(rows)
    return out


def rollout_metrics(batch: RolloutBatch, t_gen: float) -> dict:
    from policylab.kernels.advantages import group_stats

    lengths = batch.response_lengths.float()
    m = {
        "reward/mean": float(batch.rewards.mean()),
        "reward/std": float(batch.rewards.std(unbiased=False)),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "rollout/sequences": batch.size,
        "rollout/tokens_per_s": float(lengths.sum()) / max(t_gen, 1e-9),
        "rollout/completions_per_s": batch.size / max(t_gen, 1e-9),
    }
    if "gold_correct" in batch.extras:
        m["accuracy"] = float(batch.extras["gold_correct"].float().mean())
    if "truncated" in batch.extras:
        m["response/truncated_frac"] = float(batch.extras["truncated"].float().mean())
    gs = group_stats(batch.outcome["correct"].float(), batch.group)
    for k, v in gs.items():
        m[f"groups/{k}"] = float(v)
    return m


def adamw(params, **kw) -> torch.optim.AdamW:
    """AdamW with the fused kernel (one pass over each tensor: ~0.07 s instead of ~0.37 s
    per step for 135M fp32 parameters on the reference CPU; the same update up to float
    rounding); the per-tensor loop where the fused kernel does not support the parameters."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(params, **kw)


def build_engine(model, tokenizer, rcfg):
    """rollout.engine: "fast" (FastEngine; refuses non-Llama models), "hf" (HF generate),
    "auto" (FastEngine when it supports the model, else HFEngine). engine_dtype "bf16":
    FastEngine keeps a bf16 weight copy (re-synced when the weights change), HFEngine
    runs under bf16 autocast; either way a behavior engine that differs from training.
    engine_dtype "int8" / "int4": FastEngine with a weight-quantized copy (FastEngine only)."""
    from policylab.engines.fast import FastEngine, UnsupportedModel
    from policylab.engines.hf import HFEngine

    bf16 = rcfg.engine_dtype == "bf16"
    quant = rcfg.engine_dtype if rcfg.engine_dtype in ("int8", "int4") else None
    if quant and rcfg.engine == "hf":
        raise ConfigError(f"rollout.engine_dtype={quant} (a weight-quantized behavior engine) is a FastEngine "
                          "setting: use rollout.engine=fast or auto (Llama-architecture models)")
    if rcfg.engine in ("fast", "auto"):
        try:
            if quant:
                return FastEngine(model, tokenizer, weights=quant, quant_group=rcfg.engine_quant_group)
            return FastEngine(model, tokenizer, dtype=torch.bfloat16 if bf16 else None)
        except UnsupportedModel as exc:
            if rcfg.engine == "fast" or quant:
                raise ConfigError(f"rollout.engine {rcfg.engine!r} with engine_dtype={rcfg.engine_dtype}: {exc}") from exc
    if bf16:
        return HFEngine(model, tokenizer, engine_name="hf-bf16", autocast_dtype=torch.bfloat16)
    return HFEngine(model, tokenizer, engine_name="hf-fp32")


def wrap_lora(model, tcfg):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError("train.lora_rank > 0 needs peft: pip install 'policylab[lora]'") from exc
    lcfg = LoraConfig(r=tcfg.lora_rank, lora_alpha=tcfg.lora_alpha, target_modules="all-linear", lora_dropout=0.0)
    return get_peft_model(model, lcfg)


def save_config(cfg: RunConfig, run_dir: Path) -> None:
    """Write run_dir/config.yaml atomically (a temporary file renamed into place)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / ".config.yaml.tmp"
    tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    tmp.replace(run_dir / "config.yaml")


def load_run_config(run_dir: Path) -> RunConfig:
    from policylab.trainer.config import read_yaml

    p = Path(run_dir) / "config.yaml"
    if not Path(run_dir).is_dir():
        raise ConfigError(f"{run_dir} is not a directory: give the run directory a policylab run wrote")
    if not p.is_file():
        raise ConfigError(f"{run_dir} has no config.yaml: is it a policylab run directory?")
    data = read_yaml(p)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: not a run config (the top level must be a mapping of config sections)")
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
