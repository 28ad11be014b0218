"""`make bench` over several seeds: throughput ratios and reward against TRL, pooled.

    .venv/bin/python benchmarks/vs_trl_pool.py RESULT.json [RESULT.json ...] [--out benchmarks/results/vs_trl_pooled]

Each RESULT.json is one run of benchmarks/vs_trl.py (one seed, TRL beside the policylab
sides, `--eval-n` for the held-out part). One run's reward comparison is noisy: five steps of
training on 4 prompts x 8 samples, and a held-out accuracy on 128 sampled answers, whose
difference from TRL's moves by ±12 points from seed to seed. Pooled here, per policylab side:

* ratio_vs_trl of every run, their mean and minimum;
* held-out accuracy − TRL's: per run, and the mean over runs with a 95% t interval from the
  runs' spread (n − 1 degrees of freedom: it carries both the evaluation's sampling and the
  training trajectories' variation);
* training reward − TRL's (per step, over the same prompts on both sides): every step of
  every run pooled, mean with a 95% t interval over those steps.

A side is "lower than TRL" on a measure when its interval lies entirely below 0 (the rule
`benchmarks/vs_trl.py` applies to one run).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vs_trl import t_interval  # a sibling script: its folder is on sys.path when this one runs

HERE = Path(__file__).resolve()
RESULTS = HERE.parent / "results"

def pool(reports: list[dict]) -> dict:
    """The pooled comparison of every policylab side found in all `reports` against TRL."""
    for i, r in enumerate(reports):
        if "trl" not in r.get("sides", {}):
            raise SystemExit(f"result {i + 1} ({r.get('command', '?')}) has no TRL side: nothing to compare with")
    sides = [s for s in reports[0]["sides"] if s.startswith("policylab") and all(s in r["sides"] for r in reports)]
    out = {"runs": len(reports), "commands": [r.get("command") for r in reports], "sides": {}}
    for s in sides:
        ratios = [r["sides"][s]["ratio_vs_trl"] for r in reports]
        step_diffs = []
        for r in reports:
            pairs = zip(r["sides"][s]["steps"], r["sides"]["trl"]["steps"])
            step_diffs += [a["reward"] - b["reward"] for a, b in pairs if a["reward"] is not None
                           and b["reward"] is not None]
        held = [r["sides"][s]["heldout"]["accuracy"] - r["sides"]["trl"]["heldout"]["accuracy"] for r in reports
                if "heldout" in r["sides"][s] and "heldout" in r["sides"]["trl"]]
        entry = {"ratios": ratios, "ratio_mean": sum(ratios) / len(ratios), "ratio_min": min(ratios),
                 "training": t_interval(step_diffs) if step_diffs else None,
                 "heldout_per_run": held, "heldout": t_interval(held) if held else None}
        out["sides"][s] = entry
    return out


def _iv(c: dict | None, scale: float = 100.0) -> str:
    if not c:
        return "-"
    if c["lo"] is None:
        return f"{scale * c['mean']:+.1f} (one value: no interval)"
    verdict = "lower" if c["lower"] else "not lower"
    return f"{scale * c['mean']:+.1f} [{scale * c['lo']:+.1f}, {scale * c['hi']:+.1f}] ({verdict})"


def to_markdown(p: dict) -> str:
    lines = ["# `make bench` pooled over seeds: policylab against TRL", "",
             f"{p['runs']} runs of benchmarks/vs_trl.py:", ""]
    lines += [f"- `{c}`" for c in p["commands"]]
    lines += ["", "| side | ratio_vs_trl per run | mean / min | held-out − TRL per run (points) | held-out − TRL, mean "
              "[95% t interval over runs] | training reward − TRL, mean [95% t interval over steps] |",
              "|---|---|---:|---|---:|---:|"]
    for s, e in p["sides"].items():
        lines.append(f"| {s} | {', '.join(f'{x:.2f}' for x in e['ratios'])} | {e['ratio_mean']:.2f} / "
                     f"{e['ratio_min']:.2f} | {', '.join(f'{100 * x:+.1f}' for x in e['heldout_per_run']) or '-'} | "
                     f"{_iv(e['heldout'])} | {_iv(e['training'])} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="results JSON files of benchmarks/vs_trl.py, one per seed")
    ap.add_argument("--out", default=str(RESULTS / "vs_trl_pooled"), help="results path without suffix ('' = none)")
    a = ap.parse_args(argv)
    reports = []
    for f in a.results:
        path = Path(f)
        if not path.is_file():
            raise SystemExit(f"{f}: no such results file")
        reports.append(json.loads(path.read_text()))
    p = pool(reports)
    md = to_markdown(p)
    print(md)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(p, indent=2))
        out.with_suffix(".md").write_text(md)
    return p


if __name__ == "__main__":
    main()
