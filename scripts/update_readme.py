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


def render(text: str) -> str:
    block = f"<!-- METHODS-TABLE -->\n{methods_table()}\n<!-- /METHODS-TABLE -->"
    return re.sub(r"<!-- METHODS-TABLE -->.*?<!-- /METHODS-TABLE -->", lambda m: block, text, flags=re.S)


if __name__ == "__main__":
    new = render(README.read_text())
    README.write_text(new)
    sys.exit(0)
