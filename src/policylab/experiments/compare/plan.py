"""What a compare config becomes once checked: the method entries, the budget, and one
planned run (its run config and state) per method and seed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from policylab.trainer.config import RunConfig

BUDGET_KINDS = ("steps", "seconds", "tokens")
BUDGET_UNITS = {"steps": "rollout steps", "seconds": "s of training wall-clock", "tokens": "sampled tokens"}
DEFAULT_MAX_STEPS = 100_000


@dataclass
class Entry:
    """One method of the comparison: its registered name, the label its runs and its row
    of the report carry, and the parameters given to it alone."""
    name: str
    label: str
    method_params: dict


@dataclass
class Budget:
    """What every run may spend: `kind` is one of BUDGET_KINDS (None when the config's
    budget was refused), `max_steps` caps a seconds or tokens budget."""
    kind: str | None
    value: float | int | None
    max_steps: int = DEFAULT_MAX_STEPS


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

    def order(self, run: PlannedRun) -> tuple[int, int]:
        """Seed-major order: every method's run of the first seed, then of the next."""
        return self.seeds.index(run.seed), [e.label for e in self.entries].index(run.label)


def describe_plan(plan: Plan) -> str:
    """The plan as `policylab compare --plan` (and the start of a comparison) prints it."""
    cfg = plan.runs[0].cfg
    r, t = cfg.rollout, cfg.train
    lines = [f"compare    {len(plan.entries)} method(s) x {len(plan.seeds)} seed(s) = {len(plan.runs)} runs in "
             f"{plan.out_dir}",
             f"budget     {plan.budget_value:g} {BUDGET_UNITS[plan.budget_kind]} per run" + (
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
