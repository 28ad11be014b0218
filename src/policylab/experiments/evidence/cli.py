"""The `policylab evidence` subcommand's arguments (added to the main parser by cli.py)."""

from __future__ import annotations

from pathlib import Path


def add_subcommand(sub) -> None:
    e = sub.add_parser("evidence", help="each method's mechanism against its negative control: a few seeds, a handful "
                                         "of steps, one table of verdicts")
    e.add_argument("names", nargs="*", metavar="NAME", help="methods to measure, in this order (cheap ones first)")
    e.add_argument("--all", action="store_true", dest="all_methods", help="every registered method")
    e.add_argument("--seeds", default="0,1,2", metavar="S1,S2,...", help="seeds of both arms (default 0,1,2)")
    e.add_argument("--steps", type=int, default=6, help="rollout steps per run (default 6)")
    e.add_argument("--eval-n", type=int, default=50, help="held-out prompts per evaluation (default 50)")
    e.add_argument("--model", default="embedded", help="model of every arm (default: the embedded SmolLM2-135M)")
    e.add_argument("--out", default="runs/evidence", help="directory of the runs (and the table unless --report-dir)")
    e.add_argument("--report-dir", default=None, help="write evidence.md and evidence.json here instead of --out")
    e.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="override a run-config field in every arm, e.g. rollout.max_new_tokens=8 (YAML value)")
    e.add_argument("--plan", action="store_true", help="show the arms, shared runs and their state; run nothing")
    e.add_argument("--report-only", action="store_true", help="write the table from the finished runs; run nothing")
    e.set_defaults(fn=run_command)


def settings_from_args(args):
    from policylab.errors import ConfigError
    from policylab.experiments.evidence.arms import Settings
    from policylab.trainer.config import parse_overrides, yaml_load

    try:
        seeds = tuple(int(s) for s in str(args.seeds).split(",") if s.strip())
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds must name distinct seeds, got {args.seeds!r}")
    if args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if args.eval_n < 1:
        raise ConfigError(f"--eval-n must be >= 1 (both arms' held-out accuracy is reported), got {args.eval_n}")
    sets = tuple((k, yaml_load(v, f"--set {k}")) for k, v in parse_overrides(args.set or []))
    for k, _ in sets:
        if "." not in k:
            raise ConfigError(f"--set {k}: name a field as SECTION.KEY (e.g. rollout.max_new_tokens)")
    return Settings(out_dir=Path(args.out), seeds=seeds, steps=args.steps, model=args.model, eval_n=args.eval_n,
                    sets=sets)


def run_command(args) -> int:
    from policylab.experiments.evidence import evidence

    settings = settings_from_args(args)
    evidence(args.names, settings, all_methods=args.all_methods,
             report_dir=Path(args.report_dir) if args.report_dir else None, plan_only=args.plan,
             report_only=args.report_only)
    return 0
