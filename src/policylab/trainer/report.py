"""What a run prints and writes about itself: the start-up summary, one-line notes,
the evaluations as they finish, report.json and the final table."""

from __future__ import annotations

import json
import time
from pathlib import Path


def make_console():
    from rich.console import Console

    return Console()


def print_note(text: str) -> None:
    """One line on stderr (stdout stays the command's output)."""
    import sys

    print(f"policylab: {text}", file=sys.stderr, flush=True)


def summary(trainer) -> str:  # a policylab.trainer.loop.Trainer
    cfg, rc = trainer.cfg, trainer.method
    n = sum(p.numel() for p in trainer.model.parameters())
    ntrain = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    card = rc.card
    p = rc.p
    r, t = cfg.rollout, cfg.train
    lines = [
        f"model      {cfg.model}  ({n / 1e6:.1f}M params, {ntrain / 1e6:.1f}M trainable, {_train_dtype_line(t.dtype)})",
        f"method     {rc.name}: {card.summary}",
        f"samples    {card.samples}  [engine {trainer.engine.engine_name}]",
        f"learns     {card.learns}",
        f"reference  {card.reference}",
        *(f"{label:<10} {text}" for label, text in (line(p) for line in rc.header)),
        f"device     cpu, {__import__('torch').get_num_threads()} threads ({_wait_line()}), allocator: "
        f"{_allocator_line()}",
        f"batch      {r.prompts_per_step} prompts x {r.group_size} samples, <= {r.max_new_tokens} new tokens, "
        f"T={r.temperature}; {t.epochs} pass(es) x {t.minibatches} minibatch(es), micro-batch {t.micro_batch_size}",
        f"old logp   {trainer.old_logp_source()}",
        "params     " + ", ".join(f"{k}={v}" for k, v in p.items()),
        f"run dir    {cfg.run_dir}",
    ]
    return "\n".join(lines)


def _train_dtype_line(dtype: str) -> str:
    if dtype == "bf16":
        return "bf16 training: decoder body in bf16 autocast, head, log-softmax and ratios in fp32, fp32 master weights"
    if dtype == "bf16-backward":
        return ("bf16-backward training: every forward value (log-probs, ratios, loss) in fp32, the linear layers' "
                "backward products in bf16 with fp32 accumulation, fp32 master weights")
    return f"{dtype} training"


def _wait_line() -> str:
    """The OpenMP wait policy in force, and why when the `policylab` command chose it."""
    from policylab.trainer import runtime

    why = runtime.wait_reason()
    return f"wait: {why}" if why else f"wait: {runtime.wait_policy()}"


def _allocator_line() -> str:
    from policylab.trainer import runtime

    from policylab.trainer.allocator import status

    lim = runtime.applied_limit()
    kept = "system default" if lim is None else f"freed blocks <= {lim >> 20} MiB kept for reuse"
    return f"{kept}, {status()}"


def read_report(path: Path) -> dict:
    """report.json of a run ({} when there is none; a damaged one is warned about). A link
    or a special file in its place is refused (policylab.trainer.run_paths)."""
    import os

    from policylab.trainer.run_paths import guard, read_bytes

    path = guard(Path(path).parent, Path(path).name)
    if not os.path.lexists(path):
        return {}
    try:
        data = json.loads(read_bytes(path).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        import warnings

        from policylab.errors import PolicylabWarning

        warnings.warn(f"{path} is not valid JSON (cut by a kill?); a new report is written", PolicylabWarning,
                      stacklevel=2)
        return {}
    return data if isinstance(data, dict) else {}


def write_report(path: Path, report: dict) -> None:
    """report.json replaced as a whole (a temporary file renamed over it: a link in its
    place is replaced, never written through)."""
    from policylab.trainer.run_paths import guard, replace_file

    replace_file(guard(Path(path).parent, Path(path).name), json.dumps(report, indent=2))


def evaluate_and_print(trainer, label: str, console) -> dict:  # trainer: a Trainer
    t0 = time.perf_counter()
    with console.status(f"evaluating {label} model on {trainer.cfg.eval.n} held-out prompts ..."):
        res = trainer.evaluate(label)
    res["seconds"] = time.perf_counter() - t0
    console.print(f"[bold]{label}[/]: accuracy {res['accuracy']:.3f} ± {res['accuracy_stderr']:.3f} "
                  f"(n={res['n_prompts']}x{res['samples_per_prompt']}), mean length {res['mean_length']:.1f}")
    return res


def print_report(report: dict, console, run_dir: Path) -> None:
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
