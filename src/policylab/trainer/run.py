"""Running a training job end to end: the run directory checked, the trainer built (or
restored from a checkpoint), the base evaluation, the training loop with a live progress
bar, checkpoints, plots, the final evaluation and the report; `resume` continues a run
(what a resume may change: `trainer.resume`; what a run prints and writes:
`trainer.report`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from policylab.trainer.checkpoint import checkpoint_from, damaged, latest_checkpoint, load_checkpoint, verify_checkpoint, \
    verify_manifest
from policylab.errors import CheckpointError, ConfigError, NonFiniteError, RunInterrupted, Terminated
from policylab.trainer.config import RunConfig
from policylab.trainer.loop import Trainer
from policylab.trainer.memory import check_eval
from policylab.trainer.report import evaluate_and_print, make_console, print_note, print_report, read_report, summary, \
    write_report
from policylab.trainer.run_dir import check_new_run_dir, checkpoint_bytes, clean_stray, preflight, remove_previous
from policylab.trainer.run_paths import RunLock, check_run_tree, stale_note
from policylab.trainer.runlog import RunLog, write_plots
from policylab.trainer.support import load_run_config, save_config
from policylab.trainer.resume import identity_config, resume_changes


def _instrument(trainer: Trainer) -> None:
    """Count what the run samples for training and record the prompts it draws, in the
    run state the checkpoints carry (so both continue across resumes):

    run_state["sampled_tokens"]  response tokens the rollout backend produced for training
                                 (every generate request, refills included, and greedy
                                 decodes; held-out evaluation samples through the engine
                                 directly and is not counted)
    run_state["prompt_digests"]  the first 12 hex digits of sha256(prompt) of every training
                                 prompt drawn, in order: runs of different methods with the
                                 same seed and task draw the same stream (checked by
                                 `policylab compare`)
    """
    import hashlib

    rollout, task = trainer.rollout, trainer.task
    generate, greedy, next_train = rollout.generate, rollout.greedy, task.next_train

    def add_tokens(n: int) -> None:
        trainer.run_state["sampled_tokens"] = int(trainer.run_state.get("sampled_tokens", 0)) + int(n)

    def counted_generate(*args, **kwargs):
        batch = generate(*args, **kwargs)
        add_tokens(int(batch.loss_mask.sum()))
        return batch

    def counted_greedy(*args, **kwargs):
        out = greedy(*args, **kwargs)
        add_tokens(sum(len(x) for x in out))
        return out

    def recorded_next_train(n: int):
        examples = next_train(n)
        digests = trainer.run_state.setdefault("prompt_digests", [])
        digests.extend(hashlib.sha256(e.prompt.encode()).hexdigest()[:12] for e in examples)
        return examples

    rollout.generate, rollout.greedy, task.next_train = counted_generate, counted_greedy, recorded_next_train


def budget_reached(cfg: RunConfig, run_state: dict) -> str | None:
    """Which budget of train.budget_seconds / train.budget_tokens the run has used up
    (None: neither). train.steps is checked by the loop itself."""
    t = cfg.train
    if t.budget_seconds and float(run_state.get("elapsed_s", 0.0)) >= t.budget_seconds:
        return "budget_seconds"
    if t.budget_tokens and int(run_state.get("sampled_tokens", 0)) >= t.budget_tokens:
        return "budget_tokens"
    return None


@dataclass
class _Start:
    """How a run starts: fresh (with the previous run's files `--overwrite` removes) or
    resumed from `checkpoint` (with the settings `policylab resume --set` changed)."""

    resume: bool
    checkpoint: Path | None = None
    previous: list[str] = field(default_factory=list)
    changes: dict = field(default_factory=dict)


def train(cfg: RunConfig, *, resume: bool = False, console=None, overwrite: bool = False,
          config_path: str | Path | None = None, on_step=None) -> dict:
    """Train (or, with `resume`, continue from its latest checkpoint) the run `cfg`
    describes, evaluate, report.

    A fresh run refuses a run_dir holding a previous run unless `overwrite` (see
    `run_dir.check_new_run_dir`). Before step 1: the run directory is checked writable with
    room for one checkpoint, stray temporary checkpoint directories are removed. Ctrl-C
    raises RunInterrupted, whose message names the step, the last checkpoint and how to
    resume. The run ends after train.steps steps, or earlier when train.budget_seconds of
    training wall-clock or train.budget_tokens sampled tokens are used up (report
    "stopped_by"). `on_step(trainer, metrics)` is called after every logged step."""
    from policylab.trainer.config import check_model_value

    check_model_value("model", cfg.model)  # before the run directory is created or anything in it removed
    if resume:
        return continue_run(cfg, console=console, on_step=on_step)
    previous = check_new_run_dir(cfg, overwrite=overwrite, config_path=config_path)
    return _run(cfg, _Start(resume=False, previous=previous), console, on_step)


def continue_run(cfg: RunConfig, *, from_checkpoint: str | None = None, changes: dict | None = None, console=None,
                 on_step=None) -> dict:
    """Continue the run in cfg.run_dir from its latest checkpoint (or `from_checkpoint`, e.g.
    "step_000004"), verified before anything else happens; `changes` are the settings a
    resume changed, {key: (recorded, new)} (recorded in config.yaml and the report)."""
    from policylab.trainer.config import check_model_value

    check_model_value("model", cfg.model)
    run_dir = Path(cfg.run_dir)
    check_run_tree(run_dir)  # no link out of the run, no FIFO / device / socket, before anything is opened
    ckpt = checkpoint_from(run_dir, from_checkpoint) if from_checkpoint else latest_checkpoint(run_dir)
    if ckpt is None:
        raise ConfigError(f"{run_dir} has no complete checkpoint to resume from")
    try:
        verify_checkpoint(ckpt, ("model",))
        verify_manifest(ckpt, identity_config(cfg))
    except CheckpointError as exc:
        raise damaged(run_dir, ckpt, str(exc)) from None
    return _run(cfg, _Start(resume=True, checkpoint=ckpt, changes=dict(changes or {})), console, on_step)


def _build(cfg: RunConfig, start: _Start, console) -> Trainer:
    """Check the run directory, build the trainer, restore the checkpoint when resuming."""
    run_dir = Path(cfg.run_dir)
    preflight(run_dir)
    for name in clean_stray(run_dir):
        print_note(f"removed {run_dir / 'checkpoints' / name}, left by an interrupted checkpoint write")
    trainer = Trainer(cfg, console=console)
    _instrument(trainer)
    if start.previous:
        remove_previous(run_dir, start.previous)
        print_note(f"--overwrite: removed the previous run's {', '.join(start.previous)} from {run_dir}")
    optimizers = [o for o in (trainer.optimizer, trainer.critic_opt) if o is not None]
    preflight(run_dir, need_bytes=int(checkpoint_bytes(trainer.models(), optimizers) * 1.1) + (16 << 20))
    if start.resume:
        trainer.load_state(load_checkpoint(start.checkpoint, trainer.models(), run_dir))
        if start.changes:
            save_config(cfg, run_dir)
    return trainer


def _open(trainer: Trainer, log: RunLog, start: _Start, console) -> None:
    """The run's first log event (start, or resumed_from with the changes) and its header."""
    cfg, run_dir = trainer.cfg, trainer.run_dir
    if start.resume:
        event = {"event": "resumed_from", "step": trainer.step, "time": time.time(), "checkpoint": start.checkpoint.name}
        if start.changes:
            event["changes"] = {k: [a, b] for k, (a, b) in start.changes.items()}
            print_note("resume changes (recorded in config.yaml): "
                       + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in start.changes.items()))
        log.event(**event)
        console.print(f"[bold]resumed[/] {run_dir} at step {trainer.step} ({start.checkpoint.name})")
    else:
        save_config(cfg, run_dir)
        log.event(event="start", method=cfg.method, model=cfg.model, time=time.time())
    console.print(summary(trainer))
    if cfg.eval.n > 0 and (cfg.eval.before or cfg.eval.after or cfg.eval.every):
        check_eval(trainer)


def _finish(trainer: Trainer, report: dict, log: RunLog, start: _Start, resumed_at: int, console) -> None:
    """After the last step: the final checkpoint and evaluation, the report's totals."""
    cfg = trainer.cfg
    # every part of the run counts: the parts up to the checkpoint resumed from + this one
    report["train_seconds"] = trainer.run_state["train_seconds"]
    report["train_seconds_parts"] = trainer.run_state["train_seconds_parts"]
    trainer.save()
    if cfg.eval.after and cfg.eval.n > 0:
        report["trained"] = evaluate_and_print(trainer, "trained", console)
        log.event(event="eval", at_step=trainer.step, **{f"eval/{k}": v for k, v in report["trained"].items()})
    report.update(method=cfg.method, model=cfg.model, steps=trainer.step, policy_version=trainer.policy_version,
                  stopped_by=budget_reached(cfg, trainer.run_state) or "steps",
                  sampled_tokens=int(trainer.run_state.get("sampled_tokens", 0)),
                  prompt_digests=list(trainer.run_state.get("prompt_digests", [])))
    for key, section in trainer.method.report_sections:  # e.g. a test-time method's adaptation budgets
        report[key] = section(trainer.shape, cfg.train.steps)
    if start.changes:
        report.setdefault("resume_changes", []).append(
            {"at_step": resumed_at, **{k: [a, b] for k, (a, b) in start.changes.items()}})


def _run(cfg: RunConfig, start: _Start, console, on_step) -> dict:
    console = console or make_console()
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir).acquire()  # one run per directory, before anything in it is changed
    try:
        if lock.stale:
            print_note(stale_note(run_dir, lock.stale))
        return _run_locked(cfg, start, console, on_step)  # SIGTERM: the command line raises Terminated
    finally:
        lock.release()


def _run_locked(cfg: RunConfig, start: _Start, console, on_step) -> dict:
    run_dir = Path(cfg.run_dir)
    trainer = None
    try:
        trainer = _build(cfg, start, console)
        report_path = run_dir / "report.json"
        report = read_report(report_path) if start.resume else {}
        log = RunLog(run_dir, tensorboard=cfg.log.tensorboard)
    except OSError as exc:
        if _disk_full(exc):
            raise _disk_full_error(run_dir, exc, "before step 1") from None
        raise
    except KeyboardInterrupt as exc:
        code = 143 if isinstance(exc, Terminated) else 130
        raise RunInterrupted(f"{_signal_name(exc)} before the run started; nothing was trained", code) from None
    try:
        resumed_at = trainer.step
        _open(trainer, log, start, console)
        if cfg.eval.before and "base" not in report and cfg.eval.n > 0:
            report["base"] = evaluate_and_print(trainer, "base", console)
            log.event(event="eval", at_step=0, **{f"eval/{k}": v for k, v in report["base"].items()})
            write_report(report_path, report)
        _loop(trainer, log, console, on_step)
        _finish(trainer, report, log, start, resumed_at, console)
        write_report(report_path, report)
        write_plots(run_dir)
    except KeyboardInterrupt as exc:
        code = 143 if isinstance(exc, Terminated) else 130
        raise RunInterrupted(_interrupted(trainer, run_dir, _signal_name(exc)), code) from None
    except OSError as exc:
        if _disk_full(exc):
            raise _disk_full_error(run_dir, exc, f"after step {trainer.step}") from None
        raise
    finally:
        log.close()
    print_report(report, console, run_dir)
    return report


def _signal_name(exc: BaseException) -> str:
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"


def _disk_full(exc: BaseException) -> bool:
    import errno

    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _disk_full_error(run_dir: Path, exc: OSError, when: str) -> CheckpointError:
    """A full disk outside a checkpoint write (metrics.jsonl, a plot, report.json ...): the
    path that could not be written and the checkpoint that is intact."""
    from policylab.trainer.checkpoint import latest_name_or_none

    last = latest_name_or_none(run_dir)
    where = exc.filename or "a file of the run directory"
    intact = (f"the last checkpoint, {last}, is intact (LATEST unchanged); free some space, then "
              f"`policylab resume {run_dir}`") if last else "no checkpoint was written yet"
    return CheckpointError(f"no space left on device while writing {where} ({when}); {intact}")


def _interrupted(trainer: Trainer, run_dir: Path, how: str = "interrupted") -> str:
    from policylab.trainer.checkpoint import latest_name_or_none

    done, total = trainer.step, trainer.cfg.train.steps
    last = latest_name_or_none(run_dir)
    at = f"{how} at step {min(done + 1, total)} of {total} ({done} done)" if done < total else \
        f"{how} after all {total} steps (during the final checkpoint or evaluation)"
    if last is None:
        return (f"{at}; no checkpoint was written yet, so there is nothing to resume: train again with "
                f"--overwrite (or set log.checkpoint_every to checkpoint as the run goes)")
    from policylab.trainer.trust import imported_modules, trusted_module

    flag = " --allow-imports" if any(not trusted_module(m) for m, _ in imported_modules(trainer.cfg)) else ""
    return f"{at}; last checkpoint: {last}; resume with `policylab resume {run_dir}{flag}`"


def _loop(trainer: Trainer, log: RunLog, console, on_step=None) -> None:
    cfg = trainer.cfg
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"),
        TimeRemainingColumn(), TextColumn("{task.fields[stats]}"), console=console, disable=not cfg.log.progress,
    )
    t0, t_eval = time.perf_counter(), 0.0
    # both clocks continue across resumes: the checkpoint carries them (trainer.run_state);
    # train_seconds_parts holds each part's loop time (the first run up to the checkpoint
    # resumed from, then each resume), train_seconds their sum
    rs = trainer.run_state
    parts = [float(x) for x in rs.get("train_seconds_parts", [rs["train_seconds"]] if "train_seconds" in rs else [])]
    elapsed0 = float(rs.get("elapsed_s", 0.0))

    def account():
        now = parts + [time.perf_counter() - t0]
        rs.update(train_seconds=sum(now), train_seconds_parts=now)

    account()
    with progress:
        task = progress.add_task("train", total=cfg.train.steps, completed=trainer.step, stats="")
        while trainer.step < cfg.train.steps and budget_reached(cfg, rs) is None:
            try:
                m = trainer.train_step()
            except NonFiniteError as exc:
                _diverged(trainer, exc)
                raise
            step = trainer.step
            m["time/elapsed_s"] = elapsed0 + time.perf_counter() - t0 - t_eval  # training wall time (evaluations excluded)
            rs["elapsed_s"] = m["time/elapsed_s"]
            last = step >= cfg.train.steps or budget_reached(cfg, rs) is not None  # the final evaluation follows
            if cfg.eval.every and step % cfg.eval.every == 0 and not last:
                te = time.perf_counter()
                ev = trainer.evaluate(f"step{step}")
                t_eval += time.perf_counter() - te
                m.update({f"eval/{k}": v for k, v in ev.items() if isinstance(v, (int, float))})
            m["rollout/sampled_tokens_total"] = int(rs.get("sampled_tokens", 0))
            log.log(step, m)
            stats = (
                f"reward {m.get('reward/mean', float('nan')):.3f}  acc {m.get('accuracy', float('nan')):.3f}  "
                f"len {m.get('response/length_mean', float('nan')):.1f}  {m.get('time/step_s', 0):.1f}s/step"
            )
            progress.update(task, completed=step, stats=stats)
            account()
            if on_step is not None:
                on_step(trainer, m)
            if cfg.log.checkpoint_every and step % cfg.log.checkpoint_every == 0 and not last:
                trainer.save()
            if cfg.log.plot_every and step % cfg.log.plot_every == 0:
                write_plots(trainer.run_dir)
    account()


def _diverged(trainer: Trainer, exc: Exception) -> None:
    """A step failed on a non-finite value: if the weights themselves are no longer finite
    (an update diverged), say that, rather than where the NaN surfaced."""
    from policylab.trainer.checkpoint import DIVERGED_ADVICE, latest_name_or_none, first_nonfinite_weight

    bad = first_nonfinite_weight(trainer.models())
    if bad is None:
        return
    last = latest_name_or_none(trainer.run_dir)
    raise NonFiniteError(
        f"the weights hold NaN or inf after step {trainer.step} ({bad}); {DIVERGED_ADVICE}. Step {trainer.step + 1} "
        f"stopped at: {exc}. Weights like these are never checkpointed: "
        + (f"the last checkpoint, {last}, is intact" if last else "no checkpoint was written")
    ) from None


def resume(run_dir: str | Path, overrides: list[str] = (), console=None, *, allow_imports: bool = False,
           from_checkpoint: str | None = None) -> dict:
    """Continue the run in `run_dir` from its latest checkpoint (or `from_checkpoint`,
    e.g. "step_000004"). `overrides` may change only `trainer.resume.RESUME_CHANGEABLE`
    keys; reward code outside policylab needs `allow_imports` (see
    `trainer.resume.load_received_run`)."""
    from policylab.trainer.config import parse_overrides

    run_dir = Path(run_dir)
    parse_overrides(overrides)  # a malformed --set is reported before anything is read
    cfg = load_run_config(run_dir)
    cfg.run_dir = str(run_dir)
    cfg, changes = resume_changes(cfg, overrides)  # run_dir among them: refused (resume writes where it reads)
    from policylab.trainer.trust import check_imports

    check_imports(cfg, str(run_dir / "config.yaml"), allow=allow_imports, say=print_note)
    return continue_run(cfg, from_checkpoint=from_checkpoint, changes=changes, console=console)
