"""Where a decode step goes: weights read per step against compute, per rollout engine.

    .venv/bin/python benchmarks/decode_profile.py        # embedded model; writes results/decode_profile.{md,json}

Timed: run it on an idle machine (the load average is recorded; the report says when the
machine was busy).

Limits of this machine, measured in the same run: memory bandwidth (the best of several
reads of a 256 MiB fp32 tensor, `sum`: bytes read / time) and the matmul peak in fp32 and
bf16 (2048 x 2048, 2 n^3 FLOPs).

On a CPU without native bf16 (no avx512_bf16 / amx_bf16) the bf16 peak is measured on a
256 x 256 product (the emulated 2048 x 2048 one takes minutes) and the default engine list
leaves fast-bf16 out (the trainer refuses it there; the report says so).

Per engine (FastEngine fp32, bf16, int8-g32; HF `generate` fp32), on the same 4 prompts x
8 samples (the trainer's batch), --max-new tokens per row with the eos disabled (every row
runs every step, so each step has the same 32 rows), the engines timed in turn, rep by
rep, best of --reps (the host's speed drifts by ~20% over minutes; in turn, a drift reaches
every engine alike instead of whichever ran first):

* time per decode step (after the prefill) and generated tokens/s;
* for FastEngine, the step split into the decoder layers (`LlamaDecoder.step`), the output
  head (`LlamaDecoder.logits`) and the rest (sampling: temperature / top-k / top-p
  transform, draw, log-softmax; bookkeeping), timed by wrapping the two calls;
* what one step must move and compute: the weights read once per step (every matrix of
  the decoder in its compute dtype, the head once; the int8 engine keeps its quantized
  copy in the model's dtype, so it reads as many bytes as fp32), the key/value cache read
  by attention (2 x layers x rows x kv-heads x columns x head-dim, at the mean column),
  and the FLOPs (2 x matrix parameters x rows + attention's 4 x layers x rows x heads x
  columns x head-dim);
* the bound: t_memory = bytes / bandwidth, t_compute = FLOPs / matmul peak of the compute
  dtype; the step's fraction of the binding one = max(t_memory, t_compute) / measured step
  time (1.0 would be at the limit), and which one binds.

A sampling run with the eos enabled (responses end; finished rows leave the batch) also
reports tokens/s as the trainer sees them.
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
DEFAULT_ENGINES = "fast-fp32,fast-bf16,fast-int8-g32,hf-fp32"


def bandwidth(mib: int = 256, reps: int = 5) -> float:
    """Bytes per second of a streaming read (x.sum() over a `mib` MiB fp32 tensor)."""
    x = torch.ones(mib * 2**20 // 4)
    x.sum()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def step_budget(model, rows: int, columns: float, weight_bytes: int) -> dict:
    """Bytes and FLOPs of one decode step of `rows` rows attending over `columns` columns."""
    cfg = model.config
    layers, nh, nkv = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    d = cfg.hidden_size // nh
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    matrix = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and p is not emb and p is not head)
    kv_bytes = 2 * layers * rows * nkv * columns * d * weight_bytes
    weights = (matrix + head.numel()) * weight_bytes
    flops = 2.0 * (matrix + head.numel()) * rows + 4.0 * layers * rows * nh * columns * d
    return {"weight_bytes": weights, "kv_bytes": kv_bytes, "bytes": weights + kv_bytes, "flops": flops}


def _prompts(tokenizer, n: int, seed: int) -> list[list[int]]:
    from policylab.tasks.arithmetic import ArithmeticTask

    out = []
    for e in ArithmeticTask(ops=("+", "*"), digits=1, seed=seed).train_prompts(n):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": e.prompt}], add_generation_prompt=True,
                                            tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


class Split:
    """Wall time inside LlamaDecoder.step / .logits during one generate call."""

    def __init__(self, net):
        self.net, self.t = net, {"step": 0.0, "logits": 0.0, "prefill": 0.0}
        self.orig = {k: getattr(net, k) for k in self.t}
        for k in self.t:
            setattr(net, k, self._wrap(k))

    def _wrap(self, k):
        f = self.orig[k]

        def timed(*a, **kw):
            t0 = time.perf_counter()
            out = f(*a, **kw)
            self.t[k] += time.perf_counter() - t0
            return out
        return timed

    def restore(self):
        for k, f in self.orig.items():
            setattr(self.net, k, f)


def timed_rep(name, forced, prompts, a, rep) -> dict:
    """One timed generate call of an engine whose eos is disabled (every row runs every step)."""
    from policylab import SamplingSettings

    kw = dict(group_size=a.group, sampling=SamplingSettings(), max_new_tokens=a.max_new, policy_version=0,
              batch_id="prof")
    split = Split(forced._net) if hasattr(forced, "_net") else None
    t0 = time.perf_counter()
    b = forced.generate(prompts, seed=rep, **kw)
    total = time.perf_counter() - t0
    if split is not None:
        split.restore()
    steps = b.loss_mask.shape[1]
    if int(b.loss_mask.sum()) != b.size * steps:
        raise SystemExit(f"{name}: a row ended early ({int(b.loss_mask.sum())} of {b.size * steps} tokens)")
    return {"total_s": total, "steps": steps, "rows": b.size, "split": None if split is None else dict(split.t)}


def forced_engine(make, model, prompts, a):
    """The engine with its eos set to an id the model does not draw here, warmed up."""
    from policylab import SamplingSettings

    vocab = model.get_output_embeddings().weight.shape[0]
    forced = make(eos_token_id=vocab - 1)
    forced.generate(prompts, seed=0, group_size=a.group, sampling=SamplingSettings(), max_new_tokens=2,
                    policy_version=0, batch_id="prof")  # warm-up
    return forced


def summarize_engine(name, make, model, prompts, a, limits, recs: list[dict], forced) -> dict:
    """The best of an engine's timed reps, split into layers / head / rest, against the bounds;
    then one sampling run with the eos enabled."""
    from policylab import SamplingSettings

    best = dict(min(recs, key=lambda r: r["total_s"]))
    best["all_total_s"] = [r["total_s"] for r in recs]
    rows, steps = best["rows"], best["steps"]
    if best["split"] is not None:
        sp = best["split"]
        per_step = (best["total_s"] - sp["prefill"]) / max(steps - 1, 1)
        best["ms_per_step"] = 1e3 * per_step
        n = max(steps - 1, 1)
        best["ms_layers"], best["ms_head"] = 1e3 * sp["step"] / n, 1e3 * sp["logits"] / n
        best["ms_rest"] = best["ms_per_step"] - best["ms_layers"] - best["ms_head"]
    else:
        per_step = best["total_s"] / steps
        best["ms_per_step"] = 1e3 * per_step
    best["tokens_per_s_forced"] = rows * steps / best["total_s"]
    P = max(len(p) for p in prompts)
    dtype = getattr(forced, "dtype", torch.float32) if name != "hf-fp32" else torch.float32
    wbytes = torch.empty((), dtype=dtype).element_size()
    bud = step_budget(model, rows, P + steps / 2, wbytes)
    t_mem = bud["bytes"] / limits["bandwidth"]
    peak = limits["peak_bf16"] if dtype == torch.bfloat16 else limits["peak_fp32"]
    t_cmp = bud["flops"] / peak
    best.update(bud, t_memory_ms=1e3 * t_mem, t_compute_ms=1e3 * t_cmp, bound="memory" if t_mem >= t_cmp else "compute",
                fraction_of_bound=max(t_mem, t_cmp) / per_step, compute_dtype=str(dtype).removeprefix("torch."),
                achieved_gflops=bud["flops"] / per_step / 1e9, achieved_gbs=bud["bytes"] / per_step / 1e9)
    # with the eos: responses end, finished rows leave the batch
    eng = make()
    t0 = time.perf_counter()
    b = eng.generate(prompts, seed=0, group_size=a.group, sampling=SamplingSettings(), max_new_tokens=a.max_new,
                     policy_version=0, batch_id="prof")
    dt = time.perf_counter() - t0
    best["tokens_per_s_sampling"] = int(b.loss_mask.sum()) / dt
    best["mean_response_tokens"] = float(b.loss_mask.sum(1).float().mean())
    return best


def run(a) -> dict:
    from policylab.engines.cpu import bf16_training_native, describe_cpu
    from policylab.engines.fast import FastEngine
    from policylab.engines.hf import HFEngine
    from policylab.models.loading import load_policy

    from policylab.trainer import runtime

    runtime.keep_freed_memory()
    load_before = os.getloadavg()[0]
    model, tok = load_policy(a.model, dtype=torch.float32)
    model.eval()
    native = bf16_training_native()
    # without native bf16 the CPU's bf16 matmul is an emulation (single-threaded here, minutes
    # for the 2048 x 2048 product): a smaller product measures its rate
    limits = {"bandwidth": bandwidth(), "peak_fp32": matmul_peak(torch.float32),
              "peak_bf16": matmul_peak(torch.bfloat16) if native else matmul_peak(torch.bfloat16, n=256, reps=2),
              "bf16_native": native}
    prompts = _prompts(tok, a.prompts, seed=a.seed)
    makers = {
        "fast-fp32": lambda **kw: FastEngine(model, tok, **kw),
        "fast-bf16": lambda **kw: FastEngine(model, tok, dtype=torch.bfloat16, **kw),
        "fast-int8-g32": lambda **kw: FastEngine(model, tok, weights="int8", quant_group=32, **kw),
        "hf-fp32": lambda **kw: HFEngine(model, tok, **kw),
    }
    engines, skipped = {}, {}
    names = [e for e in a.engines.split(",") if e]
    if a.engines == DEFAULT_ENGINES and not native:
        names.remove("fast-bf16")
        skipped["fast-bf16"] = ("no native bf16 on this CPU (flags avx512_bf16 / amx_bf16): bf16 is emulated, so "
                                "the trainer refuses rollout.engine=fast-bf16 here; `--engines fast-bf16` forces it")
        print(f"fast-bf16 skipped: {skipped['fast-bf16']}", flush=True)
    bad = [n for n in names if n not in makers]
    if bad:
        raise SystemExit(f"unknown engine {bad[0]!r}; choose from {', '.join(makers)}")
    forced = {name: forced_engine(makers[name], model, prompts, a) for name in names}
    recs: dict[str, list] = {name: [] for name in names}
    for rep in range(a.reps):  # round-robin: a drift of the host's speed reaches every engine alike
        for name in names:
            recs[name].append(timed_rep(name, forced[name], prompts, a, rep))
    for name in names:
        engines[name] = summarize_engine(name, makers[name], model, prompts, a, limits, recs[name], forced[name])
        e = engines[name]
        print(f"{name}: {e['ms_per_step']:.1f} ms/step, {e['tokens_per_s_forced']:.0f} tokens/s forced, "
              f"{e['tokens_per_s_sampling']:.0f} sampling; {e['bound']} bound, {100 * e['fraction_of_bound']:.0f}% of it",
              flush=True)
    return {"machine": machine(), "cpu": describe_cpu(), "threads": torch.get_num_threads(),
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
            "limits": limits, "engines": engines, "skipped": skipped,
            "settings": {"prompts": a.prompts, "group": a.group, "max_new_tokens": a.max_new, "reps": a.reps,
                         "model": a.model}}


def to_markdown(r: dict, command: str) -> str:
    L, s = r["limits"], r["settings"]
    busy = r["load_before"] > 0.5 * max(1, os.cpu_count() or 1)
    lines = ["# Decode step profile: weights read per step vs compute", "",
             f"Command: `{command}`; {s['prompts']} prompts x {s['group']} samples, {s['max_new_tokens']} new tokens "
             f"per row (eos disabled), best of {s['reps']} (the engines measured in turn, rep by rep). "
             f"Machine: {r['machine']}; {r['threads']} threads; load "
             f"average {r['load_before']} before, {r['load_after']} after"
             + (" (**not idle: the times overstate the cost**)" if busy else "") + ".", "",
             f"Limits measured in this run: memory read bandwidth {L['bandwidth'] / 1e9:.1f} GB/s, matmul peak fp32 "
             f"{L['peak_fp32'] / 1e9:.0f} GFLOP/s, bf16 {L['peak_bf16'] / 1e9:.0f} GFLOP/s"
             + ("" if L.get("bf16_native", True) else " (emulated: this CPU has no native bf16; 256 x 256 product)")
             + ".", "",
             "| engine | compute dtype | ms / step | layers / head / rest (ms) | tokens/s (all rows run) | "
             "tokens/s sampling (eos on) | weights + KV read per step (MB) | GFLOP per step | t_memory / t_compute "
             "(ms) | bound | fraction of the bound |", "|---|---|---:|---|---:|---:|---:|---:|---|---|---:|"]
    for name, e in r["engines"].items():
        sp = (f"{e['ms_layers']:.1f} / {e['ms_head']:.1f} / {e['ms_rest']:.1f}" if "ms_layers" in e else "-")
        lines.append(f"| {name} | {e['compute_dtype']} | {e['ms_per_step']:.1f} | {sp} | {e['tokens_per_s_forced']:.0f} | "
                     f"{e['tokens_per_s_sampling']:.0f} | {e['weight_bytes'] / 1e6:.0f} + {e['kv_bytes'] / 1e6:.0f} | "
                     f"{e['flops'] / 1e9:.2f} | {e['t_memory_ms']:.1f} / {e['t_compute_ms']:.1f} | {e['bound']} | "
                     f"{100 * e['fraction_of_bound']:.0f}% |")
    for name, why in r.get("skipped", {}).items():
        lines += ["", f"{name} was not measured: {why}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--engines", default=DEFAULT_ENGINES, help="comma list (the default leaves fast-bf16 out on a "
                    "CPU without native bf16)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "decode_profile"), help="output path without suffix ('' = none)")
    a = ap.parse_args(argv)
    r = run(a)
    if a.out:
        cmd = "python benchmarks/decode_profile.py " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(a.out).with_suffix(".json").write_text(json.dumps(r, indent=2))
        Path(a.out).with_suffix(".md").write_text(to_markdown(r, cmd.strip()))
    return r


if __name__ == "__main__":
    main()
