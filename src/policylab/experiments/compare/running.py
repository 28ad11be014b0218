"""Running a plan: every unfinished run in seed-major order under one progress display
(finished runs skipped, interrupted ones resumed from their last checkpoint), then the
report."""

from __future__ import annotations

from pathlib import Path

from policylab.experiments.compare.plan import Plan, PlannedRun, describe_plan
from policylab.experiments.compare.report import write_report


class _Display:
    """The progress display across runs: a bar over all runs, and one over the current
    run's budget (steps, training seconds or sampled tokens)."""

    def __init__(self, plan: Plan, todo: int, console):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.plan = plan
        self.budget = float(plan.budget_value)
        self.done_before = len(plan.runs) - todo
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), console=console, transient=False)

    def __enter__(self) -> _Display:
        self.progress.__enter__()
        n = len(self.plan.runs)
        self.overall = self.progress.add_task("all runs", total=n, completed=self.done_before,
                                              info=f"{self.done_before}/{n} done")
        self.current = self.progress.add_task("", total=self.budget, visible=False, info="")
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    @property
    def console(self):
        return self.progress.console

    def start(self, r: PlannedRun) -> None:
        self.progress.update(self.current, description=f"{r.label} seed {r.seed}", completed=0, visible=True,
                             info=r.state)

    def step_hook(self, i: int):
        """The trainer's on_step callback of the i-th run to do."""
        def on_step(trainer, m):
            used = {"steps": trainer.step, "seconds": m.get("time/elapsed_s", 0.0),
                    "tokens": m.get("rollout/sampled_tokens_total", 0)}[self.plan.budget_kind]
            self.progress.update(self.current, completed=min(float(used), self.budget),
                                 info=f"step {trainer.step}  acc {m.get('accuracy', float('nan')):.2f}")
            self.progress.update(self.overall, completed=self.done_before + i + min(float(used) / self.budget, 1.0))
        return on_step

    def finished(self, i: int) -> None:
        done = self.done_before + i + 1
        self.progress.update(self.overall, completed=done, info=f"{done}/{len(self.plan.runs)} done")


def run_plan(plan: Plan, *, console=None) -> dict:
    """Run every unfinished run (seed-major order), then write the report."""
    from rich.console import Console

    console = console or Console()
    console.print(describe_plan(plan))
    todo = [r for r in sorted(plan.runs, key=plan.order) if r.state != "done"]
    with _Display(plan, len(todo), console) as shown:
        for i, r in enumerate(todo):
            shown.start(r)
            _train(plan, r, shown.console, shown.step_hook(i))
            r.state = "done"
            if not plan.keep_checkpoints:
                _drop_checkpoints(r.run_dir, shown.console)
            shown.finished(i)
    report = write_report(plan)
    console.print(f"report: {plan.report_to / 'compare.md'}, {plan.report_to / 'compare.json'}, "
                  f"{plan.report_to / 'curves.png'}")
    return report


def _train(plan: Plan, r: PlannedRun, console, on_step) -> None:
    """One run (resumed or restarted as its state says); Ctrl-C says how to continue."""
    from policylab.errors import RunInterrupted
    from policylab.trainer.run import train

    try:
        train(r.cfg, resume=r.state == "resume", overwrite=r.state == "restart", console=console, on_step=on_step)
    except RunInterrupted as exc:
        raise RunInterrupted(f"{exc.message}. The comparison stopped at run {r.label} seed {r.seed}: run "
                             f"`policylab compare {plan.source}` again to continue (finished runs are "
                             "skipped, this one resumes from its last checkpoint)") from None


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
