"""Time from starting `policylab quiz` to its first question on screen (the learning layer's
target: under 2 s), a fresh process each time, answers piped in empty:

    .venv/bin/python benchmarks/quiz_start.py --runs 3

Prints one line per run and the median; run it on a quiet machine (it records the load
average). Not a test: timings belong here, never in tests."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time



def once(args: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "policylab.cli", "quiz", *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
    try:
        for line in p.stdout:
            if line.startswith("[1/"):  # the first question's header, e.g. "[1/5] [dapo · mechanism] ..."
                return time.perf_counter() - t0
        raise RuntimeError("the quiz ended without printing its first question")
    finally:
        p.kill()
        p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("quiz_args", nargs="*", default=["-n", "5", "--seed", "1"])
    a = ap.parse_args()
    times = [once(a.quiz_args) for _ in range(a.runs)]
    for i, t in enumerate(times):
        print(f"run {i}: first question after {t:.2f} s")
    print(f"median {statistics.median(times):.2f} s over {a.runs} runs; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
