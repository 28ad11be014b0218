"""Decision-token calibration: temperature fitted on a validation split, ECE and Brier on
a disjoint test split.

Paper: "Balancing Classification and Calibration Performance in Decision-Making LLMs via
Calibration Aware Reinforcement Learning" (arXiv 2601.13284): RL with verifiable rewards
leaves the decision token's probability overconfident; its calibration is measured on the
decision token's distribution over the choices. The post-hoc temperature is the standard
temperature scaling ("On Calibration of Modern Neural Networks", arXiv 1706.04599):

    T* = argmin_T  NLL_val(softmax(z / T))          on rows tagged "val" only
    then, frozen, on rows tagged "test":
      accuracy (unchanged by T), NLL, Brier = mean_i Σ_c (p_ic − 1[y_i = c])²,
      ECE = Σ_b (|B_b| / N) · |acc_b − conf_b|       (M equal-width bins, `metrics.ece`, the
                                                      project's one ECE, exact at the bin edges)

Fitting. NLL(β) with β = 1/T is convex in β (its second derivative is the variance of z
under softmax(βz)), so T* is found by bisection on the sign of dNLL/dβ = mean_i(E_p[z] −
z_y) over [1/t_max, 1/t_min]; a minimum outside that range returns the bound and says so.
Fitting on a row tagged "test" raises: calibration parameters come from validation data
only (conventions rule 7). Evaluation only: nothing here feeds a reward.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.metrics import ece, ece_bins

SPLITS = ("val", "test")


def _logits_labels(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise ShapeError("`logits` must be a floating [N, C] tensor of decision-token logits over the choices")
    N, C = logits.shape
    if N == 0 or C < 2:
        raise ShapeError(f"`logits` needs N >= 1 rows and C >= 2 choices, got {tuple(logits.shape)}")
    if not bool(torch.isfinite(logits).all()):
        raise PolicylabError("`logits` must be finite")
    labels = torch.as_tensor(labels)
    if labels.shape != (N,) or labels.is_floating_point() or labels.dtype == torch.bool:
        raise ShapeError(f"`labels` must be an integer [N] = ({N},) tensor, got {labels.dtype} {tuple(labels.shape)}")
    if bool(((labels < 0) | (labels >= C)).any()):
        raise PolicylabError(f"`labels` must index the {C} choices")
    return logits.double(), labels.long()


def _tags(splits: Sequence[str], N: int) -> list[str]:
    if isinstance(splits, str) or len(splits) != N:
        raise ShapeError(f"`splits` must hold one tag per row ({N}), got {splits!r:.60}")
    bad = sorted({s for s in splits if s not in SPLITS})
    if bad:
        raise PolicylabError(f"split tags must be one of {', '.join(SPLITS)}, got {bad}")
    return list(splits)


def nll(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of the labels under softmax(z / T)."""
    z, y = _logits_labels(logits, labels)
    lp = torch.log_softmax(z / float(temperature), dim=-1)
    return float(-lp.gather(1, y[:, None]).mean())


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, splits: Sequence[str], *, t_min: float = 0.05,
                    t_max: float = 20.0, tol: float = 1e-7) -> tuple[float, dict]:
    """T* minimizing the validation NLL. Every row must be tagged "val" (a "test" row
    raises). Returns (T*, info) with info: nll_before (T = 1), nll_after, at_bound
    (the minimum lies outside [t_min, t_max]), iterations."""
    z, y = _logits_labels(logits, labels)
    tags = _tags(splits, z.shape[0])
    n_test = sum(t == "test" for t in tags)
    if n_test:
        raise PolicylabError(f"fit_temperature got {n_test} row(s) tagged 'test': the temperature is fitted on the "
                             "validation split only, never on the data it is evaluated on")
    if not 0 < t_min < t_max or not math.isfinite(t_max):
        raise PolicylabError(f"need 0 < t_min < t_max, got {t_min}, {t_max}")
    zy = z.gather(1, y[:, None]).squeeze(1)

    def slope(beta: float) -> float:  # dNLL/dβ = mean(E_p[z] − z_y), increasing in β
        p = torch.softmax(beta * z, dim=-1)
        return float(((p * z).sum(-1) - zy).mean())

    lo, hi = 1.0 / t_max, 1.0 / t_min
    s_lo, s_hi = slope(lo), slope(hi)
    it = 0
    if s_lo >= 0:
        beta, at_bound = lo, True
    elif s_hi <= 0:
        beta, at_bound = hi, True
    else:
        at_bound = False
        while hi - lo > tol * max(1.0, lo) and it < 200:
            mid = 0.5 * (lo + hi)
            if slope(mid) > 0:
                hi = mid
            else:
                lo = mid
            it += 1
        beta = 0.5 * (lo + hi)
    T = 1.0 / beta
    return T, {"nll_before": nll(z, y), "nll_after": nll(z, y, T), "at_bound": at_bound, "iterations": it}


def reliability_bins(conf: torch.Tensor, correct: torch.Tensor, *, n_bins: int) -> list[dict]:
    """Per equal-width bin ([b/M, (b+1)/M), the last one closed): count, mean confidence
    and accuracy (None for an empty bin) — the points of a reliability diagram. The bins
    are `metrics.ece_bins`, the same as the ECE's (exact at the edges k/M)."""
    b = ece_bins(conf, n_bins=n_bins)
    conf = conf.double()
    y = torch.as_tensor(correct).double()
    out = []
    for i in range(n_bins):
        sel = b == i
        k = int(sel.sum())
        out.append({"lo": i / n_bins, "hi": (i + 1) / n_bins, "count": k,
                    "conf": float(conf[sel].mean()) if k else None, "acc": float(y[sel].mean()) if k else None})
    return out


def calibration_metrics(logits: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0,
                        n_bins: int = 10) -> dict:
    """accuracy, nll, brier (multi-class), ece (top-choice confidence, `n_bins` bins),
    mean confidence and the reliability bins, of softmax(z / T)."""
    z, y = _logits_labels(logits, labels)
    if not temperature > 0 or not math.isfinite(temperature):
        raise PolicylabError(f"`temperature` must be finite and > 0, got {temperature}")
    p = torch.softmax(z / temperature, dim=-1)
    conf, pred = p.max(-1)
    correct = pred == y
    onehot = torch.nn.functional.one_hot(y, z.shape[1]).double()
    return {
        "n": int(z.shape[0]), "temperature": float(temperature),
        "accuracy": float(correct.double().mean()),
        "nll": nll(z, y, temperature),
        "brier": float(((p - onehot) ** 2).sum(-1).mean()),
        "ece": float(ece(conf, correct, n_bins=n_bins)),
        "confidence": float(conf.mean()),
        "bins": reliability_bins(conf, correct, n_bins=n_bins),
    }


def calib_rl(logits: torch.Tensor, labels: torch.Tensor, splits: Sequence[str], *, n_bins: int = 10,
             ids: Sequence | None = None) -> dict:
    """Fit T* on the rows tagged "val", then report the "test" rows at T = 1 ("raw") and at
    T* ("scaled"). `ids` (optional, one per row, e.g. the problem): a problem present in
    both splits raises (the splits must be disjoint)."""
    z, y = _logits_labels(logits, labels)
    tags = _tags(splits, z.shape[0])
    val = torch.tensor([t == "val" for t in tags])
    if not bool(val.any()) or bool(val.all()):
        raise PolicylabError("calibration needs rows tagged 'val' (to fit T) and rows tagged 'test' (to measure)")
    if ids is not None:
        if len(ids) != z.shape[0]:
            raise ShapeError(f"{len(ids)} ids for {z.shape[0]} rows")
        both = {i for i, t in zip(ids, tags) if t == "val"} & {i for i, t in zip(ids, tags) if t == "test"}
        if both:
            raise PolicylabError(f"{len(both)} item(s) appear in both the val and the test split, e.g. "
                                 f"{sorted(map(str, both))[:2]}: the splits must be disjoint")
    T, info = fit_temperature(z[val], y[val], ["val"] * int(val.sum()))
    test = ~val
    return {"temperature": T, "fit": info, "n_val": int(val.sum()), "n_test": int(test.sum()),
            "raw": calibration_metrics(z[test], y[test], temperature=1.0, n_bins=n_bins),
            "scaled": calibration_metrics(z[test], y[test], temperature=T, n_bins=n_bins)}
