"""A sandbox for model-written Python: one separate, walled-in process per candidate.

Execution-based rewards (the code task's tests, `code_opt`'s timings) run code that a
policy wrote. Nothing of it runs in the trainer's process. `Session(source, entry, policy)`
starts a fresh interpreter (`python -I -S -B policylab/sandbox/child.py`) per candidate;
that process puts up every wall below on itself before the candidate's first line runs,
then serves the parent one call at a time over a pipe. `run_job(job, policy)` is the
one-shot form (load, call on each argument list, close).

| wall | mechanism | what a candidate that tries gets |
|---|---|---|
| separate process | one interpreter per candidate, its own session (process group), killed as a group at the end | the trainer keeps running whatever it does |
| CPU time | RLIMIT_CPU (SIGXCPU at the limit, SIGKILL one second later) | status `cpu_limit` |
| memory | RLIMIT_AS (address space) | MemoryError, status `memory` |
| wall clock | the parent waits at most `wall_seconds` for the whole session, then kills the process group | status `timeout` |
| processes | RLIMIT_NPROC = 1 for a fresh unprivileged uid (as root the child drops to it with setgroups/setgid/setuid: RLIMIT_NPROC does not bind uid 0); the audit hook stops fork/exec/spawn; Landlock denies execve; after the run the parent looks for any process left in the session or under the uid, kills it and scores `forked` | status `violation` or `forked` |
| network | a network namespace of its own (unshare CLONE_NEWNET, with CLONE_NEWUSER when not root): no interface but a down loopback; Landlock denies TCP bind/connect (ABI >= 4); the audit hook stops socket creation | status `violation` |
| writes | Landlock: writes, creations, removals and renames only beneath the fresh directory (its cwd, HOME and TMPDIR); the dropped uid owns nothing else; RLIMIT_FSIZE caps every file it writes, stdout and stderr included | status `violation` (or `output_limit`) |
| scratch space | the directory is a tmpfs of `scratch_bytes` with `scratch_files` inodes, mounted in the child's own mount namespace (the host's /tmp never holds its files; it vanishes with the process) | ENOSPC in the candidate, which then fails |
| reads | Landlock: reads only beneath its directory and the standard library's modules (never site-packages, never policylab's own tree); the audit hook stops the first read or listing elsewhere | status `violation` (or PermissionError) |
| answer key | the child receives the candidate's source, its function name and, call by call, the arguments; never a reference solution, an expected value or a timing | — |
| timings | measured by the parent: the child's CPU clock (`clock_gettime` on its process CPU clock) read before each request is written and after its answer is read; the parent judges every output | — |
| environment | a clean environment (PATH, LANG, HOME, TMPDIR, PYTHONHASHSEED only): no secret of the trainer's environment is inherited; `-I` ignores PYTHON* variables | — |
| signals | Landlock scoping (ABI >= 6): no signal to a process outside its domain; the audit hook stops os.kill | status `violation` |

The audit hook (`sys.addaudithook`, which cannot be removed) is the early stop: it ends the
process with a report naming the event, so a candidate that merely tries is scored as
failed. The kernel walls (namespaces, Landlock, rlimits, the uid, the tmpfs) hold even
against code that gets past the hook (e.g. through ctypes, whose calls the hook also stops).

Where a wall cannot be put up (no network namespace: not root and no unprivileged user
namespaces; no Landlock: kernel < 5.13 or the LSM disabled; no tmpfs in a mount namespace
of its own), `check_available` refuses to run anything unless the user opted out with the
flag that names what is given up: `SandboxPolicy(without_network_isolation=True)`
(`task.sandbox_without_network_isolation`) or `without_filesystem_isolation=True`
(`task.sandbox_without_filesystem_isolation`; then reads, writes and scratch space are
bounded only by the audit hook, the uid and RLIMIT_FSIZE, and policylab's source tree,
reference solutions included, is readable by code that gets past the hook).

What the sandbox does not do. The candidate's process is the candidate's: it can rewrite
anything in it (the serving loop, the canonical form of its return values, what it writes
on the pipe); nothing it does there changes what the parent measures or how it judges.
Timings are CPU time of the candidate's whole process, so the decoding of the arguments
and the encoding of the result (the same code in the reference's process) are part of
every timed call; a candidate that shares a CPU cache with other work can be slowed (not
sped up) by it. The standard library stays readable (as root the child drops to a uid that
may not read it at all: the modules it may import are preloaded before the drop, see
`policylab.sandbox.child._PRELOAD`).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from policylab.errors import PolicylabError

CHILD = Path(__file__).with_name("child.py")
STATUSES = ("ok", "timeout", "cpu_limit", "memory", "output_limit", "violation", "forked", "isolation_failed",
            "error")


class SandboxUnavailable(PolicylabError):
    """A wall the policy requires cannot be put up on this machine."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-candidate limits. cpu_seconds: CPU time (rounded up to whole seconds);
    memory_mb: address space; wall_seconds: real time before the process group is killed;
    output_bytes: the largest file it may write (stdout, stderr, files in its directory)
    and the largest answer it may send for one call; open_files: file descriptors;
    scratch_bytes / scratch_files: the size of its directory (a tmpfs) and how many files
    and directories it may hold."""

    cpu_seconds: float = 2.0
    memory_mb: int = 512
    wall_seconds: float = 10.0
    output_bytes: int = 1_000_000
    open_files: int = 64
    scratch_bytes: int = 16 * 1024 * 1024
    scratch_files: int = 256

    def __post_init__(self):
        for name in ("cpu_seconds", "memory_mb", "wall_seconds", "output_bytes", "open_files", "scratch_bytes",
                     "scratch_files"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise PolicylabError(f"sandbox limit `{name}` must be a number > 0, got {v!r}")
        if self.memory_mb < 64:
            raise PolicylabError(f"sandbox limit `memory_mb` must be >= 64 (the interpreter itself), got {self.memory_mb}")


@dataclass(frozen=True)
class SandboxPolicy:
    """The limits and the walls the user allows to be missing (both off: every wall required)."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    without_network_isolation: bool = False
    without_filesystem_isolation: bool = False

    def required(self) -> str:
        return ",".join(w for w, off in (("net", self.without_network_isolation),
                                          ("fs", self.without_filesystem_isolation)) if not off)


@dataclass
class SandboxResult:
    """What one candidate's process did. `status` is one of STATUSES; `report` is what
    the parent gathered (return values and errors of `run_job`'s calls) or the child's own
    final report (a violation, an isolation failure) when the process got that far."""

    status: str
    returncode: int | None
    wall_seconds: float
    stdout: str = ""
    stderr: str = ""
    report: dict | None = None
    detail: str = ""

    @property
    def ran(self) -> bool:
        """The candidate ran to the end of the harness (its own tests may still have failed)."""
        return self.status == "ok" and self.report is not None and self.report.get("stage") == "ok"


# ----------------------------------------------------------------------------- uid
def _mapped(uid: int) -> bool:
    try:
        rows = Path("/proc/self/uid_map").read_text().split("\n")
    except OSError:
        return False
    for row in rows:
        parts = row.split()
        if len(parts) == 3:
            inside, _, count = map(int, parts)
            if inside <= uid < inside + count:
                return True
    return False


def sandbox_uid() -> int:
    """An unprivileged uid for one candidate when running as root: a random uid in
    [200000, 299999] that the user namespace maps, that no passwd entry names and that no
    process uses (so RLIMIT_NPROC = 1 means exactly this process); -1 when not root."""
    if os.geteuid() != 0:
        return -1
    import pwd

    rng = random.SystemRandom()
    for _ in range(100):
        uid = rng.randrange(200_000, 300_000)
        if not _mapped(uid):
            continue
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        if not _processes_of(uid):
            return uid
    raise SandboxUnavailable("no free unprivileged uid in [200000, 300000) for the sandbox")


def _proc_status(pid: str) -> dict:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            out[k] = v.strip()
    except OSError:
        pass
    return out


def _processes_of(uid: int) -> list[int]:
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            st = _proc_status(p)
            if st.get("Uid", "").split()[:1] == [str(uid)]:
                pids.append(int(p))
    return pids


def _session_members(sid: int) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid:  # field 6 of stat: the session id
            out.append(int(p))
    return out


# ----------------------------------------------------------------------------- probe
_PROBE: dict | None = None


def probe() -> dict:
    """What this machine can wall in (run once, cached): {"network": bool, "filesystem":
    bool, "privilege_drop": bool | None (None: not root, nothing to drop), "detail": {...}}."""
    global _PROBE
    if _PROBE is None:
        res = _spawn({"probe": True, "limits": asdict(SandboxLimits())}, SandboxPolicy(
            without_network_isolation=True, without_filesystem_isolation=True)).finish()
        rep = res.report or {}
        walls = rep.get("walls") or {}
        if rep.get("stage") != "probe":
            _PROBE = {"network": False, "filesystem": False, "privilege_drop": False,
                      "detail": {"probe": f"{res.status}: {res.stderr[-300:] or res.detail}"}}
        else:
            _PROBE = {"network": walls.get("net") is None, "filesystem": walls.get("fs") is None,
                      "privilege_drop": (walls.get("uid") is None) if rep.get("root") else None,
                      "detail": {k: v for k, v in walls.items() if v is not None}}
    return _PROBE


def check_available(policy: SandboxPolicy) -> dict:
    """Refuse (SandboxUnavailable) when a wall the policy requires cannot be put up here."""
    p = probe()
    if p["privilege_drop"] is False:
        raise SandboxUnavailable(f"the sandbox runs as root but cannot drop to an unprivileged uid: {p['detail']}")
    if not p["network"] and not policy.without_network_isolation:
        raise SandboxUnavailable(
            "the sandbox cannot give model-written code a network namespace of its own here "
            f"({p['detail'].get('net', 'unknown reason')}); nothing was run. Set "
            "task.sandbox_without_network_isolation=true to run it with this machine's network")
    if not p["filesystem"] and not policy.without_filesystem_isolation:
        raise SandboxUnavailable(
            "the sandbox cannot confine model-written code's reads, writes and scratch space to its directory here "
            f"({p['detail'].get('fs', 'unknown reason')}); nothing was run. Set "
            "task.sandbox_without_filesystem_isolation=true to let it read and write wherever its user may")
    return p


# ----------------------------------------------------------------------------- run
def clean_env(home: str) -> dict:
    """The whole environment of a candidate: nothing from the trainer's."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home,
            "PYTHONHASHSEED": "0"}


def canonical_text(value: Any) -> str:
    """The JSON text outputs are compared by (type-strict: `child.canon`, keys sorted)."""
    from policylab.sandbox.child import canon

    return json.dumps(canon(value), sort_keys=True, separators=(",", ":"))


def process_cpu_ns(pid: int) -> int | None:
    """The CPU time (ns, all threads) process `pid` has used so far, read from the kernel
    (its process CPU clock, MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)); None when it is gone."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except OSError:
        return None


@dataclass(frozen=True)
class Call:
    """One call's answer as the parent received it: `output` (the candidate's return
    value in canonical JSON, None when it raised), `text` (that JSON, the form outputs are
    compared in), `error` (its exception, or None) and `cpu_ns` (the child's CPU time
    between the request being written and the answer being read, measured by the parent)."""

    output: Any
    text: str
    error: str | None
    cpu_ns: int


class Session:
    """One candidate's process, held open: `load()` once, then `call(args)` as often as
    needed, then `close()` for its SandboxResult. Every failure (a limit, a violation, a
    malformed answer) ends the session: `load` returns False and `call` returns None from
    then on, and `close` says what happened. Refuses (SandboxUnavailable) when a required
    wall is missing, before any process starts."""

    def __init__(self, source: str, entry: str, policy: SandboxPolicy, *, audit_hook: bool = True,
                 preload=(), check: bool = True):
        if check:
            check_available(policy)
        if not isinstance(source, str) or not isinstance(entry, str):
            raise PolicylabError("a sandbox session needs the source and the function name as str")
        self._proc = _spawn({"source": source, "entry": entry, "audit_hook": bool(audit_hook),
                             "preload": list(preload), "limits": asdict(policy.limits)}, policy)
        self.load_stage: str | None = None
        self.load_detail = ""

    @property
    def alive(self) -> bool:
        return self._proc.problem is None and self._proc.ready

    def load(self) -> bool:
        """Run the candidate's source (its module level); True iff it defined the function."""
        if not self._proc.ready:
            return False
        resp = self._proc.request({"op": "load"})
        if not isinstance(resp, dict) or "stage" not in resp:
            self._proc.fail("violation", "malformed answer to load")
            return False
        self.load_stage, self.load_detail = str(resp["stage"]), str(resp.get("detail", ""))
        return self.load_stage == "loaded"

    def call(self, args: list) -> Call | None:
        """Call the candidate's function on `args` (a fresh copy: the child decodes it from
        JSON); None when the process is gone or broke the protocol (see `close`)."""
        if self.load_stage != "loaded" or not self.alive:
            return None
        t0 = process_cpu_ns(self._proc.pid)
        resp = self._proc.request({"op": "call", "args": args})
        t1 = process_cpu_ns(self._proc.pid)
        if resp is None:
            return None
        if (not isinstance(resp, dict) or set(resp) != {"output", "error"}
                or not (resp["error"] is None or isinstance(resp["error"], str))):
            self._proc.fail("violation", "malformed answer to a call")
            return None
        if t0 is None or t1 is None:
            self._proc.fail("error", "the candidate's CPU clock could not be read")
            return None
        out = resp["output"] if resp["error"] is None else None
        return Call(out, json.dumps(out, sort_keys=True, separators=(",", ":")), resp["error"], t1 - t0)

    def cpu_ns(self) -> int | None:
        """CPU time the candidate's process used since it said ready (nothing of the
        candidate ran before): its load, every call and anything between them."""
        now = process_cpu_ns(self._proc.pid)
        return None if now is None or self._proc.ready_cpu is None else now - self._proc.ready_cpu

    def close(self) -> SandboxResult:
        return self._proc.finish()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._proc.finish()


def run_job(job: dict, policy: SandboxPolicy) -> SandboxResult:
    """Run one candidate once: `job` = {"source": code, "entry": function name, "calls":
    [args lists]}; `"audit_hook": False` leaves the early stop out and `"preload": [modules]`
    imports more modules before the walls go up (tests use both to show that each kernel
    wall holds on its own). The result's report, when the candidate ran to the end, is
    {"stage": "ok", "outputs": [...], "errors": [...], "walls": {...}}.
    Refuses (SandboxUnavailable) when a required wall is missing; every other outcome,
    however the candidate misbehaves, is a SandboxResult."""
    unknown = set(job) - {"source", "entry", "calls", "audit_hook", "preload"}
    if unknown:
        raise PolicylabError(f"run_job: unknown job keys {sorted(unknown)} (timings are taken by the parent: "
                             "use Session and time its calls)")
    s = Session(job["source"], job["entry"], policy, audit_hook=job.get("audit_hook", True),
                preload=job.get("preload", ()))
    outputs, errors = [], []
    loaded = s.load()
    if loaded:
        for args in job["calls"]:
            c = s.call(list(args))
            if c is None:
                break
            outputs.append(c.output)
            errors.append(c.error)
    res = s.close()
    if res.status == "ok":
        if not loaded:
            res.report = {"stage": s.load_stage or "error", "detail": s.load_detail}
        elif len(outputs) == len(job["calls"]):
            res.report = {"stage": "ok", "outputs": outputs, "errors": errors,
                          "walls": (res.report or {}).get("walls", {})}
        else:
            res.status, res.detail = "error", "the session ended before every call was answered"
    return res


class _Process:
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
        _kill_group(self.pid)

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

    def _unsolicited(self) -> bool:
        """Did the child write before it was asked (an answer nobody requested)?"""
        if self._buf:
            return True
        r, _, _ = select.select([self.resp], [], [], 0)
        if r:
            chunk = os.read(self.resp, 1 << 16)
            self._buf += chunk
            return bool(chunk)
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
                _kill_group(self.pid)
                self.proc.wait()
            wall = time.perf_counter() - self.t0
            leftover = _leftovers(self.pid, self.uid)
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
            status, detail = _status(self.proc.returncode, timed_out, leftover, report)
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


def _spawn(job: dict, policy: SandboxPolicy) -> _Process:
    return _Process(job, policy)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _leftovers(sid: int, uid: int) -> list[int]:
    """Processes the candidate left behind (in its session, or under its uid): killed;
    their pids returned. The process-count check behind RLIMIT_NPROC."""
    found = set(_session_members(sid))
    if uid >= 0:
        found |= set(_processes_of(uid))
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _kill_group(sid)
    return sorted(found)


def _status(rc: int | None, timed_out: bool, leftover: list[int], report: dict | None) -> tuple[str, str]:
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
