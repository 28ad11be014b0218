"""policylab.trainer.runtime.keep_freed_memory: glibc keeps freed blocks for reuse (checked by
counting page faults, not by timing), bad input refused, the trainer's config switch."""

import mmap
import resource
from pathlib import Path

import pytest
import torch

from policylab.trainer import runtime
from policylab.trainer.allocator import glibc
from policylab.trainer.config import RunConfig

GLIBC = glibc()


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _alloc_touch_free(n_bytes: int) -> None:
    t = torch.empty(n_bytes // 4, dtype=torch.float32)
    t.fill_(1.0)  # touch every page
    del t


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    assert runtime.keep_freed_memory() is True
    assert runtime.applied_limit() == runtime.DEFAULT_LIMIT
    size = 48 << 20  # 48 MiB: above glibc's largest dynamic mmap threshold (32 MiB)
    # warm-up: torch allocates with posix_memalign, whose request is a little larger than
    # the block it returns, so a freed block is reused only once a few neighbours have
    # coalesced (measured: after ~9 rounds, the heap then holds ~8 blocks of slack)
    for _ in range(16):
        _alloc_touch_free(size)
    before = _faults()
    for _ in range(3):
        _alloc_touch_free(size)
    pages = 3 * size // resource.getpagesize()
    # with glibc's defaults every round faults in every page again (measured: all of them)
    assert _faults() - before < 0.05 * pages


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1G"])
def test_bad_limit(bad):
    with pytest.raises(ValueError, match="limit_bytes"):
        runtime.keep_freed_memory(bad)


def test_run_config_switch_defaults_on():
    assert RunConfig().keep_freed_memory is True


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only: the peak is reset via clear_refs")
def test_peak_memory_is_reset_for_each_run():
    """Several runs in one process (`policylab compare`): each run's sys/peak_rss_mb must
    be its own peak, not the largest any earlier run reached."""
    before = runtime.memory_mb()["peak_rss"]
    # an anonymous mapping, not malloc: freed for certain (keep_freed_memory may keep malloc's)
    block = mmap.mmap(-1, 300 * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1  # touch every page: 300 MiB resident
    high = runtime.memory_mb()["peak_rss"]
    assert high >= before + 250
    block.close()
    assert runtime.reset_peak_memory()
    after = runtime.memory_mb()
    assert after["peak_rss"] < high - 250  # the 300 MiB block is gone from the count
    assert after["peak_rss"] >= after["rss"] - 1.0  # the peak is at least what is resident now
