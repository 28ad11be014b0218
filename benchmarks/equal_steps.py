"""Held-out accuracy at equal steps, between groups of seeds: does the fast mode learn as
much per step as exact fp32, and if not, is it the bf16 sampler's draws or TIS's reweighting?

    .venv/bin/python benchmarks/equal_steps.py [--arm NAME=DIR:SIDE ...] [--window 100,200]
                                               [--out benchmarks/results/equal_steps]

Reads finished runs of benchmarks/learn_vs_trl.py from its parts directories (one JSON per
side and seed; each holds the run's held-out evaluations by step). An arm is a set of such
runs: `--arm exact=benchmarks/results/learn_vs_trl_exact_parts:policylab` takes every
`policylab-seed*.json` there; an arm may be given several times to pool directories. The
default arms are the ones benchmarks/results/PENDING_RUNS.md fixes for issue 26 ("The fast
mode's equal-steps gap").

The decision statistic, fixed before the runs: per run, the mean of its held-out accuracies
at the evaluations whose step lies in the window (default steps 100-200: five evaluations of
200 prompts each when evaluated every 25 steps). Per arm: the mean over its seeds and the
standard error from their spread. Two arms: the difference of the means, its Welch standard
error sqrt(s_a^2/n_a + s_b^2/n_b), the Welch-Satterthwaite degrees of freedom (rounded
down, so the interval is a little wider than exact) and the two-sided 95% t interval. A
comparison "contains 0" when the interval does; the report also gives the accuracy at the
window's last step, the per-seed values and a figure of every run.

Reported beside it (added after the rule was fixed, so not the decision statistic): each
run's mean training reward over the steps in the window (lo, hi] (on the prompts the step
trained on, scored on the samples its own sampler drew: 100 steps x 32 samples; a seed's
arms train on the same prompt stream), compared the same way.

No timing: the runs' seconds are not read (parts from different hosts and loads can be
pooled; their steps are comparable, their seconds are not).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
RESULTS = HERE.parent / "results"

from policylab.experiments.evidence.verdict import mean_se, t_crit

DEFAULT_ARMS = [
    "exact=benchmarks/results/learn_vs_trl_sampler_only_parts:policylab",
    "exact=benchmarks/results/learn_vs_trl_exact_parts:policylab",
    "exact=benchmarks/results/learn_vs_trl_exact_dual_eval_parts:policylab",
    "fast=benchmarks/results/learn_vs_trl_bf16_backward_parts:policylab-fast",
    "fast=benchmarks/results/learn_vs_trl_fast_dual_eval_parts:policylab-fast",
    "uncorrected=benchmarks/results/learn_vs_trl_uncorrected_parts:policylab-fast",
    "fast-fp32-training=benchmarks/results/learn_vs_trl_sampler_only_parts:policylab-fast",
]
# (a, b): the report's comparisons a − b, the first one the issue's question
# per run: the window's mean accuracy (the decision statistic), the accuracy at the window's
# last step, the training reward and the bf16 − fp32 evaluation gap (both beside it)
STATISTICS = ("window", "final", "train_reward", "engine_gap")
COMPARISONS = [("fast", "exact"), ("uncorrected", "exact"), ("fast", "uncorrected"), ("fast-fp32-training", "exact")]


def parse_arm(spec: str) -> tuple[str, Path, str]:
    """'NAME=DIR:SIDE' -> (NAME, DIR, SIDE), with a clear error for anything else."""
    name, eq, rest = spec.partition("=")
    directory, colon, side = rest.rpartition(":")
    if not (eq and colon and name and directory and side):
        raise SystemExit(f"--arm {spec!r}: expected NAME=DIR:SIDE (e.g. exact=benchmarks/results/x_parts:policylab)")
    return name, Path(directory), side


def load_arms(specs: list[str], root: Path = Path(".")) -> dict[str, list[dict]]:
    """Every run of every arm, in order of its spec and then its seed. A directory that does
    not exist contributes nothing (an arm not yet run is reported as such, not invented); a
    seed found twice in one arm is an error (pooled directories must not overlap)."""
    arms: dict[str, list[dict]] = {}
    for spec in specs:
        name, directory, side = parse_arm(spec)
        runs = arms.setdefault(name, [])
        d = directory if directory.is_absolute() else root / directory
        files = sorted(d.glob(f"{side}-seed*.json"), key=lambda p: int(p.stem.rsplit("seed", 1)[1])) \
            if d.is_dir() else []
        for f in files:
            run = json.loads(f.read_text())
            if any(r["seed"] == run["seed"] for r in runs):
                raise SystemExit(f"arm {name}: seed {run['seed']} found twice (again in {f})")
            run["source"] = str(directory / f.name)
            runs.append(run)
    return arms


def window_mean(points: list[dict], lo: int, hi: int) -> float | None:
    """Mean held-out accuracy over the evaluations with lo <= step <= hi; None when the run
    has none there or did not reach `hi` (a shorter run is not compared with longer ones)."""
    if not points or points[-1]["step"] < hi:
        return None
    acc = [p["accuracy"] for p in points if lo <= p["step"] <= hi]
    return sum(acc) / len(acc) if acc else None


def train_reward_mean(steps: list[dict], lo: int, hi: int) -> float | None:
    """Mean training reward over steps lo+1 .. hi (the run's `steps` list: step k is entry
    k-1); None when the run did not reach `hi` or a step in it has no reward."""
    if len(steps) < hi or hi <= lo:
        return None
    rewards = [x.get("reward") for x in steps[lo:hi]]
    if any(r is None for r in rewards):
        return None
    return sum(rewards) / len(rewards)


def engine_gap(points: list[dict], lo: int, hi: int) -> float | None:
    """Mean over the window's evaluations of accuracy_bf16 − accuracy (the same model, prompts
    and random numbers sampled by the bf16 engine and by fp32: runs with --eval-bf16); None
    for a run without it or that did not reach `hi`."""
    if not points or points[-1]["step"] < hi:
        return None
    d = [p["accuracy_bf16"] - p["accuracy"] for p in points if lo <= p["step"] <= hi and "accuracy_bf16" in p]
    return sum(d) / len(d) if d else None


def at_step(points: list[dict], step: int) -> float | None:
    for p in points:
        if p["step"] == step:
            return p["accuracy"]
    return None


def summarize(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    m, se = mean_se(values)
    return {"n": len(values), "mean": m, "se": se, "values": values}


def welch(a: list[float], b: list[float]) -> dict:
    """Difference of means a − b with the Welch standard error, the Welch-Satterthwaite
    degrees of freedom (floored) and the two-sided 95% t interval. Needs two values per arm."""
    out = {"n_a": len(a), "n_b": len(b)}
    if len(a) < 2 or len(b) < 2:
        return {**out, "diff": None, "why": "an arm with fewer than 2 seeds has no spread"}
    ma, sa = mean_se(a)
    mb, sb = mean_se(b)
    va, vb = sa * sa, sb * sb  # squared standard errors s^2 / n
    se = math.sqrt(va + vb)
    diff = ma - mb
    if se == 0.0:
        return {**out, "diff": diff, "se": 0.0, "df": None, "lo": diff, "hi": diff, "contains_0": diff == 0.0}
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    k = t_crit(max(1, math.floor(df)))
    lo, hi = diff - k * se, diff + k * se
    return {**out, "diff": diff, "se": se, "df": df, "t_crit": k, "lo": lo, "hi": hi, "contains_0": lo <= 0.0 <= hi}


def analyze(arms: dict[str, list[dict]], lo: int, hi: int) -> dict:
    per_arm = {}
    for name, runs in arms.items():
        rows = []
        for r in runs:
            rows.append({"seed": r["seed"], "window": window_mean(r["points"], lo, hi),
                         "train_reward": train_reward_mean(r.get("steps", []), lo, hi),
                         "engine_gap": engine_gap(r["points"], lo, hi),
                         "final": at_step(r["points"], hi), "train_dtype": r.get("train_dtype"),
                         "engine": r.get("engine"), "corrections": r.get("corrections"), "source": r["source"]})
        used = [x for x in rows if x["window"] is not None]  # runs that reached the window's end
        per_arm[name] = {"runs": rows, **{k: summarize([x[k] for x in used if x[k] is not None]) for k in STATISTICS}}
    comps = []
    for a, b in COMPARISONS:
        if a in per_arm and b in per_arm:
            comps.append({"a": a, "b": b, **{k: welch(per_arm[a][k].get("values", []), per_arm[b][k].get("values", []))
                                             for k in STATISTICS}})
    return {"window": [lo, hi], "arms": per_arm, "comparisons": comps}


def _pts(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}"


def to_markdown(report: dict, command: str) -> str:
    lo, hi = report["window"]
    lines = ["# Held-out accuracy at equal steps: the fast mode, its sampler without TIS, and exact fp32", "",
             f"Command: `{command}`  ", f"Statistic: per run, the mean held-out accuracy over its evaluations at "
             f"steps {lo}-{hi}; per arm, the mean over seeds ± the standard error of their spread; arms compared by "
             "the difference of means with Welch's standard error and a 95% t interval (points of accuracy).", "",
             "| arm | seeds | engine / train dtype / corrections | window mean per seed (%) | arm mean ± s.e. (%) | "
             f"step {hi} mean (%) | training reward, steps {lo + 1}-{hi}, per seed (%) |",
             "|---|---|---|---|---:|---:|---|"]
    for name, arm in report["arms"].items():
        runs = [r for r in arm["runs"] if r["window"] is not None]
        if not runs:
            lines.append(f"| {name} | none finished | | | | | |")
            continue
        kinds = sorted({f"{r['engine']} / {r['train_dtype']} / {', '.join(r['corrections'] or []) or 'none'}"
                        for r in runs})
        w, f = arm["window"], arm["final"]
        se = "" if w["se"] is None else f" ± {100 * w['se']:.1f}"
        per_seed = ", ".join(f"{100 * r['window']:.1f}" for r in runs)
        final = f"{100 * f['mean']:.1f}" if f.get("n") else "n/a"
        reward = ", ".join("n/a" if r["train_reward"] is None else f"{100 * r['train_reward']:.1f}" for r in runs)
        lines.append(f"| {name} | {', '.join(str(r['seed']) for r in runs)} | {'; '.join(kinds)} | {per_seed} | "
                     f"{100 * w['mean']:.1f}{se} | {final} | {reward} |")
    lines += ["", "| comparison | window: difference [95% interval] (points) | contains 0 | "
              f"step {hi}: difference [95% interval] | training reward: difference [95% interval] (beside) |",
              "|---|---:|---|---:|---:|"]
    for c in report["comparisons"]:
        cells = []
        for key in ("window", "final", "train_reward"):
            x = c[key]
            cells.append("n/a (" + x["why"] + ")" if x.get("diff") is None else
                         f"{_pts(x['diff'])} ± {100 * x['se']:.1f} [{_pts(x['lo'])}, {_pts(x['hi'])}]")
        w = c["window"]
        inside = "" if w.get("diff") is None else ("yes" if w["contains_0"] else "no")
        lines.append(f"| {c['a']} − {c['b']} | {cells[0]} | {inside} | {cells[1]} | {cells[2]} |")
    gaps = {n: a for n, a in report["arms"].items() if a["engine_gap"].get("n")}
    if gaps:
        lines += ["", f"Runs evaluated by both engines (`--eval-bf16`): per run, the mean over steps {lo}-{hi} of the "
                  "bf16 engine's accuracy minus the fp32 engine's (same model, prompts and random numbers).", "",
                  "| arm | seeds | bf16 − fp32 evaluation per seed (points) | arm mean ± s.e. |", "|---|---|---|---:|"]
        for name, arm in gaps.items():
            runs = [r for r in arm["runs"] if r["engine_gap"] is not None]
            g = arm["engine_gap"]
            se = "" if g["se"] is None else f" ± {100 * g['se']:.1f}"
            lines.append(f"| {name} | {', '.join(str(r['seed']) for r in runs)} | "
                         f"{', '.join(_pts(r['engine_gap']) for r in runs)} | {_pts(g['mean'])}{se} |")
        for c in report["comparisons"]:
            x = c["engine_gap"]
            if x.get("diff") is not None:
                lines.append(f"\n{c['a']} − {c['b']}: {_pts(x['diff'])} ± {100 * x['se']:.1f} "
                             f"[{_pts(x['lo'])}, {_pts(x['hi'])}] points")
    lines += ["", "![held-out accuracy by step, every run](" + report.get("figure", "equal_steps.png") + ")", ""]
    return "\n".join(lines)


def plot(arms: dict[str, list[dict]], report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"exact": "tab:blue", "fast": "tab:red", "uncorrected": "tab:orange", "fast-fp32-training": "tab:green"}
    fig, (ax, cx, bx) = plt.subplots(1, 3, figsize=(17, 4.5), gridspec_kw={"width_ratios": [3, 3, 2]})
    names = [n for n in arms if arms[n]]
    for i, name in enumerate(names):
        col = colors.get(name, f"C{i}")
        for r in arms[name]:
            ax.plot([p["step"] for p in r["points"]], [100 * p["accuracy"] for p in r["points"]], color=col, alpha=0.35,
                    lw=1)
        steps = sorted({p["step"] for r in arms[name] for p in r["points"]})
        mean = [sum(100 * p["accuracy"] for r in arms[name] for p in r["points"] if p["step"] == s) /
                max(1, sum(1 for r in arms[name] for p in r["points"] if p["step"] == s)) for s in steps]
        ax.plot(steps, mean, color=col, lw=2.5, label=f"{name} (mean of {len(arms[name])} seeds)")
        rewards = [[x.get("reward") for x in r.get("steps", [])] for r in arms[name]]
        n = min((len(x) for x in rewards), default=0)
        if n and all(v is not None for x in rewards for v in x[:n]):
            mean_r = [sum(x[k] for x in rewards) / len(rewards) for k in range(n)]
            k = 20  # a 20-step moving average of the seeds' mean: one step is 32 samples
            smooth = [100 * sum(mean_r[j - k + 1: j + 1]) / k for j in range(k - 1, n)]
            cx.plot(range(k, n + 1), smooth, color=col, lw=2, label=name)
        w = report["arms"][name]["window"]
        vals = w.get("values", [])
        bx.scatter([i] * len(vals), [100 * v for v in vals], color=col, alpha=0.6)
        if w.get("n", 0) >= 2:
            bx.errorbar([i + 0.15], [100 * w["mean"]], yerr=[200 * w["se"]], color=col, fmt="o", capsize=4)
    lo, hi = report["window"]
    ax.axvspan(lo, hi, color="0.9", zorder=0)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out accuracy (%)")
    ax.legend(fontsize=8)
    ax.set_title("every run (thin) and each arm's mean (thick); shaded: the window")
    cx.set_xlabel("step")
    cx.set_ylabel("training reward (%)")
    cx.set_title("training reward, mean of seeds, 20-step moving average")
    cx.legend(fontsize=8)
    bx.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    bx.set_ylabel(f"mean accuracy, steps {lo}-{hi} (%)")
    bx.set_title("per seed, and arm mean ± 2 s.e.")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", action="append", help="NAME=DIR:SIDE (repeatable; default: issue 26's arms)")
    ap.add_argument("--window", default="100,200", help="first and last step of the window, e.g. 100,200")
    ap.add_argument("--root", default=str(HERE.parent.parent), help="directory the arms' relative paths start from")
    ap.add_argument("--out", default=str(RESULTS / "equal_steps"), help="results path without suffix")
    a = ap.parse_args(argv)
    try:
        lo, hi = (int(x) for x in a.window.split(","))
    except ValueError:
        raise SystemExit(f"--window {a.window!r}: expected two step numbers, e.g. 100,200") from None
    if not 0 <= lo <= hi:
        raise SystemExit(f"--window {a.window!r}: needs 0 <= first <= last")
    arms = load_arms(a.arm or DEFAULT_ARMS, Path(a.root))
    if not any(arms.values()):
        raise SystemExit("no finished run in any arm's directory: nothing to compare")
    report = analyze(arms, lo, hi)
    out = Path(a.out)
    report["figure"] = out.with_suffix(".png").name
    command = " ".join(["python benchmarks/equal_steps.py", *(sys.argv[1:] if argv is None else argv)])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(to_markdown(report, command))
    plot(arms, report, out.with_suffix(".png"))
    for c in report["comparisons"]:
        w = c["window"]
        if w.get("diff") is not None:
            print(f"{c['a']} - {c['b']}: {_pts(w['diff'])} points [{_pts(w['lo'])}, {_pts(w['hi'])}] "
                  f"(n = {w['n_a']}, {w['n_b']})")
    return report


if __name__ == "__main__":
    main()
