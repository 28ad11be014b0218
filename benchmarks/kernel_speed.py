"""Kernel speed: policylab's vectorized kernels against naive per-group / per-sequence loops.

    .venv/bin/python benchmarks/kernel_speed.py                      # 16384 x 64 = 1M tokens, groups of 16
    .venv/bin/python benchmarks/kernel_speed.py --B 256 --T 16 --out ''   # tiny (smoke test)

Every kernel runs on the same random inputs as a naive reference written below: a Python
loop over groups (advantages, GMC) or over sequences (token corrections, objectives),
doing the per-group / per-row arithmetic with small tensor ops, which is how the formula
reads on paper. The two outputs are compared (torch.testing.assert_close) before any
timing, so a speedup is never reported for a wrong answer. The library kernels do more
than the loops (input validation, diagnostics metrics); the loops compute the output only.

Timing: the best of `--reps` runs for the kernels, one run for the loops (they take
seconds); torch threads as configured by the environment. Everything is timed twice in
one process (`--allocators system,keep`): first with glibc's default allocator
behaviour, then after `policylab.trainer.runtime.keep_freed_memory()` (what the trainer applies
at start-up). Writes Markdown tables to benchmarks/results/kernels.md (and .json) unless
`--out ''`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
from torch.testing import assert_close

from policylab.kernels import advantages, corrections, objectives

RESULTS = Path(__file__).resolve().parent / "results"


# ----------------------------------------------------------------------------- inputs
def make_inputs(B: int, T: int, G: int, seed: int = 0) -> dict:
    """Random batch: B sequences of T positions, groups of G with shuffled, non-contiguous
    ids, random response lengths 1..T, log-probs around -1 with a small policy drift."""
    if B % G:
        raise SystemExit(f"--B {B} must be a multiple of --G {G}")
    g = torch.Generator().manual_seed(seed)
    n = B // G
    ids = torch.randperm(10 * n, generator=g)[:n] * 3 + 7  # arbitrary, unsorted ids
    group = ids.repeat_interleave(G)[torch.randperm(B, generator=g)]
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logp_old = -torch.rand(B, T, generator=g) * 3
    logp = logp_old + 0.1 * torch.randn(B, T, generator=g)
    logp_behavior = logp_old + 0.05 * torch.randn(B, T, generator=g)
    rewards = (torch.rand(B, generator=g) < 0.4).float() + 0.1 * torch.randn(B, generator=g)
    weights = torch.rand(B, generator=g) * 2
    adv = torch.randn(B, generator=g)
    return dict(group=group, mask=mask, logp=logp, logp_old=logp_old, logp_behavior=logp_behavior,
                rewards=rewards, weights=weights, adv=adv)


def _members(group: torch.Tensor) -> list[torch.Tensor]:
    rows: dict[int, list[int]] = {}
    for i, gid in enumerate(group.tolist()):
        rows.setdefault(gid, []).append(i)
    return [torch.tensor(v) for v in rows.values()]


# ------------------------------------------------------------------ naive references
def naive_grpo(rewards, group, eps=1e-6):
    out = torch.zeros_like(rewards)
    for idx in _members(group):
        r = rewards[idx]
        if bool((r == r[0]).all()):
            continue  # zero spread: advantage exactly 0
        out[idx] = (r - r.mean()) / (r.std(unbiased=True) + eps)
    return out


def naive_rloo(rewards, group):
    out = torch.zeros_like(rewards)
    for idx in _members(group):
        r = rewards[idx]
        k = r.numel()
        out[idx] = r - (r.sum() - r) / (k - 1)
    return out


def naive_gmc(weights, group, cap):
    out = torch.zeros_like(weights)
    for idx in _members(group):
        w = weights[idx]
        s = w.sum()
        out[idx] = w * (cap / s) if s > cap else w
    return out


def naive_tis(logp_old, logp_behavior, mask, cap):
    out = torch.zeros_like(logp_old)
    for b in range(mask.shape[0]):
        m = mask[b]
        out[b, m] = torch.exp(logp_old[b, m] - logp_behavior[b, m]).clamp(max=cap)
    return out


def naive_icepop(logp_old, logp_behavior, mask, low, high):
    out = torch.zeros_like(logp_old)
    for b in range(mask.shape[0]):
        m = mask[b]
        k = torch.exp(logp_old[b, m] - logp_behavior[b, m])
        out[b, m] = torch.where((k >= low) & (k <= high), k, torch.zeros_like(k))
    return out


def naive_ppo_clip(logp, logp_old, adv, mask, eps_low, eps_high):
    out = torch.zeros_like(logp)
    for b in range(mask.shape[0]):
        m = mask[b]
        ratio = torch.exp(logp[b, m] - logp_old[b, m])
        a = adv[b]
        out[b, m] = -torch.minimum(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a)
    return out


def naive_gspo(logp, logp_old, adv, mask, eps_low, eps_high):
    out = torch.zeros_like(logp)
    for b in range(mask.shape[0]):
        m = mask[b]
        s = torch.exp((logp[b, m] - logp_old[b, m]).mean())
        a = adv[b]
        out[b, m] = -torch.minimum(s * a, s.clamp(1 - eps_low, 1 + eps_high) * a)
    return out


def naive_cispo(logp, logp_old, adv, mask, eps_high):
    out = torch.zeros_like(logp)
    for b in range(mask.shape[0]):
        m = mask[b]
        w = torch.exp(logp[b, m] - logp_old[b, m]).clamp(max=1 + eps_high)
        out[b, m] = -w * adv[b] * logp[b, m]
    return out


# -------------------------------------------- bare vectorized formulas (no checks, no metrics)
def _dense(group):
    uniq, dense = torch.unique(group, return_inverse=True)
    return dense, uniq.numel()


def bare_grpo(rewards, group, eps=1e-6):
    dense, n = _dense(group)
    k = torch.zeros(n).index_add_(0, dense, torch.ones_like(rewards))
    mean = torch.zeros(n).index_add_(0, dense, rewards) / k
    c = rewards - mean[dense]
    std = (torch.zeros(n).index_add_(0, dense, c * c) / (k - 1)).sqrt()
    flat = std[dense] == 0
    return torch.where(flat, torch.zeros_like(c), c / (std[dense] + eps))


def bare_rloo(rewards, group):
    dense, n = _dense(group)
    k = torch.zeros(n).index_add_(0, dense, torch.ones_like(rewards))[dense]
    s = torch.zeros(n).index_add_(0, dense, rewards)[dense]
    return rewards - (s - rewards) / (k - 1)


def bare_gmc(weights, group, cap):
    dense, n = _dense(group)
    mass = torch.zeros(n).index_add_(0, dense, weights)
    return weights * torch.where(mass > cap, cap / mass, torch.ones_like(mass))[dense]


def bare_tis(lo, lb, mask, cap):
    return torch.where(mask, torch.exp(torch.clamp(lo - lb, max=math.log(cap))), 0.0)


def bare_icepop(lo, lb, mask, low, high):
    k = torch.exp(torch.where(mask, lo - lb, 0.0))
    return torch.where(mask & (k >= low) & (k <= high), k, 0.0)


def bare_ppo_clip(lp, lo, adv, mask, eps_low, eps_high):
    r = torch.exp(torch.where(mask, lp - lo, 0.0))
    a = adv[:, None]
    return torch.where(mask, -torch.minimum(r * a, r.clamp(1 - eps_low, 1 + eps_high) * a), 0.0)


def bare_gspo(lp, lo, adv, mask, eps_low, eps_high):
    s = torch.exp(torch.where(mask, lp - lo, 0.0).sum(-1) / mask.sum(-1).clamp(min=1))
    row = -torch.minimum(s * adv, s.clamp(1 - eps_low, 1 + eps_high) * adv)
    return torch.where(mask, row[:, None], 0.0)


def bare_cispo(lp, lo, adv, mask, eps_high):
    w = torch.exp(torch.where(mask, lp - lo, 0.0)).clamp(max=1 + eps_high)
    return torch.where(mask, -w * adv[:, None] * lp, 0.0)


# ------------------------------------------------------------------------ the cases
def cases(x: dict) -> list[tuple]:
    """(name, family, library call, naive loop, bare vectorized formula); each returns the
    kernel's main output tensor."""
    g, m, r, w = x["group"], x["mask"], x["rewards"], x["weights"]
    lp, lo, lb, a = x["logp"], x["logp_old"], x["logp_behavior"], x["adv"]
    return [
        ("grpo", "advantage", lambda: advantages.grpo(r, g, std="unbiased", eps=1e-6),
         lambda: naive_grpo(r, g), lambda: bare_grpo(r, g)),
        ("rloo", "advantage", lambda: advantages.rloo(r, g), lambda: naive_rloo(r, g), lambda: bare_rloo(r, g)),
        ("tis", "correction", lambda: corrections.tis(lo, lb, m, cap=2.0)[0], lambda: naive_tis(lo, lb, m, 2.0),
         lambda: bare_tis(lo, lb, m, 2.0)),
        ("icepop", "correction", lambda: corrections.icepop(lo, lb, m, low=0.95, high=1.05)[0],
         lambda: naive_icepop(lo, lb, m, 0.95, 1.05), lambda: bare_icepop(lo, lb, m, 0.95, 1.05)),
        ("gmc", "correction", lambda: corrections.gmc(w, g, cap=16.0)[0], lambda: naive_gmc(w, g, 16.0),
         lambda: bare_gmc(w, g, 16.0)),
        ("ppo_clip", "objective", lambda: objectives.ppo_clip(lp, lo, a, m, eps_low=0.2, eps_high=0.28)[0],
         lambda: naive_ppo_clip(lp, lo, a, m, 0.2, 0.28), lambda: bare_ppo_clip(lp, lo, a, m, 0.2, 0.28)),
        ("gspo", "objective", lambda: objectives.gspo(lp, lo, a, m, eps_low=3e-4, eps_high=4e-4)[0],
         lambda: naive_gspo(lp, lo, a, m, 3e-4, 4e-4), lambda: bare_gspo(lp, lo, a, m, 3e-4, 4e-4)),
        ("cispo", "objective", lambda: objectives.cispo(lp, lo, a, m, eps_low=None, eps_high=0.28)[0],
         lambda: naive_cispo(lp, lo, a, m, 0.28), lambda: bare_cispo(lp, lo, a, m, 0.28)),
    ]


def _time(fn, reps: int) -> tuple[float, torch.Tensor]:
    best, out = math.inf, None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run(B: int, T: int, G: int, reps: int = 5, naive_reps: int = 1) -> list[dict]:
    x = make_inputs(B, T, G)
    rows = []
    for name, family, lib, naive, bare in cases(x):
        t_naive, ref = _time(naive, naive_reps)
        t_lib, got = _time(lib, reps)
        t_bare, got_bare = _time(bare, reps)
        assert_close(got, ref, rtol=1e-5, atol=1e-6, msg=lambda s, n=name: f"{n}: kernel != naive loop: {s}")
        assert_close(got_bare, ref, rtol=1e-5, atol=1e-6, msg=lambda s, n=name: f"{n}: bare != naive loop: {s}")
        rows.append(dict(kernel=name, family=family, kernel_ms=1e3 * t_lib, naive_ms=1e3 * t_naive,
                         speedup=t_naive / t_lib, bare_ms=1e3 * t_bare, bare_speedup=t_naive / t_bare))
    return rows


ALLOCATORS = {
    "system": "glibc's default malloc behaviour (large freed blocks go back to the OS)",
    "keep": "after policylab.trainer.runtime.keep_freed_memory(), the setting the policylab trainer applies",
}


def to_markdown(runs: dict[str, list[dict]], meta: dict) -> str:
    lines = [
        "# Kernel speed: vectorized kernels vs naive loops",
        "",
        f"Command: `{meta['command']}`",
        f"Machine: {meta['machine']}; torch {meta['torch']}, {meta['threads']} threads; load average "
        f"{meta['load_before']} before, {meta['load_after']} after.",
        f"Inputs: B = {meta['B']} sequences x T = {meta['T']} positions ({meta['B'] * meta['T']:,} tokens), "
        f"groups of {meta['G']} with shuffled non-contiguous ids, random lengths 1..T.",
        "Naive = a Python loop over groups (advantages, gmc) or sequences (tis, icepop, objectives) doing "
        "the per-row arithmetic with tensor ops; the kernel output is checked equal to it "
        "(assert_close rtol 1e-5, atol 1e-6) before timing. Kernel time = best of "
        f"{meta['reps']} runs and includes the library's input validation and diagnostics metrics, "
        "which the loops do not compute. 'Bare' = the same formula vectorized in a few torch ops in this "
        "file, without validation or metrics (also checked equal to the loop): the gap between the two "
        "columns is what the checks and diagnostics cost.",
        "",
        "Each table is one allocator setting of the same process (the loops are timed again in each). "
        "At this size every temporary is a 4 MiB block: with glibc's defaults it is often handed back "
        "to the OS when freed and the next one is zero-filled page by page (~1,000 page faults, ~1 ms), "
        "which costs more than the arithmetic; see `policylab/trainer/runtime.py`.",
    ]
    for mode, rows in runs.items():
        lines += [
            "",
            f"## Allocator: {mode} ({ALLOCATORS[mode]})",
            "",
            "| kernel | family | library kernel (ms) | naive loop (ms) | speedup | bare vectorized (ms) | speedup |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(f"| `{r['kernel']}` | {r['family']} | {r['kernel_ms']:.2f} | {r['naive_ms']:.0f} | "
                         f"{r['speedup']:.0f}x | {r['bare_ms']:.2f} | {r['bare_speedup']:.0f}x |")
        worst = min(r["speedup"] for r in rows)
        worst_bare = min(r["bare_speedup"] for r in rows)
        lines += ["", f"Smallest speedup ({mode}): library kernels {worst:.0f}x, bare formulas {worst_bare:.0f}x "
                      "(target >= 50x)."]
    return "\n".join(lines) + "\n"


def machine() -> str:
    """The machine line of every benchmark report: CPU model and the CPU features it ran
    on (policylab.engines.cpu: vector width, bf16, AMX flags), the cores the process may
    use (affinity, cgroup quota), the OS."""
    from policylab.engines.cpu import describe_cpu
    from policylab.trainer.runtime import available_cores

    return (f"{describe_cpu()}; {os.cpu_count()} cores, {available_cores().describe()}; "
            f"{platform.system()} {platform.release()}")


def main(argv=None) -> dict[str, list[dict]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--B", type=int, default=16384)
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--G", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--allocators", default="system,keep",
                    help="comma list, in order: 'system' must come before 'keep' (a process cannot undo it)")
    ap.add_argument("--out", default=str(RESULTS / "kernels"), help="output path without suffix ('' = none)")
    args = ap.parse_args(argv)
    modes = [m for m in args.allocators.split(",") if m]
    if any(m not in ALLOCATORS for m in modes) or modes != sorted(modes, key=list(ALLOCATORS).index):
        raise SystemExit(f"--allocators: a comma list of {list(ALLOCATORS)}, in that order; got {args.allocators!r}")
    from policylab.trainer import runtime

    load_before = os.getloadavg()[0]
    runs = {}
    for mode in modes:
        if mode == "keep" and not runtime.keep_freed_memory():
            print("keep_freed_memory() is not available here (not glibc): skipping the 'keep' run")
            continue
        runs[mode] = run(args.B, args.T, args.G, args.reps)
        for r in runs[mode]:
            print(f"[{mode:6s}] {r['kernel']:10s} kernel {r['kernel_ms']:9.2f} ms   naive {r['naive_ms']:9.0f} ms   "
                  f"speedup {r['speedup']:7.0f}x   bare {r['bare_ms']:8.2f} ms  {r['bare_speedup']:7.0f}x")
    meta = dict(command="python benchmarks/kernel_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                machine=machine(), torch=torch.__version__, threads=torch.get_num_threads(),
                load_before=round(load_before, 2), load_after=round(os.getloadavg()[0], 2),
                B=args.B, T=args.T, G=args.G, reps=args.reps)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(to_markdown(runs, meta))
        out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, runs=runs), indent=2))
    return runs


if __name__ == "__main__":
    main()
