"""Text rendering of the registry: the methods table and one method's card."""

from __future__ import annotations

from .registry import REGISTRY, Recipe


def table_text() -> str:
    rows = [("method", "family", "advantage", "objective", "aggregation", "status")]
    for name in sorted(REGISTRY):
        r = REGISTRY[name]
        rows.append((name, r.card.family, r.advantage, r.objective, r.aggregation, r.card.status))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for j, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
        if j == 0:
            lines.append("-" * (sum(widths) + 2 * len(widths) + 10))
    return "\n".join(lines)


def card_text(r: Recipe) -> str:
    c = r.card
    kl = f"{r.kl.estimator} x {r.kl.coef}, placed in the {r.kl.placement}" if r.kl else "none"
    params = ", ".join(f"{k}={v}" for k, v in r.params.items()) or "(none)"
    parts = [
        f"{r.name}: {c.title}" + (f" (arXiv {c.arxiv})" if c.arxiv else ""),
        f"  family        {c.family}",
        f"  what it does  {c.summary}",
        f"  samples       {c.samples}",
        f"  learns        {c.learns}",
        f"  reference     {c.reference}",
        f"  critic        {c.critic}",
        f"  needs         {', '.join(r.needs) or 'rewards only'}",
        f"  stages        advantage={r.advantage}  objective={r.objective}  aggregation={r.aggregation}"
        + (f"  correction={r.correction}" if r.correction else "")
        + (f"  filter={r.filter}" if r.filter else "")
        + (f"  shaping={','.join(r.shaping)}" if r.shaping else ""),
        f"  KL            {kl}",
        f"  parameters    {params}",
        f"  status        {c.status}",
        f"  not shown     {c.not_established}",
    ]
    if c.confirmed:
        parts.append(f"  confirmed     {c.confirmed}")
    if c.unconfirmed:
        parts.append(f"  unconfirmed   {'; '.join(c.unconfirmed)}")
    return "\n".join(parts)
