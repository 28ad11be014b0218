"""Helpers for CLI tests: run `policylab` in a subprocess on the tiny model, write
configs, and fingerprint files so a test can assert nothing the user had was changed."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def env(**extra) -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(TESTS) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("POLICYLAB_MEM_AVAILABLE", None)
    e.update({k: str(v) for k, v in extra.items()})
    return e


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # so the child installs Python's Ctrl-C handler


def cli(*args, cwd=None, timeout=300, fault=None, **extra_env):
    """Run `python -m policylab.cli ARGS` (or, with `fault`, tests/fault_cli.py, which
    injects that fault first) and return the CompletedProcess (text output)."""
    cmd = [sys.executable, "-m", "policylab.cli", *map(str, args)]
    if fault is not None:
        cmd = [sys.executable, str(TESTS / "fault_cli.py"), fault, *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env(**extra_env), cwd=cwd, timeout=timeout)


def cli_inprocess(*args, cwd=None, **extra_env):
    """`policylab ARGS` run in this process through `policylab.cli.main` (no new
    interpreter, no second torch import: for tests where the subprocess is not the point;
    crashes, signals, fault injection and a PYTHONPATH of the test's own keep `cli`).
    `cwd` and `extra_env` as for `cli` (the environment as `env` makes it). Returns a
    CompletedProcess with the exit code and the captured output; the process-wide state
    the CLI sets (signal handlers, warnings.showwarning, the working directory, the
    environment) is restored."""
    import contextlib
    import io
    import warnings

    from policylab import cli as policylab_cli

    assert "PYTHONPATH" not in extra_env, "a PYTHONPATH of its own needs a new interpreter: use cli()"
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    show, here, environ = warnings.showwarning, os.getcwd(), dict(os.environ)
    try:
        os.environ.pop("POLICYLAB_MEM_AVAILABLE", None)
        os.environ.update({k: str(v) for k, v in extra_env.items()})
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = policylab_cli.main(argv)
            except SystemExit as exc:  # argparse's usage errors (exit 2) and --help (exit 0)
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        warnings.showwarning = show
        policylab_cli._default_showwarning = None
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
    return subprocess.CompletedProcess(["policylab", *argv], int(rc or 0), out.getvalue(), err.getvalue())


def popen(*args, **extra_env):
    return subprocess.Popen([sys.executable, "-m", "policylab.cli", *map(str, args)], env=env(**extra_env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)


def write_config(path: Path, model_dir, run_dir, steps=2, extra="", **sections) -> Path:
    """A two-step GRPO config on the tiny model (no evaluation unless `eval` is given)."""
    text = f"""
method: grpo
model: {model_dir}
run_dir: {run_dir}
seed: 1
method_params: {{kl_coef: 0.0}}
task: {sections.get('task', '{reward: "trainer_utils:parity_reward"}')}
rollout: {{prompts_per_step: 2, group_size: 2, max_new_tokens: 4}}
train: {{steps: {steps}, lr: 1.0e-3, micro_batch_size: 2}}
eval: {sections.get('eval', '{n: 0, max_new_tokens: 4}')}
log: {sections.get('log', '{tensorboard: false, progress: false, plot_every: 0}')}
{extra}
"""
    path.write_text(text)
    return path


def fingerprint(*roots) -> dict:
    """{path: sha256} of every file under `roots` (files themselves are allowed)."""
    out = {}
    for root in roots:
        root = Path(root)
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("policylab: error:")]


def assert_one_clear_error(res, *needles, code=2):
    """Exit code `code`, exactly one `policylab: error:` line containing every needle, no traceback."""
    assert res.returncode == code, (res.returncode, res.stderr[-3000:])
    lines = error_lines(res.stderr)
    assert len(lines) == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]
