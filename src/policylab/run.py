"""Running a training job end to end: start-up summary, base evaluation, the training
loop with a live progress bar, checkpoints, plots, final evaluation and the report."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .config import ConfigError, RunConfig
from .runlog import RunLog, write_plots
from .trainer import Trainer, load_run_config, save_config


def _console():
    from rich.console import Console

    return Console()


def summary(trainer: Trainer) -> str:
    cfg, rc = trainer.cfg, trainer.method
    n = sum(p.numel() for p in trainer.model.parameters())
    ntrain = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    card = rc.card
    p = rc.p
    kl = (f"{p['kl_estimator']} x {p['kl_coef']} in the {p['kl_placement']}"
          if "kl_coef" in p and p["kl_coef"] > 0 else "none")
    r, t = cfg.rollout, cfg.train
    lines = [
        f"model      {cfg.model}  ({n / 1e6:.1f}M params, {ntrain / 1e6:.1f}M trainable, {t.dtype} training)",
        f"method     {rc.name}: {card.summary}",
        f"samples    {card.samples}  [engine {trainer.engine.engine_name}]",
        f"learns     {card.learns}",
        f"reference  {card.reference}  [KL: {kl}]",
        f"device     cpu, {__import__('torch').get_num_threads()} threads, allocator: {_allocator_line()}",
        f"batch      {r.prompts_per_step} prompts x {r.group_size} samples, <= {r.max_new_tokens} new tokens, "
        f"T={r.temperature}; {t.epochs} pass(es) x {t.minibatches} minibatch(es), micro-batch {t.micro_batch_size}",
        f"old logp   {'recomputed by the trainer' if trainer.needs_old_pass() else 'same forward (single on-policy update: ratio exactly 1)'}",
        f"params     " + ", ".join(f"{k}={v}" for k, v in p.items()),
        f"run dir    {cfg.run_dir}",
    ]
    return "\n".join(lines)


def _allocator_line() -> str:
    from . import runtime

    lim = runtime.applied_limit()
    return "system default" if lim is None else f"freed blocks <= {lim >> 20} MiB kept for reuse"


def train(cfg: RunConfig, *, resume: bool = False, console=None) -> dict:
    console = console or _console()
    run_dir = Path(cfg.run_dir)
    if not resume and (run_dir / "checkpoints" / "LATEST").exists():
        raise ConfigError(
            f"{run_dir} already holds a run with checkpoints; use `policylab resume {run_dir}` or choose another run_dir "
            "(nothing is overwritten)"
        )
    trainer = Trainer(cfg, console=console)
    log = RunLog(run_dir, tensorboard=cfg.log.tensorboard)
    report_path = run_dir / "report.json"
    report = json.loads(report_path.read_text()) if resume and report_path.exists() else {}
    if resume:
        if not trainer.restore():
            raise ConfigError(f"{run_dir} has no complete checkpoint to resume from")
        log.event(event="resumed_from", step=trainer.step, time=time.time())
        console.print(f"[bold]resumed[/] {run_dir} at step {trainer.step}")
    else:
        save_config(cfg, run_dir)
        log.event(event="start", method=cfg.method, model=cfg.model, time=time.time())
    console.print(summary(trainer))
    if cfg.eval.before and "base" not in report and cfg.eval.n > 0:
        report["base"] = _eval(trainer, "base", console)
        log.event(event="eval", at_step=0, **{f"eval/{k}": v for k, v in report["base"].items()})
        _write_report(report_path, report)
    t_start = time.perf_counter()
    _loop(trainer, log, console)
    report["train_seconds"] = report.get("train_seconds", 0.0) + time.perf_counter() - t_start
    trainer.save()
    if cfg.eval.after and cfg.eval.n > 0:
        report["trained"] = _eval(trainer, "trained", console)
        log.event(event="eval", at_step=trainer.step, **{f"eval/{k}": v for k, v in report["trained"].items()})
    report.update(method=cfg.method, model=cfg.model, steps=trainer.step, policy_version=trainer.policy_version)
    _write_report(report_path, report)
    write_plots(run_dir)
    log.close()
    _print_report(report, console, run_dir)
    return report


def resume(run_dir: str | Path, overrides: list[str] = (), console=None) -> dict:
    cfg = load_run_config(Path(run_dir))
    if overrides:
        from .config import _apply, validate

        for item in overrides:
            k, v = item.split("=", 1)
            _apply(cfg, k.strip(), v)
        validate(cfg)
    cfg.run_dir = str(run_dir)
    return train(cfg, resume=True, console=console)


def _loop(trainer: Trainer, log: RunLog, console) -> None:
    cfg = trainer.cfg
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"),
        TimeRemainingColumn(), TextColumn("{task.fields[stats]}"), console=console, disable=not cfg.log.progress,
    )
    t0, t_eval = time.perf_counter(), 0.0
    with progress:
        task = progress.add_task("train", total=cfg.train.steps, completed=trainer.step, stats="")
        while trainer.step < cfg.train.steps:
            m = trainer.train_step()
            step = trainer.step
            m["time/elapsed_s"] = time.perf_counter() - t0 - t_eval  # training wall time (evaluations excluded)
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.train.steps:
                te = time.perf_counter()
                ev = trainer.evaluate(f"step{step}")
                t_eval += time.perf_counter() - te
                m.update({f"eval/{k}": v for k, v in ev.items() if isinstance(v, (int, float))})
            log.log(step, m)
            stats = (
                f"reward {m.get('reward/mean', float('nan')):.3f}  acc {m.get('accuracy', float('nan')):.3f}  "
                f"len {m.get('response/length_mean', float('nan')):.1f}  {m.get('time/step_s', 0):.1f}s/step"
            )
            progress.update(task, completed=step, stats=stats)
            if cfg.log.checkpoint_every and step % cfg.log.checkpoint_every == 0 and step < cfg.train.steps:
                trainer.save()
            if cfg.log.plot_every and step % cfg.log.plot_every == 0:
                write_plots(trainer.run_dir)


def _eval(trainer: Trainer, label: str, console) -> dict:
    t0 = time.perf_counter()
    with console.status(f"evaluating {label} model on {trainer.cfg.eval.n} held-out prompts ..."):
        res = trainer.evaluate(label)
    res["seconds"] = time.perf_counter() - t0
    console.print(f"[bold]{label}[/]: accuracy {res['accuracy']:.3f} ± {res['accuracy_stderr']:.3f} "
                  f"(n={res['n_prompts']}x{res['samples_per_prompt']}), mean length {res['mean_length']:.1f}")
    return res


def _write_report(path: Path, report: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(path)


def _print_report(report: dict, console, run_dir: Path) -> None:
    from rich.table import Table

    base, trained = report.get("base"), report.get("trained")
    table = Table(title=f"policylab report: {report.get('method')} on {report.get('model')}")
    table.add_column("held-out metric")
    table.add_column("base", justify="right")
    table.add_column("trained", justify="right")
    keys = [k for k in (trained or base or {}) if k.startswith("pass@") or k in ("accuracy", "mean_length")]
    for k in keys:
        b = f"{base[k]:.3f}" if base and k in base else "-"
        t = f"{trained[k]:.3f}" if trained and k in trained else "-"
        table.add_row(k, b, t)
    console.print(table)
    console.print(f"training time {report.get('train_seconds', 0):.0f}s, {report.get('steps')} steps; "
                  f"metrics, plots and checkpoints in {run_dir}")
