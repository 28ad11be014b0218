"""`policylab compare CONFIG`: several methods (and seeds) on one model, task and budget,
one run directory each, then one report.

A compare config is YAML:

    out_dir: runs/compare-chain-sum     # runs/<label>-seed<s>/ per run, and the report
    report_dir: benchmarks/results/compare_chain_sum  # optional: the report goes here instead
    methods:                            # names, or {name, label, method_params}
      - grpo
      - dr_grpo
      - {name: dapo, label: dapo-nofilter, method_params: {dynamic_sampling: false}}
    seeds: [0, 1]
    budget: {steps: 40}                 # or {seconds: 300} or {tokens: 400000}; + max_steps (cap)
    target_accuracy: 0.3                # "time to target": first evaluation at or above it
    keep_checkpoints: true              # false: a finished run's checkpoints are deleted (the
                                        # report needs only report.json and metrics.jsonl)
    common_method_params: {kl_coef: 0.0}  # given to every method that declares the parameter
    run:                                # the run config every run shares (policylab train's sections)
      model: embedded
      task: {name: arithmetic, digits: 2}
      rollout: {prompts_per_step: 4, group_size: 8, max_new_tokens: 16}
      train: {lr: 1.0e-5}
      eval: {n: 200, every: 10}

Budgets. `steps`: every run takes that many rollout steps, each with train.epochs x
train.minibatches optimizer steps (the same for every run: a method entry can set only
its method's parameters), so the optimizer steps are equal. `seconds`: every run trains
until its training wall-clock (evaluations excluded) reaches the budget
(train.budget_seconds). `tokens`: until it has sampled that many response tokens for
training, refills included (train.budget_tokens). A run checks the budget after each step,
so it can overshoot by less than one step; the report gives what each run used.

Same prompts: every run of seed s draws the task's training stream of seed s, which is a
function of the stream position only, so the k-th prompt is the same for every method
(a method that refills, e.g. DAPO's dynamic sampling, draws further along the same
stream). The report checks it from the prompts each run recorded.

Resumable: a run whose report is complete is skipped; an interrupted run resumes from its
last checkpoint (`policylab resume` machinery, so the resumed run equals the uninterrupted
one); a run interrupted before its first checkpoint starts again. A run directory made
with another config is refused before anything runs.

Before any run starts, every problem is reported at once: unknown methods or parameters,
labels that collide, a method the task cannot feed (a field its stages read that nothing
produces, or a judge that needs numeric gold answers on a task without them: derived from
the method's stage specs), budgets that are not comparable, and a task whose base accuracy
cannot be measured (no held-out split, eval.n < 1, a verifier that fails on or rejects
the reference answers).

The report (compare.{json,md} and curves.png in report_dir, default out_dir; the run
directories hold checkpoints, the report directory only the report): held-out accuracy ± standard
error at each evaluation, time to the target accuracy, sampled tokens per training
second, peak memory, clip and correction diagnostics, the difference of each method's
final accuracy from the first method's, and the learning curves of all methods.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policylab.trainer.config import ConfigError, RunConfig, config_from_dict, read_yaml

TOP_KEYS = ("out_dir", "report_dir", "methods", "seeds", "budget", "target_accuracy", "common_method_params",
            "keep_checkpoints", "run")
BUDGET_KINDS = ("steps", "seconds", "tokens")
DEFAULT_MAX_STEPS = 100_000
# fields a stage may read that the trainer itself produces (the rest must be written by a stage)
_TRAINER_FIELDS = {"tokens", "attention_mask", "loss_mask", "group", "batch_id", "policy_version", "logp", "entropy",
                   "prompt_width", "logp_old", "logp_ref", "values", "logp_current"}
_DIAG_SUFFIXES = ("frac_capped", "frac_masked", "ess", "kl_k3", "accepted_frac", "ess_after", "frac_far")


@dataclass
class Entry:
    name: str
    label: str
    method_params: dict


@dataclass
class PlannedRun:
    label: str
    method: str
    seed: int
    cfg: RunConfig
    state: str = "new"  # new | done | resume | restart

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)


@dataclass
class Plan:
    source: str
    out_dir: Path
    entries: list[Entry]
    seeds: list[int]
    budget_kind: str
    budget_value: float
    target: float | None
    runs: list[PlannedRun]
    notes: list[str] = field(default_factory=list)
    task_describe: str = ""
    report_dir: Path | None = None
    keep_checkpoints: bool = True

    @property
    def report_to(self) -> Path:
        return self.report_dir or self.out_dir


# ------------------------------------------------------------------------------------ loading
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
    from policylab import methods
    from policylab.errors import PolicylabError
    from policylab.trainer.loop import run_shape

    problems: list[str] = []
    notes: list[str] = []
    for k in data:
        if k not in TOP_KEYS:
            problems.append(f"unknown key `{k}`." + _close(k, TOP_KEYS))
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

    # ---- the shared run
    run = data.get("run", {})
    if not isinstance(run, dict):
        problems.append("`run` must be a mapping of run-config sections (model, task, rollout, train, eval, log)")
        run = {}
    run = copy.deepcopy(run)
    for k, why in (("method", "the methods come from `methods`"), ("seed", "the seeds come from `seeds`"),
                   ("run_dir", "each run's directory is made under `out_dir`"),
                   ("method_params", "give parameters per method or in `common_method_params`")):
        if k in run:
            problems.append(f"`run.{k}` is set: {why}")
            run.pop(k)
    train = run.setdefault("train", {}) if isinstance(run.get("train", {}), dict) else {}
    for k in ("budget_seconds", "budget_tokens"):
        if k in train:
            problems.append(f"`run.train.{k}` is set: the budget goes in `budget`")
            train.pop(k)

    # ---- methods
    entries: list[Entry] = []
    raw_methods = data.get("methods")
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

    # ---- seeds
    seeds = data.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if (not isinstance(seeds, list) or not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds)
            or len(set(seeds)) != len(seeds)):
        problems.append(f"`seeds` must be a non-empty list of distinct integers, got {seeds!r}")
        seeds = [0]

    # ---- budget
    kind, value, max_steps = _budget(data.get("budget"), train, problems)

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

    # ---- evaluation
    ev = run.get("eval", {}) if isinstance(run.get("eval", {}), dict) else {}
    for k in ("before", "after"):
        if ev.get(k) is False:
            problems.append(f"`run.eval.{k}` is false: the comparison reports the {'base' if k == 'before' else 'final'} "
                            "held-out accuracy of every run")
    log = run.setdefault("log", {}) if isinstance(run.get("log", {}), dict) else {}
    log["progress"] = False  # the comparison draws one progress display across runs
    if not log.get("checkpoint_every"):
        log["checkpoint_every"] = int(ev.get("every") or 5)

    # ---- every run's config
    runs: list[PlannedRun] = []
    base_cfg = None
    for e in entries:
        try:
            spec = methods.get(e.name)
        except PolicylabError as exc:
            problems.append(str(exc))
            continue
        declared = {q.name for q in spec.params}
        params = {k: v for k, v in common.items() if k in declared} | e.method_params
        for seed in seeds:
            d = copy.deepcopy(run)
            d.update(method=e.name, seed=seed, method_params=params,
                     run_dir=str(Path(out_dir) / "runs" / f"{e.label}-seed{seed}"))
            t = d.setdefault("train", {})
            if kind == "steps":
                t["steps"] = int(value)
            elif kind == "seconds":
                t.update(steps=max_steps, budget_seconds=float(value))
            elif kind == "tokens":
                t.update(steps=max_steps, budget_tokens=int(value))
            try:
                cfg = config_from_dict(d)
                method = spec.with_params(cfg.method_params, run_shape(cfg))
            except PolicylabError as exc:
                problems.append(f"{e.label}: {exc}")
                break
            if base_cfg is None:
                base_cfg = cfg
            runs.append(PlannedRun(e.label, e.name, seed, cfg))
            if seed == seeds[0]:
                problems += _budget_problems(e.label, method, cfg, kind, value)
                notes += _inert_note(e.label, spec, cfg)
    plan = Plan(source, Path(out_dir), entries, seeds, kind or "steps", value or 0, target, runs, notes,
                report_dir=Path(report_dir) if report_dir else None, keep_checkpoints=keep)
    if base_cfg is not None and not problems:
        problems += _task_problems(plan, base_cfg)
    if problems:
        listed = problems[0] if len(problems) == 1 else "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
        raise ConfigError(f"{source}: nothing was run: {listed}")
    _states(plan)
    return plan


def _budget(b, train: dict, problems: list[str]):
    if not isinstance(b, dict) or not b:
        problems.append("`budget` must be one of {steps: N}, {seconds: S}, {tokens: N} (optionally with max_steps)")
        return None, None, DEFAULT_MAX_STEPS
    unknown = set(b) - set(BUDGET_KINDS) - {"max_steps"}
    if unknown:
        problems.append(f"`budget` has unknown key(s) {sorted(unknown)}; use one of {', '.join(BUDGET_KINDS)} "
                        "(+ max_steps)")
    given = [k for k in BUDGET_KINDS if k in b]
    if len(given) != 1:
        problems.append(f"`budget` must give exactly one of steps, seconds, tokens (got {given or 'none'}): runs "
                        "under different budgets do not compare")
        return None, None, DEFAULT_MAX_STEPS
    kind = given[0]
    value = b[kind]
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    if kind in ("steps", "tokens") and not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        ok = False
    if not ok:
        problems.append(f"`budget.{kind}` must be a positive {'integer' if kind != 'seconds' else 'number'}, got {value!r}")
        return None, None, DEFAULT_MAX_STEPS
    max_steps = b.get("max_steps", DEFAULT_MAX_STEPS)
    if kind == "steps" and "max_steps" in b:
        problems.append("`budget.max_steps` caps a seconds or tokens budget; a steps budget is its own cap")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        problems.append(f"`budget.max_steps` must be a positive integer, got {max_steps!r}")
        max_steps = DEFAULT_MAX_STEPS
    if "steps" in train:
        if kind == "steps" and train["steps"] != value:
            problems.append(f"`run.train.steps` ({train['steps']}) and `budget.steps` ({value}) disagree: give the "
                            "budget once, in `budget`")
        elif kind != "steps":
            problems.append(f"`run.train.steps` is set with a {kind} budget: runs would stop at different budgets; "
                            "the step cap of a seconds or tokens budget is `budget.max_steps`")
        train.pop("steps")
    if kind != "steps" and train.get("decay", "constant") != "constant":
        problems.append(f"`run.train.decay` is {train['decay']!r} with a {kind} budget: the schedule's length is "
                        "train.steps, which a seconds or tokens budget does not fix, so the runs would decay at "
                        "different points; use decay constant or a steps budget")
    return kind, float(value) if kind == "seconds" else int(value), int(max_steps)


def _budget_problems(label: str, method, cfg: RunConfig, kind: str | None, value) -> list[str]:
    """A budget a method cannot spend comparably (derived from its spec)."""
    c = method.critic
    if c is not None and c.pretrain_param is not None and kind == "steps":
        n = int(method.p[c.pretrain_param])
        if n >= int(value):
            return [f"{label}: {c.pretrain_param}={n} critic-only steps use the whole budget of {value} steps: it "
                    "would never update the policy (lower the parameter or raise the budget)"]
    return []


def _inert_note(label: str, spec, cfg: RunConfig) -> list[str]:
    """Methods whose declared `exercise` settings are not met here do nothing beyond their host."""
    missing = []
    for section, keys in (spec.exercise or {}).items():
        sec = getattr(cfg, section, None)
        for k, want in keys.items():
            have = getattr(sec, k, None)
            if k == "engine_dtype" and want != "fp32" and have not in (None, "fp32"):
                continue  # any behavior engine that differs from the trainer (bf16, int8, int4) exercises it
            if have != want and not (isinstance(want, int) and isinstance(have, int) and have >= want > 0):
                missing.append(f"{section}.{k}={want}")
    if missing:
        return [f"{label} acts only with {', '.join(missing)} (its spec's `exercise`); at these settings it "
                "trains like its host method"]
    return []


# ------------------------------------------------------------------------ what the task can do
def feed_problems(method, numeric_answers: bool, example_answer: str = "") -> list[str]:
    """Why the task cannot feed `method` (empty: it can), from the method's active stages:
    a field a stage reads must be produced by the trainer or written by a stage, and a
    stage kernel that declares `task_needs` (rewards.graded: numeric gold answers) needs a
    task that has it."""
    from policylab.kernels.rewards.graded import NEEDS_NUMERIC_GOLD

    stages = [s for s in method.stages() if s.is_active(method.p)]
    written: dict[str, Any] = {}
    for s in stages:
        for w in s.writes:
            written.setdefault(w, s)
    out = []
    for s in stages:
        for f in s.reads:
            if f in _TRAINER_FIELDS or f in written:
                continue
            out.append(f"{method.name} reads `{f}` (stage `{s.name}`), which neither its stages nor the trainer "
                       "produce: no task can feed it")
    for s in stages:
        for k in s.kernels:
            if getattr(k, "task_needs", None) == NEEDS_NUMERIC_GOLD and not numeric_answers:
                what = ", ".join(w for w in s.writes) or "its output"
                out.append(f"{method.name} gets {what} from stage `{s.name}` ({k.__module__}.{k.__name__}), which "
                           f"needs numeric gold answers; this task's are not all numbers (e.g. {example_answer!r})")
    return out


def _is_number(text: str) -> bool:
    from decimal import Decimal, InvalidOperation

    try:
        return Decimal(str(text).strip().replace(",", "")).is_finite()
    except InvalidOperation:
        return False


def _task_problems(plan: Plan, cfg: RunConfig) -> list[str]:
    """Can the shared task be evaluated (a base accuracy measured) and fed to every method?"""
    from policylab import methods
    from policylab.errors import PolicylabError
    from policylab.kernels.rewards import combine_rewards
    from policylab.tasks.source import build_task, verifier_name
    from policylab.trainer.loop import run_shape

    problems = []
    if cfg.eval.n < 1:
        return [f"run.eval.n={cfg.eval.n}: the base accuracy of the task cannot be measured without held-out prompts"]
    if cfg.model != "embedded":
        from policylab.models.loading import check_model_dir

        if not Path(cfg.model).is_dir():
            return [f"model {cfg.model!r} is neither 'embedded' nor a directory"]
        try:
            check_model_dir(cfg.model)
        except (PolicylabError, FileNotFoundError) as exc:
            return [str(exc)]
    try:
        task = build_task(cfg.task, seed=cfg.seed)
        held = task.heldout(cfg.eval.n)
    except (PolicylabError, ImportError, FileNotFoundError) as exc:
        return [f"the task's base accuracy cannot be measured: {exc}"]
    plan.task_describe = task.describe
    if not held:
        return ["the task's base accuracy cannot be measured: its held-out split is empty"]
    sample = [e for e in held[: min(len(held), 20)] if str(e.answer)]
    verifier = verifier_name(cfg.task)
    if sample:
        fn = task.reward_fn
        try:
            scores, _ = combine_rewards([(verifier, fn, 1.0)], [str(e.answer) for e in sample],
                                        [e.answer for e in sample], prompts=[e.prompt for e in sample])
        except Exception as exc:  # the verifier's own code: any failure means no base accuracy
            return [f"the task's base accuracy cannot be measured: the verifier `{verifier}` fails on the held-out "
                    f"reference answers: {type(exc).__name__}: {' '.join(str(exc).split())}"]
        zero = [i for i, v in enumerate(scores.tolist()) if not v > 0]
        if zero:
            e = sample[zero[0]]
            problems.append(f"the task's base accuracy cannot be measured: the verifier `{verifier}` gives the "
                            f"reference answer itself 0 on {len(zero)} of {len(sample)} held-out examples, e.g. "
                            f"answer {str(e.answer)!r} of prompt {e.prompt[:80]!r}")
    numeric = all(_is_number(str(e.answer)) for e in held)
    example = next((str(e.answer) for e in held if not _is_number(str(e.answer))), "")
    for e in plan.entries:
        method = methods.get(e.name).with_params(next(r.cfg.method_params for r in plan.runs if r.label == e.label),
                                                 run_shape(cfg))
        problems += [f"{e.label}: {p}" for p in feed_problems(method, numeric, example)]
    return problems


# ------------------------------------------------------------------------ run states, resume
def _states(plan: Plan) -> None:
    from policylab.trainer.checkpoint import latest_checkpoint
    from policylab.trainer.run import RUN_FILES
    from policylab.trainer.support import load_run_config

    conflicts = []
    for r in plan.runs:
        d = r.run_dir
        if not (d / "config.yaml").exists():
            has_files = d.is_dir() and any((d / n).exists() for n in RUN_FILES)
            r.state = "restart" if has_files else "new"
            continue
        try:
            recorded = load_run_config(d).to_dict()
        except ConfigError as exc:
            conflicts.append(f"{d}: {exc}")
            continue
        planned = r.cfg.to_dict()
        if recorded != planned:
            diff = sorted(k for k in set(_flat(recorded)) | set(_flat(planned))
                          if _flat(recorded).get(k) != _flat(planned).get(k))
            conflicts.append(f"{d} holds a run made with another config (differs in {', '.join(diff[:6])}"
                             + (" ..." if len(diff) > 6 else "") + ")")
            continue
        report = _read_json(d / "report.json")
        if report.get("trained") and report.get("stopped_by"):
            r.state = "done"
        else:
            r.state = "resume" if latest_checkpoint(d) is not None else "restart"
    if conflicts:
        raise ConfigError(f"{plan.source}: nothing was run: " + "; ".join(conflicts)
                          + "; delete those run directories, choose another out_dir, or restore the config they were "
                            "made with")


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe_plan(plan: Plan) -> str:
    unit = {"steps": "rollout steps", "seconds": "s of training wall-clock", "tokens": "sampled tokens"}[plan.budget_kind]
    cfg = plan.runs[0].cfg
    r, t = cfg.rollout, cfg.train
    lines = [f"compare    {len(plan.entries)} method(s) x {len(plan.seeds)} seed(s) = {len(plan.runs)} runs in "
             f"{plan.out_dir}",
             f"budget     {plan.budget_value:g} {unit} per run" + (
                 f" (cap {t.steps} steps)" if plan.budget_kind != "steps" else
                 f" = {t.steps * t.epochs * t.minibatches} optimizer steps"),
             f"model      {cfg.model}",
             f"task       {plan.task_describe or cfg.task.name}",
             f"batch      {r.prompts_per_step} prompts x {r.group_size} samples, <= {r.max_new_tokens} new tokens, "
             f"T={r.temperature}, engine {r.engine}-{r.engine_dtype}; lr {t.lr}",
             f"held-out   {cfg.eval.n} prompts" + (f", every {cfg.eval.every} steps" if cfg.eval.every else "")]
    for n in plan.notes:
        lines.append(f"note       {n}")
    counts = {s: sum(1 for x in plan.runs if x.state == s) for s in ("done", "resume", "restart", "new")}
    lines.append("runs       " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ running
def run_plan(plan: Plan, *, console=None) -> dict:
    """Run every unfinished run (seed-major order), then write the report."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from policylab.errors import RunInterrupted
    from policylab.trainer.run import train

    console = console or Console()
    console.print(describe_plan(plan))
    todo = [r for r in sorted(plan.runs, key=lambda x: (plan.seeds.index(x.seed), _order(plan, x.label)))
            if r.state != "done"]
    budget = float(plan.budget_value)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), console=console, transient=False)
    done_before = len(plan.runs) - len(todo)
    with progress:
        overall = progress.add_task("all runs", total=len(plan.runs), completed=done_before,
                                    info=f"{done_before}/{len(plan.runs)} done")
        current = progress.add_task("", total=budget, visible=False, info="")
        for i, r in enumerate(todo):
            progress.update(current, description=f"{r.label} seed {r.seed}", completed=0, visible=True,
                            info=r.state)

            def on_step(trainer, m, _r=r):
                used = {"steps": trainer.step, "seconds": m.get("time/elapsed_s", 0.0),
                        "tokens": m.get("rollout/sampled_tokens_total", 0)}[plan.budget_kind]
                progress.update(current, completed=min(float(used), budget),
                                info=f"step {trainer.step}  acc {m.get('accuracy', float('nan')):.2f}")
                progress.update(overall, completed=done_before + i + min(float(used) / budget, 1.0))

            try:
                train(r.cfg, resume=r.state == "resume", overwrite=r.state == "restart", console=progress.console,
                      on_step=on_step)
            except RunInterrupted as exc:
                raise RunInterrupted(f"{exc.message}. The comparison stopped at run {r.label} seed {r.seed}: run "
                                     f"`policylab compare {plan.source}` again to continue (finished runs are "
                                     "skipped, this one resumes from its last checkpoint)") from None
            r.state = "done"
            if not plan.keep_checkpoints:
                _drop_checkpoints(r.run_dir, progress.console)
            progress.update(overall, completed=done_before + i + 1,
                            info=f"{done_before + i + 1}/{len(plan.runs)} done")
    report = write_report(plan)
    console.print(f"report: {plan.report_to / 'compare.md'}, {plan.report_to / 'compare.json'}, "
                  f"{plan.report_to / 'curves.png'}")
    return report


def _drop_checkpoints(run_dir: Path, console) -> None:
    """`keep_checkpoints: false`: a finished run's checkpoints go (the report reads only
    report.json and metrics.jsonl); an interrupted run keeps its own, to resume from."""
    import shutil

    ck = run_dir / "checkpoints"
    if ck.is_dir():
        size = sum(f.stat().st_size for f in ck.rglob("*") if f.is_file())
        shutil.rmtree(ck)
        console.print(f"{run_dir.name}: finished; its checkpoints ({size / 2**30:.1f} GiB) deleted "
                      "(keep_checkpoints: false)")


def _order(plan: Plan, label: str) -> int:
    return [e.label for e in plan.entries].index(label)


# ------------------------------------------------------------------------------------ report
def _run_result(r: PlannedRun) -> dict | None:
    from policylab.trainer.runlog import read_metrics, read_records

    rep = _read_json(r.run_dir / "report.json")
    path = r.run_dir / "metrics.jsonl"
    if not rep.get("trained") or not path.is_file():
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = read_records(path)
    rows = read_metrics(path, records)
    last = rows[-1] if rows else {}
    seconds = float(last.get("time/elapsed_s", rep.get("train_seconds", 0.0)))
    tokens = int(rep.get("sampled_tokens", last.get("rollout/sampled_tokens_total", 0)))
    points = [{"step": 0, "seconds": 0.0, "tokens": 0, "accuracy": rep["base"]["accuracy"],
               "stderr": rep["base"]["accuracy_stderr"]}]
    for row in rows:
        if isinstance(row.get("eval/accuracy"), (int, float)):
            points.append({"step": row["step"], "seconds": float(row.get("time/elapsed_s", 0.0)),
                           "tokens": int(row.get("rollout/sampled_tokens_total", 0)),
                           "accuracy": row["eval/accuracy"], "stderr": row.get("eval/accuracy_stderr", 0.0)})
    points.append({"step": int(rep.get("steps", len(rows))), "seconds": seconds, "tokens": tokens,
                   "accuracy": rep["trained"]["accuracy"], "stderr": rep["trained"]["accuracy_stderr"]})

    def mean(key):
        vals = [row[key] for row in rows if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]
        return sum(vals) / len(vals) if vals else None

    diag_keys = sorted({k for row in rows for k in row
                        if (k.startswith("correction/") and k.rsplit("/", 1)[-1] in _DIAG_SUFFIXES)
                        or k in ("mismatch/old_vs_behavior_abs_dlogp_mean", "staleness/versions_behind_mean")})
    peaks = [row[k] for row in rows for k in ("sys/peak_rss_mb",) if isinstance(row.get(k), (int, float))]
    return {
        "label": r.label, "method": r.method, "seed": r.seed, "run_dir": str(r.run_dir), "points": points,
        "steps": int(rep.get("steps", len(rows))), "optimizer_steps": int(last.get("policy_version", 0)),
        "train_seconds": seconds, "sampled_tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else None, "peak_rss_mb": max(peaks) if peaks else None,
        "clip_frac": mean("policy/clip_frac"), "train_accuracy_last": last.get("accuracy"),
        "diagnostics": {k: mean(k) for k in diag_keys}, "stopped_by": rep.get("stopped_by"),
        "prompt_digests": rep.get("prompt_digests", []), "resumed": any(rec.get("event") == "resumed_from"
                                                                        for rec in records),
    }


def _time_to(points: list[dict], target: float | None) -> dict | None:
    if target is None:
        return None
    for p in points:
        if p["accuracy"] >= target:
            return {"step": p["step"], "seconds": p["seconds"], "tokens": p["tokens"]}
    return None


def _agg(results: list[dict], target: float | None) -> dict:
    """One method over its seeds. s.e. of the mean accuracy: max(binomial, between-seed)."""
    k = len(results)
    by_step: dict[int, list[dict]] = {}
    for res in results:
        for p in res["points"][:-1]:
            by_step.setdefault(p["step"], []).append(p)
    curve = []
    for step in sorted(by_step):
        pts = by_step[step]
        if len(pts) == k:
            curve.append(_mean_point(step, pts))
    final = _mean_point(None, [res["points"][-1] for res in results])
    reached = [_time_to(res["points"], target) for res in results]
    hit = [x for x in reached if x is not None]

    def avg(key):
        vals = [res[key] for res in results if isinstance(res.get(key), (int, float))]
        return sum(vals) / len(vals) if vals else None

    diag = {}
    for key in sorted({k2 for res in results for k2 in res["diagnostics"]}):
        vals = [res["diagnostics"][key] for res in results if res["diagnostics"].get(key) is not None]
        if vals:
            diag[key] = sum(vals) / len(vals)
    return {"seeds": [res["seed"] for res in results], "curve": curve, "final": final,
            "time_to_target": {"reached": len(hit), "of": k,
                               "seconds_mean": sum(x["seconds"] for x in hit) / len(hit) if hit else None,
                               "steps_mean": sum(x["step"] for x in hit) / len(hit) if hit else None},
            "tokens_per_s": avg("tokens_per_s"), "peak_rss_mb": max((res["peak_rss_mb"] or 0) for res in results),
            "clip_frac": avg("clip_frac"), "train_seconds": avg("train_seconds"), "steps": avg("steps"),
            "optimizer_steps": avg("optimizer_steps"), "sampled_tokens": avg("sampled_tokens"), "diagnostics": diag}


def _mean_point(step, pts: list[dict]) -> dict:
    k = len(pts)
    accs = [p["accuracy"] for p in pts]
    m = sum(accs) / k
    binom = math.sqrt(sum(p["stderr"] ** 2 for p in pts)) / k
    seed_se = math.sqrt(sum((a - m) ** 2 for a in accs) / (k - 1) / k) if k > 1 else 0.0
    return {"step": step if step is not None else sum(p["step"] for p in pts) / k, "accuracy": m,
            "stderr": max(binom, seed_se), "stderr_binomial": binom, "stderr_seeds": seed_se if k > 1 else None,
            "per_seed": accs, "seconds": sum(p["seconds"] for p in pts) / k, "tokens": sum(p["tokens"] for p in pts) / k}


def same_prompts(results: list[dict]) -> dict:
    """Per seed: do the runs' recorded prompt streams agree on their common prefix?"""
    out = {}
    for seed in sorted({r["seed"] for r in results}):
        streams = [r["prompt_digests"] for r in results if r["seed"] == seed]
        n = min((len(s) for s in streams), default=0)
        agree = all(s[:n] == streams[0][:n] for s in streams)
        out[str(seed)] = {"runs": len(streams), "common_prefix": n, "agree": agree and n > 0}
    return out


def build_report(plan: Plan) -> dict:
    results = [res for res in (_run_result(r) for r in plan.runs) if res is not None]
    methods_out = {}
    for e in plan.entries:
        rs = [res for res in results if res["label"] == e.label]
        if rs:
            methods_out[e.label] = {"method": e.name, "method_params": e.method_params, **_agg(rs, plan.target)}
    ref = next(iter(methods_out), None)
    if ref is not None:
        f0 = methods_out[ref]["final"]
        for lab, m in methods_out.items():
            f = m["final"]
            se = math.sqrt(f["stderr"] ** 2 + f0["stderr"] ** 2)
            d = f["accuracy"] - f0["accuracy"]
            m["vs_first"] = {"reference": ref, "difference": d, "stderr": se, "z": d / se if se > 0 else None}
    cfg = plan.runs[0].cfg
    return {
        "config": plan.source, "out_dir": str(plan.out_dir), "budget": {plan.budget_kind: plan.budget_value},
        "target_accuracy": plan.target, "seeds": plan.seeds, "model": cfg.model, "task": plan.task_describe,
        "shared_run": _flat(cfg.to_dict()), "runs_finished": len(results), "runs_planned": len(plan.runs),
        "notes": plan.notes, "same_prompts": same_prompts(results), "methods": methods_out,
        "runs": [{k: v for k, v in res.items() if k != "prompt_digests"} for res in results],
        "machine": _machine(), "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def write_report(plan: Plan) -> dict:
    report = build_report(plan)
    to = plan.report_to
    to.mkdir(parents=True, exist_ok=True)
    (to / "compare.json").write_text(json.dumps(report, indent=2))
    plot_curves(report, to / "curves.png")
    (to / "compare.md").write_text(to_markdown(report))
    return report


def plot_curves(report: dict, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not report["methods"]:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for lab, m in report["methods"].items():
        pts = m["curve"] + [m["final"]]
        for ax, key in zip(axes, ("seconds", "step")):
            xs = [p[key] for p in pts]
            ys = [p["accuracy"] for p in pts]
            se = [p["stderr"] for p in pts]
            line, = ax.plot(xs, ys, marker="o", ms=3, label=f"{lab} ({len(m['seeds'])} seed(s))")
            ax.fill_between(xs, [y - s for y, s in zip(ys, se)], [y + s for y, s in zip(ys, se)],
                            color=line.get_color(), alpha=0.12)
    for ax, name in zip(axes, ("training wall-clock (s, evaluations excluded)", "rollout step")):
        ax.set_xlabel(name)
        ax.set_ylabel("held-out accuracy (T = 1)")
        ax.grid(alpha=0.3)
    if report.get("target_accuracy"):
        for ax in axes:
            ax.axhline(report["target_accuracy"], color="grey", ls="--", lw=0.8)
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{report['task']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pct(x, se=None) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" + (f" ± {100 * se:.1f}" if se is not None else "")


def to_markdown(report: dict) -> str:
    kind, value = next(iter(report["budget"].items()))
    unit = {"steps": "rollout steps", "seconds": "s of training wall-clock", "tokens": "sampled tokens"}[kind]
    M = report["methods"]
    lines = [f"# Method comparison: {report['task']}", "",
             f"`policylab compare {report['config']}`: {report['runs_finished']} of {report['runs_planned']} runs "
             f"finished; budget {value:g} {unit} per run; seeds {report['seeds']}; model {report['model']}.",
             f"Machine: {report['machine']}.", ""]
    sr = report["shared_run"]
    lines += [f"Shared run: {sr.get('rollout.prompts_per_step')} prompts x {sr.get('rollout.group_size')} samples, "
              f"<= {sr.get('rollout.max_new_tokens')} new tokens, T = {sr.get('rollout.temperature')}, engine "
              f"{sr.get('rollout.engine')}-{sr.get('rollout.engine_dtype')}, lr {sr.get('train.lr')}, "
              f"{sr.get('train.epochs')} epoch(s) x {sr.get('train.minibatches')} minibatch(es); held-out "
              f"{sr.get('eval.n')} prompts sampled at T = {sr.get('eval.temperature')}.", ""]
    if not M:
        return "\n".join(lines + ["No run has finished yet."]) + "\n"
    steps = sorted({p["step"] for m in M.values() for p in m["curve"]})
    head = ["method", "seeds"] + [("base" if s == 0 else f"step {s}") for s in steps] + [
        "final", "Δ final vs " + next(iter(M)), f"time to {_pct(report['target_accuracy'])}" if
        report["target_accuracy"] else "time to target", "tokens/s", "peak RSS (MB)", "clip frac",
        "correction / mismatch (run means)"]
    lines += ["Held-out accuracy (mean over seeds ± s.e.; s.e. = the larger of the binomial error of the mean and "
              "the between-seed error), at each evaluation:", "",
              "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lab, m in M.items():
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
        cells.append("-" if report["target_accuracy"] is None else (
            f"{tt['seconds_mean']:.0f} s, step {tt['steps_mean']:.0f} ({tt['reached']}/{tt['of']})" if tt["reached"]
            else f"not reached (0/{tt['of']})"))
        cells.append("-" if m["tokens_per_s"] is None else f"{m['tokens_per_s']:.0f}")
        cells.append("-" if not m["peak_rss_mb"] else f"{m['peak_rss_mb']:.0f}")
        cells.append("-" if m["clip_frac"] is None else f"{m['clip_frac']:.4f}")
        cells.append(", ".join(f"{k.split('/', 1)[1]}={v:.4g}" for k, v in m["diagnostics"].items()) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "![learning curves](curves.png)", ""]
    best = max(M.items(), key=lambda kv: kv[1]["final"]["accuracy"])
    sig = [lab for lab, m in M.items() if m.get("vs_first", {}).get("z") is not None and abs(m["vs_first"]["z"]) > 1.96]
    lines += [f"Highest final accuracy: `{best[0]}` ({_pct(best[1]['final']['accuracy'], best[1]['final']['stderr'])}). "
              + (f"Final accuracies differing from `{next(iter(M))}` by more than 1.96 s.e. (two-sided 5%, not "
                 f"corrected for {len(M) - 1} comparisons): {', '.join(f'`{x}`' for x in sig)}."
                 if sig else f"No method's final accuracy differs from `{next(iter(M))}` by more than 1.96 s.e.: no "
                             "significant difference at this budget."), ""]
    sp = report["same_prompts"]
    lines += ["Same prompts in the same order: " + "; ".join(
        f"seed {s}: {v['runs']} runs agree on the first {v['common_prefix']} prompts" if v["agree"]
        else f"seed {s}: the {v['runs']} runs' prompt streams DIFFER" for s, v in sp.items()) + ".", ""]
    for n in report["notes"]:
        lines.append(f"Note: {n}.")
    lines += ["", "Per run:", "", "| run | steps (optimizer) | training s | sampled tokens | stopped by | base | final |"
              " resumed |", "|---|---:|---:|---:|---|---:|---:|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['label']} seed {r['seed']} | {r['steps']} ({r['optimizer_steps']}) | "
                     f"{r['train_seconds']:.0f} | {r['sampled_tokens']} | {r['stopped_by']} | "
                     f"{_pct(r['points'][0]['accuracy'])} | {_pct(r['points'][-1]['accuracy'])} | "
                     f"{'yes' if r['resumed'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _machine() -> str:
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


def compare(config: str | Path | Plan, *, report_only: bool = False, plan_only: bool = False, console=None) -> dict:
    """The `policylab compare` command (see the module doc): `config` is a compare config
    file or a plan already loaded from one."""
    plan = config if isinstance(config, Plan) else load_plan(config)
    if plan_only:
        print(describe_plan(plan))
        for r in plan.runs:
            print(f"  {r.state:8s} {r.run_dir}")
        return {}
    if report_only:
        report = write_report(plan)
        print(f"report: {plan.report_to / 'compare.md'} ({report['runs_finished']} of {report['runs_planned']} runs)")
        return report
    return run_plan(plan, console=console)


__all__ = ["compare", "load_plan", "plan_from_dict", "feed_problems", "build_report", "same_prompts"]
