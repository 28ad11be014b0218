"""The path guard of a run directory: every file policylab reads or writes inside a run
(config.yaml, metrics.jsonl and its .partial, report.json, plots/, tensorboard/, the
lock, a pipeline's stage folders and reports) goes through here.

A run directory may come from someone else (a received archive), so nothing inside it is
trusted to be what its name says:

- a symbolic link anywhere between the run directory and the file is refused (a link
  named `metrics.jsonl` or `plots/` could point at the user's own files, which a resume
  would then append to or overwrite); the run directory itself may be a link, which is
  the user's own choice;
- a special file (FIFO, character or block device, socket) is refused: opening a FIFO
  blocks until someone writes to it, and a device is hardware;
- files are opened with O_NOFOLLOW | O_NONBLOCK and checked with fstat after opening, so a
  link or FIFO swapped in after the check is refused too, not followed or waited on;
- files replaced as a whole (config.yaml, report.json, PNGs, reports) are written to a
  fresh temporary file (O_EXCL) in the same directory and renamed over the name: a
  rename replaces a link, it never writes through it.

Every refusal is a RunPathError naming the path and what it is.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from policylab.errors import RunPathError

_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a directory",
          stat.S_IFREG: "a regular file"}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "a special file")


def _refuse(path: Path, what: str, st: os.stat_result | None = None) -> RunPathError:
    target = ""
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            target = f" (to {os.readlink(path)})"
        except OSError:
            pass
    return RunPathError(f"{path} is {what}{target}; policylab reads and writes only plain files and directories "
                        "inside a run directory and never follows a link out of it or opens a special file. "
                        "Nothing was written: remove it (or use another run directory)")


def guard(run_dir: str | os.PathLike, *parts: str, want: str = "file") -> Path:
    """run_dir/parts, checked: every component below `run_dir` that exists is a plain
    directory (not a link), and the last, if it exists, is `want` ("file" or "dir"), not a
    link and not a special file. Raises RunPathError naming the path; returns the path."""
    root = Path(run_dir)
    path = root
    names = [p for part in parts for p in Path(part).parts]
    if any(n in ("..", "/") or os.sep in n for n in names) or any(Path(part).is_absolute() for part in parts):
        raise RunPathError(f"{root / Path(*parts)} does not name a path inside the run directory {root}")
    for i, name in enumerate(names):
        path = path / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return root.joinpath(*names)
        except NotADirectoryError:
            raise _refuse(path.parent, "not a directory") from None
        last = i == len(names) - 1
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(path, "a symbolic link", st)
        expect = want if last else "dir"
        ok = stat.S_ISDIR(st.st_mode) if expect == "dir" else stat.S_ISREG(st.st_mode)
        if not ok:
            raise _refuse(path, _kind(st.st_mode) + ("" if expect == "dir" or not stat.S_ISDIR(st.st_mode)
                                                    else ", not a file"))
    return path


def guard_dir(run_dir: str | os.PathLike, *parts: str, create: bool = True) -> Path:
    """The directory run_dir/parts, guarded (see `guard`), created when missing."""
    path = guard(run_dir, *parts, want="dir")
    if create:
        path.mkdir(parents=True, exist_ok=True)
        guard(run_dir, *parts, want="dir")  # a link that appeared meanwhile
    return path


def _open_fd(path: Path, flags: int, mode: int = 0o644) -> int:
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "a symbolic link", os.lstat(path)) from None
        if exc.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise _refuse(path, "a FIFO (named pipe)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _refuse(path, _kind(st.st_mode))
    import fcntl

    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def open_file(path: str | os.PathLike, mode: str = "rb", *, buffering: int = -1):
    """open(path, mode) for "rb", "r", "ab", "a", "r+b", refusing (RunPathError) a link or a
    special file at `path` itself, checked on the opened descriptor (no race, no hang)."""
    path = Path(path)
    flags = {"rb": os.O_RDONLY, "r": os.O_RDONLY, "ab": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
             "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT, "r+b": os.O_RDWR}[mode]
    fd = _open_fd(path, flags)
    return os.fdopen(fd, mode, buffering=buffering, **({} if "b" in mode else {"encoding": "utf-8"}))


def read_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of the plain file `path` (a link or special file is refused, not read)."""
    with open_file(path, "rb") as fh:
        return fh.read()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def replace_file(path: str | os.PathLike, data: bytes | str | None = None, *, write=None, suffix: str = ".tmp") -> Path:
    """Write `path` as a whole: into a fresh temporary file in its directory, fsync'd, then
    renamed over `path` (a link at `path` is replaced, never written through). `write(tmp)`
    instead of `data` lets a library write the temporary file (e.g. savefig; `suffix` gives
    the temporary file the extension such a writer reads the format from)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)  # the permissions a plain open() would give (mkstemp makes 0600)
    try:
        with os.fdopen(fd, "wb") as fh:
            if data is not None:
                fh.write(data.encode() if isinstance(data, str) else data)
            if write is not None:
                fh.close()
                write(tmp)
            else:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


# the entries a run directory holds (trainer.run_dir.RUN_FILES) and what each must be
RUN_ENTRIES = {"config.yaml": "file", "metrics.jsonl": "file", "metrics.jsonl.partial": "file",
               "report.json": "file", "plots": "dir", "tensorboard": "dir", "checkpoints": "dir",
               ".policylab.lock": "file"}


def check_run_tree(run_dir: str | os.PathLike) -> None:
    """Before a run directory is read or written (resume, eval): each of its entries is
    what it must be (RUN_ENTRIES), and nothing directly inside plots/ or tensorboard/ is a
    link or a special file. Raises RunPathError naming the first offender."""
    run_dir = Path(run_dir)
    for name, want in RUN_ENTRIES.items():
        guard(run_dir, name, want=want)
    for sub in ("plots", "tensorboard"):
        d = run_dir / sub
        if d.is_dir():
            for p in sorted(d.rglob("*")):
                st = os.lstat(p)
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                    raise _refuse(p, _kind(st.st_mode), st)


# ----------------------------------------------------------------------------- the lock
LOCK_NAME = ".policylab.lock"


class RunLock:
    """One policylab process per run directory: an exclusive, non-blocking flock on
    run_dir/.policylab.lock, held for the whole run and released (the file removed) at
    the end. The file records who holds it (pid, host, start time, command).

    The kernel releases a flock when its process dies, so a lock left by a crashed or
    killed process never blocks the next run: the file is still there, with the dead
    holder's record, and `acquire` reports it (`stale`) before taking it over."""

    def __init__(self, run_dir: str | os.PathLike, what: str = "run"):
        self.run_dir, self.what = Path(run_dir), what
        self.fd: int | None = None
        self.stale: dict | None = None  # the record a process that died holding the lock left

    def acquire(self) -> "RunLock":
        import fcntl
        import json
        import socket
        import sys
        import time

        path = guard(self.run_dir, LOCK_NAME)
        for _ in range(5):
            try:
                fd = _open_fd(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                from policylab.errors import RunDirError

                raise RunDirError(f"run directory {self.run_dir} cannot be written ({exc.strerror}: {path}); nothing "
                                  "was trained. Choose a writable run_dir (--set run_dir=...)") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _record(fd)
                os.close(fd)
                raise RunBusy(self.run_dir, holder) from None
            try:  # the file may have been removed by the holder that just released it
                same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            raise RunBusy(self.run_dir, None)
        self.stale = _record(fd) or None
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                  "command": " ".join(sys.argv[:4])[:200], "what": self.what}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.run_dir / LOCK_NAME)
        except OSError:
            pass
        os.close(self.fd)  # closing releases the flock
        self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _record(fd: int) -> dict:
    import json

    try:
        raw = os.pread(fd, 4096, 0)
        rec = json.loads(raw.decode()) if raw.strip() else {}
    except (OSError, ValueError, UnicodeDecodeError):
        return {"unreadable": True}
    return rec if isinstance(rec, dict) else {"unreadable": True}


def describe_holder(rec: dict | None) -> str:
    if not rec or rec.get("unreadable"):
        return "another process"
    import time

    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec["started"])) if isinstance(
        rec.get("started"), (int, float)) else "?"
    return f"pid {rec.get('pid')} on {rec.get('host')}, started {when}" + (
        f" ({rec['command']})" if rec.get("command") else "")


def RunBusy(run_dir: Path, holder: dict | None):
    from policylab.errors import RunBusyError

    return RunBusyError(f"{run_dir} is in use by another policylab process ({describe_holder(holder)}): one run per "
                        "directory. Wait for it to finish, or choose another run_dir; nothing was changed")


def stale_note(run_dir: Path, rec: dict) -> str:
    return (f"{run_dir} was left locked by a policylab process that ended without releasing it "
            f"({describe_holder(rec)}; killed or crashed?); the lock is taken over and what it wrote is kept")
