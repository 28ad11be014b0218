"""One row per registered method: its signature measured on both arms' finished runs
(per seed, paired), the verdict, and what the runs cost and reached (capability columns:
final held-out accuracy of both arms, their paired difference, sampled tokens, optimizer
steps). Written as evidence.json and evidence.md."""

from __future__ import annotations

import json
import textwrap
import time
import warnings
from pathlib import Path

from policylab.errors import PolicylabError
from policylab.experiments.compare.report import machine
from policylab.experiments.compare.results import run_result
from policylab.experiments.compare.states import read_json
from policylab.experiments.evidence.verdict import (
    MIN_SEEDS_FOR_CLAIM,
    NOT_MEASURABLE,
    NOT_RUN,
    REFUSED,
    mean_se,
    paired,
    t_crit,
    verdict,
)


def _finished(arm, seed: int):
    """(metric rows, run result) of a finished run of `arm`, or None."""
    from policylab.trainer.runlog import read_metrics, read_records

    d = arm.run_dir(seed)
    rep = read_json(d / "report.json")
    if not (rep.get("trained") and rep.get("stopped_by")) or not (d / "metrics.jsonl").is_file():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = read_records(d / "metrics.jsonl")
    rows = read_metrics(d / "metrics.jsonl", records)
    # held-out evaluations, at the step they describe (after the step rows of that step): the
    # quantities of held-out measures (eval/...) read them, the others never see their keys
    rows += [{**{k: v for k, v in rec.items() if k.startswith("eval/")}, "step": rec["at_step"]}
             for rec in records if rec.get("event") == "eval" and isinstance(rec.get("at_step"), int)]
    from types import SimpleNamespace

    res = run_result(SimpleNamespace(label=arm.label, method=arm.method, seed=seed, run_dir=d))
    evals = sum(float(r.get("eval/seconds", 0.0)) for r in records if r.get("event") == "eval")
    return rows, {**res, "eval_seconds": evals}


def _summary(values: list[float]) -> dict | None:
    if not values:
        return None
    m, se = mean_se(values)
    return {"mean": m, "se": se, "n": len(values)}


def mechanism_row(mech, arms, refused: dict, settings) -> dict:
    row = {"method": mech.method, "signature": mech.signature, "task": mech.task,
           "control": mech.describe_control() if mech.measurable else None,
           "quantity": mech.quantity.label if mech.quantity else None, "direction": mech.direction}
    if not mech.measurable:
        return {**row, "verdict": NOT_MEASURABLE, "why": mech.not_measurable_here}
    if mech.method in refused:
        return {**row, "verdict": REFUSED, "why": refused[mech.method]}
    m_arm, c_arm = arms[mech.method]
    row["runs"] = {"method": str(m_arm.run_dir(0).parent), "method_label": m_arm.label,
                   "control_label": c_arm.label, "control_group": c_arm.group, "method_group": m_arm.group}
    got = {s: (_finished(m_arm, s), _finished(c_arm, s)) for s in settings.seeds}
    done = [s for s, (a, b) in got.items() if a is not None and b is not None]
    if not done:
        return {**row, "verdict": NOT_RUN, "why": f"no seed has both arms finished (of {list(settings.seeds)})"}
    q = mech.quantity
    qm = {s: q(got[s][0][0]) for s in done}
    qc = {s: q(got[s][1][0]) for s in done}
    missing = [f"{arm} seed {s}" for s in done for arm, v in (("method", qm[s]), ("control", qc[s])) if v is None]
    row["per_seed"] = {str(s): {"method": qm[s], "control": qc[s]} for s in done}
    row["capability"] = _capability({s: got[s] for s in done})
    if missing:
        return {**row, "verdict": NOT_MEASURABLE, "why": f"the runs never logged `{q.key}` as a finite number "
                f"({', '.join(missing)}): the mechanism did not act on these batches at this size and budget"}
    stats = paired(qm, qc)
    v, why = verdict(stats, mech.direction)
    if len(done) < len(settings.seeds):
        why += f"; {len(settings.seeds) - len(done)} seed(s) not finished yet"
    return {**row, "stats": stats, "verdict": v, "why": why}


def _capability(got: dict) -> dict:
    """Final held-out accuracy of both arms (mean ± s.e. over seeds), the paired
    difference, and what the runs spent (means over seeds)."""
    out = {}
    for i, arm in enumerate(("method", "control")):
        res = [got[s][i][1] for s in sorted(got)]
        out[arm] = {"final_accuracy": _summary([r["points"][-1]["accuracy"] for r in res]),
                    "base_accuracy": res[0]["points"][0]["accuracy"],
                    "sampled_tokens": sum(r["sampled_tokens"] for r in res) / len(res),
                    "optimizer_steps": sum(r["optimizer_steps"] for r in res) / len(res),
                    "train_seconds": sum(r["train_seconds"] for r in res) / len(res),
                    "eval_seconds": sum(r["eval_seconds"] for r in res) / len(res)}
    acc = {s: got[s][0][1]["points"][-1]["accuracy"] for s in got}
    ctl = {s: got[s][1][1]["points"][-1]["accuracy"] for s in got}
    out["paired_accuracy"] = paired(acc, ctl)
    return out


REFERENCE = "grpo"  # the capability reference: plain GRPO at its defaults, on the same prompts


def capability_rows(arms: dict, settings) -> list[dict]:
    """Held-out accuracy of every method arm against plain GRPO run on the same task, prompts
    and budget (the GRPO run of the same shared-run group, whichever mechanism it was run
    for), paired by seed: both means ± s.e., the paired difference with its 95% t interval,
    the seeds a difference of that size and spread would need, and what each side spent
    (sampled tokens, optimizer steps). Only seeds where both runs finished count; a method
    whose task has no GRPO run here has no row."""
    reference = {}
    for pair in arms.values():
        for a in pair:
            if a.method == REFERENCE and a.label == REFERENCE:
                reference[a.group] = a
    rows, seen = [], set()
    for name, (m_arm, _) in sorted(arms.items()):
        ref = reference.get(m_arm.group)
        if name == REFERENCE or ref is None or (m_arm.group, m_arm.label) in seen:
            continue
        seen.add((m_arm.group, m_arm.label))
        got = {s: (_finished(m_arm, s), _finished(ref, s)) for s in settings.seeds}
        done = {s: v for s, v in got.items() if v[0] is not None and v[1] is not None}
        if not done:
            continue
        cap = _capability(done)
        pa = cap["paired_accuracy"]
        row = {"method": name, "label": m_arm.label, "task_group": m_arm.group, "seeds": sorted(done),
               "method_accuracy": cap["method"]["final_accuracy"], "grpo_accuracy": cap["control"]["final_accuracy"],
               "base_accuracy": cap["method"]["base_accuracy"], "difference": pa.get("difference"),
               "difference_se": pa.get("difference_se"), "t": pa.get("t"), "seeds_needed": pa.get("seeds_needed"),
               "interval": None, "sampled_tokens": [cap["method"]["sampled_tokens"], cap["control"]["sampled_tokens"]],
               "optimizer_steps": [cap["method"]["optimizer_steps"], cap["control"]["optimizer_steps"]]}
        if pa.get("difference_se") is not None:
            half = t_crit(pa["n"] - 1) * pa["difference_se"]
            row["interval"] = [pa["difference"] - half, pa["difference"] + half]
        rows.append(row)
    return rows


def build_table(mechs, refused: dict, settings, commands: list[str]) -> dict:
    """The table of `mechs` from the runs on disk under settings.out_dir (whichever
    invocation ran them); `refused`: method -> why its arms could not run."""
    from policylab.experiments.evidence.arms import arms_of

    arms = {}
    for m in mechs:
        if m.measurable and m.method not in refused:
            try:
                arms[m.method] = arms_of(m, settings)
            except PolicylabError as exc:  # e.g. a --set its run cannot take: its row says so
                refused = {**refused, m.method: f"{type(exc).__name__}: {exc}"}
    rows = [mechanism_row(m, arms, refused, settings) for m in mechs]
    capability = capability_rows(arms, settings)
    cost = _cost(arms, rows, settings)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return {"commands": list(commands), "settings": settings.describe(), "seeds": list(settings.seeds),
            "steps": settings.steps, "model": settings.model, "counts": counts, "cost": cost, "rows": rows,
            "capability": capability,
            "machine": machine(), "written": time.strftime("%Y-%m-%d %H:%M:%S")}


def _cost(arms: dict, rows: list[dict], settings) -> dict:
    """The distinct runs every measurable method's arms need at these settings (shared
    controls counted once), and the mean wall-clock of a finished run (training plus its
    two evaluations) so far: the total the whole table would take on this machine."""
    distinct = {(a.group, a.label) for pair in arms.values() for a in pair}
    per_run = [cap[arm]["train_seconds"] + cap[arm]["eval_seconds"]
               for r in rows if (cap := r.get("capability")) for arm in ("method", "control")]
    mean = sum(per_run) / len(per_run) if per_run else None
    n = len(distinct) * len(settings.seeds)
    return {"runs_needed": n, "seconds_per_run": mean, "total_hours": mean * n / 3600 if mean else None}


def _pm(s: dict | None, fmt: str = "{:.4g}") -> str:
    if not s:
        return "-"
    return fmt.format(s["mean"]) + (f" ± {fmt.format(s['se'])}" if s.get("se") is not None else "")


def _num(x, fmt="{:.4g}") -> str:
    return "-" if x is None else fmt.format(x)


def to_markdown(table: dict) -> str:
    lines = ["# Mechanism evidence: each method against its negative control", "",
             "Produced by (resumed as needed, each part skipping finished runs):", "",
             *[f"    {c}" for c in table["commands"]], "",
             f"Settings: {table['settings']}. Machine: {table['machine']}; written {table['written']}.", "",
             "Verdicts: " + ", ".join(f"{v} {k}" for k, v in sorted(table["counts"].items())) + ".", "",
             _cost_line(table.get("cost") or {}), "",
             "Each arm pair sees the same prompts per seed. Difference = method − control of the quantity, paired by "
             "seed, mean ± standard error over seeds; *observed* means significant (two-sided 5% Student t over the "
             "seed differences) in the direction the paper claims. *Seeds needed*: seeds for the difference of this "
             "size and spread to reach |t| ≈ 1.96. Capability columns: final held-out accuracy, sampled at T = 1, "
             "mean ± s.e. over seeds; they are what a handful of steps reached, not a capability claim.", "",
             "| method | signature (quantity; control) | method | control | difference | seeds needed | verdict | "
             "held-out: method / control (paired diff) | sampled: method / control |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        st = r.get("stats") or {}
        cap = r.get("capability") or {}
        sig = r["signature"] if r["quantity"] is None else f"{r['signature']} ({r['quantity']}; control: {r['control']})"
        m = {"mean": st["method"], "se": st.get("method_se")} if st.get("n") else None
        c = {"mean": st["control"], "se": st.get("control_se")} if st.get("n") else None
        d = {"mean": st["difference"], "se": st.get("difference_se")} if st.get("n") else None
        held = "-"
        toks = "-"
        if cap:
            pa = cap["paired_accuracy"]
            diff = _pm({"mean": pa["difference"], "se": pa.get("difference_se")}, "{:+.1%}") if pa.get("n") else "-"
            held = (f"{_pm(cap['method']['final_accuracy'], '{:.1%}')} / {_pm(cap['control']['final_accuracy'], '{:.1%}')}"
                    f" ({diff})")
            toks = (f"{cap['method']['sampled_tokens']:.0f} / {cap['control']['sampled_tokens']:.0f} tokens, "
                    f"{cap['method']['optimizer_steps']:.0f} / {cap['control']['optimizer_steps']:.0f} optimizer steps")
        verdict_text = f"**{r['verdict']}**: {r['why']}"
        lines.append(f"| `{r['method']}` | {sig} | {_pm(m)} | {_pm(c)} | {_pm(d)} | {_num(st.get('seeds_needed'), '{}')} | "
                     f"{verdict_text} | {held} | {toks} |")
    lines += capability_markdown(table.get("capability") or [], table.get("steps"))
    return "\n".join(lines) + "\n"


def capability_markdown(rows: list[dict], steps) -> list[str]:
    if not rows:
        return []
    out = ["", "## Held-out accuracy against GRPO on the same prompts", "",
           f"Every method arm beside the plain-GRPO run of its task (same prompts per seed, same {steps} rollout "
           "steps), final held-out accuracy sampled at T = 1, mean ± s.e. over seeds; the paired difference with its "
           "95% t interval over the seed differences; *seeds needed*: seeds for a difference of this size and "
           "spread to reach |t| ≈ 1.96. What a handful of steps reached at this size, not the method's capability "
           "at its paper's scale.", "",
           "| method | seeds | held-out: method | GRPO | difference (95% interval) | seeds needed | sampled tokens: "
           "method / GRPO | optimizer steps: method / GRPO |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = "-" if r["difference"] is None else f"{r['difference']:+.1%}"
        if r["interval"]:
            diff = f"{r['difference']:+.1%} ± {r['difference_se']:.1%} [{r['interval'][0]:+.1%}, {r['interval'][1]:+.1%}]"
        out.append(f"| `{r['label']}` | {len(r['seeds'])} | {_pm(r['method_accuracy'], '{:.1%}')} | "
                   f"{_pm(r['grpo_accuracy'], '{:.1%}')} | {diff} | {_num(r['seeds_needed'], '{}')} | "
                   f"{r['sampled_tokens'][0]:.0f} / {r['sampled_tokens'][1]:.0f} | "
                   f"{r['optimizer_steps'][0]:.0f} / {r['optimizer_steps'][1]:.0f} |")
    return out


def _cost_line(c: dict) -> str:
    if not c.get("seconds_per_run"):
        return f"Cost: {c.get('runs_needed', '?')} distinct runs for every measurable method at these settings."
    return (f"Cost: {c['runs_needed']} distinct runs for every measurable method at these settings (shared controls "
            f"once); a finished run took {c['seconds_per_run']:.0f} s on average here (training and its two "
            f"evaluations, machine shared and loaded), so the whole table needs about {c['total_hours']:.1f} h.")


def write_table(table: dict, to: Path) -> None:
    to.mkdir(parents=True, exist_ok=True)
    (to / "evidence.json").write_text(json.dumps(table, indent=2, default=str))
    (to / "evidence.md").write_text(to_markdown(table))


def card_text(row: dict) -> str | None:
    """The mechanism level a card states for one row of the table (None: nothing to state
    beyond the declaration: not run, or not measurable by declaration)."""
    v = row["verdict"]
    if v == NOT_RUN or (v == NOT_MEASURABLE and "stats" not in row and "per_seed" not in row):
        return None
    where = "benchmarks/results/evidence.md"
    if v == REFUSED:  # the first clause of compare's refusal, e.g. "the task's base accuracy cannot be measured"
        reason = row["why"].split("nothing was run: ", 1)[-1]
        cut = min((i for i in (reason.find(": "), reason.find("; ")) if i > 0), default=len(reason))
        return f"refused on its task: {reason[:cut]} ({where})"
    if "stats" not in row:  # measurable, but the runs never logged the quantity
        return f"{v}: the runs never logged `{row['quantity'].split('`')[1]}` as a finite number at this size and budget ({where})"
    st = row["stats"]
    se = f" ± {st['difference_se']:.3g}" if st.get("difference_se") is not None else ""
    if st["n"] < 2:
        v = "one seed so far, no claim"
    return (f"{v}: {row['quantity']} {st['method']:.4g} vs {st['control']:.4g} for the control ({row['control']}), "
            f"difference {st['difference']:+.3g}{se} over {st['n']} seeds ({where})")


def card_texts(table: dict) -> dict[str, str]:
    """method -> card_text of every row that has one."""
    return {r["method"]: t for r in table["rows"] if (t := card_text(r)) is not None}


def capability_card_text(row: dict, steps) -> str:
    """The capability level a card states for one row of the table's GRPO comparison."""
    n = len(row["seeds"])
    m, g = row["method_accuracy"]["mean"], row["grpo_accuracy"]["mean"]
    head = (f"held-out accuracy after {steps} rollout steps on its evidence task, {n} seed{'s' if n > 1 else ''}: "
            f"{m:.1%} vs GRPO's {g:.1%} on the same prompts")
    where = "(benchmarks/results/evidence.md)"
    if row.get("interval") is None:
        return f"{head}, difference {row['difference']:+.1%}; one seed so far, no claim {where}"
    lo, hi = row["interval"]
    sig = "significant" if lo > 0 or hi < 0 else "not significant"
    if n < MIN_SEEDS_FOR_CLAIM and sig == "significant":  # two seeds agreeing exactly by chance: no claim
        sig = "too few seeds for a claim"
    need = f"; about {row['seeds_needed']} seeds would make a difference of this size significant" \
        if row.get("seeds_needed") and sig == "not significant" else ""
    return (f"{head}, difference {row['difference']:+.1%} ± {row['difference_se']:.1%} (95% interval "
            f"[{lo:+.1%}, {hi:+.1%}], {sig}){need} {where}")


def capability_texts(table: dict) -> dict[str, str]:
    """method -> capability_card_text of every method with a GRPO comparison."""
    return {r["method"]: capability_card_text(r, table.get("steps")) for r in table.get("capability") or []}


def levels_module(table: dict) -> str:
    """The source of policylab/methods/evidence_levels.py: the card levels from this table."""
    def block(name: str, d: dict) -> list[str]:
        out = [f"{name}: dict[str, str] = {{"]
        for k in sorted(d):
            out.append(f"    {k!r}:")
            text = d[k]
            pieces = textwrap.wrap(text, 90, drop_whitespace=False, replace_whitespace=False,
                                   break_long_words=False, break_on_hyphens=False) or [""]
            assert "".join(pieces) == text
            out += [f"        {p!r}" for p in pieces[:-1]] + [f"        {pieces[-1]!r},"]
        return out + ["}"]

    return "\n".join([
        '"""Generated from benchmarks/results/evidence.json by scripts/update_evidence_levels.py: do not edit.',
        "",
        "The mechanism and capability levels the cards state (policylab.methods.evidence.levels).",
        '"""',
        "",
        *block("MECHANISM", card_texts(table)),
        "",
        *block("CAPABILITY_RUNS", capability_texts(table)),
        ""])
