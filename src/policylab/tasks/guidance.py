"""Training-time guidance derived from a task's own solver: gold answers, demonstrations,
expert traces (worked solutions) and privileged hints, for the train split only.

Mixed-policy methods learn from sequences the learner did not sample: LUFFY's
demonstrations, GRIN's injected gold answers, MOER's expert prefixes and traces,
Off-Context GRPO's hints. Here they come from the task's solver (for the arithmetic task:
the operands in `Example.meta`), never from a model, and never for a held-out problem:
every function below first calls `require_train(example)`, which refuses an example whose
split is not "train" (docs/conventions.md rule 7: training-time gold stays in the
training split; evaluation gold never reaches a hint, a demonstration or an injection).

    solver_id(ex)        "solver:arithmetic" (the producer recorded on the rows)
    gold_answer(ex)      the verified answer text, e.g. "56"
    worked_solution(ex)  a step-by-step solution ending with the answer, e.g.
                         "7 × 8 = 7 × 7 + 7 = 49 + 7 = 56"
    demonstration(ex, style)   "answer" (the ideal reply to "reply with only the number")
                               or "worked" (the worked solution)
    hint(ex, kind)       "none" (empty), "answer" ("The answer is 56."), "worked" (the
                         worked solution's steps without its final result)

JSONL tasks carry their own guidance as fields of the line (`solution`, `hint`,
`demonstration`, kept in `Example.meta`); `taskrun` tags their split and marks a train
line whose prompt also appears in the held-out file (`meta["heldout_overlap"]`), which is
refused like a held-out example.
"""

from __future__ import annotations

from policylab.errors import PolicylabError
from policylab.tasks.example import Example

HINT_KINDS = ("none", "answer", "worked")
DEMONSTRATION_STYLES = ("answer", "worked")


class GuidanceError(PolicylabError):
    """Guidance asked for an example outside the train split, or for a task without a solver."""


def require_train(example: Example) -> Example:
    """`example` if it belongs to the train split; GuidanceError otherwise."""
    meta = example.meta or {}
    split = meta.get("split")
    if split != "train":
        raise GuidanceError(
            f"guidance (hints, demonstrations, gold, expert traces) comes from the train split only; "
            f"{example.prompt[:60]!r} is in split {split!r}")
    if meta.get("heldout_overlap"):
        raise GuidanceError(f"{example.prompt[:60]!r} also appears in the held-out split: no guidance for it")
    return example


def _arith(example: Example):
    m = example.meta or {}
    if {"op", "a", "b"} <= set(m):
        return m["op"], int(m["a"]), int(m["b"])
    return None


def solver_id(example: Example) -> str:
    """The producer identity of the guidance rows built from `example`."""
    if _arith(example) is not None:
        return "solver:arithmetic"
    if any(k in (example.meta or {}) for k in ("solution", "demonstration", "hint")):
        return "solver:dataset"
    raise GuidanceError(f"no solver for {example.prompt[:60]!r}: the arithmetic task has one; a JSONL line needs a "
                        "`solution` (and optionally `hint`, `demonstration`) field")


def gold_answer(example: Example) -> str:
    """The verified answer text (training split only)."""
    require_train(example)
    solver_id(example)
    return str(example.answer)


def _times(example: Example) -> str:
    return "*" if " * " in example.prompt else "×"


def _arith_steps(op: str, a: int, b: int, times: str) -> list[str]:
    """The expressions of a worked solution, first to last (the last is the result)."""
    if op == "+":
        r = a + b
        if b >= 10:
            hi, lo = b // 10 * 10, b % 10
            return [f"{a} + {b}", f"{a} + {hi} + {lo}", f"{a + hi} + {lo}", str(r)]
        if a < 10 and 0 < 10 - a <= b < 10 and a > 0 and r > 10:
            return [f"{a} + {b}", f"{a} + {10 - a} + {b - (10 - a)}", f"10 + {r - 10}", str(r)]
        return [f"{a} + {b}", str(r)]
    if op == "-":
        r = a - b
        if b >= 10:
            hi, lo = b // 10 * 10, b % 10
            return [f"{a} - {b}", f"{a} - {hi} - {lo}", f"{a - hi} - {lo}", str(r)]
        return [f"{a} - {b}", str(r)]
    if op == "*":
        r = a * b
        if b >= 10:
            hi, lo = b // 10 * 10, b % 10
            return [f"{a} {times} {b}", f"{a} {times} {hi} + {a} {times} {lo}", f"{a * hi} + {a * lo}", str(r)]
        if a <= 1 or b <= 1:
            return [f"{a} {times} {b}", str(r)]
        if b <= 4:
            return [f"{a} {times} {b}", " + ".join([str(a)] * b), str(r)]
        return [f"{a} {times} {b}", f"{a} {times} {b - 1} + {a}", f"{a * (b - 1)} + {a}", str(r)]
    raise GuidanceError(f"no solver for op {op!r}")


def worked_solution(example: Example) -> str:
    """A step-by-step solution whose last number is the answer (training split only)."""
    require_train(example)
    p = _arith(example)
    if p is None:
        sol = (example.meta or {}).get("solution")
        if not isinstance(sol, str) or not sol.strip():
            solver_id(example)
            raise GuidanceError(f"{example.prompt[:60]!r} has no `solution` field")
        return sol
    return " = ".join(_arith_steps(*p, _times(example)))


def demonstration(example: Example, style: str = "answer") -> str:
    """A verified reply: the answer alone ("answer") or the worked solution ("worked")."""
    if style not in DEMONSTRATION_STYLES:
        raise GuidanceError(f"demonstration style must be one of {', '.join(DEMONSTRATION_STYLES)}, got {style!r}")
    require_train(example)
    own = (example.meta or {}).get("demonstration")
    if _arith(example) is None and isinstance(own, str) and own.strip():
        return own
    return gold_answer(example) if style == "answer" else worked_solution(example)


def hint(example: Example, kind: str = "worked") -> str:
    """Privileged information about `example` for the sampler only ("" for kind "none")."""
    if kind not in HINT_KINDS:
        raise GuidanceError(f"hint kind must be one of {', '.join(HINT_KINDS)}, got {kind!r}")
    require_train(example)
    if kind == "none":
        return ""
    if kind == "answer":
        return f"Hint: the answer is {gold_answer(example)}."
    p = _arith(example)
    if p is None:
        own = (example.meta or {}).get("hint")
        if isinstance(own, str) and own.strip():
            return own
        return "Hint: " + worked_solution(example)
    steps = _arith_steps(*p, _times(example))
    shown = steps[:-1] if len(steps) > 2 else steps[:1]
    return "Hint: " + " = ".join(shown) + "."
