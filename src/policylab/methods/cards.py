"""Text rendering of the registry: the methods table and one method's card.

A card names, for every stage of the method, the function that runs it and the kernels
it calls with their file and line (`policylab methods NAME`), so a reader goes from the
card to the formula in one hop.
"""

from __future__ import annotations

from policylab.methods.registry import LITERATURE, REGISTRY
from policylab.methods.spec import Card, Method, describe_params


def _stage_names(m: Method, kind: str) -> str:
    return ",".join(s.name for s in m.stages() if s.kind == kind and s.is_active(m.p)) or "-"


def table_text() -> str:
    rows = [("method", "family", "advantage", "objective", "corrections", "aggregation", "status")]
    for name in sorted(REGISTRY):
        m = REGISTRY[name]
        rows.append((name, m.card.family, m.advantage.name, m.objective.name, _stage_names(m, "correction"),
                     m.aggregation, m.card.status))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for j, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
        if j == 0:
            lines.append("-" * (sum(widths) + 2 * len(widths) + 10))
    if LITERATURE:
        lines += ["", "literature-only (a card, nothing runs): " + ", ".join(sorted(LITERATURE))]
    return "\n".join(lines)


def stage_lines(m: Method) -> list[str]:
    """One line per stage (inactive ones marked), then one per kernel it calls:
    `kind name  module.function  path:line`."""
    out = []
    for s in m.stages():
        off = "" if s.is_active(m.p) else "  (off with these parameters)"
        binds = getattr(s.fn, "binds", None)
        if binds is not None:  # a binding: the kernel with its inputs and the parameters it takes
            _, inputs, params = binds
            kw = ", ".join(f"{k}={v}" for k, v in params.items())
            out.append(f"    {s.kind:<10} {s.name:<22} binds ({', '.join(inputs)}{'; ' + kw if kw else ''}){off}")
            kernels = s.where()
        else:
            qual, path, line = s.where()[0]
            out.append(f"    {s.kind:<10} {s.name:<22} {qual}  {path}:{line}{off}")
            kernels = s.where()[1:]
        for qual, path, line in kernels:
            out.append(f"    {'':<10} {'':<22}   kernel {qual}  {path}:{line}")
    return out


def literature_card_text(name: str, c: Card) -> str:
    """The card of a literature-only entry: no parameters, stages or kernels to list."""
    parts = [
        f"{name}: {c.title}" + (f" (arXiv {c.arxiv})" if c.arxiv else ""),
        f"  family        {c.family}",
        f"  what it does  {c.summary}",
        f"  samples       {c.samples}",
        f"  learns        {c.learns}",
        f"  status        {c.status}",
        f"  not shown     {c.not_established}",
    ]
    if c.unconfirmed:
        parts.append(f"  unconfirmed   {'; '.join(c.unconfirmed)}")
    return "\n".join(parts)


def card_text(m: Method) -> str:
    c = m.card
    parts = [
        f"{m.name}: {c.title}" + (f" (arXiv {c.arxiv})" if c.arxiv else ""),
        f"  family        {c.family}",
        f"  what it does  {c.summary}",
        f"  samples       {c.samples}",
        f"  learns        {c.learns}",
        f"  reference     {c.reference}",
        f"  critic        {c.critic}",
        f"  needs         {', '.join(m.required_fields) or 'rewards only'}",
        f"  role passes   {', '.join(m.roles) or 'none beyond the training forward'}",
        f"  aggregation   {m.aggregation}",
        f"  status        {c.status}",
        f"  not shown     {c.not_established}",
    ]
    if c.confirmed:
        parts.append(f"  confirmed     {c.confirmed}")
    if c.unconfirmed:
        parts.append(f"  unconfirmed   {'; '.join(c.unconfirmed)}")
    parts.append("  parameters")
    parts += [f"    {line}" for line in describe_params(m)]
    parts.append("  stages")
    parts += stage_lines(m)
    return "\n".join(parts)
