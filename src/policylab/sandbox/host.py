"""What the host offers the sandbox: the unprivileged uid the child drops to, and the
processes left under that uid or in a session (what the parent kills and scores `forked`)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from policylab.sandbox.policy import SandboxUnavailable


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
        if not processes_of(uid):
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


def processes_of(uid: int) -> list[int]:
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            st = _proc_status(p)
            if st.get("Uid", "").split()[:1] == [str(uid)]:
                pids.append(int(p))
    return pids


def session_members(sid: int) -> list[int]:
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
