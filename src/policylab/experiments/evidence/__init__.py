"""`policylab evidence NAME... | --all`: each method's mechanism measured against its
negative control on the task it targets, a few seeds and a handful of steps each, one
table of verdicts.

For every named method, its declaration (`policylab.methods.mechanisms`) gives the
signature the paper claims, the quantity that measures it (a function of a run's metric
rows), the control (the same run with the mechanism switched off: parameter overrides,
or another method such as plain GRPO), and the task. The command runs both arms for each
seed through `policylab compare`'s machinery, one compare plan per mechanism, in the
order the methods are named, under the directory of the arms' shared run
(out_dir/<task>-<hash>/; the mechanism's compare report in compare-<method>/ there): arms that are the same method with
the same parameters on the same run are one run directory, so a plain-GRPO control
serves every method whose control it is (run once, skipped after). Finished runs are skipped, interrupted ones
resume from their last checkpoint (a finished run's checkpoints are deleted); running the
same command again continues where it stopped.

The table (evidence.md and evidence.json in report_dir, default out_dir) has one row per
registered method, computed from whatever runs under out_dir match these settings: the
quantity of both arms (mean ± s.e. over seeds), their paired difference, the seeds a
difference of that size would need, and the verdict: observed (significant, two-sided
5% t over seed differences, in the claimed direction), not observed, not measurable here
(why: the declaration's reason, or the runs never logged the quantity), not run, or
refused (the method cannot run on that task: the message says why). Capability columns
give each arm's final held-out accuracy and what it sampled.

    verdict.py  paired differences and verdicts (pure functions)
    arms.py     the two arms of a mechanism, their shared runs, one compare plan per mechanism
    table.py    the rows from the finished runs; evidence.md / evidence.json
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from policylab.errors import ConfigError, RunInterrupted
from policylab.experiments.compare.plan import describe_plan
from policylab.experiments.compare.running import run_plan
from policylab.experiments.evidence.arms import Settings, build_plans
from policylab.experiments.evidence.table import build_table, write_table

_STATE = "evidence_state.json"  # under out_dir: the commands that ran, across invocations


def requested(names: list[str], all_methods: bool) -> list:
    """The mechanisms to run, in the order given (--all: every registered method's); an
    unknown or literature-only name raises the registry's error before anything runs."""
    from policylab import methods
    from policylab.methods.mechanisms import mechanism

    if all_methods and names:
        raise ConfigError("give method names or --all, not both")
    if not all_methods and not names:
        raise ConfigError("name the methods to measure (e.g. `policylab evidence dapo gspo`) or pass --all")
    chosen = methods.names() if all_methods else list(dict.fromkeys(names))
    return [mechanism(n) for n in chosen]


def _state(out_dir: Path) -> dict:
    try:
        data = json.loads((out_dir / _STATE).read_text())
    except (OSError, ValueError):
        return {"commands": []}
    return {"commands": list(data.get("commands", []))}


def evidence(names: list[str], settings: Settings, *, all_methods: bool = False, report_dir: Path | None = None,
             plan_only: bool = False, report_only: bool = False, command: str | None = None, console=None) -> dict:
    """The `policylab evidence` command (see the module doc); returns the table."""
    from rich.console import Console

    from policylab.methods.mechanisms import MECHANISMS

    console = console or Console()
    mechs = requested(names, all_methods)
    command = command or "policylab " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if not report_only:
        arms, refused, plans = build_plans([m for m in mechs if m.measurable], settings)
        if plan_only:
            _show(console, mechs, arms, refused, plans)
            return {}
        settings.out_dir.mkdir(parents=True, exist_ok=True)
        state = _state(settings.out_dir)  # read just before writing: parts may run side by side (other seeds)
        if command not in state["commands"]:
            state["commands"].append(command)
        (settings.out_dir / _STATE).write_text(json.dumps(state, indent=2))
        for key in _order(mechs, arms, plans):
            plan = plans[key]
            for r in plan.runs:  # a run an earlier plan of this invocation finished (a shared control)
                if r.state != "done" and _done(r.run_dir):
                    r.state = "done"
            if any(r.state != "done" for r in plan.runs):
                try:
                    run_plan(plan, console=console)
                except RunInterrupted as exc:
                    raise RunInterrupted(f"{exc.message.split('. The comparison stopped')[0]}. Run `{command}` again "
                                         "to continue (finished runs are skipped, the interrupted one resumes from "
                                         "its last checkpoint)") from None
    from policylab import methods

    every = [MECHANISMS[n] for n in methods.names() if n in MECHANISMS]
    # which methods cannot run on their task at these settings (checked for every method, nothing run)
    refused = build_plans([m for m in every if m.measurable], settings)[1]
    table = build_table(every, refused, settings, _state(settings.out_dir)["commands"] or [command])
    to = report_dir or settings.out_dir
    write_table(table, to)
    console.print(f"evidence table: {to / 'evidence.md'}, {to / 'evidence.json'} "
                  + ", ".join(f"{v} {k}" for k, v in sorted(table["counts"].items())))
    return table


def _order(mechs, arms, plans) -> list[str]:
    """The plans in the order their mechanism was named (its control's plan after it)."""
    return [k for m in mechs for k in (m.method, m.method + " (control)") if k in plans]


def _done(run_dir: Path) -> bool:
    from policylab.experiments.compare.states import read_json

    rep = read_json(run_dir / "report.json")
    return bool(rep.get("trained") and rep.get("stopped_by"))


def _show(console, mechs, arms, refused, plans) -> None:
    for m in mechs:
        if not m.measurable:
            console.print(f"{m.method}: not measurable here: {m.not_measurable_here}")
        elif m.method in refused:
            console.print(f"{m.method}: refused: {refused[m.method]}")
        else:
            a, c = arms[m.method]
            console.print(f"{m.method}: {m.quantity.label}; arms {a.group}/{a.label} vs {c.group}/{c.label}")
    for key in _order(mechs, arms, plans):
        console.print(f"{key}:")
        console.print(describe_plan(plans[key]))
        for r in plans[key].runs:
            console.print(f"  {r.state:8s} {r.run_dir}")


__all__ = ["evidence", "requested", "Settings"]
