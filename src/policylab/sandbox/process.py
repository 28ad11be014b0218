"""The candidate's process as the parent sees it: spawned with a clean environment,
spoken to one request at a time over a pipe (an answer it writes unasked is a violation),
timed by its own CPU clock, and at the end killed with its whole session and scored
(`status_of`: ok, timeout, cpu_limit, memory, output_limit, violation, forked, ...)."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from policylab.sandbox.host import processes_of, sandbox_uid, session_members
from policylab.sandbox.policy import (
    CHILD,
    SandboxPolicy,
    SandboxResult,
)


def clean_env(home: str) -> dict:
    """The whole environment of a candidate: nothing from the trainer's."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home,
            "PYTHONHASHSEED": "0"}


def process_cpu_ns(pid: int) -> int | None:
    """The CPU time (ns, all threads) process `pid` has used so far, read from the kernel
    (its process CPU clock, MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)); None when it is gone."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except OSError:
        return None


class Process:
    """The parent's side of one child: the pipes, the deadline, the end."""

    def __init__(self, job: dict, policy: SandboxPolicy):
        lim = policy.limits
        self.limits = lim
        self.uid = sandbox_uid()
        self.box = tempfile.mkdtemp(prefix="policylab-sandbox-")
        # the parent's: stdout, stderr and the final report, never writable by the candidate by path
        self.side = tempfile.mkdtemp(prefix="policylab-sandbox-io-")
        self.problem: tuple[str, str] | None = None
        self.ready, self.ready_cpu, self.result = False, None, None
        self._buf = b""
        os.chmod(self.box, 0o700)
        Path(self.box, "job.json").write_text(json.dumps(job))
        if self.uid >= 0:
            os.chown(self.box, self.uid, self.uid)
        self.out = open(os.path.join(self.side, "stdout"), "w+b")
        self.err = open(os.path.join(self.side, "stderr"), "w+b")
        self.rep = open(os.path.join(self.side, "report"), "w+b")
        req_r, self.req = os.pipe()
        self.resp, resp_w = os.pipe()
        os.set_blocking(self.req, False)
        self.t0 = time.perf_counter()
        self.deadline = time.monotonic() + float(lim.wall_seconds)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(CHILD), self.box, str(self.rep.fileno()), str(req_r),
                 str(resp_w), str(self.uid), policy.required()],
                cwd=self.box, env=clean_env(self.box), stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err,
                pass_fds=(self.rep.fileno(), req_r, resp_w), start_new_session=True, close_fds=True)
        finally:
            os.close(req_r)
            os.close(resp_w)
        self.pid = self.proc.pid
        if not job.get("probe"):
            hello = self._read_line()
            if hello is not None:
                try:
                    ok = json.loads(hello) == {"stage": "ready"}
                except ValueError:
                    ok = False
                if ok:
                    self.ready, self.ready_cpu = True, process_cpu_ns(self.pid)
                else:
                    self.fail("violation", "malformed ready line")

    # ---- the pipe ---------------------------------------------------------------------
    def fail(self, status: str, detail: str) -> None:
        if self.problem is None:
            self.problem = (status, detail)
        kill_group(self.pid)

    def _read_line(self) -> bytes | None:
        limit = int(self.limits.output_bytes) + 4096
        while b"\n" not in self._buf:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.fail("timeout", "wall-clock limit")
                return None
            r, _, _ = select.select([self.resp], [], [], remaining)
            if not r:
                continue
            chunk = os.read(self.resp, 1 << 16)
            if not chunk:  # the process ended (its report says why)
                return None
            self._buf += chunk
            if len(self._buf) > limit:
                self.fail("output_limit", f"an answer longer than {limit} bytes")
                return None
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _read_waiting(self) -> bytes | None:
        """One non-blocking read of the answer pipe: the bytes waiting (b"" at its end), or
        None when nothing is waiting."""
        r, _, _ = select.select([self.resp], [], [], 0)
        return os.read(self.resp, 1 << 16) if r else None

    def _unsolicited(self) -> bool:
        """Did the child write before it was asked (an answer nobody requested)?"""
        if self._buf:
            return True
        chunk = self._read_waiting()
        if chunk:
            self._buf += chunk
        return bool(chunk)

    def _answers_left(self) -> bool:
        """After the child ended: is anything left on the answer pipe that no request asked for?"""
        if self._buf.strip():
            return True
        try:
            while chunk := self._read_waiting():
                if chunk.strip():
                    return True
        except OSError:
            pass
        return False

    def request(self, obj: dict) -> Any:
        """Write one request, read one answer (parsed JSON); None when the session failed."""
        if self.problem is not None:
            return None
        if self._unsolicited():
            self.fail("violation", "the candidate wrote an answer before it was asked")
            return None
        view = memoryview(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
        while view:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.fail("timeout", "wall-clock limit")
                return None
            _, w, _ = select.select([], [self.req], [], remaining)
            if not w:
                continue
            try:
                n = os.write(self.req, view)
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                return None
            view = view[n:]
        line = self._read_line()
        if line is None:
            return None
        try:
            return json.loads(line)
        except ValueError:
            self.fail("violation", "an answer that is not JSON")
            return None

    # ---- the end ----------------------------------------------------------------------
    def finish(self) -> SandboxResult:
        if self.result is not None:
            return self.result
        try:
            try:
                os.close(self.req)  # end of requests: a well-behaved child exits 0
            except OSError:
                pass
            timed_out = self.problem is not None and self.problem[0] == "timeout"
            try:
                self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()) + 0.05)
            except subprocess.TimeoutExpired:
                if self.problem is None:
                    self.problem, timed_out = ("timeout", "wall-clock limit"), True
                kill_group(self.pid)
                self.proc.wait()
            wall = time.perf_counter() - self.t0
            if self.ready and self.problem is None and self._answers_left():
                # more answer lines than requests: a forged answer slipped in between two real
                # ones (the parent read it as the answer, the real one was still on its way)
                self.problem = ("violation", "the candidate wrote an answer before it was asked")
            leftover = leftovers(self.pid, self.uid)
            lim = self.limits
            for f in (self.out, self.err, self.rep):
                f.flush()
                f.seek(0)
            stdout = self.out.read(lim.output_bytes).decode(errors="replace")
            stderr = self.err.read(lim.output_bytes).decode(errors="replace")
            raw = self.rep.read()
            report = None
            if raw:
                try:
                    report = json.loads(raw.decode())
                except (ValueError, UnicodeDecodeError):
                    report = None
            status, detail = status_of(self.proc.returncode, timed_out, leftover, report)
            rc = self.proc.returncode
            if self.problem is not None and status != "forked" and rc not in (70, 71, -signal.SIGXCPU):
                status, detail = self.problem  # what the parent saw (and then killed it for)
            self.result = SandboxResult(status, self.proc.returncode, wall, stdout, stderr, report, detail)
            return self.result
        finally:
            for f in (self.out, self.err, self.rep):
                f.close()
            try:
                os.close(self.resp)
            except OSError:
                pass
            shutil.rmtree(self.box, ignore_errors=True)
            shutil.rmtree(self.side, ignore_errors=True)


def spawn(job: dict, policy: SandboxPolicy) -> Process:
    return Process(job, policy)


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def leftovers(sid: int, uid: int) -> list[int]:
    """Processes the candidate left behind (in its session, or under its uid): killed;
    their pids returned. The process-count check behind RLIMIT_NPROC."""
    found = set(session_members(sid))
    if uid >= 0:
        found |= set(processes_of(uid))
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    kill_group(sid)
    return sorted(found)


def status_of(rc: int | None, timed_out: bool, leftover: list[int], report: dict | None) -> tuple[str, str]:
    stage = (report or {}).get("stage")
    if leftover:
        return "forked", f"processes left behind: {leftover}"
    if timed_out:
        return "timeout", "wall-clock limit"
    if rc == 70 or stage == "violation":
        return "violation", f"{(report or {}).get('violation')}: {(report or {}).get('detail', '')}"
    if rc == 71 or stage == "memory":
        return "memory", "MemoryError under the address-space limit"
    if rc == 72 or stage == "isolation_failed":
        return "isolation_failed", str((report or {}).get("detail"))
    if rc == 74:
        return "output_limit", "stdout/stderr beyond the file-size limit"
    if rc is not None and rc < 0:
        sig = -rc
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return "cpu_limit", f"signal {signal.Signals(sig).name}"
        if sig == signal.SIGXFSZ:
            return "output_limit", "file size limit"
        return "error", f"killed by signal {signal.Signals(sig).name}"
    if rc == 0 and report is not None:
        return "ok", ""
    return "error", f"exit code {rc}; report stage {stage!r}"
