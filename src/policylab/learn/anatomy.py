"""A method's anatomy, read from its spec rather than written by hand: the policylab
kernels its stages call (with the equation block of their docstrings and their source
location), its stages on one line, and the comparison table of every registered method.

    kernels(method)        -> [Kernel]        the kernels the method's active stages call
    formula_text(method)   -> str             those equations, stage by stage
    comparison_table()     -> [dict]          one row per registered method, from the cards

Every kernel comes from the spec (`Stage.kernels`), so a method that composes a host
objective with a correction shows both; a kernel whose docstring changes changes the text
of `policylab explain`, the quiz and the site.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from policylab import methods
from policylab.methods.spec import PACKAGE_ROOT, Method, source_location  # noqa: F401  (PACKAGE_ROOT: read by the site)

# the stage kinds whose kernels carry the method's math, in pipeline order
MATH_KINDS = ("reward", "filter", "round", "advantage", "objective", "correction", "addend", "term", "grad")


@dataclass(frozen=True)
class Kernel:
    stage: str  # the stage kind: advantage | objective | correction | reward | ...
    key: str  # the stage's name (e.g. "gae", "ppo_clip", "tis")
    qualname: str  # e.g. "policylab.kernels.advantages.gae.gae"
    path: str  # source file relative to the package root, e.g. "policylab/kernels/advantages/gae.py"
    line: int  # line of the `def`
    formula: str  # the equation block of its docstring ("" if none)


def _equation_block(doc: str | None) -> str:
    """The first indented block of a docstring (its displayed equations), at most 8 lines."""
    block: list[str] = []
    for line in inspect.cleandoc(doc or "").splitlines():
        if line.startswith("    ") and line.strip():
            block.append(line[4:].rstrip())
        elif block:
            break
    return "\n".join(block[:8]) if any(c in b for b in block for c in "=←") else ""


def _kernel(kind: str, name: str, fn) -> Kernel:
    fn = inspect.unwrap(fn)
    qualname, path, line = source_location(fn)
    formula = _equation_block(fn.__doc__) or _equation_block(inspect.getmodule(fn).__doc__)
    return Kernel(kind, name, qualname, path, line, formula)


def kernels(method: Method) -> list[Kernel]:
    """The kernels of the method's active stages in pipeline order (each kernel once);
    stages that are only plumbing (sources, bookkeeping) have none."""
    out, seen = [], set()
    for stage in method.stages():
        if stage.kind not in MATH_KINDS or not stage.is_active(method.p):
            continue
        for fn in stage.kernels:
            if fn not in seen:
                seen.add(fn)
                out.append(_kernel(stage.kind, stage.name, fn))
    return out


def formula_text(method: Method) -> str:
    """Each kernel's equation block under a `stage: qualname` line; a kernel whose
    docstrings show no equation contributes the card summary instead."""
    parts = []
    for k in kernels(method):
        parts.append(f"{k.stage}: {k.qualname}\n" + _indent(k.formula or method.card.summary))
    return "\n".join(parts)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


COMPARISON_COLUMNS = (
    ("method", {"en": "method", "zh": "方法"}),
    ("family", {"en": "family", "zh": "类别"}),
    ("samples", {"en": "who samples", "zh": "谁采样"}),
    ("learns", {"en": "who learns", "zh": "谁学习"}),
    ("reference", {"en": "reference", "zh": "参考策略"}),
    ("inputs", {"en": "required inputs", "zh": "所需输入"}),
    ("stages", {"en": "stages", "zh": "阶段"}),
    ("changes", {"en": "what it changes (vs PPO/GRPO)", "zh": "相对 PPO/GRPO 的改动"}),
)


def stages_text(m: Method) -> str:
    """The active stages by kind on one line, e.g. `source=on_policy reward=verifier
    advantage=grpo objective=ppo_clip addend=kl_loss aggregation=seq_mean_token_mean`."""
    kinds: dict[str, list[str]] = {}
    for stage in m.stages():
        if stage.is_active(m.p):
            kinds.setdefault(stage.kind, []).append(stage.name)
    return " ".join(f"{k}={','.join(v)}" for k, v in kinds.items()) + f" aggregation={m.aggregation}"


def comparison_table() -> list[dict[str, str]]:
    """One row per registered method (keys: COMPARISON_COLUMNS), from the registry cards:
    inputs = method.required_fields, changes = card.summary."""
    rows = []
    for name in methods.names():
        m = methods.get(name)
        rows.append(dict(method=name, family=m.card.family, samples=m.card.samples, learns=m.card.learns,
                         reference=m.card.reference, inputs=", ".join(m.required_fields) or "rewards only",
                         stages=stages_text(m), changes=m.card.summary))
    return rows
