"""Worked examples: estimators over richer rewards (range_grpo on intervals, gprl on reward vectors)."""

from __future__ import annotations

import torch

from policylab.kernels import advantages as adv_mod
from policylab.errors import PolicylabError
from policylab.kernels.rewards.graded import numeric_interval, reward_vectors
from policylab.learn.examples.registry import example
from policylab import methods
from policylab.learn.examples.core_common import F64, method_advantages, nums, f64


def _intervals(pairs) -> torch.Tensor:
    return torch.tensor([[float(lo), float(hi)] for lo, hi in pairs], dtype=F64)


@example("range_grpo_group")
def range_grpo_group(intervals):
    """One group of intervals: which pairs are determinate and the advantages."""
    iv = _intervals(intervals)
    a = adv_mod.range_grpo(iv, torch.zeros(len(intervals), dtype=torch.long))
    pairs = []
    for i in range(len(intervals)):
        for j in range(i + 1, len(intervals)):
            lo_i, hi_i = intervals[i]
            lo_j, hi_j = intervals[j]
            rel = f"{i} ≻ {j}" if lo_i > hi_j else (f"{j} ≻ {i}" if lo_j > hi_i else f"{i} ? {j}")
            pairs.append(rel)
    return {"intervals": str([list(map(float, p)) for p in intervals]), "advantages": nums(a),
            "relations": ", ".join(pairs), "sum": round(float(a.sum()), 10) + 0.0}


@example("range_grpo_point_limit")
def range_grpo_point_limit(rewards):
    r = f64(rewards)
    g = torch.zeros(len(rewards), dtype=torch.long)
    point = adv_mod.range_grpo(torch.stack([r, r], dim=1), g)
    return {"rewards": nums(r), "range_grpo": nums(point), "dr_grpo": nums(adv_mod.dr_grpo(r, g)),
            "equal": bool(torch.allclose(point, adv_mod.dr_grpo(r, g)))}


@example("range_vs_grpo")
def range_vs_grpo(intervals):
    """Range-GRPO on intervals vs GRPO on their midpoints (GRPO's own advantage stage, its
    registered std convention): an overlap is no evidence."""
    iv = _intervals(intervals)
    g = torch.zeros(len(intervals), dtype=torch.long)
    mid = iv.mean(dim=1)
    return {"midpoints": nums(mid), "grpo_on_midpoints": method_advantages("grpo", nums(mid)),
            "std": methods.get("grpo").p["std"], "range_grpo": nums(adv_mod.range_grpo(iv, g))}


@example("range_grpo_judge")
def range_grpo_judge(replies, answer, bad):
    """The built-in interval judge on numeric replies, and the refusal of an inverted interval."""
    iv = numeric_interval(list(replies), [answer] * len(replies))
    try:
        adv_mod.range_grpo(_intervals(bad), torch.zeros(len(bad), dtype=torch.long))
        err = "no error"
    except (PolicylabError, ValueError) as exc:
        err = f"{type(exc).__name__}: {exc}"
    return {"replies": str(list(replies)), "answer": answer, "intervals": str([nums(row) for row in iv]),
            "advantages": nums(adv_mod.range_grpo(iv.double(), torch.zeros(len(replies), dtype=torch.long))),
            "inverted_error": err}


@example("gprl_dimensions")
def gprl_dimensions(correct, style):
    """Two dimensions on very different scales: normalize each, then sum (vs sum first)."""
    r = torch.stack([f64(correct), f64(style)], dim=1)
    g = torch.zeros(len(correct), dtype=torch.long)
    per_dim = adv_mod.gprl(r, g, torch.ones(2, dtype=F64), std="population", eps=0.0)
    summed = adv_mod.grpo(r.sum(dim=1), g, std="population", eps=0.0)
    stats = adv_mod.gprl_stats(r, g, torch.ones(2, dtype=F64), std="population", eps=0.0)
    return {"correct": nums(correct), "style": nums(style), "gprl": nums(per_dim), "sum_first": nums(summed),
            "w_eff_correct": round(float(stats["dim0/effective_weight"]), 4),
            "w_eff_style": round(float(stats["dim1/effective_weight"]), 4)}


@example("gprl_affine")
def gprl_affine(correct, style, scale, shift):
    """A positive affine rescaling of one dimension leaves the advantage unchanged."""
    r = torch.stack([f64(correct), f64(style)], dim=1)
    g = torch.zeros(len(correct), dtype=torch.long)
    w = torch.ones(2, dtype=F64)
    r2 = r.clone()
    r2[:, 1] = r2[:, 1] * scale + shift
    a1 = adv_mod.gprl(r, g, w, std="population", eps=0.0)
    a2 = adv_mod.gprl(r2, g, w, std="population", eps=0.0)
    return {"scale": scale, "shift": shift, "before": nums(a1), "after": nums(a2),
            "unchanged": bool(torch.allclose(a1, a2))}


@example("gprl_weights")
def gprl_weights(correct, style, weights):
    """Weights decide importance once every dimension is on one scale."""
    r = torch.stack([f64(correct), f64(style)], dim=1)
    g = torch.zeros(len(correct), dtype=torch.long)
    return {"weights": nums(weights), "advantages": nums(adv_mod.gprl(r, g, f64(weights), std="population", eps=0.0))}


@example("gprl_graded")
def gprl_graded(replies, answer):
    """The built-in rule-based dimensions (correct, closeness, terse) on replies."""
    v = reward_vectors(list(replies), [answer] * len(replies), ["correct", "closeness", "terse"])
    g = torch.zeros(len(replies), dtype=torch.long)
    a = adv_mod.gprl(v.double(), g, torch.ones(3, dtype=F64), std="population")
    return {"replies": str(list(replies)), "answer": answer, "vectors": str([nums(row) for row in v]),
            "advantages": nums(a)}
