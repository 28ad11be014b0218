"""A recipe's anatomy, read from the code rather than written by hand: the policylab
kernels its stages call (with the equation block of their docstrings and their source
location), its stages on one line, and the comparison table of every registered method.

    kernels(recipe)        -> [Kernel]        the stage kernels a recipe calls, with formulas
    formula_text(recipe)   -> str             those equations, stage by stage
    comparison_table()     -> [dict]          one row per registered method, from the cards

Used by `policylab explain`, the quiz and the static site; a kernel whose docstring
changes changes the text everywhere.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path

from .. import methods
from ..errors import PolicylabError
from ..methods.registry import Recipe

PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # the directory that holds `policylab/` (src/)


@dataclass(frozen=True)
class Kernel:
    stage: str  # advantage | objective | correction
    key: str  # the recipe's stage name (e.g. "gae", "ppo_clip", "tis")
    qualname: str  # e.g. "policylab.advantages.gae.gae"
    path: str  # source file relative to the package root, e.g. "policylab/advantages/gae.py"
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


def _stage_kernel(stage: str, key: str) -> Kernel:
    """The policylab kernel a stage adapter calls: the `<alias>.<fn>(` call in its source
    whose name is the stage key, else starts with it, else the first function called."""
    from ..methods import stages

    adapter = {"advantage": stages.ADVANTAGES, "objective": stages.OBJECTIVES,
               "correction": stages.CORRECTIONS}[stage][key]
    calls = []
    for alias, fn_name in re.findall(r"\b(\w+)\.(\w+)\(", inspect.getsource(adapter)):
        fn = getattr(adapter.__globals__.get(alias), fn_name, None)
        if inspect.isfunction(fn) and fn.__module__.startswith("policylab."):
            calls.append((fn_name, inspect.unwrap(fn)))
    if not calls:
        raise PolicylabError(f"no policylab kernel found in the {stage} adapter {adapter.__name__}")
    exact = [f for n, f in calls if n == key] or [f for n, f in calls if n.startswith(key)] or [calls[0][1]]
    fn = exact[0]
    src = Path(inspect.getsourcefile(fn)).resolve()
    formula = _equation_block(fn.__doc__) or _equation_block(inspect.getmodule(fn).__doc__)
    return Kernel(stage, key, f"{fn.__module__}.{fn.__name__}", src.relative_to(PACKAGE_ROOT).as_posix(),
                  inspect.getsourcelines(fn)[1], formula)


def kernels(recipe: Recipe) -> list[Kernel]:
    """The recipe's stage kernels in pipeline order: advantage, objective, correction."""
    out = [_stage_kernel("advantage", recipe.advantage), _stage_kernel("objective", recipe.objective)]
    if recipe.correction is not None:
        out.append(_stage_kernel("correction", recipe.correction))
    return out


def formula_text(recipe: Recipe) -> str:
    """Each stage kernel's equation block under a `stage: qualname` line; a kernel whose
    docstrings show no equation contributes the card summary instead."""
    parts = []
    for k in kernels(recipe):
        parts.append(f"{k.stage}: {k.qualname}\n" + _indent(k.formula or recipe.card.summary))
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


def stages_text(r: Recipe) -> str:
    parts = [f"advantage={r.advantage}", f"objective={r.objective}", f"aggregation={r.aggregation}"]
    if r.correction:
        parts.append(f"correction={r.correction}")
    if r.filter:
        parts.append(f"filter={r.filter}")
    if r.shaping:
        parts.append(f"shaping={','.join(r.shaping)}")
    if r.kl:
        parts.append(f"kl={r.kl.estimator}x{r.kl.coef}@{r.kl.placement}")
    return " ".join(parts)


def comparison_table() -> list[dict[str, str]]:
    """One row per registered method (keys: COMPARISON_COLUMNS), from the registry cards:
    inputs = recipe.required_fields, changes = card.summary."""
    rows = []
    for name in methods.names():
        r = methods.get(name)
        rows.append(dict(method=name, family=r.card.family, samples=r.card.samples, learns=r.card.learns,
                         reference=r.card.reference, inputs=", ".join(r.required_fields) or "rewards only",
                         stages=stages_text(r), changes=r.card.summary))
    return rows
