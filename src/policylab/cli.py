"""`policylab` command line.

    policylab train CONFIG.yaml [--set key=value ...]   train (then evaluate and report)
                     [--overwrite]                      replace a previous run in run_dir
    policylab resume RUN_DIR [--set key=value ...]      continue a run from its latest checkpoint
                     [--from step_N] [--allow-imports]
    policylab eval RUN_DIR [--n N] [--from step_N]      base vs trained on the held-out split
                     [--allow-imports]
    policylab convert-checkpoint RUN_DIR --i-trust-this-file   old pickle checkpoints -> safe format
    policylab methods [NAME]                            the methods table, or one method's card
    policylab quiz [--method NAME] [--lang en|zh]       a question, your answer, then the live example
    policylab explain NAME [--lang en|zh]               card, formula and live examples
    policylab site build OUT_DIR                        the static question-bank site
    policylab integrations [--python PY] [--method NAME] engines installed, their versions, the policylab
                                                        names their plug-ins registered (verl, TRL)
"""

from __future__ import annotations

import argparse
import sys


def _methods(args) -> int:
    from . import methods
    from .methods.cards import card_text, table_text

    if args.name:
        print(card_text(methods.get(args.name)))
    else:
        print(table_text())
    return 0


def _integrations(args) -> int:
    from .integrations.status import report

    text, ok = report(args.python, args.method)
    print(text)
    return 0 if ok else 1


def _train(args) -> int:
    from .config import load_config
    from .run import _note, train
    from .taskrun import check_imports

    cfg = load_config(args.config, args.set or [])
    # the user's own config: its modules are named, and allowed
    check_imports(cfg.task, args.config, allow=True, say=_note)
    train(cfg, overwrite=args.overwrite, config_path=args.config)
    return 0


def _resume(args) -> int:
    from .run import resume

    resume(args.run_dir, args.set or [], allow_imports=args.allow_imports, from_checkpoint=args.from_checkpoint)
    return 0


def _eval(args) -> int:
    import json
    from pathlib import Path

    from .checkpoint import checkpoint_from, damaged, latest_checkpoint, load_checkpoint, verify_checkpoint
    from .config import ConfigError
    from .errors import CheckpointError
    from .run import load_received_run
    from .trainer import Trainer

    run_dir = Path(args.run_dir)
    if args.n is not None and args.n < 1:
        raise ConfigError(f"--n must be >= 1 (held-out prompts), got {args.n}")
    cfg = load_received_run(run_dir, allow_imports=args.allow_imports)
    if args.n:
        cfg.eval.n = args.n
    if cfg.eval.n < 1:
        raise ConfigError(f"{run_dir} was trained with eval.n={cfg.eval.n} (no held-out evaluation); "
                          "pass --n N to evaluate on N held-out prompts")
    ckpt = checkpoint_from(run_dir, args.from_checkpoint) if args.from_checkpoint else latest_checkpoint(run_dir)
    if ckpt is not None:
        try:
            verify_checkpoint(ckpt, ("model",))
        except CheckpointError as exc:
            raise damaged(run_dir, ckpt, str(exc)) from None
    trainer = Trainer(cfg)
    from .memory import check_eval

    check_eval(trainer)
    base = trainer.evaluate("base")
    if ckpt is None:
        print(f"{args.run_dir} has no checkpoint; only the base model was evaluated", file=sys.stderr)
        print(json.dumps({"base": base}, indent=2))
        return 1
    trainer.load_state(load_checkpoint(ckpt, trainer.models(), run_dir))
    trained = trainer.evaluate("trained")
    print(json.dumps({"base": base, "trained": trained, "checkpoint": ckpt.name}, indent=2))
    return 0


def _convert(args) -> int:
    from .checkpoint import convert_legacy

    for p in convert_legacy(args.run_dir, trust=args.i_trust_this_file):
        print(f"converted {p}: state.json + state.safetensors written (state.pt left in place, no longer read)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="policylab", description="Role-explicit RL post-training for language models.")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train from a YAML config")
    t.add_argument("config")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. train.lr=1e-5")
    t.add_argument("--overwrite", action="store_true",
                   help="replace a previous run in run_dir (its config, metrics, report, plots and checkpoints)")
    t.set_defaults(fn=_train)
    allow_help = ("import reward modules outside policylab that the run's config.yaml names (their code runs); "
                  "only for a run directory you trust")
    r = sub.add_parser("resume", help="resume a run from its latest checkpoint")
    r.add_argument("run_dir")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="change train.steps, train.micro_batch_size, train.shared_prefix, eval.*, log.*, threads")
    r.add_argument("--from", dest="from_checkpoint", metavar="step_N", help="resume from this checkpoint of the run")
    r.add_argument("--allow-imports", action="store_true", help=allow_help)
    r.set_defaults(fn=_resume)
    e = sub.add_parser("eval", help="evaluate base vs trained model of a run")
    e.add_argument("run_dir")
    e.add_argument("--n", type=int, default=None, help="held-out prompts (default: the run's eval.n)")
    e.add_argument("--from", dest="from_checkpoint", metavar="step_N", help="evaluate this checkpoint of the run")
    e.add_argument("--allow-imports", action="store_true", help=allow_help)
    e.set_defaults(fn=_eval)
    c = sub.add_parser("convert-checkpoint", help="rewrite a run's old pickle checkpoints (state.pt) in the safe format")
    c.add_argument("run_dir")
    c.add_argument("--i-trust-this-file", action="store_true",
                   help="required: converting unpickles state.pt, which runs any code it contains")
    c.set_defaults(fn=_convert)
    m = sub.add_parser("methods", help="list methods, or show one card")
    m.add_argument("name", nargs="?")
    m.set_defaults(fn=_methods)
    i = sub.add_parser("integrations", help="engines installed (verl, TRL) and the policylab names they registered")
    i.add_argument("--python", default=None, metavar="PY",
                   help="check verl with this interpreter (e.g. .venv-verl/bin/python), the way its workers load it")
    i.add_argument("--method", default=None, metavar="NAME", help="also print what verl needs to run NAME")
    i.set_defaults(fn=_integrations)
    from .learn.cli import add_subcommands

    add_subcommands(sub)  # quiz, explain, site
    return p


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _show_warning(message, category, filename, lineno, file=None, line=None):
    from .errors import PolicylabWarning

    if issubclass(category, PolicylabWarning):
        print(f"policylab: warning: {_one_line(message)}", file=sys.stderr, flush=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = None


def main(argv: list[str] | None = None) -> int:
    """Run one command. Bad input: one line `policylab: error: ...` on stderr, exit code 2;
    Ctrl-C: one line saying where the run stopped and how to resume, exit code 130."""
    import errno
    import warnings

    global _default_showwarning
    if _default_showwarning is None:
        _default_showwarning = warnings.showwarning
        warnings.showwarning = _show_warning
    args = build_parser().parse_args(argv)
    from .errors import PolicylabError, RunInterrupted

    try:
        return args.fn(args)
    except (PolicylabError, FileNotFoundError, ImportError) as exc:
        print(f"policylab: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        msg = exc.message if isinstance(exc, RunInterrupted) else "interrupted"
        print(f"policylab: {_one_line(msg)}", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EPERM):
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"policylab: error: {where}{exc.strerror or exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
