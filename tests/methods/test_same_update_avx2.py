"""The golden updates hold on the AVX2 kernels too, checked from an AVX-512 host.

A CPU without AVX-512 runs other vectorized kernels, which round differently: in fp32 the
recorded updates came out ~1e-6 relative apart (`test_same_update.py` explains the fp64
path that removed that). Such a host is emulated here: PyTorch picks its vectorized ATen
kernels from `ATEN_CPU_CAPABILITY`, oneDNN caps its instruction set at
`ONEDNN_MAX_CPU_ISA`, MKL at `MKL_ENABLE_INSTRUCTIONS`; all three are read when torch is
loaded, so the golden cases run in a fresh interpreter with them set.

Which cases: every stage kind that a golden case has, every rollout path (the fp64
engine, the int8 behavior engine, a stale queue), both old-logprob routes (a separate
pass and the single update's own forward) and the critic, each by at least one case
(`avx2_cases` picks them greedily; six of the 28). The kernels that differ between
instruction sets sit in that shared path (forward, backward, the engine's decode, the
optimizer), not in a method's own element-wise formula, so these six meet all of them;
the full set runs natively in `test_same_update.py`. The lr = 0 test of the trainer runs
there too (its fp32 ratio bound is stated for any host).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from policylab import methods
from policylab.methods.spec import STAGE_KINDS

import test_same_update as golden

ROOT = Path(__file__).resolve().parents[2]
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def _features(name: str) -> set[str]:
    """What case `name` exercises: its active stage kinds and its rollout / update path."""
    case = golden.CASES[name]
    method = methods.get(name).with_params(dict(golden.FIXED_DEFAULTS.get(name, {}).get("method_params", {})))
    rollout = {**golden._BASE["rollout"], **case.get("rollout", {})}
    train = {**golden._BASE["train"], **case.get("train", {})}
    out = {f"stage kind {k}" for k in STAGE_KINDS if method.active(k)}
    out.add(f"engine {rollout.get('engine_dtype', 'fp32')}")
    out.add("stale queue" if rollout.get("staleness") else "on-policy")
    separate = train["minibatches"] > 1 or rollout.get("staleness") or rollout.get("engine_dtype")
    out.add("old-logprob pass" if separate else "old log-probs from the training forward")
    if method.critic is not None:
        out.add("critic")
    return out


def avx2_cases() -> list[str]:
    """A small set of golden cases that together have every feature any case has (greedy
    cover; ties go to the first name in sorted order)."""
    features = {name: _features(name) for name in sorted(golden.CASES)}
    need, chosen = set().union(*features.values()), []
    while need:
        best = max(features, key=lambda n: len(features[n] & need))
        chosen.append(best)
        need -= features[best]
    return chosen


def test_the_avx2_cases_cover_every_feature_of_the_golden_cases():
    chosen = avx2_cases()
    every = set().union(*(_features(n) for n in golden.CASES))
    assert set().union(*(_features(n) for n in chosen)) == every
    assert {"engine int8", "stale queue", "critic", "old-logprob pass", "stage kind correction"} <= every
    assert len(chosen) < len(golden.CASES) / 3


_RUN = ("import sys, torch, pytest; print('cpu capability:', torch.backends.cpu.get_cpu_capability(), flush=True); "
        "sys.exit(pytest.main(sys.argv[1:]))")


def test_golden_cases_on_the_avx2_kernels():
    native = torch.backends.cpu.get_cpu_capability()
    if native == "AVX2":
        pytest.skip("this CPU runs the AVX2 kernels natively: test_same_update.py covers them")
    if native not in ("AVX512", "AVX512_BF16", "AMX"):
        pytest.skip(f"the AVX2 switches apply to x86 CPUs with AVX-512; this one runs {native} kernels")
    tests = [f"tests/methods/test_same_update.py::test_same_update_as_recorded[{n}]" for n in avx2_cases()]
    tests.append("tests/trainer/test_trainer.py::"
                 "test_lr_zero_keeps_the_weights_and_the_ratio_at_one_up_to_fp32_rounding")
    env = {k: v for k, v in os.environ.items() if k != "POLICYLAB_RECORD_GOLDEN"} | AVX2
    proc = subprocess.run([sys.executable, "-c", _RUN, "-q", "-p", "no:cacheprovider", *tests],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert "cpu capability: AVX2" in out, out[-3000:]  # the switch took: these are the AVX2 kernels
    assert proc.returncode == 0, out[-6000:]
    assert f"{len(tests)} passed" in out, out[-3000:]
