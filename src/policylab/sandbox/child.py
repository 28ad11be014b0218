"""The process that runs one candidate inside the sandbox (see `policylab.sandbox.runner`).

Started by `policylab.sandbox.runner.run_job` as `python -I -S -B child.py DIR FD UID REQUIRE`
with a clean environment, its working directory DIR (the fresh sandbox directory), and
FD an open file for its report. It imports nothing from policylab (only the standard
library) and walls itself in before it runs a line of the candidate:

    1. read and delete DIR/job.json; preload the standard modules a candidate may use
    2. a network namespace of its own (unshare CLONE_NEWNET; CLONE_NEWUSER too when not root)
    3. Landlock: writes only beneath DIR, no TCP bind/connect, no signals or abstract
       unix sockets outside its own domain
    4. resource limits: CPU time, address space, file size, open files, processes, core
    5. as root: setgroups([]), setgid/setuid to the unprivileged UID (RLIMIT_NPROC does not
       bind root; it binds the fresh uid, whose only process this is), and a check that
       uid 0 cannot be regained
    6. an audit hook that stops the process at the first fork/exec/spawn, socket, signal,
       ctypes call, import of a process or network module, or write outside DIR

REQUIRE is "net,fs" minus what the user opted out of; a wall in REQUIRE that cannot be
put up ends the process with exit code 72 before the candidate runs.

Exit codes: 0 report written, 70 stopped by the audit hook (report names the event),
71 MemoryError, 72 isolation could not be set up, 73 internal error of this harness,
74 stdout or stderr could not be written (the file-size limit).
"""

import sys

REPORT_FD = -1
SANDBOX_DIR = ""

_PRELOAD = ("math", "itertools", "functools", "collections", "heapq", "bisect", "re", "string", "operator",
            "statistics", "fractions", "decimal", "typing", "dataclasses", "copy", "json", "random", "array",
            "time", "traceback", "os.path", "enum", "numbers", "textwrap", "unicodedata")

_BLOCKED_EVENTS = {
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "os.kill", "os.killpg",
    "subprocess.Popen", "pty.spawn", "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.sendto", "socket.sendmsg", "signal.pthread_kill", "os.setuid", "os.setgid",
    "sys.remote_exec",
}
_BLOCKED_IMPORTS = {"socket", "_socket", "subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing",
                    "ctypes", "_ctypes", "select", "selectors", "asyncio", "ssl", "_ssl", "pty", "signal",
                    "_signal", "urllib", "http", "ftplib", "smtplib", "telnetlib", "resource", "fcntl", "mmap",
                    "threading", "_thread", "concurrent"}
_PATH_EVENTS = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.symlink", "os.link", "os.chmod", "os.chown",
                "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"}


def _write_report(obj) -> None:
    import json
    import os

    data = json.dumps(obj).encode()
    os.lseek(REPORT_FD, 0, 0)
    os.ftruncate(REPORT_FD, 0)
    view = memoryview(data)
    while view:
        n = os.write(REPORT_FD, view)
        view = view[n:]


def _inside(path) -> bool:
    import os

    if isinstance(path, int):
        return True  # an fd that is already open: its opening was checked
    if isinstance(path, bytes):
        path = path.decode(errors="replace")
    if not isinstance(path, str):
        return False
    real = os.path.realpath(path)
    return real == SANDBOX_DIR or real.startswith(SANDBOX_DIR + os.sep) or real == "/dev/null"


def _writes(mode, flags) -> bool:
    import os

    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    if isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND):
        return True
    return False


def _stop(event: str, detail: str) -> None:
    import os

    try:
        _write_report({"stage": "violation", "violation": event, "detail": detail[:200]})
    finally:
        os._exit(70)


def _hook(event, args):
    if event in _BLOCKED_EVENTS or event.startswith("ctypes."):
        _stop(event, repr(args))
    if event == "import" and args and isinstance(args[0], str) and args[0].split(".")[0] in _BLOCKED_IMPORTS:
        _stop(event, args[0])
    if event == "open" and len(args) >= 3 and _writes(args[1], args[2]) and not _inside(args[0]):
        _stop("write outside the sandbox directory", repr(args[0]))
    if event in _PATH_EVENTS and args and not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes))):
        _stop(event, repr(args[:2]))


# ----------------------------------------------------------------------------- walls
def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc


def _unshare_network(root: bool) -> str | None:
    ctypes, libc = _libc()
    CLONE_NEWNET, CLONE_NEWUSER, CLONE_NEWIPC = 0x40000000, 0x10000000, 0x08000000
    flags = CLONE_NEWNET | CLONE_NEWIPC if root else CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC
    if libc.unshare(flags) != 0:
        import os

        return os.strerror(ctypes.get_errno())
    return None


_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446  # the same numbers on x86_64 and aarch64


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0 = unavailable)."""
    try:
        ctypes, libc = _libc()
    except OSError:
        return 0
    v = libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return int(v) if v > 0 else 0


def _landlock(directory: str) -> str | None:
    """Writes only beneath `directory` (and /dev/null); no TCP bind/connect (ABI >= 4);
    no signals or abstract unix sockets beyond the domain (ABI >= 6)."""
    import os

    ctypes, libc = _libc()
    abi = landlock_abi()
    if abi < 1:
        return "Landlock is not available in this kernel"
    write_fs = 0
    for bit in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12):  # write file, remove dir/file, make char/dir/reg/sock/fifo/block/sym
        write_fs |= 1 << bit
    if abi >= 2:
        write_fs |= 1 << 13  # refer (link/rename across directories)
    if abi >= 3:
        write_fs |= 1 << 14  # truncate
    net = (1 << 0) | (1 << 1) if abi >= 4 else 0  # bind tcp, connect tcp
    scoped = (1 << 0) | (1 << 1) if abi >= 6 else 0  # abstract unix socket, signal

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                    ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(write_fs, net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    rs = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rs < 0:
        return f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"
    file_rights = (1 << 1) | ((1 << 14) if abi >= 3 else 0)
    for path, rights in ((directory, write_fs), ("/dev/null", file_rights)):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = PathBeneath(rights, fd)
        r = libc.syscall(_SYS_ADD_RULE, ctypes.c_int(rs), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0))
        os.close(fd)
        if r != 0:
            return f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}"
    PR_SET_NO_NEW_PRIVS = 38
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return "prctl(PR_SET_NO_NEW_PRIVS) failed"
    if libc.syscall(_SYS_RESTRICT, ctypes.c_int(rs), ctypes.c_uint32(0)) != 0:
        return f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}"
    os.close(rs)
    return None


def _limits(lim: dict) -> None:
    import math
    import resource

    cpu = max(1, math.ceil(float(lim["cpu_seconds"])))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL a second later
    mem = int(lim["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    out = int(lim["output_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (out, out))
    nofile = int(lim["open_files"])
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))  # this process only (binds once uid is not 0)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop_privileges(uid: int) -> str | None:
    import os

    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        return "still uid 0 after setuid"
    try:
        os.setuid(0)
    except PermissionError:
        return None
    return "uid 0 could be regained"


# ----------------------------------------------------------------------------- the candidate
def _canon(x, depth=0):
    """Return values as JSON: lists for tuples, str keys for dicts; anything else is tagged
    (and so never equal to an expected value)."""
    if depth > 50:
        return {"__unsupported__": "nesting"}
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return x if abs(x) < 2**63 else {"__bigint__": str(x)}
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else {"__float__": repr(x)}
    if isinstance(x, (list, tuple)):
        return [_canon(v, depth + 1) for v in x]
    if isinstance(x, dict):
        if all(isinstance(k, str) for k in x):
            return {k: _canon(v, depth + 1) for k, v in sorted(x.items())}
        return {"__unsupported__": "dict with non-str keys"}
    return {"__unsupported__": type(x).__name__}


def _run(job: dict) -> dict:
    import copy
    import time

    clock = time.perf_counter_ns
    scope: dict = {"__name__": "candidate", "__builtins__": __builtins__}
    try:
        code = compile(job["source"], "<candidate>", "exec")
    except (SyntaxError, ValueError) as exc:
        return {"stage": "compile_error", "detail": f"{type(exc).__name__}: {exc}"[:300]}
    try:
        exec(code, scope)
    except MemoryError:
        raise
    except BaseException as exc:  # noqa: BLE001  (the candidate's top level failed: report it)
        return {"stage": "import_error", "detail": f"{type(exc).__name__}: {exc}"[:300]}
    fn = scope.get(job["entry"])
    if not callable(fn):
        return {"stage": "no_function", "detail": f"no function `{job['entry']}` defined"}
    outputs, errors = [], []
    for args in job["calls"]:
        try:
            outputs.append(_canon(fn(*copy.deepcopy(args))))
            errors.append(None)
        except MemoryError:
            raise
        except BaseException as exc:  # noqa: BLE001
            outputs.append(None)
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
    report = {"stage": "ok", "outputs": outputs, "errors": errors}
    timing = job.get("timing")
    if timing and all(e is None for e in errors):
        _write_report({**report, "timing_started": True})  # kept if a limit stops the timing
        try:
            report["timing"] = _time(job, timing, fn, clock)
        except MemoryError:
            report["timing_error"] = "MemoryError"
        except BaseException as exc:  # noqa: BLE001
            report["timing_error"] = f"{type(exc).__name__}: {exc}"[:200]
        report["timing_started"] = True
    return report


def _time(job: dict, timing: dict, fn, clock) -> dict:
    """Reference and candidate timed on the performance input, interleaved."""
    import copy

    ref_scope: dict = {"__name__": "reference", "__builtins__": __builtins__}
    exec(compile(timing["reference"], "<reference>", "exec"), ref_scope)
    ref = ref_scope[job["entry"]]
    args = timing["args"]
    cand_ns, ref_ns = [], []
    for r in range(int(timing["warmup"]) + int(timing["repeats"])):
        # interleaved, order alternating (ABBA), each call on a fresh copy of the input
        order = ((ref, ref_ns), (fn, cand_ns)) if r % 2 == 0 else ((fn, cand_ns), (ref, ref_ns))
        for f, sink in order:
            a = copy.deepcopy(args)
            t0 = clock()
            f(*a)
            dt = clock() - t0
            if r >= int(timing["warmup"]):
                sink.append(dt)
    return {"candidate_ns": cand_ns, "reference_ns": ref_ns}


def main(argv) -> int:
    global REPORT_FD, SANDBOX_DIR
    import json
    import os

    SANDBOX_DIR, REPORT_FD, uid, require = os.path.realpath(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    required = set(filter(None, require.split(",")))
    job_path = os.path.join(SANDBOX_DIR, "job.json")
    with open(job_path) as f:
        job = json.load(f)
    os.remove(job_path)
    for name in _PRELOAD + tuple(job.get("preload", ())):  # "preload": a trusted caller's extra modules (tests)
        try:
            __import__(name)
        except ImportError:
            pass
    root = os.geteuid() == 0
    walls = {}
    walls["net"] = _unshare_network(root)
    walls["fs"] = _landlock(SANDBOX_DIR)
    if job.get("probe"):
        _limits(job["limits"])
        walls["uid"] = _drop_privileges(uid) if root else None
        _write_report({"stage": "probe", "walls": walls, "root": root, "uid": os.getuid()})
        return 0
    failed = {k: v for k, v in walls.items() if v is not None and k in required}
    if failed:
        _write_report({"stage": "isolation_failed", "detail": failed})
        return 72
    _limits(job["limits"])
    if root:
        problem = _drop_privileges(uid)
        if problem:
            _write_report({"stage": "isolation_failed", "detail": {"uid": problem}})
            return 72
    for name in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]
    if job.get("audit_hook", True):
        sys.addaudithook(_hook)
    try:
        report = _run(job)
    except MemoryError:
        report = None
    if report is None:
        _write_report({"stage": "memory"})
        return 71
    report["walls"] = {k: v is None for k, v in walls.items()}
    _write_report(report)
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv)
    except MemoryError:
        code = 71
    except BaseException as exc:  # noqa: BLE001  (report, then a distinct exit code)
        try:
            _write_report({"stage": "internal_error", "detail": f"{type(exc).__name__}: {exc}"[:300]})
        except BaseException:  # noqa: BLE001
            pass
        code = 73
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # the file-size limit hit stdout: report it as such
        code = 74 if code == 0 else code
    import os as _os

    _os._exit(code)
