"""Every registered method, a few real optimizer steps on the embedded SmolLM2-135M-Instruct.

    .venv/bin/python benchmarks/methods_real.py [--steps 2] [--only NAME ...]

Not a learning claim (a few steps prove plumbing, not improvement): it records that each
recipe runs end to end on the real model — rollout, rewards, role passes, advantages, its
objective/correction, an optimizer step — with finite metrics, and what it logged.
Writes benchmarks/results/methods_real.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch

from policylab.experiments.exercise import exercise_settings
from policylab import methods
from policylab.trainer.config import config_from_dict
from policylab.trainer.loop import Trainer

RESULTS = Path(__file__).parent / "results"
# budget choices of this benchmark (a short run): one value-pretraining step for vapo
BUDGET = {"vapo": {"method_params": {"value_pretrain_steps": 1}},
          # code_opt's replies are whole functions: fewer new tokens than its exercise, 2 prompts a step and
          # smaller micro-batches keep a step within this machine's time and memory (same update up to rounding)
          "code_opt": {"rollout": {"max_new_tokens": 64, "prompts_per_step": 2}, "train": {"micro_batch_size": 4}},
          **{n: {"train": {"micro_batch_size": 4}} for n in ("rlcr", "mad_rl", "rlcpr", "rfpo")}}


def settings(name: str, workdir: str) -> dict:
    """The settings a method needs to do anything (its spec's `exercise`, e.g. a bf16
    behavior engine for the mismatch corrections, and what must be made first, e.g. RFPO's
    critic trained on the embedded model's rollouts into `workdir`), plus this
    benchmark's budget choices."""
    out = exercise_settings(name, model="embedded", workdir=workdir, budget="real")
    for k, v in BUDGET.get(name, {}).items():
        out[k] = {**out.get(k, {}), **v}
    return out


def run(name: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        extra = settings(name, d)
        cfg = config_from_dict({
            "method": name, "model": "embedded", "run_dir": d, "seed": 0,
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 12, **extra.get("rollout", {})},
            "train": {"steps": steps, "lr": 1e-5, "micro_batch_size": 16, **extra.get("train", {})},
            "method_params": extra.get("method_params", {}),
            **({"task": extra["task"]} if "task" in extra else {}),
            "log": {"tensorboard": False, "progress": False},
            # any other section the method is exercised under (e.g. its task) as given
            **{k: v for k, v in extra.items() if k not in ("rollout", "train", "method_params", "log")},
        })
        tr = Trainer(cfg)
        t0, rows = time.perf_counter(), []
        for _ in range(steps):
            rows.append(tr.train_step())
        secs = time.perf_counter() - t0
        made = {}
        path = extra.get("method_params", {}).get("critic_path")
        if path:  # a critic made for this run in the temporary directory: record what it is, not where
            made["critic"] = json.loads((Path(path) / "critic.json").read_text())["calibration"]
            extra = {**extra, "method_params": {**extra["method_params"], "critic_path": "(trained for this run)"}}
    finite = all(math.isfinite(v) for r in rows for k, v in r.items() if isinstance(v, float))
    trained = [r for r in rows if "loss/policy" in r]
    return {
        "method": name, "settings": extra, "engine": tr.engine.engine_name, "steps": steps,
        "seconds": round(secs, 1),
        "optimizer_steps": sum(int(r.get("optimizer_steps", 0)) for r in trained),
        "policy_version": tr.policy_version, "skipped": sum(r.get("skipped_nonfinite", 0) for r in rows),
        "reward": [round(r.get("reward/mean", float("nan")), 3) for r in rows],
        "loss_policy": [round(r["loss/policy"], 4) for r in trained],
        "grad_norm": [round(r["grad_norm"], 3) for r in trained if "grad_norm" in r],
        "all_metrics_finite": finite,
        **({"made": made} if made else {}),
        **({"method_metrics": method_metrics(rows)} if method_metrics(rows) else {}),
    }


# the metrics a method's own stages log (beyond reward, loss and gradient norm)
_OWN = ("accuracy", "calibration/", "distribution/", "rlcpr/", "code/", "rfpo/")


def method_metrics(rows: list[dict]) -> dict:
    keys = sorted({k for r in rows for k in r if k.startswith(_OWN)})
    return {k: [round(float(r[k]), 4) if k in r else None for r in rows] for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--out", default="methods_real", help="results file stem in benchmarks/results/ (json and md)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    names = [n for n in methods.names() if not args.only or n in args.only]
    path = RESULTS / f"{args.out}.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    for name in names:
        print(f"== {name}", flush=True)
        out[name] = run(name, args.steps)
        print(json.dumps(out[name]), flush=True)
        RESULTS.mkdir(exist_ok=True)
        path.write_text(json.dumps(out, indent=2))
    lines = ["# Every method on SmolLM2-135M-Instruct: real optimizer steps (plumbing, not learning)", "",
             "Command: `.venv/bin/python benchmarks/methods_real.py --steps N --only NAME ...` (N per row in the "
             "`steps` column); 4 prompts x 4 samples, 12 new tokens, lr 1e-5, single-digit + and x, seed 0. "
             "With `staleness` k the first k steps only sample (nothing trained yet). The `s` column is wall time "
             "on a machine shared with other jobs, with the engine of its day (rows before the FastEngine was "
             "wired into the trainer used HF generate, under bf16 autocast for the mismatch engine): not a speed "
             "measurement (see benchmarks/vs_trl.py for that).", "",
             "| method | settings | engine | steps | optimizer steps | skipped | reward per step | policy loss "
             "| grad norm | finite | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in sorted(out.items()):
        lines.append(f"| `{name}` | {json.dumps(r['settings']) if r['settings'] else '-'} | {r.get('engine', 'hf')} | "
                     f"{r['steps']} | {r['optimizer_steps']} | "
                     f"{int(r['skipped'])} | {r['reward']} | {r['loss_policy']} | {r['grad_norm']} | "
                     f"{r['all_metrics_finite']} | {r['seconds']} |")
    own = [(n, r) for n, r in sorted(out.items()) if r.get("method_metrics") or r.get("made")]
    if own:
        lines += ["", "## What the reward stages logged (per step)", ""]
        for n, r in own:
            lines.append(f"- `{n}`: " + "; ".join(f"{k} {v}" for k, v in r.get("method_metrics", {}).items()))
            if r.get("made"):
                lines.append(f"  - made first: {json.dumps(r['made'])}")
    lines += ["", "A policy loss of 0.0 with a nonzero grad norm (grpo-style sequence-mean aggregation, one on-policy "
                  "update) is expected: at ratio 1 the loss value is −mean(A), and group-centred advantages sum to "
                  "0; the gradient Σ A ∇log π is not zero."]
    same = [n for n in ("tis", "icepop", "minirl") if n in out]
    if len(same) > 1 and len({json.dumps(out[n]["loss_policy"]) for n in same}) == 1:
        lines += ["", f"{', '.join(same)} have identical rows: with no token above the TIS cap or outside the "
                      "IcePop band, all three weight each token by the same engine ratio π_old/μ (their "
                      "diagnostics in offpolicy.md show how rarely the cap and the band bind at this scale)."]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
