"""The comparison's budget: one of steps, seconds or tokens per run, checked against the
shared run's own train settings and against what each method spends before it learns."""

from __future__ import annotations

import math

from policylab.experiments.compare.plan import BUDGET_KINDS, DEFAULT_MAX_STEPS, Budget

_REFUSED = Budget(None, None, DEFAULT_MAX_STEPS)


def parse_budget(b, train: dict, problems: list[str]) -> Budget:
    """The config's `budget` mapping; problems are appended to `problems`. `train` (the
    shared run's train section) loses its `steps`: the budget sets them."""
    if not isinstance(b, dict) or not b:
        problems.append("`budget` must be one of {steps: N}, {seconds: S}, {tokens: N} (optionally with max_steps)")
        return _REFUSED
    unknown = set(b) - set(BUDGET_KINDS) - {"max_steps"}
    if unknown:
        problems.append(f"`budget` has unknown key(s) {sorted(unknown)}; use one of {', '.join(BUDGET_KINDS)} "
                        "(+ max_steps)")
    given = [k for k in BUDGET_KINDS if k in b]
    if len(given) != 1:
        problems.append(f"`budget` must give exactly one of steps, seconds, tokens (got {given or 'none'}): runs "
                        "under different budgets do not compare")
        return _REFUSED
    kind = given[0]
    value = b[kind]
    if not _valid_value(kind, value):
        problems.append(f"`budget.{kind}` must be a positive {'integer' if kind != 'seconds' else 'number'}, got {value!r}")
        return _REFUSED
    max_steps = _max_steps(b, kind, problems)
    _check_train(train, kind, value, problems)
    return Budget(kind, float(value) if kind == "seconds" else int(value), max_steps)


def _valid_value(kind: str, value) -> bool:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    if kind in ("steps", "tokens") and not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        return False
    return ok


def _max_steps(b: dict, kind: str, problems: list[str]) -> int:
    max_steps = b.get("max_steps", DEFAULT_MAX_STEPS)
    if kind == "steps" and "max_steps" in b:
        problems.append("`budget.max_steps` caps a seconds or tokens budget; a steps budget is its own cap")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        problems.append(f"`budget.max_steps` must be a positive integer, got {max_steps!r}")
        max_steps = DEFAULT_MAX_STEPS
    return int(max_steps)


def _check_train(train: dict, kind: str, value, problems: list[str]) -> None:
    """The shared run's train.steps and train.decay must agree with the budget."""
    if "steps" in train:
        if kind == "steps" and train["steps"] != value:
            problems.append(f"`run.train.steps` ({train['steps']}) and `budget.steps` ({value}) disagree: give the "
                            "budget once, in `budget`")
        elif kind != "steps":
            problems.append(f"`run.train.steps` is set with a {kind} budget: runs would stop at different budgets; "
                            "the step cap of a seconds or tokens budget is `budget.max_steps`")
        train.pop("steps")
    if kind != "steps" and train.get("decay", "constant") != "constant":
        problems.append(f"`run.train.decay` is {train['decay']!r} with a {kind} budget: the schedule's length is "
                        "train.steps, which a seconds or tokens budget does not fix, so the runs would decay at "
                        "different points; use decay constant or a steps budget")


def apply_budget(train: dict, budget: Budget) -> None:
    """Write the budget into one run's train section."""
    if budget.kind == "steps":
        train["steps"] = int(budget.value)
    elif budget.kind == "seconds":
        train.update(steps=budget.max_steps, budget_seconds=float(budget.value))
    elif budget.kind == "tokens":
        train.update(steps=budget.max_steps, budget_tokens=int(budget.value))


def budget_problems(label: str, method, budget: Budget) -> list[str]:
    """A budget a method cannot spend comparably (derived from its spec): critic-only
    pretraining steps that use the whole steps budget."""
    c = method.critic
    if c is not None and c.pretrain_param is not None and budget.kind == "steps":
        n = int(method.p[c.pretrain_param])
        if n >= int(budget.value):
            return [f"{label}: {c.pretrain_param}={n} critic-only steps use the whole budget of {budget.value} steps: it "
                    "would never update the policy (lower the parameter or raise the budget)"]
    return []
