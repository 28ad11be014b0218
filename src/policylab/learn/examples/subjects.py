"""Worked examples of the subjects that are not training methods: pass@k (the estimator
behind `policylab eval --metrics pass@k`) and the literature-only cards (orl). Each calls
the library: the estimator and the coverage functions, or the registry's refusal."""

from __future__ import annotations

from policylab import methods
from policylab.errors import PolicylabError
from policylab.eval.coverage import coverage_at_k, pool_counts
from policylab.kernels.metrics import pass_at_k
from policylab.learn.examples.core_common import num
from policylab.learn.examples.registry import example


@example("pass_at_k_budgets")
def pass_at_k_budgets(n, c, ks):
    """pass@k of one task (n samples, c correct) at several budgets."""
    out = {"n": n, "c": c, "ks": list(ks)}
    out["values"] = [num(pass_at_k(n, c, k)) for k in ks]
    return out


@example("pass_at_k_saturates")
def pass_at_k_saturates(n, c, k):
    """n − c < k: every k-subset holds a correct sample, the estimate is exactly 1; one
    correct sample fewer and it is not."""
    return {"n": n, "c": c, "k": k, "full": num(pass_at_k(n, c, k)), "one_fewer": num(pass_at_k(n, c - 1, k)),
            "exactly_one": bool(float(pass_at_k(n, c, k)) == 1.0)}


@example("pass_at_k_pooled")
def pass_at_k_pooled(task_ids, n, c, k):
    """Repeated prompts of one problem are pooled (n and c add up) before coverage; coverage
    of the raw list refuses the repeated ids."""
    ids, pn, pc = pool_counts(task_ids, n, c)
    cov = coverage_at_k(ids, pn, pc, k)
    try:
        coverage_at_k(task_ids, n, c, k)
        refused = "no error"
    except PolicylabError as exc:
        refused = str(exc)
    return {"tasks": len(ids), "pooled_n": [int(x) for x in pn], "pooled_c": [int(x) for x in pc],
            "coverage": num(cov.value), "per_task": [num(x) for x in cov.per_task], "refused": refused}


@example("pass_at_k_refusals")
def pass_at_k_refusals(n, c, k):
    """Bad counts raise with the problem named."""
    msgs = []
    for args in ((n, c, k), (n, n + 1, 1), (n, c, 0)):
        try:
            pass_at_k(*args)
            msgs.append("no error")
        except PolicylabError as exc:
            msgs.append(str(exc))
    return {"n": n, "k": k, "n_below_k": msgs[0], "c_above_n": msgs[1], "k_zero": msgs[2]}


@example("literature_refusal")
def literature_refusal(name):
    """What the registry does with a literature-only name: every execution path refuses it."""
    try:
        methods.get(name)
        msg, kind = "no error", "none"
    except PolicylabError as exc:
        msg, kind = str(exc), type(exc).__name__
    return {"name": name, "error": kind, "message": msg.split(". Card:")[0],
            "runnable": name in methods.names(), "listed": name in methods.registry.literature_names()}


@example("literature_vs_method")
def literature_vs_method(name, method):
    """The `samples` and `learns` fields of a literature-only card next to a method's."""
    lit, m = methods.registry.card(name), methods.get(method).card
    return {"name": name, "method": method, "lit_samples": lit.samples, "lit_learns": lit.learns,
            "method_samples": m.samples, "method_learns": m.learns}
