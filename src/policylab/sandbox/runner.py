"""A sandbox for model-written Python: one separate, walled-in process per candidate.

Execution-based rewards (the code task's tests, `code_opt`'s timings) run code that a
policy wrote. Nothing of it runs in the trainer's process. `run_job(job, policy)` starts
a fresh interpreter (`python -I -S -B policylab/sandbox/child.py`) per candidate, and that
process puts up every wall below on itself before the candidate's first line runs:

| wall | mechanism | what a candidate that tries gets |
|---|---|---|
| separate process | one interpreter per candidate, its own session (process group), killed as a group at the end | the trainer keeps running whatever it does |
| CPU time | RLIMIT_CPU (SIGXCPU at the limit, SIGKILL one second later) | status `cpu_limit` |
| memory | RLIMIT_AS (address space) | MemoryError, status `memory` |
| wall clock | the parent waits at most `wall_seconds`, then kills the process group | status `timeout` |
| processes | RLIMIT_NPROC = 1 for a fresh unprivileged uid (as root the child drops to it with setgroups/setgid/setuid: RLIMIT_NPROC does not bind uid 0); the audit hook stops fork/exec/spawn; after the run the parent looks for any process left in the session or under the uid, kills it and scores `forked` | status `violation` or `forked` |
| network | a network namespace of its own (unshare CLONE_NEWNET, with CLONE_NEWUSER when not root): no interface but a down loopback; Landlock denies TCP bind/connect (ABI >= 4); the audit hook stops socket creation | status `violation` |
| files | Landlock: writes, creations, removals and renames only beneath the fresh temporary directory (its cwd, HOME and TMPDIR); the dropped uid owns nothing else; RLIMIT_FSIZE caps every file it writes, stdout and stderr included | status `violation` (or `output_limit`) |
| environment | a clean environment (PATH, LANG, HOME, TMPDIR, PYTHONHASHSEED only): no secret of the trainer's environment is inherited; `-I` ignores PYTHON* variables | — |
| signals | Landlock scoping (ABI >= 6): no signal to a process outside its domain; the audit hook stops os.kill | status `violation` |

The audit hook (`sys.addaudithook`, which cannot be removed) is the early stop: it ends the
process with a report naming the event, so a candidate that merely tries is scored as
failed. The kernel walls (namespaces, Landlock, rlimits, the uid) hold even against code
that gets past the hook (e.g. through ctypes, whose calls the hook also stops).

Where a wall cannot be put up (no network namespace: not root and no unprivileged user
namespaces; no Landlock: kernel < 5.13 or the LSM disabled), `check_available` refuses to
run anything unless the user opted out with the flag that names what is given up:
`SandboxPolicy(without_network_isolation=True)` (`task.sandbox_without_network_isolation`)
or `without_filesystem_isolation=True` (`task.sandbox_without_filesystem_isolation`).

What the sandbox does not do. Reading: files readable by the sandbox uid stay readable (as
root the child drops to a uid that owns nothing, so root-only files are not; the standard
modules it may import are preloaded before the drop, see `policylab.sandbox.child._PRELOAD`).
Timing: the harness measures runtimes inside the candidate's process, so a candidate
written to rewrite the harness's clock could report a false speed; correctness is never
decided inside: the child reports return values and the parent compares them with the
expected ones, which never enter the sandbox.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
    output_bytes: the largest file it may write (stdout, stderr, files in its directory);
    open_files: file descriptors."""

    cpu_seconds: float = 2.0
    memory_mb: int = 512
    wall_seconds: float = 10.0
    output_bytes: int = 1_000_000
    open_files: int = 64

    def __post_init__(self):
        for name in ("cpu_seconds", "memory_mb", "wall_seconds", "output_bytes", "open_files"):
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
    """What one candidate's process did. `status` is one of STATUSES; `report` is the
    harness's report (return values, errors, timings) when the process got that far."""

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
            without_network_isolation=True, without_filesystem_isolation=True))
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
            "the sandbox cannot confine model-written code's writes to its directory here "
            f"({p['detail'].get('fs', 'unknown reason')}); nothing was run. Set "
            "task.sandbox_without_filesystem_isolation=true to let it write wherever its user may")
    return p


# ----------------------------------------------------------------------------- run
def clean_env(home: str) -> dict:
    """The whole environment of a candidate: nothing from the trainer's."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home,
            "PYTHONHASHSEED": "0"}


def run_job(job: dict, policy: SandboxPolicy) -> SandboxResult:
    """Run one candidate: `job` = {"source": code, "entry": function name, "calls": [args
    lists], "timing": None | {"reference": code, "args": [...], "repeats": n, "warmup": w}};
    `"audit_hook": False` leaves the early stop out and `"preload": [modules]` imports more
    modules before the walls go up (tests use both to show that each kernel wall holds on
    its own).
    Refuses (SandboxUnavailable) when a required wall is missing; every other outcome,
    however the candidate misbehaves, is a SandboxResult."""
    check_available(policy)
    return _spawn({**job, "limits": asdict(policy.limits)}, policy)


def _spawn(job: dict, policy: SandboxPolicy) -> SandboxResult:
    lim = policy.limits
    uid = sandbox_uid()
    box = tempfile.mkdtemp(prefix="policylab-sandbox-")
    side = tempfile.mkdtemp(prefix="policylab-sandbox-io-")  # the parent's: outputs and report, never writable by the candidate by path
    try:
        os.chmod(box, 0o700)
        Path(box, "job.json").write_text(json.dumps(job))
        if uid >= 0:
            os.chown(box, uid, uid)
        out = open(os.path.join(side, "stdout"), "w+b")
        err = open(os.path.join(side, "stderr"), "w+b")
        rep = open(os.path.join(side, "report"), "w+b")
        with out, err, rep:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(CHILD), box, str(rep.fileno()), str(uid), policy.required()],
                cwd=box, env=clean_env(box), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                pass_fds=(rep.fileno(),), start_new_session=True, close_fds=True)
            timed_out = False
            try:
                proc.wait(timeout=float(lim.wall_seconds))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                proc.wait()
            wall = time.perf_counter() - t0
            leftover = _leftovers(proc.pid, uid)
            for f in (out, err, rep):
                f.flush()
                f.seek(0)
            stdout = out.read(lim.output_bytes).decode(errors="replace")
            stderr = err.read(lim.output_bytes).decode(errors="replace")
            raw = rep.read()
        report = None
        if raw:
            try:
                report = json.loads(raw.decode())
            except (ValueError, UnicodeDecodeError):
                report = None
        status, detail = _status(proc.returncode, timed_out, leftover, report)
        return SandboxResult(status, proc.returncode, wall, stdout, stderr, report, detail)
    finally:
        shutil.rmtree(box, ignore_errors=True)
        shutil.rmtree(side, ignore_errors=True)


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
