"""Peak memory and time of the full-vocabulary KL(π_θ‖π_ref) per position (ZCPO's drift,
STARE's entropy): chunked over positions and vocabulary (`policylab.models.vocab.head_stats`,
what `LocalWorker.vocab_stats` runs) against the naive route that builds the [B, T, V]
logits of both models.

    .venv/bin/python benchmarks/full_vocab_kl.py [--model embedded] [--rows 16] [--positions 64]

Each variant runs in its own subprocess: the model pair is loaded and the final hidden
states are computed first; then the resident memory is sampled every millisecond during
the KL computation, and its largest value minus the resident memory right before is the
computation's own peak (the process's all-time peak, ru_maxrss, is reported too: it can
stay at what loading the model reached).
The reference is a copy of the model with slightly perturbed weights, so the KL is not 0.
Writes results/full_vocab_kl.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _current_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _PeakSampler:
    """The largest current RSS seen every millisecond while the block runs (the process's
    all-time peak, ru_maxrss, may stay at what loading the model reached)."""

    def __init__(self):
        import threading

        self.peak, self._stop = _current_mb(), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _current_mb())
            self._stop.wait(0.001)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _current_mb())


def _setup(model_name: str, rows: int, positions: int):
    from policylab.models.loading import load_policy
    from policylab.models.vocab import response_hidden

    torch.manual_seed(0)
    model, _ = load_policy(model_name)
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    V = model.get_output_embeddings().weight.shape[0]
    tokens = torch.randint(0, V, (rows, positions + 1))
    att = torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad():
        h, head, cap = response_hidden(model, tokens, att, 1)
        hr, head_r, cap_r = response_hidden(ref, tokens, att, 1)
    return h, head, hr, head_r, V


def _variant(args) -> dict:
    from policylab import SamplingSettings
    from policylab.models.vocab import head_stats

    torch.set_num_threads(2)
    h, head, hr, head_r, V = _setup(args.model, args.rows, args.positions)
    mask = torch.ones(h.shape[:2], dtype=torch.bool)
    import gc

    gc.collect()
    before = _rss_mb()
    current = _current_mb()
    t0 = time.perf_counter()
    with torch.no_grad(), _PeakSampler() as sampler:
        if args.variant == "naive":
            lp = torch.log_softmax(head(h).float(), -1)  # [B, T, V]
            lq = torch.log_softmax(head_r(hr).float(), -1)  # [B, T, V]
            kl = (lp.exp() * (lp - lq)).sum(-1)
        else:
            kl = head_stats(h, head, mask, sampling=SamplingSettings(), ref_hidden=hr, ref_head=head_r,
                            position_chunk=args.position_chunk, vocab_chunk=args.vocab_chunk)["kl"]
    secs = time.perf_counter() - t0
    after = _rss_mb()
    return {"variant": args.variant, "rows": args.rows, "positions": args.positions, "vocab": V,
            "position_chunk": args.position_chunk, "vocab_chunk": args.vocab_chunk,
            "peak_rss_before_mb": round(before, 1), "peak_rss_after_mb": round(after, 1),
            "peak_increase_mb": round(after - before, 1), "rss_before_mb": round(current, 1),
            "sampled_peak_increase_mb": round(sampler.peak - current, 1), "seconds": round(secs, 2),
            "kl_mean": float(kl.mean()), "kl_sum": float(kl.double().sum()),
            "one_BTV_fp32_tensor_mb": round(args.rows * args.positions * V * 4 / 2**20, 1),
            "one_block_fp32_mb": round(args.position_chunk * args.vocab_chunk * 4 / 2**20, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--positions", type=int, default=64)
    ap.add_argument("--position-chunk", type=int, default=512)
    ap.add_argument("--vocab-chunk", type=int, default=4096)
    ap.add_argument("--variant", choices=("naive", "chunked"))
    ap.add_argument("--out", default="full_vocab_kl")
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(_variant(args)))
        return
    rows = []
    for variant in ("chunked", "naive"):
        cmd = [sys.executable, __file__, "--variant", variant, "--model", args.model, "--rows", str(args.rows),
               "--positions", str(args.positions), "--position-chunk", str(args.position_chunk),
               "--vocab-chunk", str(args.vocab_chunk)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=os.environ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    ch, nv = rows
    diff = abs(ch["kl_sum"] - nv["kl_sum"]) / max(abs(nv["kl_sum"]), 1e-12)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"rows": rows, "relative_kl_sum_difference": diff},
                                                         indent=2))
    load = os.getloadavg()[0]
    lines = [
        "# Full-vocabulary KL per position: chunked vs naive [B, T, V] (peak memory)", "",
        f"Command: `.venv/bin/python benchmarks/full_vocab_kl.py --model {args.model} --rows {args.rows} "
        f"--positions {args.positions} --position-chunk {args.position_chunk} --vocab-chunk {args.vocab_chunk}`; "
        f"each variant in a fresh process, 2 threads, load average {load:.2f} at the end. Peak during the KL: "
        "the largest resident memory sampled every millisecond while it runs, minus the resident memory right "
        "before (model pair and hidden states already in memory); the process peak increase is ru_maxrss after "
        "minus before.", "",
        "| variant | positions (B x T) | V | block | peak during the KL, MB | process peak increase, MB "
        "| one [B, T, V] fp32 tensor, MB | s | KL mean |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        block = f"{r['position_chunk']} x {r['vocab_chunk']}" if r["variant"] == "chunked" else "-"
        lines.append(f"| {r['variant']} | {r['rows']} x {r['positions']} | {r['vocab']} | {block} | "
                     f"{r['sampled_peak_increase_mb']} | {r['peak_increase_mb']} | {r['one_BTV_fp32_tensor_mb']} | "
                     f"{r['seconds']} | "
                     f"{r['kl_mean']:.3e} |")
    lines += ["", f"Relative difference of the summed KL between the two: {diff:.2e} (fp32 logits in both; the "
              "chunked route accumulates in fp64).", "",
              "The chunked route's live tensors are a few blocks of position_chunk x vocab_chunk fp32 values "
              f"({ch['one_block_fp32_mb']} MB each here); resident memory can grow by less than that when the "
              "allocator reuses blocks it already holds. The naive route holds at least two [B, T, V] fp32 tensors "
              "(the two models' logits) and their softmax intermediates. Times are on a machine shared with other "
              "jobs (see the load average): compare them only within one run."]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
