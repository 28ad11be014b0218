"""policylab.trainer.allocator: the GLIBC_TUNABLES the `policylab` command restarts itself
with (merged with the user's, never overriding them), the opt-out, bad input, and what
they are for: a freed tensor's block is reused at once instead of after ~9 rounds
(counted in page faults, in fresh interpreters, not timed)."""

import os
import subprocess
import sys
import textwrap

import pytest

from policylab.errors import ConfigError
from policylab.trainer import allocator

OURS = "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0"


def test_tunables_added_to_an_empty_environment():
    env = allocator.tunables_env({"PATH": "/bin"})
    assert env["GLIBC_TUNABLES"] == OURS and env["PATH"] == "/bin"


def test_users_own_tunables_are_kept_and_win():
    env = allocator.tunables_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=7"})
    # theirs first and untouched; only the missing one of ours is appended
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=7:glibc.malloc.mxfast=0"
    assert allocator.tunables_env({"GLIBC_TUNABLES": OURS})["GLIBC_TUNABLES"] == OURS  # idempotent


def test_system_opt_out_and_bad_value():
    assert "GLIBC_TUNABLES" not in allocator.tunables_env({"POLICYLAB_ALLOCATOR": "system"})
    assert allocator.tunables_env({"POLICYLAB_ALLOCATOR": " Tuned "})["GLIBC_TUNABLES"] == OURS
    with pytest.raises(ConfigError, match="POLICYLAB_ALLOCATOR='jemalloc'"):
        allocator.tunables_env({"POLICYLAB_ALLOCATOR": "jemalloc"})


@pytest.mark.skipif(not allocator.glibc(), reason="glibc's tunables")
def test_status_names_what_is_in_force():
    assert allocator.status({"GLIBC_TUNABLES": OURS}) == "glibc tcache_count=0, mxfast=0"
    assert allocator.status({}) == "glibc tcache and fast bins on (not set)"
    assert allocator.status({"POLICYLAB_ALLOCATOR": "system"}) == \
        "glibc tcache and fast bins on (POLICYLAB_ALLOCATOR=system)"


# rounds of: allocate a 48 MiB tensor, touch every page, free it; after keep_freed_memory
# the freed block stays in the heap. Prints each round's page faults / pages.
_ROUNDS = textwrap.dedent("""
    import resource, torch
    from policylab.trainer import runtime
    assert runtime.keep_freed_memory()
    size = 48 << 20
    out = []
    for _ in range(10):
        f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = torch.empty(size // 4); t.fill_(1.0); del t
        out.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f) / (size // 4096))
    print(" ".join(f"{x:.3f}" for x in out))
""")


def _rounds(env) -> list[float]:
    res = subprocess.run([sys.executable, "-c", _ROUNDS], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return [float(x) for x in res.stdout.split()]


@pytest.mark.skipif(not allocator.glibc(), reason="glibc's tunables")
def test_freed_block_is_reused_at_once_with_the_tunables():
    base = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "POLICYLAB_ALLOCATOR")}
    tuned = _rounds(allocator.tunables_env(base))
    assert tuned[0] > 0.9  # the first round faults every page in (a fresh block)
    assert max(tuned[1:]) < 0.05, tuned  # every later round reuses the freed block
    # negative control, the same program with glibc's defaults: the slivers posix_memalign
    # frees in front of each block sit in the tcache / fast bins and keep the freed block
    # from merging, so at least the 2nd round faults in fresh pages again (measured: rounds
    # 2-9 in a plain shell, round 2 only under `make test`: how long depends on what the
    # interpreter allocated before)
    plain = _rounds(base)
    assert sum(plain[1:]) > 0.9, plain
