"""The sandbox: every escape attempt is a real malicious candidate; each is stopped, scored
as failed, leaves no side effect, and the next candidate still runs.

The marker directories are world-writable (mode 0777) on purpose: only the sandbox's own
walls (the audit hook, Landlock, the namespaces, the dropped uid) stand between the
candidate and the marker. The `audit_hook=False` cases leave the early stop out to show
that each kernel wall holds by itself.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from policylab.sandbox import runner as sb

POLICY = sb.SandboxPolicy(sb.SandboxLimits(cpu_seconds=1, memory_mb=256, wall_seconds=5, output_bytes=200_000))

pytestmark = pytest.mark.skipif(not (sb.probe()["network"] and sb.probe()["filesystem"]),
                                reason=f"this machine cannot wall a candidate in: {sb.probe()['detail']}")


def _job(src: str, calls=((1,),), **kw) -> dict:
    return {"source": src, "entry": "f", "calls": [list(c) for c in calls], **kw}


@pytest.fixture
def marker_dir():
    # directly under the system temp dir (world-traversable) and mode 0777: any user may
    # write here, so only the sandbox's walls can stop the candidate
    d = Path(tempfile.mkdtemp(prefix="policylab-marker-"))
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _good_still_runs():
    r = sb.run_job(_job("def f(x):\n    return x + 1\n"), POLICY)
    assert r.status == "ok" and r.report["outputs"] == [2]


def test_a_plain_candidate_runs_and_returns_its_values():
    r = sb.run_job(_job("def f(x):\n    return [x, x * 2]\n", calls=[(1,), (3,)]), POLICY)
    assert r.ran
    assert r.report["outputs"] == [[1, 2], [3, 6]] and r.report["errors"] == [None, None]
    assert r.report["walls"] == {"net": True, "fs": True}


def test_fork_is_stopped_and_the_child_never_writes(marker_dir):
    m = marker_dir / "forked"
    src = ("import os\ndef f(x):\n    pid = os.fork()\n    if pid == 0:\n"
           f"        open({str(m)!r}, 'w').write('child')\n        os._exit(0)\n    return x\n")
    r = sb.run_job(_job(src), POLICY)
    assert r.status == "violation" and "os.fork" in r.detail
    assert not r.ran and not m.exists()
    _good_still_runs()


def test_subprocess_is_stopped(marker_dir):
    m = marker_dir / "spawned"
    src = f"import subprocess\ndef f(x):\n    subprocess.run(['touch', {str(m)!r}])\n    return x\n"
    r = sb.run_job(_job(src), POLICY)
    assert r.status == "violation" and not m.exists()


def test_fork_without_the_audit_hook_is_refused_by_the_process_limit(marker_dir):
    # the kernel alone: RLIMIT_NPROC = 1 for the sandbox's uid (as root: the fresh uid the
    # child dropped to, since RLIMIT_NPROC does not bind uid 0)
    m = marker_dir / "forked-nohook"
    src = ("import os\ndef f(x):\n    try:\n        pid = os.fork()\n    except OSError as e:\n        return str(e)\n"
           f"    if pid == 0:\n        open({str(m)!r}, 'w').write('child')\n        os._exit(0)\n    return 'forked'\n")
    r = sb.run_job(_job(src, audit_hook=False), POLICY)
    assert r.status == "ok", r
    assert "Resource temporarily unavailable" in r.report["outputs"][0]
    time.sleep(0.2)
    assert not m.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop is what makes RLIMIT_NPROC bind when running as root")
def test_as_root_the_candidate_runs_under_an_unprivileged_uid_that_cannot_regain_root():
    src = ("import os\ndef f(x):\n    try:\n        os.setuid(0)\n        regained = True\n"
           "    except PermissionError:\n        regained = False\n    return [os.getuid(), os.geteuid(), regained]\n")
    r = sb.run_job(_job(src, audit_hook=False), POLICY)
    uid, euid, regained = r.report["outputs"][0]
    assert uid != 0 and euid != 0 and regained is False
    assert 200_000 <= uid < 300_000


@pytest.mark.skipif(os.geteuid() != 0, reason="demonstrates the root case")
def test_rlimit_nproc_alone_does_not_bind_root():
    # why the sandbox drops privileges: the same limit on a root process does not stop a fork
    code = ("import os, resource\nresource.setrlimit(resource.RLIMIT_NPROC, (1, 1))\npid = os.fork()\n"
            "if pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('forked')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "forked"


def test_an_endless_loop_hits_the_cpu_limit():
    r = sb.run_job(_job("def f(x):\n    while True:\n        pass\n"), POLICY)
    assert r.status == "cpu_limit" and not r.ran
    _good_still_runs()


def test_sleeping_past_the_wall_clock_limit_is_stopped_there():
    # no timed bound: the candidate sleeps 2.5 s (no CPU time) and then returns. With a
    # 1 s wall-clock limit it is killed before it returns, however slowly the machine
    # starts it; a limit twice as long or longer (≥ 2.5 s) would let it finish ("ok")
    # whenever its process starts within the slack
    pol = sb.SandboxPolicy(sb.SandboxLimits(cpu_seconds=5, wall_seconds=1.0))
    r = sb.run_job(_job("import time\ndef f(x):\n    time.sleep(2.5)\n    return x\n"), pol)
    assert r.status == "timeout" and not r.ran
    # under a limit it fits in by far, the same kind of candidate runs to the end
    pol = sb.SandboxPolicy(sb.SandboxLimits(cpu_seconds=5, wall_seconds=60.0))
    r = sb.run_job(_job("import time\ndef f(x):\n    time.sleep(0.1)\n    return x\n"), pol)
    assert r.status == "ok" and r.ran


def test_unbounded_allocation_is_stopped_by_the_memory_limit():
    r = sb.run_job(_job("def f(x):\n    keep = []\n    while True:\n        keep.append(bytearray(10**7))\n"), POLICY)
    assert r.status == "memory" and not r.ran
    _good_still_runs()


def test_writing_outside_its_directory_is_stopped(marker_dir):
    m = marker_dir / "written"
    r = sb.run_job(_job(f"def f(x):\n    open({str(m)!r}, 'w').write('x')\n    return x\n"), POLICY)
    assert r.status == "violation" and "outside" in r.detail and not m.exists()


def test_writing_outside_without_the_audit_hook_is_denied_by_landlock(marker_dir):
    m = marker_dir / "written-nohook"
    src = (f"def f(x):\n    try:\n        open({str(m)!r}, 'w').write('x')\n    except OSError as e:\n"
           "        return type(e).__name__\n    return 'wrote'\n")
    r = sb.run_job(_job(src, audit_hook=False), POLICY)
    assert r.report["outputs"] == ["PermissionError"] and not m.exists()


def test_its_own_directory_is_writable_and_is_removed_afterwards():
    src = ("import os\ndef f(x):\n    open('scratch.txt', 'w').write('hi')\n"
           "    return [open('scratch.txt').read(), os.getcwd()]\n")
    r = sb.run_job(_job(src), POLICY)
    text, cwd = r.report["outputs"][0]
    assert text == "hi" and cwd.startswith(os.path.realpath(os.environ.get("TMPDIR", "/tmp")))
    assert not os.path.exists(cwd)


class _Listener:
    """A TCP server on the host's loopback that records every connection it accepts."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(5)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
                self.accepted += 1
                c.close()
            except OSError:
                pass

    def close(self):
        self.stop = True
        self.t.join()
        self.sock.close()


def test_opening_a_socket_is_stopped_and_nothing_reaches_the_host():
    srv = _Listener()
    try:
        src = f"import socket\ndef f(x):\n    socket.create_connection(('127.0.0.1', {srv.port}), timeout=1)\n    return x\n"
        r = sb.run_job(_job(src), POLICY)
        assert r.status == "violation" and not r.ran
        time.sleep(0.3)
        assert srv.accepted == 0
    finally:
        srv.close()


def test_without_the_audit_hook_the_network_namespace_has_no_route_to_the_host():
    srv = _Listener()
    try:
        src = ("import socket\ndef f(x):\n    try:\n"
               f"        socket.create_connection(('127.0.0.1', {srv.port}), timeout=1)\n"
               "    except OSError as e:\n        return type(e).__name__\n    return 'connected'\n")
        # socket preloaded (as root the dropped uid may not be able to read the standard library)
        r = sb.run_job(_job(src, audit_hook=False, preload=["socket", "encodings.idna"]), POLICY)
        assert r.status == "ok" and r.report["outputs"][0] in ("OSError", "PermissionError", "TimeoutError"), r.report
        time.sleep(0.3)
        assert srv.accepted == 0
    finally:
        srv.close()


def test_no_secret_of_the_parent_environment_is_inherited(monkeypatch):
    monkeypatch.setenv("POLICYLAB_TEST_SECRET", "hunter2")
    r = sb.run_job(_job("import os\ndef f(x):\n    return dict(os.environ)\n"), POLICY)
    env = r.report["outputs"][0]
    assert "POLICYLAB_TEST_SECRET" not in env and "hunter2" not in str(env)
    assert set(env) == {"PATH", "LANG", "HOME", "TMPDIR", "PYTHONHASHSEED"}


def test_signalling_another_process_is_stopped():
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        r = sb.run_job(_job(f"import os\ndef f(x):\n    os.kill({victim.pid}, 9)\n    return x\n"), POLICY)
        assert r.status == "violation"
        assert victim.poll() is None  # still alive
    finally:
        victim.kill()
        victim.wait()


def test_ctypes_is_stopped():
    r = sb.run_job(_job("def f(x):\n    import ctypes\n    return ctypes.CDLL(None).getpid()\n"), POLICY)
    assert r.status == "violation"


def test_flooding_stdout_hits_the_file_size_limit():
    r = sb.run_job(_job("def f(x):\n    while True:\n        print('x' * 1000)\n"), POLICY)
    assert r.status == "output_limit"
    assert len(r.stdout) <= POLICY.limits.output_bytes


def test_a_candidate_that_raises_is_reported_not_fatal():
    r = sb.run_job(_job("def f(x):\n    return 1 // (x - 1)\n", calls=[(1,), (2,)]), POLICY)
    assert r.ran and r.report["outputs"] == [None, 1] and "ZeroDivisionError" in r.report["errors"][0]
