"""policylab.engines.cpu: CPU flags read from /proc/cpuinfo-style text; bf16 fast mode only
with AVX-512 BF16 or AMX (the flags are passed in or monkeypatched, never the host's)."""

import pytest
import torch

from policylab.engines import cpu

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Example CPU @ 2.0GHz
flags\t\t: fpu vme sse2 avx avx2 fma avx512f avx512_vnni {extra}

processor\t: 1
flags\t\t: fpu
"""


def _info(tmp_path, extra=""):
    p = tmp_path / "cpuinfo"
    p.write_text(CPUINFO.format(extra=extra))
    return p


def test_flags_of_the_first_processor_and_model_name(tmp_path):
    p = _info(tmp_path, "avx512_bf16")
    flags = cpu.cpu_flags(p)
    assert {"avx2", "avx512f", "avx512_bf16"} <= flags and "fpu" in flags
    assert cpu.cpu_model(p) == "Example CPU @ 2.0GHz"
    line = cpu.describe_cpu(path=p)
    assert line.startswith("Example CPU @ 2.0GHz; flags avx2 fma avx512f avx512_vnni avx512_bf16")
    assert "(no avx512_fp16 amx_tile amx_bf16 amx_int8)" in line


@pytest.mark.parametrize("extra, native", [("", False), ("avx512_bf16", True), ("amx_tile amx_bf16", True),
                                           ("amx_tile amx_int8", False), ("avx512_fp16", False)])
def test_native_bf16_needs_avx512_bf16_or_amx_bf16(tmp_path, extra, native):
    flags = cpu.cpu_flags(_info(tmp_path, extra))
    assert cpu.native_bf16(flags) is native
    if native:
        assert cpu.fast_dtype(flags) == torch.bfloat16
    else:
        with pytest.raises(cpu.UnsupportedHost, match="emulated") as exc:
            cpu.fast_dtype(flags)
        assert "rollout.engine=fast" in str(exc.value)  # says what to use instead


def test_missing_cpuinfo_means_unknown_flags_and_no_fast_mode(tmp_path):
    missing = tmp_path / "nope"
    assert cpu.cpu_flags(missing) == frozenset()
    assert "flags unknown" in cpu.describe_cpu(path=missing)
    with pytest.raises(cpu.UnsupportedHost, match="reports unknown"):
        cpu.fast_dtype(path=missing)


def test_fast_dtype_reads_the_flags_through_cpu_flags(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: frozenset({"avx2"}))
    with pytest.raises(cpu.UnsupportedHost, match="reports avx2"):
        cpu.fast_dtype()
    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: frozenset({"avx2", "amx_bf16"}))
    assert cpu.fast_dtype() == torch.bfloat16
