"""The process that runs one candidate inside the sandbox (see `policylab.sandbox.runner`).

Started by `policylab.sandbox.runner` as `python -I -S -B child.py DIR REPORT REQ RESP UID
REQUIRE` with a clean environment, its working directory DIR (the fresh sandbox
directory), REPORT an open file for its final report, REQ / RESP the two ends of the pipes
it is served through. It imports nothing from policylab (only the standard library) and
walls itself in before it runs a line of the candidate:

    1. read and delete DIR/job.json; preload the standard modules a candidate may use
    2. namespaces of its own: network (no interface but a down loopback), IPC and mounts
       (CLONE_NEWUSER too when not root, mapping only its own uid)
    3. scratch: a tmpfs of `scratch_bytes` and `scratch_files` inodes mounted on DIR (in
       its own mount namespace: nothing of it reaches the host's /tmp), its cwd
    4. Landlock: reads only beneath DIR and the standard library (never site-packages,
       never the directory this file is in), writes only beneath DIR, no execve, no TCP
       bind/connect, no signals or abstract unix sockets outside its own domain
    5. resource limits: CPU time, address space, file size, open files, processes, core
    6. as root: setgroups([]), setgid/setuid to the unprivileged UID (RLIMIT_NPROC does not
       bind root; it binds the fresh uid, whose only process this is), and a check that
       uid 0 cannot be regained
    7. an audit hook that stops the process at the first fork/exec/spawn, socket, signal,
       ctypes call, import of a process or network module, read or write outside the
       allowed places

Then it serves (`_serve`): it says "ready" on RESP, and answers one JSON line on RESP for
each JSON line the parent writes on REQ: {"op": "load"} compiles and runs the candidate's
source, {"op": "call", "args": [...]} calls its function on arguments the parent chose at
that moment. It never holds an expected value, a reference solution or a timing: the
parent keeps those, measures this process's CPU clock around every request, and judges
every output itself. End of REQ ends the process.

REQUIRE is "net,fs" minus what the user opted out of; a wall in REQUIRE that cannot be
put up ends the process with exit code 72 before the candidate runs.

Exit codes: 0 served to the end, 70 stopped by the audit hook (report names the event),
71 MemoryError, 72 isolation could not be set up, 73 internal error of this harness,
74 stdout or stderr could not be written (the file-size limit).
"""

import sys

REPORT_FD = -1
SANDBOX_DIR = ""
STDLIB_DIR = ""
READ_ROOTS: tuple = ()

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
_LIST_EVENTS = {"os.listdir", "os.scandir", "glob.glob"}
_SKIP_READ_ROOTS = ("site-packages", "dist-packages")


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


def _real(path):
    import os

    if isinstance(path, bytes):
        path = path.decode(errors="replace")
    if not isinstance(path, str):
        return None
    return os.path.realpath(path)


def _beneath(real: str, root: str) -> bool:
    import os

    return real == root or real.startswith(root + os.sep)


def _inside(path) -> bool:
    """A path the candidate may write: beneath its directory, or /dev/null."""
    if isinstance(path, int):
        return True  # an fd that is already open: its opening was checked
    real = _real(path)
    return real is not None and (_beneath(real, SANDBOX_DIR) or real == "/dev/null")


def _readable(path, listing: bool = False) -> bool:
    """A path the candidate may read: its directory, the standard library (not its
    site-packages), /dev/null; the standard library's own directory may be listed."""
    if isinstance(path, int):
        return True
    real = _real(path)
    if real is None:
        return False
    if _beneath(real, SANDBOX_DIR) or real == "/dev/null" or (listing and real == STDLIB_DIR):
        return True
    return any(_beneath(real, r) for r in READ_ROOTS)


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
    if event == "open" and len(args) >= 3:
        if _writes(args[1], args[2]):
            if not _inside(args[0]):
                _stop("write outside the sandbox directory", repr(args[0]))
        elif args[0] is not None and not _readable(args[0]):
            _stop("read outside the sandbox directory", repr(args[0]))
    if event in _LIST_EVENTS and args and args[0] is not None and not _readable(args[0], listing=True):
        _stop("listing outside the sandbox directory", repr(args[0]))
    if event in _PATH_EVENTS and args and not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes))):
        _stop(event, repr(args[:2]))


# ----------------------------------------------------------------------------- walls
def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc


def _unshare(root: bool) -> tuple:
    """(network wall problem or None, mount namespace problem or None)."""
    import os

    ctypes, libc = _libc()
    CLONE_NEWNET, CLONE_NEWUSER, CLONE_NEWIPC, CLONE_NEWNS = 0x40000000, 0x10000000, 0x08000000, 0x00020000
    base = CLONE_NEWNET | CLONE_NEWIPC | (0 if root else CLONE_NEWUSER)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(base | CLONE_NEWNS) != 0:
        err = os.strerror(ctypes.get_errno())
        if libc.unshare(base) != 0:
            return os.strerror(ctypes.get_errno()), err
        return None, err
    if not root:  # map only our own uid and gid into the new user namespace (the scratch tmpfs needs it)
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except OSError as exc:
            return None, f"user namespace map: {exc}"
    MS_REC, MS_PRIVATE = 0x4000, 1 << 18
    if libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None) != 0:
        return None, f"mount propagation: {os.strerror(ctypes.get_errno())}"
    return None, None


def _scratch(directory: str, uid: int, lim: dict) -> str | None:
    """A tmpfs capped at scratch_bytes and scratch_files on `directory` (in this process's
    own mount namespace), and the process's cwd on it."""
    import os

    ctypes, libc = _libc()
    MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
    opts = f"size={int(lim['scratch_bytes'])},nr_inodes={int(lim['scratch_files']) + 1},mode=0700"
    if uid >= 0:
        opts += f",uid={uid},gid={uid}"
    if libc.mount(b"policylab-scratch", directory.encode(), b"tmpfs", ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC),
                  opts.encode()) != 0:
        return f"tmpfs on the sandbox directory: {os.strerror(ctypes.get_errno())}"
    os.chdir(directory)
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


def read_roots() -> tuple:
    """(the standard library's directory, the entries of it a candidate may read): every
    entry except site-packages / dist-packages, an entry that resolves outside it, and the
    entry holding this file (policylab itself)."""
    import os

    lib = os.path.realpath(os.path.dirname(os.__file__))
    me = os.path.realpath(__file__)
    roots = []
    try:
        names = sorted(os.listdir(lib))
    except OSError:
        names = []
    for name in names:
        if name in _SKIP_READ_ROOTS:
            continue
        real = os.path.realpath(os.path.join(lib, name))
        if not _beneath(real, lib) or real == lib or _beneath(me, real):
            continue
        roots.append(real)
    return lib, tuple(roots)


def _landlock(directory: str, stdlib: str, roots: tuple) -> str | None:
    """Reads only beneath `directory` and `roots` (the standard library's directory itself
    may be listed), writes only beneath `directory` (and /dev/null), no execve; no TCP
    bind/connect (ABI >= 4); no signals or abstract unix sockets beyond the domain (ABI >= 6)."""
    import os
    import stat

    ctypes, libc = _libc()
    abi = landlock_abi()
    if abi < 1:
        return "Landlock is not available in this kernel"
    EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
    write_fs = 0
    for bit in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12):  # write file, remove dir/file, make char/dir/reg/sock/fifo/block/sym
        write_fs |= 1 << bit
    if abi >= 2:
        write_fs |= 1 << 13  # refer (link/rename across directories)
    if abi >= 3:
        write_fs |= 1 << 14  # truncate
    handled = write_fs | EXECUTE | READ_FILE | READ_DIR
    net = (1 << 0) | (1 << 1) if abi >= 4 else 0  # bind tcp, connect tcp
    scoped = (1 << 0) | (1 << 1) if abi >= 6 else 0  # abstract unix socket, signal

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                    ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(handled, net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    rs = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rs < 0:
        return f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"
    truncate = (1 << 14) if abi >= 3 else 0
    rules = [(directory, write_fs | READ_FILE | READ_DIR), ("/dev/null", WRITE_FILE | READ_FILE | truncate),
             (stdlib, READ_DIR)]
    for r in roots:
        try:
            is_dir = stat.S_ISDIR(os.stat(r).st_mode)
        except OSError:
            continue  # unreadable here (e.g. root's own directory after the drop): nothing to allow
        rules.append((r, READ_FILE | READ_DIR if is_dir else READ_FILE))
    for path, rights in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            if path in (directory, "/dev/null"):
                return f"landlock: cannot open {path}"
            continue
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
def canon(x, depth=0):
    """A return value as JSON, type-strict: None, bool, int, float, str, list and dict of
    exactly those types (a tuple becomes a list; an int beyond 63 bits is tagged with its
    hex digits). Anything else is tagged (a non-finite float, a subclass of int or str, a
    dict with non-str keys, any other object) and so never equals an expected value; a
    bool never equals an int, nor an int a float, once the parent compares the JSON text."""
    if depth > 50:
        return {"__unsupported__": "nesting"}
    t = type(x)
    if x is None or t is bool or t is str:
        return x
    if t is int:
        return x if abs(x) < 2**63 else {"__bigint__": format(x, "x")}
    if t is float:
        return x if x == x and abs(x) != float("inf") else {"__float__": repr(x)}
    if t is list or t is tuple:
        return [canon(v, depth + 1) for v in x]
    if t is dict:
        if all(type(k) is str for k in x):
            return {k: canon(v, depth + 1) for k, v in sorted(x.items())}
        return {"__unsupported__": "dict with non-str keys"}
    return {"__unsupported__": t.__name__}


def _send(fd: int, obj) -> None:
    import json
    import os

    view = memoryview(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _load(job: dict) -> tuple:
    """(function or None, response)."""
    scope: dict = {"__name__": "candidate", "__builtins__": __builtins__}
    try:
        code = compile(job["source"], "<candidate>", "exec")
    except (SyntaxError, ValueError) as exc:
        return None, {"stage": "compile_error", "detail": f"{type(exc).__name__}: {exc}"[:300]}
    try:
        exec(code, scope)
    except MemoryError:
        raise
    except BaseException as exc:  # noqa: BLE001  (the candidate's top level failed: report it)
        return None, {"stage": "import_error", "detail": f"{type(exc).__name__}: {exc}"[:300]}
    fn = scope.get(job["entry"])
    if not callable(fn):
        return None, {"stage": "no_function", "detail": f"no function `{job['entry']}` defined"}
    return fn, {"stage": "loaded"}


def _serve(job: dict, req_fd: int, resp_fd: int) -> None:
    """Answer the parent's requests until it closes REQ (see the module docstring)."""
    import json
    import os

    reader = os.fdopen(req_fd, "rb")
    _send(resp_fd, {"stage": "ready"})
    fn = None
    for line in reader:
        req = json.loads(line)
        if req.get("op") == "load":
            fn, resp = _load(job)
            _send(resp_fd, resp)
        elif req.get("op") == "call" and fn is not None:
            try:
                out, err = canon(fn(*req["args"])), None
            except MemoryError:
                raise
            except BaseException as exc:  # noqa: BLE001  (the candidate raised: report it)
                out, err = None, f"{type(exc).__name__}: {exc}"[:200]
            _send(resp_fd, {"output": out, "error": err})
        else:
            _send(resp_fd, {"stage": "protocol_error", "detail": f"unexpected request {str(req)[:100]}"})


def main(argv) -> int:
    global REPORT_FD, SANDBOX_DIR, STDLIB_DIR, READ_ROOTS
    import json
    import os

    SANDBOX_DIR, REPORT_FD = os.path.realpath(argv[1]), int(argv[2])
    req_fd, resp_fd, uid, require = int(argv[3]), int(argv[4]), int(argv[5]), argv[6]
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
    STDLIB_DIR, READ_ROOTS = read_roots()
    root = os.geteuid() == 0
    walls = {}
    walls["net"], mount_ns = _unshare(root)
    scratch = mount_ns or _scratch(SANDBOX_DIR, uid if root else -1, job["limits"])
    landlock = _landlock(SANDBOX_DIR, STDLIB_DIR, READ_ROOTS)
    walls["fs"] = "; ".join(p for p in (scratch, landlock) if p) or None
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
        _serve(job, req_fd, resp_fd)
    except MemoryError:
        _write_report({"stage": "memory"})
        return 71
    _write_report({"stage": "done", "walls": {k: v is None for k, v in walls.items()}})
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
