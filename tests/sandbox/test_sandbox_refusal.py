"""Where the sandbox cannot wall a candidate in, nothing runs: the refusal and its opt-out
flags, checked on every machine (the escape tests in test_sandbox.py need the walls and are
skipped where they cannot be built). Also the limits' validation and the leftover-process
sweep, which need no walls either."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from policylab.sandbox import runner as sb
from policylab.sandbox.process import leftovers
from policylab.trainer.config import TaskConfig

from trainer_utils import tiny_config

_NO_WALLS = {"network": False, "filesystem": True, "privilege_drop": None,
             "detail": {"net": "no network namespace here"}}


@pytest.fixture
def no_network_namespace(monkeypatch):
    """This machine, as if it could not give a candidate a network namespace; and any
    attempt to start a candidate's process fails the test."""
    monkeypatch.setattr(sb, "_PROBE", dict(_NO_WALLS))

    def never(*a, **k):
        raise AssertionError("a candidate process was started although a required wall is missing")

    monkeypatch.setattr(sb, "spawn", never)


def test_missing_walls_are_refused_unless_the_user_gives_them_up(monkeypatch):
    monkeypatch.setattr(sb, "_PROBE", {"network": False, "filesystem": False, "privilege_drop": None,
                                       "detail": {"net": "no namespaces here", "fs": "no Landlock here"}})
    with pytest.raises(sb.SandboxUnavailable, match="sandbox_without_network_isolation"):
        sb.check_available(sb.SandboxPolicy())
    with pytest.raises(sb.SandboxUnavailable, match="sandbox_without_filesystem_isolation"):
        sb.check_available(sb.SandboxPolicy(without_network_isolation=True))
    sb.check_available(sb.SandboxPolicy(without_network_isolation=True, without_filesystem_isolation=True))


def test_a_root_sandbox_that_cannot_drop_privileges_is_refused_whatever_the_flags(monkeypatch):
    monkeypatch.setattr(sb, "_PROBE", {"network": True, "filesystem": True, "privilege_drop": False,
                                       "detail": {"uid": "setuid failed"}})
    with pytest.raises(sb.SandboxUnavailable, match="cannot drop to an unprivileged uid"):
        sb.check_available(sb.SandboxPolicy(without_network_isolation=True, without_filesystem_isolation=True))


def test_run_job_refuses_before_starting_a_process(no_network_namespace):
    with pytest.raises(sb.SandboxUnavailable, match="nothing was run"):
        sb.run_job({"source": "def f():\n    return 1\n", "entry": "f", "calls": [[]]}, sb.SandboxPolicy())


def test_the_code_task_is_refused_when_it_is_built(no_network_namespace):
    from policylab.tasks.source import build_task

    with pytest.raises(sb.SandboxUnavailable, match="task.sandbox_without_network_isolation=true"):
        build_task(TaskConfig(name="code", reward="code_tests"), seed=0)
    # the flag that names what is given up lets it be built
    src = build_task(TaskConfig(name="code", reward="code_tests", sandbox_without_network_isolation=True), seed=0)
    assert src.reward_fn.policy.without_network_isolation and not src.reward_fn.policy.without_filesystem_isolation


def test_a_code_opt_run_is_refused_before_training(no_network_namespace, tiny_model_dir, tmp_path):
    from policylab.trainer.loop import Trainer

    task = {"name": "code", "reward": "code_tests"}
    # refused while the Trainer is built: before any rollout, reward or step
    with pytest.raises(sb.SandboxUnavailable, match="sandbox_without_network_isolation"):
        Trainer(tiny_config(tiny_model_dir, tmp_path / "refused", method="code_opt", method_params={}, task=task))
    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "opted-out", method="code_opt", method_params={},
                             task={**task, "sandbox_without_network_isolation": True}))
    assert tr.task.reward_fn.policy.without_network_isolation


def test_bad_limits_are_refused():
    with pytest.raises(sb.PolicylabError, match="cpu_seconds"):
        sb.SandboxLimits(cpu_seconds=0)
    with pytest.raises(sb.PolicylabError, match="memory_mb"):
        sb.SandboxLimits(memory_mb=16)


def test_leftover_processes_of_a_session_are_found_and_killed():
    # the process-count check behind RLIMIT_NPROC: anything left in the candidate's session is killed
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        found = leftovers(p.pid, -1)
        assert p.pid in found
        p.wait(timeout=10)
        assert p.returncode == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
