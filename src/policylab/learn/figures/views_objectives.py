"""Views of objectives: the gradient coefficient of a token against the policy ratio
(split by the sign of the advantage), and the share of the gradient a response gets
against its length (the aggregation)."""

from __future__ import annotations

import itertools
import math

import torch

from policylab.kernels import aggregate as agg
from policylab.methods.loss import policy_loss, tensor_inputs, term_masks
from policylab.methods.spec import Method
from policylab.learn.figures.model import Mark, Panel, Series, T, view
from policylab.learn.figures.common import COEF, F64, SAME_RATIO, coefficient, grid, objective_only, variant_label


def _clip_marks(method: Method) -> tuple[list[float], list[Mark]]:
    """Kinks and labelled lines at 1 − ε_low and 1 + ε_high when the objective declares them."""
    p, keys, marks = method.p, [1.0], []
    declared = set(method.objective.params)
    if "eps_low" in declared and p.eps_low is not None:
        keys.append(1 - p.eps_low)
        marks.append(Mark("x", 1 - p.eps_low, T(f"1 − ε_low = {1 - p.eps_low:g}")))
    if "eps_high" in declared:
        keys.append(1 + p.eps_high)
        marks.append(Mark("x", 1 + p.eps_high, T(f"1 + ε_high = {1 + p.eps_high:g}")))
    return keys, marks


@view("policy_ratio")
def policy_ratio(method: Method, *, lo: float = 0.5, hi: float = 1.5, points: int = 121, p_old=(0.5,),
                 positions=(0,), prefix: str = "one", extras=({},), labels=None) -> list[Panel]:
    """Two panels (A > 0, A < 0): −(∂ℓ/∂ log π)/A of one token against its ratio
    ρ = π_θ/π_old, through the method's own policy loss (objective × corrections, the
    engine ratio at 1, addends left out). Variants: the token's old probability `p_old`,
    its position t (the t earlier tokens at ratio 1, `prefix: one`, or at the same ratio ρ,
    `prefix: same`), boolean per-token `extras` a correction reads (SIS's acceptance)."""
    if prefix not in ("one", "same"):
        raise ValueError(f"policy_ratio: prefix must be 'one' or 'same', got {prefix!r}")
    m = objective_only(method)
    keys, marks = _clip_marks(m)
    xs = grid(lo, hi, points, keys=keys)
    variants = list(itertools.product(p_old, positions, extras))
    if labels is not None and len(labels) != len(variants):
        raise ValueError(f"policy_ratio: {len(labels)} labels for {len(variants)} variants")
    ratio = torch.tensor(xs, dtype=F64)
    panels = []
    for sign, title in ((1.0, T("A > 0", "A > 0（优势为正）")), (-1.0, T("A < 0", "A < 0（优势为负）"))):
        series = []
        for i, (po, pos, ex) in enumerate(variants):
            B, T_ = len(xs), int(pos) + 1
            lp_old = torch.full((B, T_), math.log(po), dtype=F64)
            lp = lp_old.clone()
            if prefix == "same":
                lp += torch.log(ratio).unsqueeze(-1)
            else:
                lp[:, -1] += torch.log(ratio)
            mask = torch.ones((B, T_), dtype=torch.bool)
            ext = {k: torch.full((B, T_), bool(v)) for k, v in ex.items()}
            y = coefficient(m, lp, torch.full((B,), sign, dtype=F64), mask, logp_old=lp_old,
                            logp_behavior=lp_old.clone(), extras=ext)
            if labels is not None:
                label = labels[i]
            else:
                parts = [(n, v) for n, v, vals in ((T("π_old"), po, p_old), (T("t"), pos, positions))
                         if len(vals) > 1] + [(T(k), v) for k, v in ex.items() if len(extras) > 1]
                label = variant_label(parts) if parts else T(method.name)
            series.append(Series(label, xs, y))
        panels.append(Panel(title, SAME_RATIO, COEF, series, marks=list(marks),
                            source=f"methods.loss.policy_loss({method.name}) + autograd"))
    return panels


@view("length_share")
def length_share(method: Method, *, max_length: int = 64, other: int = 16) -> list[Panel]:
    """The aggregation: a batch of two responses (A = 1 on both, ratio 1), the second of
    `other` tokens; against the first one's length L, the gradient weight of one of its
    tokens and of the whole response, through the method's loss and its `aggregate` mode
    (the normalizer the trainer uses, `methods.loss.term_masks`)."""
    m = objective_only(method)
    lengths = list(range(1, int(max_length) + 1))
    per_token, total = [], []
    for L in lengths:
        T_ = max(L, other)
        mask = torch.zeros((2, T_), dtype=torch.bool)
        mask[0, :L], mask[1, :other] = True, True
        lp = torch.full((2, T_), -1.0, dtype=F64, requires_grad=True)
        inp = tensor_inputs(lp, torch.ones(2, dtype=F64), mask)
        loss, _ = policy_loss(m, inp)
        tmask, mode, L_norm = term_masks(m, inp.batch)["policy"]
        (g,) = torch.autograd.grad(agg.aggregate(loss, tmask, mode, L_norm=L_norm), lp)
        per_token.append(float(-g[0, 0]))
        total.append(float(-g[0, :L].sum()))
    xl = T("length L of the first response (tokens)", "第一个回答的长度 L（词元数）")
    src = f"methods.loss.policy_loss({method.name}) + aggregate({m.aggregation}) + autograd"
    note = T(f"the other response: {other} tokens", f"另一个回答：{other} 个词元")
    return [
        Panel(T("one token", "单个词元"), xl, T("gradient weight of one token", "单个词元的梯度权重"),
              [Series(T(method.name), lengths, per_token)], source=src, marks=[Mark("x", other, note)]),
        Panel(T("the whole response", "整个回答"), xl, T("gradient weight of the response", "整个回答的梯度权重"),
              [Series(T(method.name), lengths, total)], source=src, marks=[Mark("x", other, note)]),
    ]
