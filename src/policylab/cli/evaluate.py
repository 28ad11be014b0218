"""`policylab eval RUN_DIR`: base vs trained on the held-out split, from a run's own
configuration and checkpoint (or `--from step_N`), with the metric cards of `--metrics`
(pass@k, sharpening tax, calibration) when asked."""

from __future__ import annotations

import sys
from pathlib import Path


def run_eval(args) -> int:
    import json

    from policylab.trainer.checkpoint import (
        checkpoint_from,
        damaged,
        latest_checkpoint,
        load_checkpoint,
        verify_checkpoint,
    )
    from policylab.errors import ConfigError
    from policylab.errors import CheckpointError
    from policylab.trainer.resume import load_received_run
    from policylab.trainer.loop import Trainer

    run_dir = Path(args.run_dir)
    if args.n is not None and args.n < 1:
        raise ConfigError(f"--n must be >= 1 (held-out prompts), got {args.n}")
    metrics = None
    if args.metrics is not None:
        from policylab.eval.suite import parse_metrics

        metrics = parse_metrics(args.metrics)
    from policylab.trainer.run_paths import check_run_tree

    check_run_tree(run_dir)  # no link out of the run, no FIFO / device / socket
    cfg = load_received_run(run_dir, allow_imports=args.allow_imports)
    if args.n:
        cfg.eval.n = args.n
    if cfg.eval.n < 1:
        raise ConfigError(f"{run_dir} was trained with eval.n={cfg.eval.n} (no held-out evaluation); "
                          "pass --n N to evaluate on N held-out prompts")
    eval_overrides(cfg, args)
    ckpt = checkpoint_from(run_dir, args.from_checkpoint) if args.from_checkpoint else latest_checkpoint(run_dir)
    if ckpt is None and metrics and "sharpening_tax" in metrics:
        raise ConfigError(f"{run_dir} has no checkpoint: sharpening_tax compares the base and the trained model")
    if ckpt is not None:
        from policylab.trainer.checkpoint import verify_manifest
        from policylab.trainer.resume import identity_config

        try:
            verify_checkpoint(ckpt, ("model",))
            verify_manifest(ckpt, identity_config(cfg))
        except CheckpointError as exc:
            raise damaged(run_dir, ckpt, str(exc)) from None
    trainer = Trainer(cfg)
    from policylab.trainer.memory import check_eval

    check_eval(trainer)
    if metrics:
        return eval_metrics(trainer, run_dir, ckpt, metrics, args)
    base = trainer.evaluate("base")
    if ckpt is None:
        print(f"{args.run_dir} has no checkpoint; only the base model was evaluated", file=sys.stderr)
        print(json.dumps({"base": base}, indent=2))
        return 1
    trainer.load_state(load_checkpoint(ckpt, trainer.models(), run_dir))
    trained = trainer.evaluate("trained")
    print(json.dumps({"base": base, "trained": trained, "checkpoint": ckpt.name}, indent=2))
    return 0


def eval_overrides(cfg, args) -> None:
    """--samples and --k replace eval.samples and eval.k (validated like the config)."""
    from policylab.trainer.config import ConfigError, validate

    if args.samples is not None:
        if args.samples < 1:
            raise ConfigError(f"--samples must be >= 1 (samples per prompt), got {args.samples}")
        cfg.eval.samples = args.samples
    if args.k is not None:
        try:
            ks = tuple(int(x) for x in args.k.split(",") if x.strip())
        except ValueError:
            raise ConfigError(f"--k must be comma-separated integers, got {args.k!r}") from None
        if not ks or min(ks) < 1:
            raise ConfigError(f"--k needs budgets >= 1, got {args.k!r}")
        cfg.eval.k = ks
    validate(cfg)


def eval_metrics(trainer, run_dir, ckpt, metrics, args) -> int:
    """`eval --metrics`: base (and trained) measured, combined, printed as JSON, written to
    report.json ("eval_metrics") and plots/reliability.png."""
    import json

    from policylab.eval import suite as em
    from policylab.trainer.checkpoint import load_checkpoint
    from policylab.trainer.report import write_report, read_report

    ks = tuple(trainer.cfg.eval.k)
    base = em.measure(trainer, "base", metrics)
    trained = None
    if ckpt is not None:
        trainer.load_state(load_checkpoint(ckpt, trainer.models(), run_dir))
        trained = em.measure(trainer, "trained", metrics)
    section = em.combine(base, trained, metrics, ks)
    section["checkpoint"] = ckpt.name if ckpt is not None else None
    section["settings"] = {"n": trainer.cfg.eval.n, "samples": trainer.cfg.eval.samples, "k": list(ks),
                           "temperature": trainer.cfg.eval.temperature, "max_new_tokens": trainer.cfg.eval.max_new_tokens,
                           "metrics": metrics}
    out = {"base": plain_eval(base.get("sampled")), "eval_metrics": section}
    if trained is not None:
        out["trained"] = plain_eval(trained.get("sampled"))
    written = []
    report_path = Path(run_dir) / "report.json"
    try:
        report = read_report(report_path)
        report["eval_metrics"] = section
        write_report(report_path, report)
        written.append(str(report_path))
        if "calibration" in section:
            from policylab.trainer.run_paths import guard, guard_dir, replace_file

            png = guard(guard_dir(run_dir, "plots"), "reliability.png")
            replace_file(png, write=lambda tmp: em.reliability_png(section["calibration"], Path(tmp)), suffix=".png")
            written.append(str(png))
    except OSError as exc:
        print(f"policylab: warning: could not write into {run_dir} ({exc.strerror or exc}); the results are "
              "on stdout only", file=sys.stderr)
    print(json.dumps(out, indent=2))
    if written:
        print(f"policylab: wrote {', '.join(written)}", file=sys.stderr)
    if ckpt is None:
        print(f"{args.run_dir} has no checkpoint; only the base model was evaluated", file=sys.stderr)
        return 1
    return 0


def plain_eval(res):
    """A sampled evaluation as `policylab eval` prints it (per-prompt lists left out)."""
    if res is None:
        return None
    return {k: v for k, v in res.items() if k not in ("correct_per_prompt", "task_ids")}
