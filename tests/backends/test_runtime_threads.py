"""policylab.trainer.runtime's thread choice: the cores a process may use (affinity and a
cgroup v1 / v2 CPU quota, read from fake trees), the precedence of the overrides, the
child environment of the wait policy. No timing (benchmarks/busy_machine.py times it)."""

import pytest
import torch

from policylab.errors import ConfigError
from policylab.trainer import runtime


def _v2(tmp_path, limits: dict[str, str], rel="a/b"):
    root = tmp_path / "cg"
    (root / rel).mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for d, text in limits.items():
        (root / d / "cpu.max").write_text(text + "\n")
    proc = tmp_path / "self_cgroup"
    proc.write_text(f"0::/{rel}\n")
    return root, proc


def test_cgroup_v2_tightest_limit_of_the_cgroup_and_its_ancestors(tmp_path):
    root, proc = _v2(tmp_path, {"a/b": "max 100000", "a": "150000 100000"})
    assert runtime.cgroup_quota(root, proc) == pytest.approx(1.5)
    root, proc = _v2(tmp_path / "2", {"a/b": "50000 100000", "a": "300000 100000"})
    assert runtime.cgroup_quota(root, proc) == pytest.approx(0.5)
    root, proc = _v2(tmp_path / "3", {"a/b": "max 100000"})
    assert runtime.cgroup_quota(root, proc) is None


def test_cgroup_v1_cfs_quota(tmp_path):
    root = tmp_path / "cg"
    d = root / "cpu,cpuacct" / "docker" / "x"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text("250000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "self_cgroup"
    proc.write_text("4:memory:/docker/x\n3:cpu,cpuacct:/docker/x\n")
    assert runtime.cgroup_quota(root, proc) == pytest.approx(2.5)
    (d / "cpu.cfs_quota_us").write_text("-1\n")  # unlimited
    assert runtime.cgroup_quota(root, proc) is None


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert runtime.cgroup_quota(tmp_path / "none", tmp_path / "none_either") is None


@pytest.mark.parametrize("affinity, quota, cores", [(8, None, 8), (8, 1.5, 1), (8, 2.0, 2), (2, 6.0, 2),
                                                    (4, 0.3, 1)])
def test_available_cores_is_the_affinity_within_the_floor_of_the_quota(affinity, quota, cores):
    b = runtime.available_cores(affinity=affinity, quota=quota)
    assert b.cores == cores and b.affinity == affinity and b.quota == quota
    assert f"{cores} available" in b.describe()


def test_available_cores_reads_this_process():
    import os

    b = runtime.available_cores()
    assert 1 <= b.cores <= len(os.sched_getaffinity(0))


def test_precedence_config_then_env_then_omp_then_cores():
    b = runtime.available_cores(affinity=8, quota=2.0)
    assert runtime.choose_threads(0, env={}, budget=b).threads == 2
    assert runtime.choose_threads(0, env={"OMP_NUM_THREADS": "3"}, budget=b).threads is None  # torch's own
    assert runtime.choose_threads(0, env={"OMP_NUM_THREADS": "3", "POLICYLAB_THREADS": "1"}, budget=b).threads == 1
    c = runtime.choose_threads(4, env={"POLICYLAB_THREADS": "1"}, budget=b)
    assert c.threads == 4 and "more than the 2 available" in c.reason
    with pytest.raises(ConfigError, match="POLICYLAB_THREADS='two'"):
        runtime.choose_threads(0, env={"POLICYLAB_THREADS": "two"}, budget=b)
    with pytest.raises(ConfigError, match="threads must be an int >= 0"):
        runtime.choose_threads(-1, env={}, budget=b)


def test_configure_threads_sets_torch_and_is_remembered(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setenv("POLICYLAB_THREADS", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        c = runtime.configure_threads(0)
        assert c.threads == 1 and torch.get_num_threads() == 1 and runtime.thread_choice() == c
    finally:
        torch.set_num_threads(before)


def test_wait_policy_and_child_environment():
    assert runtime.wait_policy({}) .startswith("default")
    assert runtime.wait_policy({"OMP_WAIT_POLICY": "PASSIVE"}) == "passive"
    assert runtime.wait_policy({"GOMP_SPINCOUNT": "1000"}) == "spin 1000"
    env = runtime.thread_env(2, passive=True, base={"GOMP_SPINCOUNT": "9", "PATH": "/bin"})
    assert env == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2", "POLICYLAB_THREADS": "2"}
    assert runtime.thread_env(None, passive=False, base={"OMP_WAIT_POLICY": "ACTIVE"}) == {}


def test_wait_policy_precedence_and_bad_values():
    """The user's OpenMP variables win; POLICYLAB_WAIT_POLICY next; then the default."""
    assert runtime.wait_policy_settings({"OMP_WAIT_POLICY": "active", runtime.WAIT_ENV: "passive"}) == \
        ({}, "OMP_WAIT_POLICY=active (exported)")
    assert runtime.wait_policy_settings({"GOMP_SPINCOUNT": "5"})[0] == {}
    assert runtime.wait_policy_settings({runtime.WAIT_ENV: "passive"})[0] == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert runtime.wait_policy_settings({runtime.WAIT_ENV: "spin:250"}) == \
        ({"GOMP_SPINCOUNT": "250"}, f"spin 250 rounds, then sleep ({runtime.WAIT_ENV})")
    assert runtime.wait_policy_settings({runtime.WAIT_ENV: "openmp"})[0] == {}
    default, why = runtime.wait_policy_settings({})
    assert why.endswith("(the default)") and default == runtime.wait_policy_settings(
        {runtime.WAIT_ENV: runtime.DEFAULT_WAIT})[0]
    for bad in ("spin:", "spin:-1", "sleepy"):
        with pytest.raises(ConfigError, match="must be openmp, passive or spin:N"):
            runtime.wait_policy_settings({runtime.WAIT_ENV: bad})


def test_apply_wait_policy_only_before_torch_loads(monkeypatch):
    import sys

    monkeypatch.setattr(runtime, "_wait_reason", None)  # restored after the test
    env = {runtime.WAIT_ENV: "spin:7"}
    why = runtime.apply_wait_policy(env)  # torch is loaded in this process: too late
    assert "not applied" in why and "GOMP_SPINCOUNT" not in env and runtime.wait_reason() == why
    monkeypatch.delitem(sys.modules, "torch")
    assert runtime.apply_wait_policy(env) == f"spin 7 rounds, then sleep ({runtime.WAIT_ENV})"
    assert env["GOMP_SPINCOUNT"] == "7"


def test_the_command_sets_the_wait_policy_before_torch(tmp_path):
    """`policylab methods` in a fresh process: the default policy reaches the environment
    torch's OpenMP reads (checked in the child, after torch is imported)."""
    import os
    import subprocess
    import sys

    code = ("import os, sys; from policylab.cli import main; main(['methods', 'grpo']); "
            "import torch; print('SPIN', os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", runtime.WAIT_ENV)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    want = runtime.wait_policy_settings({})[0]
    line = [x for x in out.stdout.splitlines() if x.startswith("SPIN")][-1]
    assert line == f"SPIN {want.get('GOMP_SPINCOUNT')} {want.get('OMP_WAIT_POLICY')}"
