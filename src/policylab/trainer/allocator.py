"""glibc's per-thread cache and fast bins off in the `policylab` command's process, so that
a freed tensor's block can merge with its free neighbours (`POLICYLAB_ALLOCATOR`).

PyTorch allocates every CPU tensor with posix_memalign(64, n). glibc's malloc returns
16-byte aligned blocks, so for each request it carves a slightly larger block and frees
the few bytes in front of the aligned start: one chunk of 32-112 bytes right before
every large tensor. glibc keeps small freed chunks in two caches that count as "in use"
for merging: the per-thread cache (tcache, up to 7 chunks per size) and the fast bins.
While such a sliver sits between two freed tensors, the two cannot merge into one block,
so the next tensor that needs their combined size is placed at the top of the heap, and
the heap grows. With `keep_freed_memory` (freed blocks stay in the heap for reuse) that
growth is resident memory:

- a loop that allocates, touches and frees one 48 MiB tensor faults in all 12,288 pages
  again in later rounds before it reuses the freed block (rounds 2-9 in a fresh
  interpreter from a shell, round 2 under `make test`: it depends on what was allocated
  before); with the tunables below it reuses the block from the 2nd round on
  (tests/trainer/test_allocator.py);
- the `make bench` workload (GRPO, 4 prompts x 8 completions, <= 48 new tokens, the fast
  mode, 5 steps, seed 2, trainer only): peak RSS 3.97-4.20 GB over nine runs with glibc's
  defaults, 3.67-3.69 GB over two runs with both tunables (3.84 GB with the tcache off
  alone, 4.09-4.15 GB with the fast bins off alone); the heap's free blocks at the peak
  1.2-1.5 GB -> 0.8-0.9 GB; the same tokens and rewards (allocation changes no value);
- `make bench` itself, seeds 0-3 (benchmarks/results/vs_trl_runs.md, runs 24-27 against
  20-23): the fast mode's peak 3.99-4.18 -> 3.56-3.75 GB, exact fp32 3.80-4.00 ->
  3.67-3.69 GB, steps no slower;
- the quickstart (`make quickstart`, 30 steps): peak 3.65 GB, 3.35 GB resident at the
  end; with `keep_freed_memory` alone it had sat at 4.34 GB from step 11 on when that was
  measured (policylab.trainer.runtime).

Both settings are glibc tunables, read once when a process starts (`GLIBC_TUNABLES`), so
a running Python cannot change them for itself. The `policylab` command therefore starts
itself again, once, with them added to the environment (`reexec_with_tunables`: the same
interpreter, arguments, working directory, process id and open files; only commands
that run a model). A program that uses policylab as a library sets the variable itself
(`tunables_env()` builds it; e.g. for a child process) or runs as before.

`POLICYLAB_ALLOCATOR=system` leaves glibc's settings alone (no restart). A tunable the
user already set in GLIBC_TUNABLES (e.g. their own tcache_count) is kept as theirs.
Outside glibc (macOS, musl) nothing happens.
"""

from __future__ import annotations

import os
import platform
import sys

from policylab.errors import ConfigError

__all__ = ["TUNABLES", "ALLOCATOR_ENV", "glibc", "tunables_env", "in_force", "status", "reexec_with_tunables"]

TUNABLES = {"glibc.malloc.tcache_count": "0", "glibc.malloc.mxfast": "0"}
ALLOCATOR_ENV = "POLICYLAB_ALLOCATOR"  # "tuned" (default) | "system"
_GUARD = "POLICYLAB_ALLOCATOR_RESTARTED"  # set by the restart: never restart twice


def glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _choice(env) -> str:
    raw = env.get(ALLOCATOR_ENV, "").strip().lower() or "tuned"
    if raw not in ("tuned", "system"):
        raise ConfigError(f"{ALLOCATOR_ENV}={env[ALLOCATOR_ENV]!r}: must be 'tuned' (glibc's tcache and fast bins "
                          "off, the default) or 'system' (glibc's own settings)")
    return raw


def _parse(value: str) -> dict[str, str]:
    out = {}
    for item in filter(None, value.split(":")):
        key, _, val = item.partition("=")
        out[key.strip()] = val.strip()
    return out


def tunables_env(env=None) -> dict[str, str]:
    """A copy of `env` (default os.environ) whose GLIBC_TUNABLES also holds `TUNABLES`
    (the user's own value of one of them wins). Unchanged with POLICYLAB_ALLOCATOR=system;
    a bad POLICYLAB_ALLOCATOR raises ConfigError naming it."""
    env = dict(os.environ if env is None else env)
    if _choice(env) == "system":
        return env
    have = _parse(env.get("GLIBC_TUNABLES", ""))
    extra = [f"{k}={v}" for k, v in TUNABLES.items() if k not in have]
    if extra:
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES", ""), *extra]))
    return env


def in_force(env=None) -> str | None:
    """The `TUNABLES` set in `env`'s GLIBC_TUNABLES (default os.environ, i.e. what this
    process started with), as "glibc tcache_count=0, mxfast=0"; None when none is set."""
    env = os.environ if env is None else env
    have = _parse(env.get("GLIBC_TUNABLES", ""))
    mine = [f"{k.rsplit('.', 1)[1]}={have[k]}" for k in TUNABLES if k in have]
    return "glibc " + ", ".join(mine) if mine else None


def status(env=None) -> str:
    """What this process runs with, for the run header: the tunables in force or glibc's
    defaults, and why."""
    env = os.environ if env is None else env
    if not glibc():
        return "not glibc"
    tuned = in_force(env)
    if tuned is None:
        why = f"{ALLOCATOR_ENV}=system" if env.get(ALLOCATOR_ENV, "").strip().lower() == "system" else "not set"
        return f"glibc tcache and fast bins on ({why})"
    return tuned


def reexec_with_tunables(env=None) -> None:
    """Replace this process by the same command with `tunables_env()` (`os.execve`: same
    process id, working directory and open files) unless nothing would change: not glibc,
    POLICYLAB_ALLOCATOR=system, the tunables already in the environment, or this process
    is itself the restart. Call it before anything is printed or any thread starts. A
    failed exec leaves the process running as it is (the run header says which)."""
    env = os.environ if env is None else env
    if not glibc() or env.get(_GUARD) or not getattr(sys, "orig_argv", None):
        return
    new = tunables_env(env)
    if new.get("GLIBC_TUNABLES", "") == env.get("GLIBC_TUNABLES", ""):
        return
    new[_GUARD] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], new)
    except OSError:
        return
