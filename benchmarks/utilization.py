"""How close policylab runs to this machine's limits: train-phase FLOP/s over the matmul
peak measured in the same run, and generation tokens/s.

    .venv/bin/python benchmarks/utilization.py            # embedded model; writes results/utilization.{md,json}

Peak: the best of several 2048 x 2048 matmuls (2 n^3 FLOPs each) in fp32 and in bf16.

Train phase: one batch sampled from the model (4 prompts x 8 samples, <= 48 new tokens,
T = 1, fixed seed), then one forward + backward over it exactly as
`policylab.backends.update.optimizer_step` runs it (micro-batches of --micro-batch rows after sorting
by length, columns that are padding for the whole micro-batch trimmed, `model_logprobs`
with entropy, backward of a sum of the log-probs), in fp32 and under bf16 autocast
(fp32 master weights). Achieved FLOP/s = 6 x params x tokens / time, with tokens the
real (non-padding) tokens fed to the model, and also the FLOPs actually executed
(6 x non-embedding params x fed positions incl. padding + 6 x output-head params x
response positions) for reference; utilization = achieved / the peak of the same dtype.
bf16 autocast: the per-token log-prob error against the fp32 forward on the same tokens.
Then the same forward+backward through the shared prompt prefix (the trainer's default
path): executed FLOPs (prefix positions of the distinct prompts + suffix positions fed),
time against the full forward, and the log-prob difference to the fp32 full forward.

Generation phase: the same 32 prompts-with-copies, 48 new tokens, for HFEngine (fp32),
FastEngine fp32 and FastEngine bf16: generated tokens/s (tokens that count: through the
first eos) and decode steps/s; FastEngine bf16's log-prob mismatch against the fp32
trainer forward. Also a forced-length run (no eos: every row generates 48 tokens) giving
the per-step cost at batch 32.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_speed import machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 7) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def _prompts(tokenizer, n: int, seed: int) -> list[list[int]]:
    from policylab.tasks.arithmetic import ArithmeticTask

    out = []
    for e in ArithmeticTask(ops=("+", "*"), digits=1, seed=seed).train_prompts(n):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": e.prompt}], add_generation_prompt=True,
                                            tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def train_phase(model, batch, micro_batch: int, dtype: str) -> dict:
    """One forward+backward over `batch` as optimizer_step does it; FLOP counts and time."""
    from policylab.models.logprobs import model_logprobs
    from policylab.backends.update import autocast, trim

    model.train()
    model.zero_grad(set_to_none=True)
    adv = torch.zeros(batch.size)
    order = torch.argsort(batch.attention_mask.sum(-1), descending=True, stable=True)
    real = fed = resp = 0
    logp = torch.zeros(batch.loss_mask.shape)
    t0 = time.perf_counter()
    for idx in order.split(micro_batch):
        mb, _ = trim(batch.select(idx), adv[idx])
        with autocast(dtype):
            lp, _ent = model_logprobs(model, mb.tokens, mb.attention_mask, mb.prompt_width, sampling=mb.sampling,
                                      with_entropy=True)
        (lp.float().sum() / 1000.0).backward()
        real += int(mb.attention_mask[:, :-1].sum())
        fed += mb.tokens[:, :-1].numel()
        resp += mb.loss_mask.numel()
        logp[idx, : lp.shape[1]] = lp.detach().float()
    dt = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    n_params = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings().weight.numel()
    return {"seconds": dt, "real_tokens": real, "fed_positions": fed, "response_positions": resp,
            "flops_6NT": 6.0 * n_params * real, "flops_executed": 6.0 * (n_params - head) * fed + 6.0 * head * resp,
            "logp": logp}


def train_phase_prefix(model, batch, micro_batch: int, dtype: str) -> dict:
    """The same forward+backward through the shared prompt prefix, as optimizer_step runs it
    with `train.shared_prefix` (each distinct prompt once: its keys/values and last hidden
    state; micro-batches of response tokens only, sorted by response length; the prompts'
    share of the gradient through the prefix graph once at the end)."""
    from policylab.models.prefix import shared_prefix_or_none
    from policylab.backends.update import autocast, trim

    model.train()
    model.zero_grad(set_to_none=True)
    adv = torch.zeros(batch.size)
    logp = torch.zeros(batch.loss_mask.shape)
    t0 = time.perf_counter()
    with autocast(dtype):
        prefix = shared_prefix_or_none(model, batch.tokens, batch.attention_mask, batch.prompt_width)
    if prefix is None:
        raise SystemExit("no two rows share a prompt: nothing for the shared prefix to save")
    P = batch.prompt_width
    fed = prefix.n_distinct * P  # prefix positions (left padding included)
    resp = 0
    order = torch.argsort(batch.loss_mask.sum(-1), descending=True, stable=True)
    for idx in order.split(micro_batch):
        mb, _ = trim(batch.select(idx), adv[idx], keep_prompt=True)
        with autocast(dtype):
            lp, _ent = prefix.logprobs(model, idx, mb.tokens, mb.attention_mask, sampling=mb.sampling,
                                       with_entropy="detached")
        (lp.float().sum() / 1000.0).backward()
        fed += mb.tokens.shape[0] * (mb.tokens.shape[1] - 1 - P)  # suffix positions fed
        resp += mb.loss_mask.numel()
        logp[idx, : lp.shape[1]] = lp.detach().float()
    prefix.backward()
    dt = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    n_params = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings().weight.numel()
    real = int(batch.attention_mask[:, :-1].sum())
    return {"seconds": dt, "real_tokens": real, "fed_positions": fed, "response_positions": resp,
            "distinct_prompts": prefix.n_distinct,
            "flops_6NT": 6.0 * n_params * real, "flops_executed": 6.0 * (n_params - head) * fed + 6.0 * head * resp,
            "logp": logp}


def gen_phase(engine, prompts, group: int, max_new: int, seed: int) -> dict:
    from policylab import SamplingSettings

    t0 = time.perf_counter()
    b = engine.generate(prompts, group_size=group, sampling=SamplingSettings(), max_new_tokens=max_new,
                        policy_version=0, batch_id="util", seed=seed)
    dt = time.perf_counter() - t0
    return {"seconds": dt, "tokens": int(b.loss_mask.sum()), "steps": int(b.loss_mask.shape[1]),
            "rows": b.size, "batch": b}


def run(a) -> dict:
    from policylab.engines.fast import FastEngine
    from policylab.engines.hf import HFEngine
    from policylab.models.logprobs import model_logprobs
    from policylab.models.loading import load_policy

    from policylab.trainer import runtime

    if a.allocator == "keep":
        runtime.keep_freed_memory()  # as the trainer does at start-up
    out = {"load_before": round(os.getloadavg()[0], 2), "threads": torch.get_num_threads(),
           "allocator": a.allocator if runtime.applied_limit() or a.allocator == "system" else "system (keep unavailable)"}
    peak = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    out["peak_gflops"] = {k: v / 1e9 for k, v in peak.items()}
    model, tok = load_policy(a.model)
    n_params = sum(p.numel() for p in model.parameters())
    out["params"] = n_params
    out["head_params"] = model.get_output_embeddings().weight.numel()
    prompts = _prompts(tok, a.prompts, a.seed)
    # ---- generation
    gens = {}
    engines = [("hf-fp32", HFEngine(model, tok)), ("fast-fp32", FastEngine(model, tok)),
               ("fast-bf16", FastEngine(model, tok, dtype=torch.bfloat16))]
    for name, eng in engines:
        model.eval()
        g = gen_phase(eng, prompts, a.group, a.max_new_tokens, a.seed)
        forced_eng = (HFEngine(model, tok, eos_token_id=len(tok) - 1) if name.startswith("hf")
                      else FastEngine(model, tok, dtype=eng.dtype, eos_token_id=len(tok) - 1))
        forced = gen_phase(forced_eng, prompts, a.group, a.max_new_tokens, a.seed)
        rec = {"seconds": g["seconds"], "tokens": g["tokens"], "steps": g["steps"],
               "tokens_per_s": g["tokens"] / g["seconds"],
               "forced_full_length_s": forced["seconds"],
               "forced_ms_per_step": 1e3 * forced["seconds"] / forced["steps"],
               "forced_tokens_per_s": forced["rows"] * forced["steps"] / forced["seconds"]}
        # decode FLOPs ~ 2 x params per generated position (attention over <= 93 keys is negligible)
        rec["forced_decode_gflops"] = 2.0 * n_params * forced["rows"] * forced["steps"] / forced["seconds"] / 1e9
        if name == "fast-bf16":
            b = g["batch"]
            with torch.no_grad():
                lp = model_logprobs(model, b.tokens, b.attention_mask, b.prompt_width, sampling=b.sampling)
            d = (b.logp_behavior - lp)[b.loss_mask].abs()
            rec["logp_vs_fp32_abs_mean"], rec["logp_vs_fp32_abs_max"] = float(d.mean()), float(d.max())
            rec["frac_ratio_off_by_0.2"] = float(((b.logp_behavior - lp)[b.loss_mask].exp() - 1).abs().gt(0.2).float().mean())
        gens[name] = rec
        print(f"generate {name:10s}: {rec['tokens_per_s']:6.1f} tokens/s ({g['tokens']} tokens, {g['steps']} steps, "
              f"{g['seconds']:.1f}s); forced {forced['rows']}x{a.max_new_tokens}: {rec['forced_ms_per_step']:.0f} ms/step, "
              f"{rec['forced_tokens_per_s']:.0f} tokens/s", flush=True)
        if name == "fast-fp32":
            train_batch = g["batch"]
    out["generation"] = gens
    # ---- training
    trains = {}
    ref_logp = None
    for dtype in ("fp32", "bf16"):
        train_phase(model, train_batch, a.micro_batch, dtype)  # warm-up (allocator, kernels)
        r = train_phase(model, train_batch, a.micro_batch, dtype)
        rec = {k: v for k, v in r.items() if k != "logp"}
        rec["achieved_gflops_6NT"] = r["flops_6NT"] / r["seconds"] / 1e9
        rec["utilization_6NT"] = r["flops_6NT"] / r["seconds"] / peak[dtype]
        rec["executed_gflops"] = r["flops_executed"] / r["seconds"] / 1e9
        rec["utilization_executed"] = r["flops_executed"] / r["seconds"] / peak[dtype]
        if dtype == "fp32":
            ref_logp = r["logp"]
        else:
            m = train_batch.loss_mask
            d = (r["logp"] - ref_logp)[m].abs()
            rec["logp_vs_fp32_abs_mean"], rec["logp_vs_fp32_abs_max"] = float(d.mean()), float(d.max())
        trains[dtype] = rec
        print(f"train {dtype}: {r['seconds']:.1f}s fwd+bwd, {r['real_tokens']} tokens -> "
              f"{rec['achieved_gflops_6NT']:.0f} GFLOP/s (6NT) = {100 * rec['utilization_6NT']:.0f}% of the {dtype} peak; "
              f"executed {rec['executed_gflops']:.0f} GFLOP/s = {100 * rec['utilization_executed']:.0f}%", flush=True)
    # ---- training through the shared prompt prefix (the trainer's default path)
    for dtype in ("fp32", "bf16"):
        train_phase_prefix(model, train_batch, a.micro_batch, dtype)  # warm-up
        r = train_phase_prefix(model, train_batch, a.micro_batch, dtype)
        rec = {k: v for k, v in r.items() if k != "logp"}
        rec["executed_gflops"] = r["flops_executed"] / r["seconds"] / 1e9
        rec["utilization_executed"] = r["flops_executed"] / r["seconds"] / peak[dtype]
        rec["speedup_vs_full"] = trains[dtype]["seconds"] / r["seconds"]
        d = (r["logp"] - ref_logp)[train_batch.loss_mask].abs()
        rec["logp_vs_fp32_full_abs_max"] = float(d.max())
        trains[f"{dtype}-prefix"] = rec
        print(f"train {dtype} shared prefix: {r['seconds']:.1f}s fwd+bwd ({r['distinct_prompts']} distinct prompts), "
              f"{rec['speedup_vs_full']:.2f}x the full forward; executed {rec['executed_gflops']:.0f} GFLOP/s = "
              f"{100 * rec['utilization_executed']:.0f}% of the {dtype} peak", flush=True)
    out["train"] = trains
    out["load_after"] = round(os.getloadavg()[0], 2)
    return out


def to_markdown(r: dict, command: str) -> str:
    pk = r["peak_gflops"]
    t32, t16 = r["train"]["fp32"], r["train"]["bf16"]
    lines = [
        "# Utilization: train FLOP/s vs the measured matmul peak, generation tokens/s",
        "",
        f"Command: `{command}`  ",
        f"Machine: {r['machine']}; torch {r['torch']}, {r['threads']} threads; load average {r['load_before']} "
        f"before, {r['load_after']} after; allocator: {r['allocator']}.  ",
        f"Model: {r['model']} ({r['params'] / 1e6:.1f}M parameters). Batch: {r['prompts']} prompts x {r['group']} "
        f"samples, <= {r['max_new_tokens']} new tokens, T = 1, seed {r['seed']}; training micro-batch {r['micro_batch']}.",
        "",
        f"Matmul peak measured in this run (2048 x 2048): **fp32 {pk['fp32']:.0f} GFLOP/s, bf16 {pk['bf16']:.0f} GFLOP/s**.",
        "",
        "## Train phase (one forward + backward over the batch, as optimizer_step runs it)",
        "",
        "| dtype | time (s) | real tokens | 6·N·tokens GFLOP/s | of peak | executed GFLOP/s | of peak | log-prob error vs fp32 |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, t in (("fp32", t32), ("bf16 autocast", t16)):
        err = (f"mean {t['logp_vs_fp32_abs_mean']:.3f}, max {t['logp_vs_fp32_abs_max']:.3f}"
               if "logp_vs_fp32_abs_mean" in t else "reference")
        lines.append(f"| {name} | {t['seconds']:.1f} | {t['real_tokens']} | {t['achieved_gflops_6NT']:.0f} | "
                     f"{100 * t['utilization_6NT']:.0f}% | {t['executed_gflops']:.0f} | {100 * t['utilization_executed']:.0f}% | {err} |")
    pre = [(n, r["train"].get(k)) for n, k in (("fp32", "fp32-prefix"), ("bf16 autocast", "bf16-prefix"))]
    if all(t is not None for _, t in pre):
        lines += [
            "",
            "Through the shared prompt prefix (`train.shared_prefix`, the trainer's default: each distinct "
            "prompt computed once, micro-batches of response tokens; same log-probs and gradient):",
            "",
            "| dtype | time (s) | distinct prompts | fed positions | executed GFLOP/s | of peak | time vs full forward | max log-prob diff vs fp32 full |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, t in pre:
            lines.append(f"| {name} | {t['seconds']:.1f} | {t['distinct_prompts']} | {t['fed_positions']} | "
                         f"{t['executed_gflops']:.0f} | {100 * t['utilization_executed']:.0f}% | "
                         f"{t['speedup_vs_full']:.2f}x faster | {t['logp_vs_fp32_full_abs_max']:.2g} |")
    lines += [
        "",
        f"6·N·tokens counts every parameter (the {r['head_params'] / 1e6:.1f}M-parameter output head included) "
        "for every real token; policylab applies the head only at response positions, so the FLOPs it "
        "executes are 6·(N − head)·(fed positions, padding included) + 6·head·(response positions).",
        "",
        "## Generation phase",
        "",
        f"| engine | tokens/s (sampled batch) | decode steps | forced {r['prompts'] * r['group']} x {r['max_new_tokens']}: "
        "ms/step | tokens/s | ≈ GFLOP/s (2·N per token) | log-prob vs fp32 trainer |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, g in r["generation"].items():
        err = (f"mean {g['logp_vs_fp32_abs_mean']:.3f}, max {g['logp_vs_fp32_abs_max']:.3f}, "
               f"{100 * g['frac_ratio_off_by_0.2']:.1f}% of tokens with abs(ratio − 1) > 0.2"
               if "logp_vs_fp32_abs_mean" in g else "exact (fp32)")
        lines.append(f"| {name} | {g['tokens_per_s']:.0f} | {g['steps']} | {g['forced_ms_per_step']:.0f} | "
                     f"{g['forced_tokens_per_s']:.0f} | {g['forced_decode_gflops']:.0f} | {err} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--allocator", default="keep", choices=("keep", "system"),
                    help="keep: policylab.trainer.runtime.keep_freed_memory() first, as the trainer does; system: glibc defaults")
    ap.add_argument("--out", default=str(RESULTS / "utilization"), help="results path without suffix ('' = none)")
    argv = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(argv)
    r = run(a)
    r.update(machine=machine(), torch=torch.__version__, model=a.model, prompts=a.prompts, group=a.group,
             max_new_tokens=a.max_new_tokens, micro_batch=a.micro_batch, seed=a.seed)
    command = "python benchmarks/utilization.py " + " ".join(argv)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(dict(r, command=command), indent=2))
        out.with_suffix(".md").write_text(to_markdown(r, command))
    return r


if __name__ == "__main__":
    main()
