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
from dataclasses import asdict, dataclass
from typing import Any

from policylab.errors import PolicylabError
from policylab.sandbox.host import sandbox_uid
from policylab.sandbox.policy import (
    CHILD,
    STATUSES,
    SandboxLimits,
    SandboxPolicy,
    SandboxResult,
    SandboxUnavailable,
)
from policylab.sandbox.process import (
    clean_env,
    process_cpu_ns,
    spawn,
)

__all__ = ["CHILD", "STATUSES", "SandboxLimits", "SandboxPolicy", "SandboxResult", "SandboxUnavailable",
           "check_available", "probe", "sandbox_uid", "Session", "Call", "run_job", "clean_env", "canonical_text",
           "process_cpu_ns"]


# ----------------------------------------------------------------------------- probe
_PROBE: dict | None = None


def probe() -> dict:
    """What this machine can wall in (run once, cached): {"network": bool, "filesystem":
    bool, "privilege_drop": bool | None (None: not root, nothing to drop), "detail": {...}}."""
    global _PROBE
    if _PROBE is None:
        res = spawn({"probe": True, "limits": asdict(SandboxLimits())}, SandboxPolicy(
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
def canonical_text(value: Any) -> str:
    """The JSON text outputs are compared by (type-strict: `child.canon`, keys sorted)."""
    from policylab.sandbox.child import canon

    return json.dumps(canon(value), sort_keys=True, separators=(",", ":"))


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
        self._proc = spawn({"source": source, "entry": entry, "audit_hook": bool(audit_hook),
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
