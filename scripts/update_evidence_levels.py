"""Rewrite src/policylab/methods/evidence_levels.py (the mechanism and capability levels the
method cards state) from benchmarks/results/evidence.json, after a new part of the evidence
runs has been written there:

    .venv/bin/policylab evidence --all --report-only ... --report-dir benchmarks/results
    .venv/bin/python scripts/update_evidence_levels.py

tests/experiments/test_evidence.py checks that the two agree."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    from policylab.experiments.evidence.table import levels_module

    table = json.loads((ROOT / "benchmarks" / "results" / "evidence.json").read_text())
    out = ROOT / "src" / "policylab" / "methods" / "evidence_levels.py"
    out.write_text(levels_module(table))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
