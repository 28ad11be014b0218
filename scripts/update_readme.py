"""Regenerate the methods table in README.md from the registry (tests check it is in sync).

    .venv/bin/python scripts/update_readme.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def methods_table() -> str:
    from policylab import methods

    rows = ["| method | family | what it changes | status |", "|---|---|---|---|"]
    for name in methods.names():
        c = methods.get(name).card
        rows.append(f"| `{name}` | {c.family} | {c.summary} | {c.status} |")
    from policylab.eval.cards import METRICS

    for name, m in sorted(METRICS.items()):  # metric cards: evaluation, not training (`policylab eval --metrics`)
        rows.append(f"| `{name}` | {m.family} | {m.summary} | {m.status} |")
    return "\n".join(rows)


def evidence_summary() -> str:
    """One paragraph from the committed evidence table: verdict counts and the capability rows."""
    import json

    t = json.loads((README.parent / "benchmarks" / "results" / "evidence.json").read_text())
    c = t["counts"]
    cap = [r for r in t["capability"] if len(r["seeds"]) >= 3 and r.get("interval")]
    sig = sorted(r["method"] for r in cap if not (r["interval"][0] <= 0 <= r["interval"][1]))
    sig_text = ", ".join(f"`{m}`" for m in sig) if sig else "none"
    return (f"Each row's *Levels* come from `policylab evidence --all` ({len(t['seeds'])} seeds, {t['steps']} "
            f"rollout steps per arm on SmolLM2-135M-Instruct; table, commands and per-seed values in "
            f"[benchmarks/results/evidence.md](benchmarks/results/evidence.md)): mechanism "
            f"{c.get('observed', 0)} observed, {c.get('not observed', 0)} not observed (no significant "
            f"difference from the negative control in the claimed direction at this size), {c.get('not measurable here', 0)} not "
            f"measurable here (each says what it would take); held-out accuracy against GRPO on the same prompts "
            f"with a 95% interval for {len(cap)} of them at {len(t['seeds'])} seeds, significantly different "
            f"from GRPO for {sig_text}. A few steps of a 135M model show what a mechanism does to a batch, "
            f"not what it does to a long training run.")


def render(text: str) -> str:
    block = f"<!-- METHODS-TABLE -->\n{methods_table()}\n<!-- /METHODS-TABLE -->"
    text = re.sub(r"<!-- METHODS-TABLE -->.*?<!-- /METHODS-TABLE -->", lambda m: block, text, flags=re.S)
    summary = f"<!-- EVIDENCE-SUMMARY -->\n{evidence_summary()}\n<!-- /EVIDENCE-SUMMARY -->"
    return re.sub(r"<!-- EVIDENCE-SUMMARY -->.*?<!-- /EVIDENCE-SUMMARY -->", lambda m: summary, text, flags=re.S)


if __name__ == "__main__":
    new = render(README.read_text())
    README.write_text(new)
    sys.exit(0)
