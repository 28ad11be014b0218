"""Process-wide settings the trainer applies at start-up (opt out in the run config):
the allocator (`keep_freed_memory`) and the number of compute threads (`configure_threads`).

`keep_freed_memory()`: with its default settings, glibc's malloc hands a large block
back to the operating system when it is freed (blocks above a dynamic threshold of at
most 32 MiB are mmap-ed, and the top of the heap is trimmed once more than twice that
is free). The next tensor of that size then starts on fresh pages, and the kernel
zero-fills each 4 KiB page on first touch. Measured here (torch 2.13 CPU): one page
fault costs ~1.1 µs, so a 4 MiB temporary costs ~1 ms before any arithmetic is done,
and an 80 MiB one (a logits block) ~23 ms; a training step allocates and frees
many of these. (PyTorch allocates with posix_memalign, whose request is a little
larger than the block it gets back, which also defeats glibc's dynamic threshold: with
the defaults every tensor of a few MiB is a fresh mmap.) Raising glibc's mmap and trim
thresholds makes freed blocks stay in the heap for the next allocation. Measured on the
TRL benchmark workload (benchmarks/results/vs_trl_runs.md, run 6): the policylab trainer
1.81 -> 2.13 completions/s, TRL with the same call 0.83 -> 0.96; rewards identical; peak
RSS 4.11 -> 4.10 GB for policylab, 4.98 -> 5.31 GB for TRL. The cost is memory the
process keeps instead of returning: on the 30-step quickstart (shorter sequences, so a
smaller gain: 127 -> 121 s of steps, identical accuracies) resident memory sits flat at
4.34 GB from step 11 to 30 instead of ~3.3 GB, and the peak is 4.34 instead of 4.07 GB
(+7%); it does not creep. In a loop that allocates and frees one block size, ~8 freed
blocks stay mapped before they are reused (tests/trainer/test_runtime.py): the slivers
posix_memalign frees in front of each block sit in glibc's tcache and fast bins and keep
the freed blocks from merging. The `policylab` command turns both off at start-up, which
makes the block reused at once (`policylab.trainer.allocator`).

It only changes where freed memory goes, never a value. Only glibc has these knobs
(`mallopt`); elsewhere (macOS, musl) the call changes nothing and returns False. jemalloc or
tcmalloc preloaded with LD_PRELOAD achieve the same and make this call irrelevant.
"""

from __future__ import annotations

import ctypes
import math
import os
from dataclasses import dataclass
from pathlib import Path

from policylab.errors import ConfigError
from policylab.trainer.allocator import glibc

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
DEFAULT_LIMIT = 1 << 30  # 1 GiB

_applied: int | None = None


def keep_freed_memory(limit_bytes: int = DEFAULT_LIMIT) -> bool:
    """Keep freed blocks of up to `limit_bytes` in the heap for reuse (glibc only).

    Sets glibc's M_MMAP_THRESHOLD (blocks below it come from the heap) and
    M_TRIM_THRESHOLD (free memory at the top of the heap kept before trimming) to
    `limit_bytes`. Returns True when both were applied, False when the C library is not
    glibc (nothing changed). Idempotent; process-wide, affects every later free."""
    global _applied
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes <= 0:
        raise ValueError(f"`limit_bytes` must be a positive int, got {limit_bytes!r}")
    if not glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    value = min(limit_bytes, 2**31 - 1)
    ok = mallopt(M_MMAP_THRESHOLD, value) == 1 and mallopt(M_TRIM_THRESHOLD, value) == 1
    if ok:
        _applied = value
    return ok


def applied_limit() -> int | None:
    """The limit `keep_freed_memory` set in this process (None if it never succeeded)."""
    return _applied


def reset_peak_memory() -> bool:
    """Start the peak-RSS count again (Linux: writing 5 to /proc/self/clear_refs resets the
    kernel's high-water mark, VmHWM). A new Trainer calls it, so that `sys/peak_rss_mb` is
    the peak of this run, not of everything the process ran before (several runs of
    `policylab compare` share one process). False where it cannot be reset: the peak then
    stays the process's own since its start."""
    import gc

    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _hwm_mb() is not None


def _hwm_mb() -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_mb() -> dict[str, float]:
    """{"rss": resident set size now, "peak_rss": the largest it has been since the last
    `reset_peak_memory` (or the process start)} in MiB. Linux: /proc/self/statm and VmHWM
    of /proc/self/status; elsewhere only the peak, from getrusage (whose unit is bytes on
    macOS), which cannot be reset."""
    import resource
    import sys

    peak_mb = _hwm_mb()
    if peak_mb is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_mb = peak / 2**20 if sys.platform == "darwin" else peak / 1024
    out = {"peak_rss": peak_mb}
    try:
        with open("/proc/self/statm") as f:
            out["rss"] = int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        pass
    return out


# ------------------------------------------------------------------------------ threads
#
# Intra-op threads (torch.set_num_threads) meet at a barrier after every parallel
# operation: a decode step of a 30-layer model is hundreds of them. With more threads than
# the cores the process may actually run on (its CPU affinity, or a cgroup CPU quota that
# throttles it), one thread of every barrier waits for a sibling that is not running, and
# OpenMP's default wait policy spins at the barrier first, burning the very time slice
# the sibling needs. That is how a step that takes 4 s alone took 70-140 s with ~10 other
# runnable processes on 2 cores. Two levers:
#
# * the thread count: never more than the cores available to the process, read from
#   os.sched_getaffinity and the cgroup's CPU quota (`available_cores`), so that a
#   container limited to 1.5 CPUs on a 64-core host runs 1 thread, not 64;
# * the wait policy: OMP_WAIT_POLICY=PASSIVE makes a waiting thread sleep instead of
#   spinning (GOMP_SPINCOUNT bounds the spin of GNU OpenMP). OpenMP reads both when the
#   library loads, i.e. at `import torch`: they can only be set in the environment of the
#   process before it starts (`thread_env` builds that environment; the benchmark
#   benchmarks/busy_machine.py measures both policies). The trainer reports the policy in
#   force (`wait_policy`).
#
# Override: the run config's `threads: N` (N > 0) sets the count; else the environment
# variable POLICYLAB_THREADS=N; else an OMP_NUM_THREADS the user exported (torch's own
# setting, left alone); else the available cores.

THREADS_ENV = "POLICYLAB_THREADS"
CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class CoreBudget:
    """The cores this process may compute on: `affinity` (CPUs it may be scheduled on),
    `quota` (cgroup CPU bandwidth in cores, None when unlimited or unknown) and `cores` =
    min(affinity, floor(quota)), at least 1. A fractional quota is rounded down: 2 threads
    under a 1.5-core quota are throttled every period."""

    affinity: int
    quota: float | None
    cores: int

    def describe(self) -> str:
        q = "no cgroup CPU quota" if self.quota is None else f"cgroup quota {self.quota:g} cores"
        return f"{self.cores} available (affinity {self.affinity} CPUs, {q})"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_quota(root: str | Path = CGROUP_ROOT, proc_cgroup: str | Path = "/proc/self/cgroup") -> float | None:
    """The tightest CPU bandwidth limit (in cores) on this process's cgroup and its
    ancestors, or None when there is none (or it cannot be read).

    cgroup v2: `cpu.max` = "QUOTA PERIOD" (or "max PERIOD": unlimited) in the unified
    hierarchy, at the path of the "0::" line of /proc/self/cgroup. cgroup v1: the `cpu`
    controller's cpu.cfs_quota_us / cpu.cfs_period_us (quota -1: unlimited)."""
    root = Path(root)
    lines = (_read(Path(proc_cgroup)) or "").splitlines()
    limits: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":  # v2
            base = root / "unified" if (root / "unified" / "cgroup.controllers").exists() else root
            d = base / rel if rel else base
            while True:
                raw = _read(d / "cpu.max")
                if raw:
                    q, _, per = raw.partition(" ")
                    if q != "max" and per:
                        try:
                            limits.append(int(q) / int(per))
                        except ValueError:
                            pass
                if d == base or base not in d.parents:
                    break
                d = d.parent
        elif "cpu" in controllers.split(","):  # v1
            for name in (controllers, "cpu", "cpu,cpuacct"):
                d0 = root / name
                if not d0.is_dir():
                    continue
                d = d0 / rel if rel else d0
                while True:
                    q, per = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
                    try:
                        if q is not None and per is not None and int(q) > 0 and int(per) > 0:
                            limits.append(int(q) / int(per))
                    except ValueError:
                        pass
                    if d == d0 or d0 not in d.parents:
                        break
                    d = d.parent
                break
    return min(limits) if limits else None


def available_cores(affinity: int | None = None, quota: float | None | str = "read") -> CoreBudget:
    """The `CoreBudget` of this process (both inputs can be given, for tests)."""
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux
            affinity = os.cpu_count() or 1
    if quota == "read":
        quota = cgroup_quota()
    cores = affinity if quota is None else min(affinity, max(1, math.floor(quota + 1e-9)))
    return CoreBudget(affinity=int(affinity), quota=quota, cores=max(1, int(cores)))


@dataclass(frozen=True)
class ThreadChoice:
    threads: int | None  # the count set (None: torch's own, from OMP_NUM_THREADS)
    reason: str


def choose_threads(requested: int = 0, *, env=None, budget: CoreBudget | None = None) -> ThreadChoice:
    """The intra-op thread count and why, by precedence: `requested` > 0 (the config's
    `threads`); POLICYLAB_THREADS; an exported OMP_NUM_THREADS (left to torch: threads
    None); the available cores (`available_cores`). A count above the available cores is
    kept when asked for explicitly, and the reason says it oversubscribes."""
    env = os.environ if env is None else env
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
        raise ConfigError(f"threads must be an int >= 0 (0 = chosen from the available cores), got {requested!r}")
    budget = budget or available_cores()

    def over(n: int) -> str:
        return f" (more than the {budget.cores} available cores: threads will wait for each other)" \
            if n > budget.cores else ""

    if requested > 0:
        return ThreadChoice(requested, f"{requested} (config `threads`){over(requested)}")
    raw = env.get(THREADS_ENV, "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"{THREADS_ENV}={raw!r}: must be an integer >= 1")
        return ThreadChoice(n, f"{n} ({THREADS_ENV}){over(n)}")
    if env.get("OMP_NUM_THREADS", "").strip():
        return ThreadChoice(None, f"torch's own from OMP_NUM_THREADS={env['OMP_NUM_THREADS'].strip()}")
    return ThreadChoice(budget.cores, f"{budget.cores}: {budget.describe()}")


_threads: ThreadChoice | None = None


def configure_threads(requested: int = 0) -> ThreadChoice:
    """Apply `choose_threads(requested)` (torch.set_num_threads) and remember it for the
    run's summary (`thread_choice`)."""
    import torch

    global _threads
    choice = choose_threads(requested)
    if choice.threads is not None:
        torch.set_num_threads(choice.threads)
    _threads = choice
    return choice


def thread_choice() -> ThreadChoice | None:
    """What `configure_threads` chose in this process (None: never called)."""
    return _threads


def wait_policy(env=None) -> str:
    """The OpenMP wait policy in force, from the environment the process started with:
    "passive" / "active" (OMP_WAIT_POLICY), else "spin N" (GOMP_SPINCOUNT), else
    "default (spins before sleeping)"."""
    env = os.environ if env is None else env
    pol = env.get("OMP_WAIT_POLICY", "").strip().lower()
    if pol in ("passive", "active"):
        return pol
    spin = env.get("GOMP_SPINCOUNT", "").strip()
    if spin:
        return f"spin {spin}"
    return "default (spins before sleeping)"


WAIT_ENV = "POLICYLAB_WAIT_POLICY"
# the `policylab` command's wait policy when the user sets none (benchmarks/busy_machine.py;
# the table in benchmarks/README.md, "Under load")
DEFAULT_WAIT = "spin:10000"

_wait_reason: str | None = None


def wait_policy_settings(env=None) -> tuple[dict[str, str], str]:
    """(the OpenMP variables to set, and why) for a process about to import torch, by
    precedence: an OMP_WAIT_POLICY or GOMP_SPINCOUNT the user exported (theirs: nothing is
    set); POLICYLAB_WAIT_POLICY = "openmp" (OpenMP's own default: spin, then sleep),
    "passive" (OMP_WAIT_POLICY=PASSIVE) or "spin:N" (GOMP_SPINCOUNT=N: spin N rounds, then
    sleep); else `DEFAULT_WAIT`."""
    env = os.environ if env is None else env
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if env.get(k, "").strip():
            return {}, f"{k}={env[k].strip()} (exported)"
    raw = env.get(WAIT_ENV, "").strip().lower()
    choice, source = (raw, WAIT_ENV) if raw else (DEFAULT_WAIT, "the default")
    if choice == "openmp":
        return {}, f"OpenMP's default, spins before sleeping ({source})"
    if choice == "passive":
        return {"OMP_WAIT_POLICY": "PASSIVE"}, f"passive: waiting threads sleep ({source})"
    n = choice.removeprefix("spin:")
    if choice.startswith("spin:") and n.isdigit():
        return {"GOMP_SPINCOUNT": n}, f"spin {n} rounds, then sleep ({source})"
    raise ConfigError(f"{WAIT_ENV}={raw!r}: must be openmp, passive or spin:N (N an integer >= 0)")


def apply_wait_policy(env=None) -> str:
    """Put `wait_policy_settings` into `env` (default os.environ) and return why. OpenMP reads
    them when its library loads, at `import torch`: the `policylab` command calls this
    first; once torch is imported it is too late, nothing is set and the reason says so
    (the run header then reports the policy in force, `wait_policy`)."""
    import sys

    global _wait_reason
    env = os.environ if env is None else env
    settings, why = wait_policy_settings(env)
    if settings and "torch" in sys.modules:
        _wait_reason = f"{why}: not applied, torch was imported before (set it in the environment)"
        return _wait_reason
    env.update(settings)
    _wait_reason = why
    return why


def wait_reason() -> str | None:
    """Why the wait policy in force was chosen, when `apply_wait_policy` ran in this process."""
    return _wait_reason


def thread_env(threads: int | None, *, passive: bool, spincount: int | None = None, base=None) -> dict[str, str]:
    """The environment for a child process with `threads` compute threads (None: leave
    the count to the child) and, with `passive`, OMP_WAIT_POLICY=PASSIVE (waiting threads
    sleep: what a shared machine needs; it must be in the environment before the child
    imports torch), or with `spincount`, GOMP_SPINCOUNT=spincount (a waiting thread of GNU
    OpenMP spins that many rounds, then sleeps)."""
    if passive and spincount is not None:
        raise ValueError("passive and spincount are two wait policies: give one")
    if spincount is not None and (isinstance(spincount, bool) or not isinstance(spincount, int) or spincount < 0):
        raise ValueError(f"spincount must be an int >= 0, got {spincount!r}")
    env = dict(os.environ if base is None else base)
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        env.pop(k, None)
    if threads is not None:
        env[THREADS_ENV] = env["OMP_NUM_THREADS"] = str(int(threads))
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    if spincount is not None:
        env["GOMP_SPINCOUNT"] = str(spincount)
    return env
