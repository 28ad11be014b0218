"""The sandbox's settings and results: the limits a candidate runs under, the walls it may
do without (each named by what is given up), the result of a session, and its statuses
(the walls themselves are described in `policylab.sandbox.runner`)."""

from __future__ import annotations

from dataclasses import dataclass, field
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


