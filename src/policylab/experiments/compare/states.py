"""Where each planned run stands on disk: new, done (its report is complete), resume (an
interrupted run with a checkpoint) or restart (interrupted before its first checkpoint);
a run directory made with another config is refused."""

from __future__ import annotations

import json
from pathlib import Path

from policylab.errors import ConfigError
from policylab.experiments.compare.plan import Plan, PlannedRun


def read_states(plan: Plan) -> None:
    """Set every planned run's state; refuse (ConfigError) run directories that hold a run
    made with another config, all of them in one message."""
    conflicts = []
    for r in plan.runs:
        conflict = _read_state(r)
        if conflict:
            conflicts.append(conflict)
    if conflicts:
        raise ConfigError(f"{plan.source}: nothing was run: " + "; ".join(conflicts)
                          + "; delete those run directories, choose another out_dir, or restore the config they were "
                            "made with")


def _read_state(r: PlannedRun) -> str | None:
    """Set `r.state` from its run directory; returns why the directory cannot be used, if so."""
    from policylab.trainer.checkpoint import latest_checkpoint
    from policylab.trainer.run_dir import RUN_FILES
    from policylab.trainer.support import load_run_config

    d = r.run_dir
    if not (d / "config.yaml").exists():
        has_files = d.is_dir() and any((d / n).exists() for n in RUN_FILES)
        r.state = "restart" if has_files else "new"
        return None
    try:
        recorded = load_run_config(d).to_dict()
    except ConfigError as exc:
        return f"{d}: {exc}"
    planned = r.cfg.to_dict()
    # where the run lives is the directory it was found in: a run directory moved or copied
    # (another checkout, restored logs) is the same run
    recorded.pop("run_dir", None)
    planned.pop("run_dir", None)
    if recorded != planned:
        a, b = flatten(recorded), flatten(planned)
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        return (f"{d} holds a run made with another config (differs in {', '.join(diff[:6])}"
                + (" ..." if len(diff) > 6 else "") + ")")
    report = read_json(d / "report.json")
    if report.get("trained") and report.get("stopped_by"):
        r.state = "done"
    else:
        r.state = "resume" if latest_checkpoint(d) is not None else "restart"
    return None


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested mapping as {"section.key": value} (empty mappings kept as values)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def read_json(path: Path) -> dict:
    """A JSON object from `path`; {} when the file is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
