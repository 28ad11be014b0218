"""compare.md: the comparison's report as a page (what was run, the accuracy table, the
verdict, the same-prompts check, the notes and one row per run)."""

from __future__ import annotations

from policylab.experiments.compare.plan import BUDGET_UNITS


def _pct(x, se=None) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" + (f" ± {100 * se:.1f}" if se is not None else "")


def to_markdown(report: dict) -> str:
    """The report (build_report's dict) as markdown."""
    lines = _header(report)
    M = report["methods"]
    if not M:
        return "\n".join(lines + ["No run has finished yet."]) + "\n"
    lines += _accuracy_table(report)
    lines += ["", "![learning curves](curves.png)", ""]
    lines += _verdict(M)
    sp = report["same_prompts"]
    lines += ["Same prompts in the same order: " + "; ".join(
        f"seed {s}: {v['runs']} runs agree on the first {v['common_prefix']} prompts" if v["agree"]
        else f"seed {s}: the {v['runs']} runs' prompt streams DIFFER" for s, v in sp.items()) + ".", ""]
    for n in report["notes"]:
        lines.append(f"Note: {n}.")
    lines += _per_run(report["runs"])
    return "\n".join(lines) + "\n"


def _header(report: dict) -> list[str]:
    kind, value = next(iter(report["budget"].items()))
    sr = report["shared_run"]
    return [f"# Method comparison: {report['task']}", "",
            f"`policylab compare {report['config']}`: {report['runs_finished']} of {report['runs_planned']} runs "
            f"finished; budget {value:g} {BUDGET_UNITS[kind]} per run; seeds {report['seeds']}; model {report['model']}.",
            f"Machine: {report['machine']}.", "",
            f"Shared run: {sr.get('rollout.prompts_per_step')} prompts x {sr.get('rollout.group_size')} samples, "
            f"<= {sr.get('rollout.max_new_tokens')} new tokens, T = {sr.get('rollout.temperature')}, engine "
            f"{sr.get('rollout.engine')}-{sr.get('rollout.engine_dtype')}, lr {sr.get('train.lr')}, "
            f"{sr.get('train.epochs')} epoch(s) x {sr.get('train.minibatches')} minibatch(es); held-out "
            f"{sr.get('eval.n')} prompts sampled at T = {sr.get('eval.temperature')}.", ""]


def _accuracy_table(report: dict) -> list[str]:
    M, target = report["methods"], report["target_accuracy"]
    steps = sorted({p["step"] for m in M.values() for p in m["curve"]})
    head = ["method", "seeds"] + [("base" if s == 0 else f"step {s}") for s in steps] + [
        "final", "Δ final vs " + next(iter(M)), f"time to {_pct(target)}" if target else "time to target",
        "tokens/s", "peak RSS (MB)", "clip frac", "correction / mismatch (run means)"]
    lines = ["Held-out accuracy (mean over seeds ± s.e.; s.e. = the larger of the binomial error of the mean and "
             "the between-seed error), at each evaluation:", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lab, m in M.items():
        lines.append("| " + " | ".join(_method_cells(lab, m, steps, target)) + " |")
    return lines


def _method_cells(lab: str, m: dict, steps: list, target: float | None) -> list[str]:
    by = {p["step"]: p for p in m["curve"]}
    cells = [f"`{lab}`", str(len(m["seeds"]))]
    cells += [_pct(by[s]["accuracy"], by[s]["stderr"]) if s in by else "-" for s in steps]
    f = m["final"]
    cells.append(f"{_pct(f['accuracy'], f['stderr'])} (step {f['step']:.0f})")
    v = m.get("vs_first", {})
    cells.append("-" if lab == v.get("reference") else
                 f"{100 * v['difference']:+.1f} ± {100 * v['stderr']:.1f}" + (
                     f" (z {v['z']:+.1f})" if v.get("z") is not None else ""))
    tt = m["time_to_target"]
    cells.append("-" if target is None else (
        f"{tt['seconds_mean']:.0f} s, step {tt['steps_mean']:.0f} ({tt['reached']}/{tt['of']})" if tt["reached"]
        else f"not reached (0/{tt['of']})"))
    cells.append("-" if m["tokens_per_s"] is None else f"{m['tokens_per_s']:.0f}")
    cells.append("-" if not m["peak_rss_mb"] else f"{m['peak_rss_mb']:.0f}")
    cells.append("-" if m["clip_frac"] is None else f"{m['clip_frac']:.4f}")
    cells.append(", ".join(f"{k.split('/', 1)[1]}={v:.4g}" for k, v in m["diagnostics"].items()) or "-")
    return cells


def _verdict(M: dict) -> list[str]:
    """The highest final accuracy, and which methods differ from the first by > 1.96 s.e."""
    first = next(iter(M))
    best = max(M.items(), key=lambda kv: kv[1]["final"]["accuracy"])
    sig = [lab for lab, m in M.items() if m.get("vs_first", {}).get("z") is not None and abs(m["vs_first"]["z"]) > 1.96]
    return [f"Highest final accuracy: `{best[0]}` ({_pct(best[1]['final']['accuracy'], best[1]['final']['stderr'])}). "
            + (f"Final accuracies differing from `{first}` by more than 1.96 s.e. (two-sided 5%, not "
               f"corrected for {len(M) - 1} comparisons): {', '.join(f'`{x}`' for x in sig)}."
               if sig else f"No method's final accuracy differs from `{first}` by more than 1.96 s.e.: no "
                           "significant difference at this budget."), ""]


def _per_run(runs: list[dict]) -> list[str]:
    lines = ["", "Per run:", "", "| run | steps (optimizer) | training s | sampled tokens | stopped by | base | final |"
             " resumed |", "|---|---:|---:|---:|---|---:|---:|---|"]
    for r in runs:
        lines.append(f"| {r['label']} seed {r['seed']} | {r['steps']} ({r['optimizer_steps']}) | "
                     f"{r['train_seconds']:.0f} | {r['sampled_tokens']} | {r['stopped_by']} | "
                     f"{_pct(r['points'][0]['accuracy'])} | {_pct(r['points'][-1]['accuracy'])} | "
                     f"{'yes' if r['resumed'] else 'no'} |")
    return lines
