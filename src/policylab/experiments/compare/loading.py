"""Reading and checking a compare config: every problem is collected and reported in one
ConfigError before anything runs; what passes becomes a Plan (one run config per method
and seed, each run's state on disk)."""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from pathlib import Path

from policylab.errors import ConfigError
from policylab.experiments.compare.budget import apply_budget, budget_problems, parse_budget
from policylab.experiments.compare.checks import inert_note, task_problems
from policylab.experiments.compare.plan import Budget, Entry, Plan, PlannedRun
from policylab.experiments.compare.states import read_states
from policylab.trainer.config import RunConfig, config_from_dict, read_yaml

TOP_KEYS = ("out_dir", "report_dir", "methods", "seeds", "budget", "target_accuracy", "common_method_params",
            "keep_checkpoints", "run")
# keys of the shared run the comparison sets itself, and why
_SET_BY_COMPARE = (("method", "the methods come from `methods`"), ("seed", "the seeds come from `seeds`"),
                   ("run_dir", "each run's directory is made under `out_dir`"),
                   ("method_params", "give parameters per method or in `common_method_params`"))


@dataclass
class _Settings:
    """The config's top-level settings once checked (refused values replaced by defaults)."""
    out_dir: str
    report_dir: str | None
    run: dict
    entries: list[Entry]
    seeds: list[int]
    budget: Budget
    target: float | None
    keep: bool
    common: dict


def _close(name: str, options) -> str:
    near = difflib.get_close_matches(str(name), list(options), n=3, cutoff=0.5)
    return f" Did you mean: {', '.join(near)}?" if near else f" Valid keys: {', '.join(options)}."


def load_plan(path: str | Path) -> Plan:
    """Read and check a compare config: every problem found is reported in one ConfigError,
    before anything runs. Builds the task (not the model) to check that it can be fed and
    evaluated."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"compare config not found: {p}")
    data = read_yaml(p)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a compare config is a mapping with the keys {', '.join(TOP_KEYS)}")
    return plan_from_dict(data, source=str(p))


def plan_from_dict(data: dict, *, source: str = "compare config") -> Plan:
    """The Plan of a compare config already read (see load_plan)."""
    problems: list[str] = []
    notes: list[str] = []
    s = _settings(data, problems)
    runs, base_cfg = _plan_runs(s, problems, notes)
    plan = Plan(source, Path(s.out_dir), s.entries, s.seeds, s.budget.kind or "steps", s.budget.value or 0, s.target,
                runs, notes, report_dir=Path(s.report_dir) if s.report_dir else None, keep_checkpoints=s.keep)
    if base_cfg is not None and not problems:
        problems += task_problems(plan, base_cfg)
    if problems:
        listed = problems[0] if len(problems) == 1 else "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
        raise ConfigError(f"{source}: nothing was run: {listed}")
    read_states(plan)
    return plan


def _settings(data: dict, problems: list[str]) -> _Settings:
    """Every top-level setting, checked in the order the problems are reported."""
    for k in data:
        if k not in TOP_KEYS:
            problems.append(f"unknown key `{k}`." + _close(k, TOP_KEYS))
    out_dir, report_dir = _directories(data, problems)
    run, train = _shared_run(data.get("run", {}), problems)
    entries = _entries(data.get("methods"), problems)
    seeds = _seeds(data.get("seeds", [0]), problems)
    budget = parse_budget(data.get("budget"), train, problems)
    target = data.get("target_accuracy")
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                               or not 0 < float(target) <= 1):
        problems.append(f"`target_accuracy` must be a number in (0, 1], got {target!r}")
        target = None
    keep = data.get("keep_checkpoints", True)
    if not isinstance(keep, bool):
        problems.append(f"`keep_checkpoints` must be true or false, got {keep!r}")
        keep = True
    common = data.get("common_method_params", {}) or {}
    if not isinstance(common, dict):
        problems.append("`common_method_params` must be a mapping")
        common = {}
    _evaluation(run, problems)
    return _Settings(out_dir, report_dir, run, entries, seeds, budget, target, keep, common)


def _directories(data: dict, problems: list[str]) -> tuple[str, str | None]:
    out_dir = data.get("out_dir")
    if not isinstance(out_dir, str) or not out_dir.strip():
        problems.append("`out_dir` must name the directory the runs and the report go to")
        out_dir = "."
    elif Path(out_dir).resolve() == Path.cwd().resolve():
        problems.append(f"`out_dir` {out_dir!r} is the current directory: give the comparison a directory of its own")
    report_dir = data.get("report_dir")
    if report_dir is not None and (not isinstance(report_dir, str) or not report_dir.strip()):
        problems.append(f"`report_dir` must name a directory (or be left out: the report goes to out_dir), got "
                        f"{report_dir!r}")
        report_dir = None
    return out_dir, report_dir


def _shared_run(run, problems: list[str]) -> tuple[dict, dict]:
    """A copy of the shared run config without what the comparison sets itself, and its
    train section (the same dict, or a stand-in when `run.train` is not a mapping)."""
    if not isinstance(run, dict):
        problems.append("`run` must be a mapping of run-config sections (model, task, rollout, train, eval, log)")
        run = {}
    run = copy.deepcopy(run)
    for k, why in _SET_BY_COMPARE:
        if k in run:
            problems.append(f"`run.{k}` is set: {why}")
            run.pop(k)
    train = run.setdefault("train", {}) if isinstance(run.get("train", {}), dict) else {}
    for k in ("budget_seconds", "budget_tokens"):
        if k in train:
            problems.append(f"`run.train.{k}` is set: the budget goes in `budget`")
            train.pop(k)
    return run, train


def _entries(raw_methods, problems: list[str]) -> list[Entry]:
    entries: list[Entry] = []
    if not isinstance(raw_methods, list) or not raw_methods:
        problems.append("`methods` must be a non-empty list of method names (or {name, label, method_params})")
        raw_methods = []
    for i, m in enumerate(raw_methods):
        if isinstance(m, str):
            m = {"name": m}
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            problems.append(f"methods[{i}] must be a method name or a mapping with `name`, got {m!r}")
            continue
        extra = set(m) - {"name", "label", "method_params"}
        if extra:
            problems.append(f"methods[{i}] ({m['name']}): unknown key(s) {sorted(extra)}; a method entry takes name, "
                            "label and method_params (everything else is shared through `run`, so the runs compare)")
        mp = m.get("method_params", {}) or {}
        if not isinstance(mp, dict):
            problems.append(f"methods[{i}] ({m['name']}): method_params must be a mapping")
            mp = {}
        entries.append(Entry(m["name"], str(m.get("label") or m["name"]), dict(mp)))
    labels = [e.label for e in entries]
    dups = sorted({x for x in labels if labels.count(x) > 1})
    if dups:
        problems.append(f"method label(s) {dups} appear more than once: give each entry its own `label`")
    for e in entries:
        if not e.label.replace("-", "").replace("_", "").replace(".", "").isalnum():
            problems.append(f"label {e.label!r}: use letters, digits, '-', '_' or '.' (it names a directory)")
    return entries


def _seeds(seeds, problems: list[str]) -> list[int]:
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if (not isinstance(seeds, list) or not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds)
            or len(set(seeds)) != len(seeds)):
        problems.append(f"`seeds` must be a non-empty list of distinct integers, got {seeds!r}")
        seeds = [0]
    return seeds


def _evaluation(run: dict, problems: list[str]) -> None:
    """Every run is evaluated before and after training; progress is drawn by the
    comparison; checkpoints follow the evaluations unless the config says otherwise."""
    ev = run.get("eval", {}) if isinstance(run.get("eval", {}), dict) else {}
    for k in ("before", "after"):
        if ev.get(k) is False:
            problems.append(f"`run.eval.{k}` is false: the comparison reports the {'base' if k == 'before' else 'final'} "
                            "held-out accuracy of every run")
    log = run.setdefault("log", {}) if isinstance(run.get("log", {}), dict) else {}
    log["progress"] = False  # the comparison draws one progress display across runs
    if not log.get("checkpoint_every"):
        log["checkpoint_every"] = int(ev.get("every") or 5)


def _plan_runs(s: _Settings, problems: list[str], notes: list[str]) -> tuple[list[PlannedRun], RunConfig | None]:
    """One planned run per method entry and seed (and the first run's config, which the
    task checks use); the entries' problems and notes are appended."""
    from policylab import methods
    from policylab.errors import PolicylabError

    runs: list[PlannedRun] = []
    for e in s.entries:
        try:
            spec = methods.get(e.name)
        except PolicylabError as exc:
            problems.append(str(exc))
            continue
        runs += _entry_runs(s, e, spec, problems, notes)
    return runs, runs[0].cfg if runs else None


def _entry_runs(s: _Settings, e: Entry, spec, problems: list[str], notes: list[str]) -> list[PlannedRun]:
    """The runs of one method entry, one per seed; the first config its method refuses
    ends the entry (reported once, not per seed)."""
    from policylab.errors import PolicylabError
    from policylab.trainer.loop import run_shape

    declared = {q.name for q in spec.params}
    params = {k: v for k, v in s.common.items() if k in declared} | e.method_params
    runs = []
    for seed in s.seeds:
        d = copy.deepcopy(s.run)
        d.update(method=e.name, seed=seed, method_params=params,
                 run_dir=str(Path(s.out_dir) / "runs" / f"{e.label}-seed{seed}"))
        apply_budget(d.setdefault("train", {}), s.budget)
        try:
            cfg = config_from_dict(d)
            method = spec.with_params(cfg.method_params, run_shape(cfg))
        except PolicylabError as exc:
            problems.append(f"{e.label}: {exc}")
            break
        runs.append(PlannedRun(e.label, e.name, seed, cfg))
        if seed == s.seeds[0]:
            problems += budget_problems(e.label, method, s.budget)
            notes += inert_note(e.label, spec, cfg)
    return runs
