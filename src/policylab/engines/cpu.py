"""What the host CPU can compute natively, read from the kernel's CPU flags.

The fast sampling mode (`rollout.engine: fast-bf16`) decodes on a bf16 copy of the
weights. bf16 is only faster where the CPU multiplies bf16 natively: AVX-512 BF16
(`avx512_bf16`: dot products of bf16 pairs into fp32) or AMX (`amx_bf16`: tile matrix
multiplies). On a CPU without either (e.g. an AVX2-only host), oneDNN and PyTorch
emulate bf16 by converting to fp32 around every fp32 multiply: the engine's log-probs
still differ from the fp32 trainer's (a real mismatch to correct) but nothing is gained,
and the emulated path is usually slower than plain fp32. `fast_dtype` therefore refuses
there, with the flags it found and what to use instead.

Linux reports the flags in /proc/cpuinfo ("flags : fpu vme ... avx2 ... avx512_bf16 ...");
elsewhere the flags are unknown (an empty set) and the fast mode is refused the same way.
Every function takes the flags as an argument (or a cpuinfo path), so tests pass their own.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch

from policylab.errors import ConfigError

__all__ = ["BF16_NATIVE_FLAGS", "UnsupportedHost", "bf16_training_native", "cpu_flags", "cpu_model", "describe_cpu",
           "fast_dtype", "native_bf16"]

CPUINFO = "/proc/cpuinfo"
# either gives native bf16 arithmetic (fp32 accumulation)
BF16_NATIVE_FLAGS = ("avx512_bf16", "amx_bf16")
# the flags a benchmark report names (vector width, bf16, int8 dot products, matrix tiles)
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                  "amx_int8")


class UnsupportedHost(ConfigError):
    """The host CPU cannot run the requested fast mode natively (a configuration error on
    this host: the CLI exits with code 2)."""


def _cpuinfo_lines(path: str | Path) -> list[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []


def cpu_flags(path: str | Path = CPUINFO) -> frozenset[str]:
    """The CPU feature flags the kernel reports (the first processor's `flags` line of
    /proc/cpuinfo; x86). Empty when the file is missing or has no flags line (not Linux,
    or an architecture that reports `Features` instead: treated as no native bf16)."""
    for line in _cpuinfo_lines(path):
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_model(path: str | Path = CPUINFO) -> str:
    """The processor's model name (/proc/cpuinfo), or platform.processor() elsewhere."""
    for line in _cpuinfo_lines(path):
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def native_bf16(flags: frozenset[str] | set[str]) -> bool:
    """True when the flags include AVX-512 BF16 or AMX-BF16."""
    return any(f in flags for f in BF16_NATIVE_FLAGS)


def describe_cpu(flags: frozenset[str] | None = None, path: str | Path = CPUINFO) -> str:
    """One line for a benchmark report: model name and which of `REPORTED_FLAGS` are
    present, e.g. "AMD EPYC 9B14; flags avx2 fma avx512f avx512_vnni avx512_bf16 (no amx_tile ...)"."""
    flags = cpu_flags(path) if flags is None else flags
    have = [f for f in REPORTED_FLAGS if f in flags]
    missing = [f for f in REPORTED_FLAGS if f not in flags]
    known = "flags " + (" ".join(have) if have else "(none of the reported ones)")
    if not flags:
        known = "flags unknown (no /proc/cpuinfo flags line)"
    return f"{cpu_model(path)}; {known}" + (f" (no {' '.join(missing)})" if flags and missing else "")


def bf16_training_native(flags: frozenset[str] | None = None, path: str | Path = CPUINFO) -> bool:
    """Whether bf16 autocast of the training forward computes natively on this host (the
    same flags as the bf16 engine); on an AVX2-only host bf16 matmuls are emulated through
    fp32, so the fast mode keeps fp32 training there (`methods.fast_mode.train_dtype`)."""
    return native_bf16(cpu_flags(path) if flags is None else frozenset(flags))


def fast_dtype(flags: frozenset[str] | None = None, path: str | Path = CPUINFO) -> torch.dtype:
    """The decode dtype of the fast sampling mode on this host: torch.bfloat16 when the CPU
    has native bf16 (see the module doc); otherwise `UnsupportedHost`, naming the flags
    found and the alternatives (the exact fp32 engine; an explicit bf16 engine, which is
    emulated here)."""
    flags = cpu_flags(path) if flags is None else frozenset(flags)
    if native_bf16(flags):
        return torch.bfloat16
    found = " ".join(f for f in REPORTED_FLAGS if f in flags) or ("none" if flags else "unknown")
    emulated = "avx2" in flags or "avx512f" in flags
    raise UnsupportedHost(
        "rollout.engine=fast-bf16 needs native bf16 arithmetic (CPU flag avx512_bf16 or amx_bf16); this CPU "
        f"reports {found}" + (", so bf16 would be emulated through fp32 (no faster, often slower)" if emulated
                              else "") +
        ". Use rollout.engine=fast (the exact fp32 engine), or set rollout.engine=fast with "
        "rollout.engine_dtype=bf16 and a correction method (e.g. method=tis) to run the emulated bf16 engine anyway")
