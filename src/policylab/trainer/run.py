"""Running a training job end to end: start-up summary, base evaluation, the training
loop with a live progress bar, checkpoints, plots, final evaluation and the report."""

from __future__ import annotations

import json
import time
from pathlib import Path

from policylab.trainer.checkpoint import (
    checkpoint_bytes,
    checkpoint_from,
    clean_stray,
    damaged,
    latest_checkpoint,
    load_checkpoint,
    preflight,
    verify_checkpoint,
)
from policylab.trainer.config import ConfigError, RunConfig
from policylab.errors import CheckpointError, NonFiniteError, RunDirError, RunInterrupted
from policylab.trainer.memory import check_eval
from policylab.trainer.runlog import RunLog, write_plots
from policylab.trainer.loop import Trainer, load_run_config, save_config


def make_console():
    from rich.console import Console

    return Console()


def summary(trainer: Trainer) -> str:
    cfg, rc = trainer.cfg, trainer.method
    n = sum(p.numel() for p in trainer.model.parameters())
    ntrain = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    card = rc.card
    p = rc.p
    r, t = cfg.rollout, cfg.train
    lines = [
        f"model      {cfg.model}  ({n / 1e6:.1f}M params, {ntrain / 1e6:.1f}M trainable, {t.dtype} training)",
        f"method     {rc.name}: {card.summary}",
        f"samples    {card.samples}  [engine {trainer.engine.engine_name}]",
        f"learns     {card.learns}",
        f"reference  {card.reference}",
        *(f"{label:<10} {text}" for label, text in (line(p) for line in rc.header)),
        f"device     cpu, {__import__('torch').get_num_threads()} threads, allocator: {_allocator_line()}",
        f"batch      {r.prompts_per_step} prompts x {r.group_size} samples, <= {r.max_new_tokens} new tokens, "
        f"T={r.temperature}; {t.epochs} pass(es) x {t.minibatches} minibatch(es), micro-batch {t.micro_batch_size}",
        f"old logp   {'recomputed by the trainer' if trainer.needs_old_pass() else 'same forward (single on-policy update: ratio exactly 1)'}",
        f"params     " + ", ".join(f"{k}={v}" for k, v in p.items()),
        f"run dir    {cfg.run_dir}",
    ]
    return "\n".join(lines)


def _allocator_line() -> str:
    from policylab.trainer import runtime

    lim = runtime.applied_limit()
    return "system default" if lim is None else f"freed blocks <= {lim >> 20} MiB kept for reuse"


# files and directories a run writes into its run_dir (a directory holding any of them
# holds a previous run)
RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.jsonl.partial", "report.json", "plots", "tensorboard",
             "checkpoints")

# keys `policylab resume --set` may change: none alters the method, the data stream or
# the model (train.micro_batch_size and train.shared_prefix give the same update up to
# float rounding); every other key is refused
RESUME_CHANGEABLE = ("train.steps", "train.micro_batch_size", "train.shared_prefix", "eval.*", "log.*", "threads",
                     "keep_freed_memory")


def print_note(text: str) -> None:
    """One line on stderr (stdout stays the command's output)."""
    import sys

    print(f"policylab: {text}", file=sys.stderr, flush=True)


def check_new_run_dir(cfg: RunConfig, *, overwrite: bool = False, config_path: str | Path | None = None) -> list[str]:
    """Refuse a run_dir a fresh run must not write into: the current directory, a file, or
    a directory holding a previous run's files (unless `overwrite`; never the config file
    being trained from). Returns the previous run's entries `overwrite` will remove."""
    run_dir = Path(cfg.run_dir)
    if not str(cfg.run_dir).strip():
        raise RunDirError("run_dir is empty: give the run a directory of its own (--set run_dir=runs/NAME)")
    if run_dir.resolve() == Path.cwd().resolve():
        raise RunDirError(
            f"run_dir {cfg.run_dir!r} is the current directory: a run writes config.yaml, metrics.jsonl, report.json, "
            "plots/ and checkpoints/ into its run_dir; give it a directory of its own (--set run_dir=runs/NAME)"
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run_dir {run_dir} exists and is not a directory")

    def holds(name: str) -> bool:
        p = run_dir / name
        if p.is_dir() and not p.is_symlink():  # an empty directory holds nothing to lose
            return any(q.is_file() or q.is_symlink() for q in p.rglob("*"))
        return p.exists() or p.is_symlink()

    found = [n for n in RUN_FILES if holds(n)]
    if config_path is not None and (run_dir / "config.yaml").exists():
        if Path(config_path).resolve() == (run_dir / "config.yaml").resolve():
            raise RunDirError(
                f"{config_path} is the config file you train from and also the config.yaml of run_dir {run_dir}: "
                "training would overwrite it. Copy it out of the run directory (or choose another run_dir)"
            )
    if found and not overwrite:
        has_ckpt = (run_dir / "checkpoints" / "LATEST").exists()
        cont = f"use `policylab resume {run_dir}` to continue it, " if has_ckpt else ""
        raise RunDirError(
            f"{run_dir} already holds a run ({', '.join(found)}); {cont}choose another run_dir, or pass --overwrite "
            "to replace it (nothing was changed)"
        )
    return found


def _remove_previous(run_dir: Path, names: list[str]) -> None:
    import shutil

    for n in names:
        p = run_dir / n
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


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


def train(cfg: RunConfig, *, resume: bool = False, console=None, overwrite: bool = False,
          config_path: str | Path | None = None, from_checkpoint: str | None = None,
          changes: dict | None = None, on_step=None) -> dict:
    """Train (or, with `resume`, continue) the run `cfg` describes, evaluate, report.

    A fresh run refuses a run_dir holding a previous run unless `overwrite` (see
    `check_new_run_dir`). Before step 1: the run directory is checked writable with room
    for one checkpoint, stray temporary checkpoint directories are removed. Ctrl-C raises
    RunInterrupted, whose message names the step, the last checkpoint and how to resume.
    The run ends after train.steps steps, or earlier when train.budget_seconds of
    training wall-clock or train.budget_tokens sampled tokens are used up (report
    "stopped_by"). `on_step(trainer, metrics)` is called after every logged step."""
    console = console or make_console()
    run_dir = Path(cfg.run_dir)
    previous = [] if resume else check_new_run_dir(cfg, overwrite=overwrite, config_path=config_path)
    ckpt = None
    if resume:
        ckpt = checkpoint_from(run_dir, from_checkpoint) if from_checkpoint else latest_checkpoint(run_dir)
        if ckpt is None:
            raise ConfigError(f"{run_dir} has no complete checkpoint to resume from")
        try:
            verify_checkpoint(ckpt, ("model",))
        except CheckpointError as exc:
            raise damaged(run_dir, ckpt, str(exc)) from None
    preflight(run_dir)
    for name in clean_stray(run_dir):
        print_note(f"removed {run_dir / 'checkpoints' / name}, left by an interrupted checkpoint write")
    trainer = Trainer(cfg, console=console)
    _instrument(trainer)
    if previous:
        _remove_previous(run_dir, previous)
        print_note(f"--overwrite: removed the previous run's {', '.join(previous)} from {run_dir}")
    optimizers = [o for o in (trainer.optimizer, trainer.critic_opt) if o is not None]
    preflight(run_dir, need_bytes=int(checkpoint_bytes(trainer.models(), optimizers) * 1.1) + (16 << 20))
    report_path = run_dir / "report.json"
    report = read_report(report_path) if resume else {}
    if resume:
        trainer.load_state(load_checkpoint(ckpt, trainer.models(), run_dir))
        if changes:
            save_config(cfg, run_dir)
    log = RunLog(run_dir, tensorboard=cfg.log.tensorboard)
    try:
        resumed_at = trainer.step
        if resume:
            event = {"event": "resumed_from", "step": trainer.step, "time": time.time(), "checkpoint": ckpt.name}
            if changes:
                event["changes"] = {k: [a, b] for k, (a, b) in changes.items()}
                print_note("resume changes (recorded in config.yaml): "
                      + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()))
            log.event(**event)
            console.print(f"[bold]resumed[/] {run_dir} at step {trainer.step} ({ckpt.name})")
        else:
            save_config(cfg, run_dir)
            log.event(event="start", method=cfg.method, model=cfg.model, time=time.time())
        console.print(summary(trainer))
        if cfg.eval.n > 0 and (cfg.eval.before or cfg.eval.after or cfg.eval.every):
            check_eval(trainer)
        if cfg.eval.before and "base" not in report and cfg.eval.n > 0:
            report["base"] = _eval(trainer, "base", console)
            log.event(event="eval", at_step=0, **{f"eval/{k}": v for k, v in report["base"].items()})
            write_report(report_path, report)
        _loop(trainer, log, console, on_step)
        # every part of the run counts: the parts up to the checkpoint resumed from + this one
        report["train_seconds"] = trainer.run_state["train_seconds"]
        report["train_seconds_parts"] = trainer.run_state["train_seconds_parts"]
        trainer.save()
        if cfg.eval.after and cfg.eval.n > 0:
            report["trained"] = _eval(trainer, "trained", console)
            log.event(event="eval", at_step=trainer.step, **{f"eval/{k}": v for k, v in report["trained"].items()})
        report.update(method=cfg.method, model=cfg.model, steps=trainer.step, policy_version=trainer.policy_version,
                      stopped_by=budget_reached(cfg, trainer.run_state) or "steps",
                      sampled_tokens=int(trainer.run_state.get("sampled_tokens", 0)),
                      prompt_digests=list(trainer.run_state.get("prompt_digests", [])))
        for key, section in trainer.method.report_sections:  # e.g. a test-time method's adaptation budgets
            report[key] = section(trainer.shape, cfg.train.steps)
        if changes:
            report.setdefault("resume_changes", []).append(
                {"at_step": resumed_at, **{k: [a, b] for k, (a, b) in changes.items()}})
        write_report(report_path, report)
        write_plots(run_dir)
    except KeyboardInterrupt:
        raise RunInterrupted(_interrupted(trainer, run_dir)) from None
    finally:
        log.close()
    _print_report(report, console, run_dir)
    return report


def _interrupted(trainer: Trainer, run_dir: Path) -> str:
    from policylab.trainer.checkpoint import latest_name_or_none

    done, total = trainer.step, trainer.cfg.train.steps
    last = latest_name_or_none(run_dir)
    at = f"interrupted at step {min(done + 1, total)} of {total} ({done} done)" if done < total else \
        f"interrupted after all {total} steps (during the final checkpoint or evaluation)"
    if last is None:
        return (f"{at}; no checkpoint was written yet, so there is nothing to resume: train again with "
                f"--overwrite (or set log.checkpoint_every to checkpoint as the run goes)")
    from policylab.trainer.trust import imported_modules, trusted_module

    flag = " --allow-imports" if any(not trusted_module(m) for m, _ in imported_modules(trainer.cfg)) else ""
    return f"{at}; last checkpoint: {last}; resume with `policylab resume {run_dir}{flag}`"


def read_report(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        import warnings

        from policylab.errors import PolicylabWarning

        warnings.warn(f"{path} is not valid JSON (cut by a kill?); a new report is written", PolicylabWarning,
                      stacklevel=2)
        return {}
    return data if isinstance(data, dict) else {}


def resume_changes(cfg: RunConfig, overrides) -> tuple[RunConfig, dict]:
    """(the config with `overrides` applied, {key: (recorded, new)}) for `policylab resume
    --set`. Only keys in RESUME_CHANGEABLE may differ from what the run recorded; any other
    change (it would alter the method, the data stream or the model) is a ConfigError."""
    import copy

    from policylab.trainer.config import apply_overrides, validate

    new = apply_overrides(copy.deepcopy(cfg), overrides)
    validate(new)
    old_flat, new_flat = _flatten(cfg.to_dict()), _flatten(new.to_dict())
    changed = {k: (old_flat.get(k), new_flat.get(k)) for k in sorted(set(old_flat) | set(new_flat))
               if old_flat.get(k) != new_flat.get(k)}

    def allowed(key: str) -> bool:
        return any(key == a or (a.endswith(".*") and key.startswith(a[:-1])) for a in RESUME_CHANGEABLE)

    refused = [k for k in changed if not allowed(k)]
    if refused:
        listed = ", ".join(f"{k} ({changed[k][0]!r} -> {changed[k][1]!r})" for k in refused)
        raise ConfigError(
            f"resume cannot change {listed}: the run's config.yaml records another value, and changing it would "
            f"train a different method, data stream or model than the checkpoints hold. Resume accepts changes "
            f"to {', '.join(RESUME_CHANGEABLE)}; for anything else start a new run (`policylab train`)"
        )
    return new, changed


def _flatten(tree: dict, prefix: str = "") -> dict:
    """{"train.steps": 20, "method_params.kl_coef": 0.0, ...} of a nested config dict."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_received_run(run_dir: str | Path, *, allow_imports: bool = False) -> RunConfig:
    """The config of a run directory (possibly from someone else): the modules it would
    import are named first, and any outside policylab refused unless `allow_imports`."""
    from policylab.trainer.trust import check_imports

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    check_imports(cfg, str(run_dir / "config.yaml"), allow=allow_imports, say=print_note)
    return cfg


def resume(run_dir: str | Path, overrides: list[str] = (), console=None, *, allow_imports: bool = False,
           from_checkpoint: str | None = None) -> dict:
    """Continue the run in `run_dir` from its latest checkpoint (or `from_checkpoint`,
    e.g. "step_000004"). `overrides` may change only RESUME_CHANGEABLE keys; reward code
    outside policylab needs `allow_imports` (see `load_received_run`)."""
    from policylab.trainer.config import parse_overrides

    run_dir = Path(run_dir)
    parse_overrides(overrides)  # a malformed --set is reported before anything is read
    cfg = load_run_config(run_dir)
    cfg.run_dir = str(run_dir)
    cfg, changes = resume_changes(cfg, overrides)  # run_dir among them: refused (resume writes where it reads)
    from policylab.trainer.trust import check_imports

    check_imports(cfg, str(run_dir / "config.yaml"), allow=allow_imports, say=print_note)
    return train(cfg, resume=True, console=console, from_checkpoint=from_checkpoint, changes=changes)


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


def _eval(trainer: Trainer, label: str, console) -> dict:
    t0 = time.perf_counter()
    with console.status(f"evaluating {label} model on {trainer.cfg.eval.n} held-out prompts ..."):
        res = trainer.evaluate(label)
    res["seconds"] = time.perf_counter() - t0
    console.print(f"[bold]{label}[/]: accuracy {res['accuracy']:.3f} ± {res['accuracy_stderr']:.3f} "
                  f"(n={res['n_prompts']}x{res['samples_per_prompt']}), mean length {res['mean_length']:.1f}")
    return res


def write_report(path: Path, report: dict) -> None:
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
    if report.get("eval_metrics"):
        from policylab.eval.suite import summary_rows

        for name, b, t in summary_rows(report["eval_metrics"]):
            table.add_row(name, "-" if b is None else f"{b:.3f}", "-" if t is None else f"{t:.3f}")
    console.print(table)
    if report.get("adaptation"):
        a = report["adaptation"]
        console.print(f"adapted (test-time): {a['prompts']} unlabeled prompts x {a['samples_per_prompt']} samples, "
                      f"<= {a['optimizer_steps_max']} optimizer steps")
    console.print(f"training time {report.get('train_seconds', 0):.0f}s, {report.get('steps')} steps; "
                  f"metrics, plots and checkpoints in {run_dir}")
