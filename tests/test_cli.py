"""The command line as a user runs it, with a two-step budget: a fresh `python -m policylab.cli`
for a whole train + eval and for kill -9 + resume; the refusals and the methods table through
policylab.cli.main in the test's process (`cli_inprocess`: the same exit code and output)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_utils import cli_inprocess
from policylab.trainer import allocator

TESTS = Path(__file__).parent


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(TESTS) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "policylab.cli", *args], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


def _write_config(path: Path, model_dir, run_dir, steps=2, extra=""):
    path.write_text(f"""
method: grpo
model: {model_dir}
run_dir: {run_dir}
seed: 1
method_params: {{kl_coef: 0.0}}
task: {{reward: "trainer_utils:parity_reward"}}
rollout: {{prompts_per_step: 2, group_size: 2, max_new_tokens: 4}}
train: {{steps: {steps}, lr: 1.0e-3, micro_batch_size: 2}}
eval: {{n: 4, max_new_tokens: 4}}
log: {{tensorboard: false, progress: false, plot_every: 1}}
{extra}
""")
    return path


def test_two_step_train_writes_a_complete_run(small_model_dir, tmp_path):
    run = tmp_path / "run"
    cfg = _write_config(tmp_path / "c.yaml", small_model_dir, run)
    res = _cli("train", str(cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for key in ["reward/mean", "loss/policy", "policy/entropy", "policy/clip_frac", "grad_norm", "time/step_s"]:
        assert key in steps[-1], key
    report = json.loads((run / "report.json").read_text())
    assert "base" in report and "trained" in report and report["steps"] == 2
    assert (run / "config.yaml").exists() and (run / "checkpoints" / "LATEST").exists()
    assert (run / "plots" / "reward.png").exists()
    assert "policylab report" in res.stdout
    if allocator.glibc():  # the command restarted itself with glibc's tcache and fast bins off
        assert "glibc tcache_count=0, mxfast=0" in res.stdout
    ev = _cli("eval", str(run), "--n", "4", "--allow-imports")
    assert ev.returncode == 0, ev.stderr[-2000:]
    both = json.loads(ev.stdout)
    assert both["base"]["n_prompts"] == 4 and both["trained"]["n_prompts"] == 4
    assert 0.0 <= both["trained"]["accuracy"] <= 1.0 and "pass@1" in both["trained"]


def test_existing_run_is_not_overwritten(small_model_dir, tmp_path):
    run = tmp_path / "run"
    cfg = _write_config(tmp_path / "c.yaml", small_model_dir, run, extra="")
    assert cli_inprocess("train", str(cfg), "--set", "eval.n=0").returncode == 0
    before = (run / "metrics.jsonl").read_text()
    res = cli_inprocess("train", str(cfg))
    assert res.returncode == 2 and "policylab resume" in res.stderr
    assert (run / "metrics.jsonl").read_text() == before


def test_kill_9_then_resume_completes(small_model_dir, tmp_path):
    run = tmp_path / "run"
    cfg = _write_config(tmp_path / "c.yaml", small_model_dir, run, steps=40,
                        extra="")
    proc = subprocess.Popen([sys.executable, "-m", "policylab.cli", "train", str(cfg), "--set", "log.checkpoint_every=1",
                             "--set", "eval.n=0"], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    latest = run / "checkpoints" / "LATEST"
    deadline = time.time() + 240
    while time.time() < deadline and not (latest.exists() and "step_000002" <= latest.read_text().strip()):
        if proc.poll() is not None:
            pytest.fail(f"training ended early: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = latest.read_text().strip()
    # the kill is the subprocess's point; the resume after it runs in process
    res = cli_inprocess("resume", str(run), "--set", "train.steps=6", "--allow-imports")
    assert res.returncode == 0, res.stderr[-3000:]
    assert latest.read_text().strip() == "step_000006"
    text = (run / "metrics.jsonl").read_text()
    assert '"event": "resumed_from"' in text
    steps = {json.loads(l)["step"] for l in text.splitlines() if '"step"' in l and "event" not in l}
    assert set(range(1, 7)) <= steps, (killed_at, steps)


def test_missing_model_is_a_clear_error(tmp_path):
    cfg = _write_config(tmp_path / "c.yaml", tmp_path / "no-such-model", tmp_path / "run")
    res = cli_inprocess("train", str(cfg))
    assert res.returncode == 2
    assert "no-such-model" in res.stderr and "error" in res.stderr


def test_unknown_key_is_a_clear_error(small_model_dir, tmp_path):
    cfg = _write_config(tmp_path / "c.yaml", small_model_dir, tmp_path / "run")
    res = cli_inprocess("train", str(cfg), "--set", "train.lerning_rate=3")
    assert res.returncode == 2 and "unknown config key" in res.stderr


def test_methods_table_and_card():
    res = cli_inprocess("methods")
    assert res.returncode == 0 and "dapo" in res.stdout and "gspo" in res.stdout
    res = cli_inprocess("methods", "dapo")
    assert res.returncode == 0 and "2503.14476" in res.stdout and "eps_high = 0.28" in res.stdout
    # every stage with the function that runs it and its kernel's file:line (card to formula in one hop)
    assert "filter     dynamic_sampling" in res.stdout
    assert "kernel policylab.kernels.objectives.ppo.ppo_clip  policylab/kernels/objectives/ppo.py:" in res.stdout
    res = cli_inprocess("methods", "dapoo")
    assert res.returncode == 2 and "Did you mean: dapo" in res.stderr
