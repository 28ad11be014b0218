"""`policylab` command line.

    policylab train CONFIG.yaml [--set key=value ...]   train (then evaluate and report)
                     [--overwrite]                      replace a previous run in run_dir
    policylab resume RUN_DIR [--set key=value ...]      continue a run from its latest checkpoint
                     [--from step_N] [--allow-imports]
    policylab eval RUN_DIR [--n N] [--from step_N]      base vs trained on the held-out split
                     [--allow-imports] [--metrics pass@k,sharpening_tax,calibration]
                     [--samples N] [--k 1,4,8]
    policylab convert-checkpoint RUN_DIR --i-trust-this-file   old pickle checkpoints -> safe format
    policylab compare CONFIG.yaml [--plan] [--report-only]   methods x seeds on one task and budget, one report
    policylab methods [NAME]                            the methods and metrics tables, or one card
    policylab pipeline NAME CONFIG                      a multi-stage pipeline (the names: policylab.pipelines.
                     [--set key=value ...] [--overwrite] PIPELINES), each stage's checkpoint, one report
    policylab train-critic CONFIG --out DIR             RFPO's critic, from the base model's own labelled rollouts
                     [--prompts N] [--group-size G] [--epochs E] [--set key=value ...]
    policylab quiz [--method NAME] [--lang en|zh]       a question, your answer, then the live example
    policylab explain NAME [--lang en|zh]               card, formula and live examples
    policylab site build OUT_DIR                        the static question-bank site
    policylab integrations [--python PY] [--method NAME] engines installed, their versions, the policylab
                                                        names their plug-ins registered (verl, TRL)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from policylab.cli.evaluate import run_eval


def _methods(args) -> int:
    from policylab import methods
    from policylab.eval.cards import METRICS
    from policylab.eval.cards import metric_card_text, metric_table_text
    from policylab.methods.cards import card_text, literature_card_text, table_text

    if args.name in methods.LITERATURE:
        print(literature_card_text(args.name, methods.LITERATURE[args.name]))
    elif args.name and args.name in METRICS:
        print(metric_card_text(METRICS[args.name]))
    elif args.name:
        print(card_text(methods.get(args.name)))
    else:
        print(table_text())
        print("\nmetrics (evaluation only: `policylab eval RUN --metrics NAME,...`)")
        print(metric_table_text())
    return 0


def _integrations(args) -> int:
    from policylab.integrations.status import report

    text, ok = report(args.python, args.method)
    print(text)
    return 0 if ok else 1


def _train(args) -> int:
    from policylab.trainer.config import load_config
    from policylab.trainer.report import print_note
    from policylab.trainer.run import train
    from policylab.trainer.trust import check_imports

    cfg = load_config(args.config, args.set or [])
    # the user's own config: its modules are named, and allowed
    check_imports(cfg, args.config, allow=True, say=print_note)
    train(cfg, overwrite=args.overwrite, config_path=args.config)
    return 0


def _compare(args) -> int:
    from policylab.experiments.compare import compare, load_plan
    from policylab.trainer.report import print_note
    from policylab.trainer.trust import check_imports

    plan = load_plan(args.config)
    # the user's own config: its modules are named, and allowed
    check_imports(plan.runs[0].cfg, args.config, allow=True, say=print_note)
    compare(plan, report_only=args.report_only, plan_only=args.plan)
    return 0


def _resume(args) -> int:
    from policylab.trainer.run import resume

    resume(args.run_dir, args.set or [], allow_imports=args.allow_imports, from_checkpoint=args.from_checkpoint)
    return 0


def _convert(args) -> int:
    from policylab.trainer.legacy import convert_legacy

    for p in convert_legacy(args.run_dir, trust=args.i_trust_this_file):
        print(f"converted {p}: state.json + state.safetensors written (state.pt left in place, no longer read)")
    return 0


def _pipeline(args) -> int:
    from rich.console import Console

    from policylab.pipelines import get_pipeline

    pipeline = get_pipeline(args.name)
    run_dir = pipeline.entry(args.config, args.set or [], console=Console(), overwrite=args.overwrite)
    print(f"policylab: wrote {Path(run_dir) / 'report.json'} and report.md", file=sys.stderr)
    return 0


def _train_critic(args) -> int:
    from pathlib import Path

    from policylab.trainer.config import ConfigError, load_config
    from policylab.pipelines.critic_pretraining import CriticBudget, train_frozen_critic
    from policylab.trainer.trust import check_imports

    cfg = load_config(args.config, args.set or [])
    check_imports(cfg, args.config, allow=True)
    out = Path(args.out)
    if (out / "critic.json").exists() and not args.overwrite:
        raise ConfigError(f"{out} already holds a critic (critic.json); pass --overwrite to replace it")
    if args.prompts < 2 or args.group_size < 1 or args.epochs < 1:
        raise ConfigError("--prompts must be >= 2, --group-size and --epochs >= 1")
    budget = CriticBudget(prompts=args.prompts, group_size=args.group_size, epochs=args.epochs)
    train_frozen_critic(cfg, out, budget, say=lambda m: print(m, file=sys.stderr))
    print(f"method_params.critic_path={out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="policylab", description="Role-explicit RL post-training for language models.")
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_run_commands(sub)
    _add_study_commands(sub)
    _add_pipeline_command(sub)
    _add_tool_commands(sub)
    from policylab.experiments.evidence.cli import add_subcommand as add_evidence

    add_evidence(sub)  # evidence
    from policylab.learn.cli import add_subcommands

    add_subcommands(sub)  # quiz, explain, site
    return p


def _add_run_commands(sub) -> None:
    """train, resume, eval, convert-checkpoint: one run."""
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
                   help="change train.steps, train.micro_batch_size, train.shared_prefix, "
                        "train.recompute_elementwise, eval.*, log.*, threads")
    r.add_argument("--from", dest="from_checkpoint", metavar="step_N", help="resume from this checkpoint of the run")
    r.add_argument("--allow-imports", action="store_true", help=allow_help)
    r.set_defaults(fn=_resume)
    e = sub.add_parser("eval", help="evaluate base vs trained model of a run")
    e.add_argument("run_dir")
    e.add_argument("--n", type=int, default=None, help="held-out prompts (default: the run's eval.n)")
    e.add_argument("--from", dest="from_checkpoint", metavar="step_N", help="evaluate this checkpoint of the run")
    e.add_argument("--allow-imports", action="store_true", help=allow_help)
    e.add_argument("--metrics", metavar="LIST", default=None,
                   help="also measure these, comma-separated: pass@k (coverage), sharpening_tax (base - trained "
                        "coverage), calibration (decision-token ECE/Brier, temperature fitted on a val split); "
                        "written to report.json and plots/reliability.png")
    e.add_argument("--samples", type=int, default=None, help="samples per prompt (default: the run's eval.samples)")
    e.add_argument("--k", default=None, metavar="K1,K2", help="pass@k budgets, e.g. 1,4,8 (default: the run's eval.k)")
    e.set_defaults(fn=run_eval)
    c = sub.add_parser("convert-checkpoint", help="rewrite a run's old pickle checkpoints (state.pt) in the safe format")
    c.add_argument("run_dir")
    c.add_argument("--i-trust-this-file", action="store_true",
                   help="required: converting unpickles state.pt, which runs any code it contains")
    c.set_defaults(fn=_convert)


def _add_study_commands(sub) -> None:
    """compare and methods."""
    cp = sub.add_parser("compare", help="run methods x seeds on one model, task and budget; write one report")
    cp.add_argument("config", help="a compare config (see policylab.experiments.compare)")
    cp.add_argument("--plan", action="store_true", help="check the config and show the runs and their state; run nothing")
    cp.add_argument("--report-only", action="store_true", help="write the report from the finished runs; run nothing")
    cp.set_defaults(fn=_compare)
    m = sub.add_parser("methods", help="list methods, or show one card")
    m.add_argument("name", nargs="?")
    m.set_defaults(fn=_methods)


def _add_pipeline_command(sub) -> None:
    """pipeline NAME CONFIG: the names and descriptions come from the registry."""
    from policylab.pipelines import PIPELINES

    listed = "; ".join(f"{name}: {p.description}" for name, p in PIPELINES.items())
    pl = sub.add_parser("pipeline", help=f"run a multi-stage pipeline ({listed}), one report")
    pl.add_argument("name", metavar="NAME", help=f"the pipeline: {', '.join(PIPELINES)}")
    pl.add_argument("config", help="the pipeline's YAML config (e.g. configs/pipelines/NAME.yaml)")
    pl.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. sft.steps=5")
    pl.add_argument("--overwrite", action="store_true", help="replace a previous pipeline run in run_dir")
    pl.set_defaults(fn=_pipeline)


def _add_tool_commands(sub) -> None:
    """train-critic and integrations."""
    k = sub.add_parser("train-critic", help="train RFPO's frozen critic on the base model's own labelled rollouts")
    k.add_argument("config", help="a run config: its model, task (train split) and rollout settings are used")
    k.add_argument("--out", required=True, help="the critic checkpoint directory (method_params.critic_path)")
    k.add_argument("--prompts", type=int, default=64, help="train prompts sampled (a quarter calibrate)")
    k.add_argument("--group-size", type=int, default=4, help="replies per prompt")
    k.add_argument("--epochs", type=int, default=300, help="full-batch Adam steps of the head")
    k.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field")
    k.add_argument("--overwrite", action="store_true", help="replace a critic already in --out")
    k.set_defaults(fn=_train_critic)
    i = sub.add_parser("integrations", help="engines installed (verl, TRL) and the policylab names they registered")
    i.add_argument("--python", default=None, metavar="PY",
                   help="check verl with this interpreter (e.g. .venv-verl/bin/python), the way its workers load it")
    i.add_argument("--method", default=None, metavar="NAME", help="also print what verl needs to run NAME")
    i.set_defaults(fn=_integrations)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _show_warning(message, category, filename, lineno, file=None, line=None):
    from policylab.errors import PolicylabWarning

    if issubclass(category, PolicylabWarning):
        print(f"policylab: warning: {_one_line(message)}", file=sys.stderr, flush=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = None
_MODEL_COMMANDS = frozenset({"train", "resume", "eval", "compare", "pipeline", "train-critic"})


def main(argv: list[str] | None = None) -> int:
    """Run one command. Bad input: one line `policylab: error: ...` on stderr, exit code 2;
    Ctrl-C: one line saying where the run stopped and how to resume, exit code 130
    (SIGTERM: the same line, exit code 143)."""
    import warnings

    from policylab.trainer.runtime import apply_wait_policy

    if argv is None and sys.argv[1:2] and sys.argv[1] in _MODEL_COMMANDS:
        # glibc's tcache and fast bins off: read at process start, so the command starts
        # itself again once with them in the environment (policylab.trainer.allocator)
        from policylab.errors import ConfigError
        from policylab.trainer.allocator import reexec_with_tunables

        try:
            reexec_with_tunables()
        except ConfigError as exc:
            print(f"policylab: error: {_one_line(exc)}", file=sys.stderr)
            return 2
    # OpenMP's wait policy is read when torch loads: set it before anything imports torch
    # (an exported OMP_WAIT_POLICY / GOMP_SPINCOUNT is left alone; POLICYLAB_WAIT_POLICY overrides)
    apply_wait_policy()
    global _default_showwarning
    if _default_showwarning is None:
        _default_showwarning = warnings.showwarning
        warnings.showwarning = _show_warning
    if (sys.argv[1:] if argv is None else argv)[:1] == ["quiz"]:
        # the quiz's own parser: building the full one imports torch and every pipeline,
        # and the first question should be on the screen before that (`learn.quiz`)
        from policylab.learn.cli import main as learn_main

        return learn_main(argv)
    args = build_parser().parse_args(argv)
    with _sigterm_interrupts():
        return _dispatch(args)


def _dispatch(args) -> int:
    """args.fn(args), every user-facing failure turned into one line (see `main`)."""
    import errno
    import pickle

    from policylab.errors import PolicylabError, RunInterrupted, Terminated
    from policylab.kernels.rewards.combine import RewardFnError

    try:
        return args.fn(args)
    except (PolicylabError, FileNotFoundError, ImportError, RewardFnError) as exc:
        print(f"policylab: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        if isinstance(exc, RunInterrupted):
            print(f"policylab: {_one_line(exc.message)}", file=sys.stderr)
            return exc.exit_code
        terminated = isinstance(exc, Terminated)
        print(f"policylab: {'terminated (SIGTERM)' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except pickle.UnpicklingError as exc:
        print(f"policylab: error: a pickle file was refused, nothing in it ran: {_one_line(exc)[:400]}",
              file=sys.stderr)
        return 2
    except OSError as exc:
        user_facing = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EPERM, errno.EISDIR,
                       errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP, errno.ENXIO)
        if exc.errno in user_facing:
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"policylab: error: {where}{exc.strerror or exc}", file=sys.stderr)
            return 2
        raise


class _sigterm_interrupts:
    """SIGTERM raises `Terminated` (a KeyboardInterrupt) while a command runs in the main
    thread, so it ends the way Ctrl-C does (a run: the step, the intact checkpoint, how to
    resume); the previous handler is restored afterwards."""

    def __enter__(self):
        import signal
        import threading

        from policylab.errors import Terminated

        self.previous = None
        if threading.current_thread() is threading.main_thread():
            def handler(signum, frame):
                raise Terminated("SIGTERM")

            self.previous = signal.signal(signal.SIGTERM, handler)
        return self

    def __exit__(self, *exc):
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

