"""The comparison's report: every finished run read, each method aggregated over its
seeds, written as compare.json, compare.md and curves.png into the report directory."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from policylab.experiments.compare.figure import plot_curves
from policylab.experiments.compare.markdown import to_markdown
from policylab.experiments.compare.plan import Plan
from policylab.experiments.compare.results import run_result
from policylab.experiments.compare.states import flatten
from policylab.experiments.compare.stats import add_vs_first, aggregate, same_prompts


def build_report(plan: Plan) -> dict:
    """The report of the runs finished so far (unfinished ones are left out and counted)."""
    results = [res for res in (run_result(r) for r in plan.runs) if res is not None]
    methods_out = {}
    for e in plan.entries:
        rs = [res for res in results if res["label"] == e.label]
        if rs:
            methods_out[e.label] = {"method": e.name, "method_params": e.method_params,
                                    **aggregate(rs, plan.target)}
    add_vs_first(methods_out)
    cfg = plan.runs[0].cfg
    return {
        "config": plan.source, "out_dir": str(plan.out_dir), "budget": {plan.budget_kind: plan.budget_value},
        "target_accuracy": plan.target, "seeds": plan.seeds, "model": cfg.model, "task": plan.task_describe,
        "shared_run": flatten(cfg.to_dict()), "runs_finished": len(results), "runs_planned": len(plan.runs),
        "notes": plan.notes, "same_prompts": same_prompts(results), "methods": methods_out,
        "runs": [{k: v for k, v in res.items() if k != "prompt_digests"} for res in results],
        "machine": machine(), "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def write_report(plan: Plan) -> dict:
    """build_report, written to the plan's report directory; returns the report."""
    report = build_report(plan)
    to = plan.report_to
    to.mkdir(parents=True, exist_ok=True)
    (to / "compare.json").write_text(json.dumps(report, indent=2))
    plot_curves(report, to / "curves.png")
    (to / "compare.md").write_text(to_markdown(report))
    return report


def machine() -> str:
    """The CPU, its core count and the load average as the report is written."""
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = f", load average {os.getloadavg()[0]:.2f} when the report was written"
    except OSError:
        load = ""
    return f"{cpu}, {os.cpu_count()} cores{load}"
