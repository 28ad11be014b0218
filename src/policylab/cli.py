"""`policylab` command line.

    policylab train CONFIG.yaml [--set key=value ...]   train (then evaluate and report)
    policylab resume RUN_DIR [--set key=value ...]      continue a run from its latest checkpoint
    policylab eval RUN_DIR [--n N]                      base vs trained on the held-out split
    policylab methods [NAME]                            the methods table, or one method's card
    policylab quiz [--method NAME] [--lang en|zh]       a question, your answer, then the live example
    policylab explain NAME [--lang en|zh]               card, formula and live examples
    policylab site build OUT_DIR                        the static question-bank site
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


def _train(args) -> int:
    from .config import load_config
    from .run import train

    cfg = load_config(args.config, args.set or [])
    train(cfg)
    return 0


def _resume(args) -> int:
    from .run import resume

    resume(args.run_dir, args.set or [])
    return 0


def _eval(args) -> int:
    import json
    from pathlib import Path

    from .trainer import Trainer, load_run_config

    cfg = load_run_config(Path(args.run_dir))
    if args.n:
        cfg.eval.n = args.n
    trainer = Trainer(cfg)
    base = trainer.evaluate("base")
    if not trainer.restore():
        print(f"{args.run_dir} has no checkpoint; only the base model was evaluated", file=sys.stderr)
        print(json.dumps({"base": base}, indent=2))
        return 1
    trained = trainer.evaluate("trained")
    print(json.dumps({"base": base, "trained": trained}, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="policylab", description="Role-explicit RL post-training for language models.")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train from a YAML config")
    t.add_argument("config")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. train.lr=1e-5")
    t.set_defaults(fn=_train)
    r = sub.add_parser("resume", help="resume a run from its latest checkpoint")
    r.add_argument("run_dir")
    r.add_argument("--set", action="append", metavar="KEY=VALUE")
    r.set_defaults(fn=_resume)
    e = sub.add_parser("eval", help="evaluate base vs trained model of a run")
    e.add_argument("run_dir")
    e.add_argument("--n", type=int, default=0, help="held-out prompts (default: the run's eval.n)")
    e.set_defaults(fn=_eval)
    m = sub.add_parser("methods", help="list methods, or show one card")
    m.add_argument("name", nargs="?")
    m.set_defaults(fn=_methods)
    from .learn.cli import add_subcommands

    add_subcommands(sub)  # quiz, explain, site
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import PolicylabError

    try:
        return args.fn(args)
    except (PolicylabError, FileNotFoundError, ImportError) as exc:
        print(f"policylab: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
