"""Off-policy stress: a behavior policy that really differs from the learner's old policy,
with and without the corrections. Does uncorrected training degrade, and does a
correction change that?

    .venv/bin/python benchmarks/offpolicy_stress.py [--task arith1_add_mul] [--steps 30] [--eval-n 200]
        [--levels onpolicy,bf16,int8,int4,int4-row,stale1-mb4,stale2-mb4,int4-row+stale2-mb4]
        [--methods grpo,tis,icepop,mis,gmc,missing_old_logits] [--seeds 0]

Mismatch levels (rollout / train settings; the learner always trains in fp32):

    onpolicy            fp32 FastEngine, one update per batch: the reference, no mismatch
    bf16 / int8 / int4  the behavior engine samples from a bf16 / int8 / int4 (groups of 32)
                        copy of the weights (policylab.engines.quant): π_old ≠ μ at every token
    int4-row            int4 with one scale per output row: a coarser grid, more mismatch
    staleK-mbM          batches trained K rollout steps after sampling, M minibatches per
                        batch: the data is K·M to K·M + M − 1 optimizer steps behind
    A+B                 both at once

Procedure: the levels are tried in the order given; at each, the uncorrected run (GRPO,
no correction) is compared with the on-policy reference on held-out accuracy. The first
level where it is lower by more than 2 standard errors (binomial, both runs) is the
"degrading" level, and every correction runs there; if no level degrades the
uncorrected run, the corrections run at the last (largest) level and the report says
that nothing degraded. (--corrections-at LEVEL forces the level.)

Every run: same seed, task stream, budget (--steps rollout steps) and learning rate;
held-out accuracy is measured on the LEARNER's weights with an fp32 FastEngine (not the
quantized sampler), on --eval-n held-out prompts, T = 1, a fixed seed, before and after
training. Diagnostics on every trained batch, the same for every method (whatever it
corrects): with r = log π_old − log μ (engine) and r_tot = log π_θ(round start) − log μ
(total: engine and staleness),

    kl_k3      mean(e^r − 1 − r)                    estimate of KL(μ ‖ π)
    out_band   fraction of tokens with e^r outside IcePop's band [icepop_low, icepop_high]
    far        fraction with |e^r − 1| > 0.2
    ess        (Σw)² / (n Σw²) of w = e^r            1 = no reweighting needed

plus each correction's own logged diagnostics (fraction capped / masked, its ESS).
Writes benchmarks/results/offpolicy_stress.{json,md,png} (--out to change; --replot JSON
redraws the figure and markdown of a written report).

Interrupted? Every finished run is saved at once to <out>.partial.json; the same command
again reuses the finished runs whose settings match (task, budget, learning rate, seed and
the rest of the configuration) and runs the others. The partial file goes when the report
is written.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
RESULTS = HERE.parent / "results"
METHODS = ("grpo", "tis", "icepop", "mis", "gmc", "missing_old_logits")
DEFAULT_LEVELS = ("onpolicy", "bf16", "int8", "int4", "int4-row", "stale1-mb4", "stale2-mb4", "int4-row+stale2-mb4")


def level_settings(level: str) -> tuple[dict, dict]:
    """(rollout overrides, train overrides) of a level name (see the module doc)."""
    rollout, train = {}, {}
    for part in level.split("+"):
        if part == "onpolicy":
            continue
        if part in ("bf16", "int8", "int4"):
            rollout["engine_dtype"] = part
        elif part == "int4-row":
            rollout.update(engine_dtype="int4", engine_quant_group=0)
        elif part.startswith("stale") and "-mb" in part:
            k, m = part[len("stale"):].split("-mb")
            rollout["staleness"], train["minibatches"] = int(k), int(m)
        else:
            raise SystemExit(f"unknown level part {part!r} in {level!r}")
    return rollout, train


def task_section(name: str) -> tuple[dict, int]:
    """A candidate of benchmarks/base_accuracy.py by name, or a task section as JSON (its
    max new tokens then come from --max-new-tokens, default 16)."""
    if name.lstrip().startswith("{"):
        return json.loads(name), 16
    cands = _bench("base_accuracy").CANDIDATES
    if name not in cands:
        raise SystemExit(f"unknown --task {name!r}; choose from {', '.join(cands)} or give a task section as JSON")
    return cands[name]


def _bench(name: str):
    sys.path.insert(0, str(HERE.parent))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(HERE.parent))


def heldout(trainer, n: int, seed: int) -> dict:
    """The learner's held-out accuracy, sampled by an fp32 FastEngine on its own weights."""
    from policylab.engines.fast import FastEngine
    from policylab.eval.evaluate import evaluate

    ex = trainer.task.heldout(n)
    prompts = [trainer.encode(e.prompt) for e in ex]
    trainer.model.eval()
    res = evaluate(FastEngine(trainer.model, trainer.tokenizer), prompts, [e.answer for e in ex],
                   trainer.task.reward_fn, temperature=1.0, max_new_tokens=trainer.cfg.eval.max_new_tokens,
                   batch_size=50, seed=seed + 999)
    trainer.model.train()
    return {k: res[k] for k in ("accuracy", "accuracy_stderr", "mean_length", "n_prompts")}


def _diagnostics(batch, trainer, band) -> dict:
    import torch

    from policylab.kernels.corrections.diagnostics import ess, mismatch_stats

    out = {}
    m = batch.loss_mask
    if batch.logp_old is None or batch.logp_behavior is None or not bool(m.any()):
        return out
    pairs = {"engine": batch.logp_old}
    cur = batch.logp_current
    if cur is None:
        cur = trainer.worker.role_logprobs("logp_current", batch)
    pairs["total"] = cur
    for name, lp in pairs.items():
        st = mismatch_stats(lp, batch.logp_behavior, m)
        r = (lp - batch.logp_behavior).double()
        w = torch.where(m, r.exp(), torch.zeros_like(r))
        out[f"{name}/kl_k3"] = float(st["kl_k3"])
        out[f"{name}/far"] = float(st["frac_far"])
        out[f"{name}/out_band"] = float(((w[m] < band[0]) | (w[m] > band[1])).double().mean())
        out[f"{name}/ess"] = float(ess(w, m))
    return out


def run_one(task: dict, max_new: int, method: str, level: str, a, seed: int) -> dict:
    from policylab import methods
    from policylab.trainer.config import config_from_dict
    from policylab.trainer.loop import Trainer

    rollout, train = level_settings(level)
    with tempfile.TemporaryDirectory() as d:
        cfg = config_from_dict({
            "method": method, "model": a.model, "run_dir": d, "seed": seed,
            "method_params": {"kl_coef": 0.0}, "task": task,
            "rollout": {"prompts_per_step": a.prompts, "group_size": a.group, "max_new_tokens": max_new, **rollout},
            "train": {"steps": a.steps, "lr": a.lr, "micro_batch_size": a.micro_batch, **train},
            "eval": {"n": a.eval_n, "max_new_tokens": max_new}, "log": {"tensorboard": False, "progress": False},
        })
        tr = Trainer(cfg)
        band = (methods.get("icepop").p.icepop_low, methods.get("icepop").p.icepop_high)
        diag_rows: list[dict] = []
        inner = tr.round_inputs

        def observed(batch):
            diag_rows.append(_diagnostics(batch, tr, band))
            return inner(batch)

        tr.round_inputs = observed
        base = heldout(tr, a.eval_n, seed)
        rows, t0 = [], time.perf_counter()
        for _ in range(a.steps):
            rows.append(tr.train_step())
            print(f"  [{method} @ {level}] step {len(rows)}: reward {rows[-1].get('reward/mean', float('nan')):.3f} "
                  f"({rows[-1].get('time/step_s', 0):.1f}s)", flush=True)
        seconds = time.perf_counter() - t0
        final = heldout(tr, a.eval_n, seed)
    trained = [r for r in rows if "loss/policy" in r]

    def mean(key, rs):
        vals = [r[key] for r in rs if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        return statistics.fmean(vals) if vals else None

    own = {k: mean(k, trained) for k in sorted({k for r in trained for k in r})
           if k.startswith("correction/") and k.rsplit("/", 1)[-1] in ("frac_capped", "frac_masked", "ess",
                                                                       "ess_after", "kl_k3", "frac_far")}
    diag = {k: mean(k, diag_rows) for k in sorted({k for r in diag_rows for k in r})}
    return {"method": method, "level": level, "seed": seed, "rollout": rollout, "train": train, "steps": a.steps,
            "seconds": round(seconds, 1), "base": base, "final": final,
            "reward_first3": mean("reward/mean", rows[:3]), "reward_last3": mean("reward/mean", trained[-3:]),
            "versions_behind_mean": mean("staleness/versions_behind_mean", trained),
            "skipped_steps": sum(1 for r in rows if r.get("skipped_nonfinite") or r.get("skipped_no_signal")),
            "diagnostics": diag, "correction_diagnostics": own}


def degraded(run: dict, ref: dict) -> tuple[bool, float, float]:
    d = ref["final"]["accuracy"] - run["final"]["accuracy"]
    se = math.sqrt(ref["final"]["accuracy_stderr"] ** 2 + run["final"]["accuracy_stderr"] ** 2)
    return d > 2 * se, d, se


def to_markdown(report: dict) -> str:
    lines = ["# Off-policy stress: corrections where the behavior policy really differs", "",
             f"Command: `{report['command']}`  ", f"Machine: {report['machine']}  ",
             f"Configuration: {report['config']}", ""]
    if report.get("smoke"):
        lines += ["**A short smoke run (few steps, few held-out prompts): it shows the script works end to end; "
                  "its accuracies are not a result.**", ""]
    lines += ["Mismatch ladder (the uncorrected run against the on-policy reference):", "",
              "| level | held-out after (uncorrected) | vs on-policy | engine kl_k3 | engine out of band | engine ESS | "
              "total kl_k3 | total out of band | total ESS | versions behind |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(x, p=4):
        return "-" if x is None else f"{x:.{p}f}"

    for lv in report["ladder"]:
        r = report["runs"][f"grpo@{lv['level']}"]
        dg = r["diagnostics"]
        vs_ref = "-" if lv["level"] == report["reference"] else (
            f"{-100 * lv['drop']:+.1f} ± {100 * lv['se']:.1f}" + (" DEGRADED" if lv["degraded"] else ""))
        lines.append(f"| {lv['level']} | {100 * r['final']['accuracy']:.1f}% ± {100 * r['final']['accuracy_stderr']:.1f} | "
                     f"{vs_ref} | "
                     f"{f(dg.get('engine/kl_k3'), 5)} | {f(dg.get('engine/out_band'))} | {f(dg.get('engine/ess'))} | "
                     f"{f(dg.get('total/kl_k3'), 5)} | {f(dg.get('total/out_band'))} | {f(dg.get('total/ess'))} | "
                     f"{f(r['versions_behind_mean'], 1)} |")
    lines += ["", report["verdict"], "", f"At level `{report['corrections_level']}`:", "",
              "| method | held-out base | held-out after | reward first 3 / last 3 steps | own diagnostics (run means) |",
              "|---|---:|---:|---|---|"]
    for key, r in report["runs"].items():
        if r["level"] != report["corrections_level"]:
            continue
        own = ", ".join(f"{k.split('/', 1)[1]}={v:.4g}" for k, v in r["correction_diagnostics"].items() if v is not None)
        lines.append(f"| {r['method']} | {100 * r['base']['accuracy']:.1f}% | {100 * r['final']['accuracy']:.1f}% ± "
                     f"{100 * r['final']['accuracy_stderr']:.1f} | {f(r['reward_first3'], 3)} / {f(r['reward_last3'], 3)}"
                     f" | {own or '-'} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    """Two panels: the ladder (uncorrected held-out accuracy at each mismatch level, with its
    k3 mismatch KL), and every method's held-out accuracy at the corrections' level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    ref = report["runs"][f"grpo@{report['reference']}"]["final"]
    levels = [lv["level"] for lv in report["ladder"]]
    acc = [100 * report["runs"][f"grpo@{lv}"]["final"]["accuracy"] for lv in levels]
    err = [200 * report["runs"][f"grpo@{lv}"]["final"]["accuracy_stderr"] for lv in levels]
    a.errorbar(range(len(levels)), acc, yerr=err, marker="o", capsize=4, color="tab:red", label="uncorrected (grpo)")
    a.axhline(100 * ref["accuracy"], color="gray", ls="--", lw=1, label="on-policy reference")
    for i, lv in enumerate(levels):
        kl = report["runs"][f"grpo@{lv}"]["diagnostics"].get("total/kl_k3")
        if kl is not None:
            a.annotate(f"KL {kl:.3g}", (i, acc[i]), textcoords="offset points", xytext=(6, 6), fontsize=8)
    a.set_xticks(range(len(levels)), levels, rotation=20, fontsize=8)
    a.set_ylabel("held-out accuracy after training (%)")
    a.set_title("mismatch ladder (± 2 s.e.)", fontsize=10)
    a.set_ylim(0, 100)
    a.legend(fontsize=8)
    lvl = report["corrections_level"]
    rows = [r for r in report["runs"].values() if r["level"] == lvl]
    names = [r["method"] for r in rows]
    vals = [100 * r["final"]["accuracy"] for r in rows]
    errs = [200 * r["final"]["accuracy_stderr"] for r in rows]
    colors = ["tab:red" if n == "grpo" else "tab:blue" for n in names]
    b.bar(range(len(names)), vals, yerr=errs, capsize=4, color=colors)
    b.axhline(100 * ref["accuracy"], color="gray", ls="--", lw=1, label=f"on-policy reference ({report['reference']})")
    b.axhline(100 * rows[0]["base"]["accuracy"], color="k", ls=":", lw=1, label="before training")
    b.set_xticks(range(len(names)), [("uncorrected" if n == "grpo" else n) for n in names], rotation=20, fontsize=8)
    b.set_title(f"corrections at {lvl} (± 2 s.e.)", fontsize=10)
    b.set_ylim(0, 100)
    b.legend(fontsize=8)
    fig.suptitle("Off-policy stress: " + report["config"].split(",")[0], fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="arith1_add_mul",
                    help="a candidate of benchmarks/base_accuracy.py, or a task section as JSON")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the task candidate's")
    ap.add_argument("--levels", default=",".join(DEFAULT_LEVELS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--corrections-at", default=None, help="run the corrections at this level (no search)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--smoke", action="store_true", help="mark the report as a smoke run (no result claimed)")
    ap.add_argument("--out", default=str(RESULTS / "offpolicy_stress"), help="results path without suffix ('' = none)")
    ap.add_argument("--replot", default=None, metavar="JSON",
                    help="only redraw the figure and the markdown of a written report (no run)")
    a = ap.parse_args(argv)
    if a.replot:
        src = Path(a.replot)
        report = json.loads(src.read_text())
        src.with_suffix(".md").write_text(to_markdown(report))
        plot(report, src.with_suffix(".png"))
        return report
    import torch

    torch.set_num_threads(int(os.environ.get("POLICYLAB_BENCH_THREADS", "2")))
    task, max_new = task_section(a.task)
    max_new = a.max_new_tokens or max_new
    levels = [x for x in a.levels.split(",") if x]
    for lv in levels:
        level_settings(lv)  # refuse a bad name before anything runs
    meths = [m for m in a.methods.split(",") if m]
    if meths[0] != "grpo":
        raise SystemExit("--methods must start with grpo (the uncorrected run)")
    seed = int(a.seeds.split(",")[0])
    reference = levels[0]
    config = (f"task {a.task}, {a.prompts} prompts x {a.group} samples, <= {max_new} new tokens, lr {a.lr}, "
              f"{a.steps} rollout steps per run, seed {seed}, held-out {a.eval_n} prompts (fp32 sampler on the "
              "learner's weights)")
    fingerprint = {"config": config, "model": a.model, "micro_batch": a.micro_batch, "smoke": a.smoke}
    partial = Path(a.out).with_suffix(".partial.json") if a.out else None
    done: dict = {}
    if partial is not None and partial.is_file():
        try:
            saved = json.loads(partial.read_text())
        except ValueError as exc:
            raise SystemExit(f"{partial} is not readable JSON ({exc}): delete it to start again") from None
        if saved.get("fingerprint") == fingerprint:
            done = saved.get("runs", {})
            print(f"reusing {len(done)} finished run(s) from {partial}: {', '.join(done) or '-'}", flush=True)
        else:
            print(f"{partial} holds runs of another configuration: not reused (it is overwritten)", flush=True)
    runs: dict = {}
    ladder = []

    def run(method, level):
        key = f"{method}@{level}"
        if key not in runs and key in done:
            runs[key] = done[key]
        elif key not in runs:
            print(f"== {key}", flush=True)
            runs[key] = run_one(task, max_new, method, level, a, seed)
            if partial is not None:
                partial.parent.mkdir(parents=True, exist_ok=True)
                tmp = partial.with_suffix(".tmp")
                tmp.write_text(json.dumps({"fingerprint": fingerprint, "runs": {**done, **runs}}, indent=2))
                os.replace(tmp, partial)
            r = runs[key]
            print(f"{key}: held-out {r['base']['accuracy']:.3f} -> {r['final']['accuracy']:.3f}; "
                  f"diagnostics {json.dumps({k: round(v, 5) for k, v in r['diagnostics'].items() if v is not None})}",
                  flush=True)
        return runs[key]

    ref = run("grpo", reference)
    ladder.append({"level": reference, "degraded": False, "drop": 0.0, "se": 0.0})
    chosen = a.corrections_at
    if chosen is None:
        for lv in levels[1:]:
            r = run("grpo", lv)
            bad, d, se = degraded(r, ref)
            ladder.append({"level": lv, "degraded": bad, "drop": d, "se": se})
            if bad:
                chosen = lv
                break
        else:
            chosen = levels[-1]
    else:
        r = run("grpo", chosen)
        bad, d, se = degraded(r, ref)
        ladder.append({"level": chosen, "degraded": bad, "drop": d, "se": se})
    hit = next((x for x in ladder if x["level"] == chosen), None)
    if hit and hit["degraded"]:
        verdict = (f"The uncorrected run degrades at `{chosen}`: held-out accuracy {100 * hit['drop']:.1f} points below "
                   f"the on-policy reference (> 2 s.e. = {200 * hit['se']:.1f}); the corrections run there.")
    else:
        verdict = (f"No level tried degraded the uncorrected run by more than 2 s.e. of held-out accuracy; the largest "
                   f"mismatch tried is `{chosen}`, where the corrections run.")
    for m in meths[1:]:
        run(m, chosen)
    vs = _bench("vs_trl")
    report = {
        "command": "python benchmarks/offpolicy_stress.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": vs.machine() + f", load average {os.getloadavg()[0]:.2f}",
        "config": config,
        "smoke": a.smoke, "reference": reference, "ladder": ladder, "corrections_level": chosen, "verdict": verdict,
        "runs": runs,
    }
    print(verdict)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=2))
        out.with_suffix(".md").write_text(to_markdown(report))
        plot(report, out.with_suffix(".png"))
        if partial is not None:
            partial.unlink(missing_ok=True)
    return report


if __name__ == "__main__":
    main()
