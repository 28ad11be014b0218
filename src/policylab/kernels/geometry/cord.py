"""CORD: combine a protected objective's gradient with another one, projecting the
other off the protected direction where they conflict."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from policylab.errors import MissingQuantityError, NonFiniteError, PolicylabError, ShapeError

MODES = ("conflict_only", "always")
SCOPES = ("global", "per_tensor")


def cord_combine(g_protected: Sequence[torch.Tensor] | None, g_other: Sequence[torch.Tensor], *, weight: float,
                 mode: str, scope: str) -> tuple[list[torch.Tensor], dict]:
    """The combined full-step gradient g = g_p + g_o', one tensor per parameter.

        g_o ← λ · g_o                                  (weight first)
        d   = ⟨g_o, g_p⟩,   n = ‖g_p‖²
        conflict_only:  g_o' = g_o − (d / n) · g_p   if d < 0, else g_o   (strict: d = 0 keeps g_o)
        always:         g_o' = g_o − (d / n) · g_p   whatever the sign of d
        n = 0:          g_o' = g_o                   (nothing to project on)
        g = g_p + g_o'

    With `conflict_only`, ⟨g, g_p⟩ ≥ ‖g_p‖² (the step never decreases the protected
    objective to first order); with `always`, ⟨g, g_p⟩ = ‖g_p‖² exactly. λ = 0 gives g_p.

    Paper: "CORD: Conflict-Aware Optimization for Joint RL and Distillation in Agents"
    (the arXiv id, which objective the paper protects and its λ are **unconfirmed**: the
    paper's text could not be checked, so the last two are explicit arguments of the
    method). The projection is the full-step one: applied once per optimizer step to
    gradients accumulated over every micro-batch (projecting per micro-batch is a different
    estimator: tested; docs/conventions.md rule 12). Whether the paper projects the whole
    flattened vector or each parameter group is **unconfirmed**: `scope="global"` (the
    default) treats the concatenation of every tensor as one vector, `"per_tensor"`
    projects each pair (g_p[i], g_o[i]) on its own.

    Args:
        g_protected: per-parameter gradients of the protected objective; None means the
            protected loss was never computed (refused: nothing to protect).
        g_other: per-parameter gradients of the other objective, same shapes.
        weight: λ ≥ 0, the weight of the other objective.
        mode: "conflict_only" or "always".
        scope: "global" or "per_tensor".

    Returns (g, info): g detached, in the dtype of the inputs; info holds the detached
    diagnostics dot (d, after weighting), cos, conflict (1.0 if d < 0), projected (the
    fraction of projections applied: 0/1 for global), protected_norm, other_norm,
    protected_zero (1.0 when ‖g_p‖ = 0 exactly: the projection was skipped, never
    refused). Dot products and norms are accumulated in fp64.
    """
    if g_protected is None:
        raise MissingQuantityError("cord", "the protected objective's gradient",
                                   "Compute the protected loss (e.g. the retention set's NLL) and backpropagate it "
                                   "before projecting; cord's grad stage does this from its retention state.")
    if mode not in MODES:
        raise PolicylabError(f"`mode` must be one of {', '.join(MODES)}, got {mode!r}")
    if scope not in SCOPES:
        raise PolicylabError(f"`scope` must be one of {', '.join(SCOPES)}, got {scope!r}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
        raise PolicylabError(f"`weight` (λ) must be a finite number >= 0, got {weight!r}")
    gp, go = list(g_protected), list(g_other)
    if len(gp) != len(go) or not gp:
        raise ShapeError(f"`g_protected` has {len(gp)} tensors and `g_other` {len(go)}: one per parameter, same order")
    for i, (a, b) in enumerate(zip(gp, go)):
        if a.shape != b.shape:
            raise ShapeError(f"tensor {i}: `g_protected` {tuple(a.shape)} != `g_other` {tuple(b.shape)}")
        for name, t in (("g_protected", a), ("g_other", b)):
            if not bool(torch.isfinite(t).all()):
                raise NonFiniteError(f"`{name}` tensor {i} holds NaN or inf")
    go = [weight * b.detach() for b in go]
    gp = [a.detach() for a in gp]
    dots = [float((a.double() * b.double()).sum()) for a, b in zip(gp, go)]
    sq_p = [float(a.double().pow(2).sum()) for a in gp]
    sq_o = [float(b.double().pow(2).sum()) for b in go]
    if scope == "global":
        d, n = sum(dots), sum(sq_p)
        c = _coefficient(d, n, mode)
        out = [a + b - c * a if c else a + b for a, b in zip(gp, go)]
        applied = float(c != 0.0)
    else:
        coeffs = [_coefficient(d, n, mode) for d, n in zip(dots, sq_p)]
        out = [a + b - c * a if c else a + b for a, b, c in zip(gp, go, coeffs)]
        applied = sum(c != 0.0 for c in coeffs) / len(coeffs)
        d, n = sum(dots), sum(sq_p)
    norm_p, norm_o = math.sqrt(n), math.sqrt(sum(sq_o))
    info = {"dot": d, "cos": d / (norm_p * norm_o) if norm_p > 0 and norm_o > 0 else 0.0,
            "conflict": float(d < 0), "projected": applied, "protected_norm": norm_p, "other_norm": norm_o,
            "protected_zero": float(n == 0.0)}
    return out, info


def _coefficient(d: float, n: float, mode: str) -> float:
    """The multiple of g_p removed from g_o (0 when nothing is projected)."""
    if n == 0.0 or (mode == "conflict_only" and not d < 0):
        return 0.0
    return d / n
