"""Evaluation metrics: unbiased pass@k, expected calibration error, Brier score.

These run in the evaluation path on evaluation data; nothing here feeds a reward.
"""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_finite, check_same_shape
from policylab.errors import PolicylabError, ShapeError


def as_counts(x, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        if t.is_floating_point() and bool((t == t.round()).all()) and bool(torch.isfinite(t).all()):
            return t.to(torch.int64)
        raise PolicylabError(f"`{name}` must hold integer counts, got {t.dtype} {t.tolist()}")
    return t.to(torch.int64)


def pass_at_k(n, c, k: int) -> torch.Tensor:
    """Unbiased pass@k per task from n samples with c correct (vectorized over tasks).

        pass@k = 1 − C(n−c, k) / C(n, k) = 1 − Π_{j=0}^{k−1} (1 − c/(n−j))

    The product form (Chen et al., "Evaluating Large Language Models Trained on Code",
    arXiv 2107.03374) avoids huge binomials. It is evaluated in float64 in log space,
    1 − exp(Σ_j log1p(−c/(n−j))) via expm1, so small pass@k values keep their relative
    precision; memory is [tasks, k]. When n − c < k some factor is ≤ 0 (every k-subset
    holds a correct sample): it is clamped to 0, log 0 = −inf, and the value is exactly 1.
    n ≥ k keeps every n − j ≥ 1. Used by fixed-budget coverage metrics (sharpening tax).

    Args:
        n: samples per task (int or integer tensor `[N]`), n >= k.
        c: correct samples per task, 0 <= c <= n, broadcastable with n.
        k: budget, int >= 1.

    Returns:
        float64 tensor of the broadcast shape of n and c (0-dim for scalars).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise PolicylabError(f"`k` must be an int >= 1, got {k!r}")
    n_t, c_t = torch.broadcast_tensors(as_counts(n, "n"), as_counts(c, "c"))
    if n_t.numel() == 0:
        return torch.zeros(n_t.shape, dtype=torch.float64)
    if bool((n_t < k).any()):
        raise PolicylabError(f"pass@k needs n >= k for every task: k = {k}, smallest n = {int(n_t.min())}")
    if bool(((c_t < 0) | (c_t > n_t)).any()):
        raise PolicylabError("`c` must satisfy 0 <= c <= n for every task")
    j = torch.arange(k, dtype=torch.float64)
    ratio = c_t.to(torch.float64).unsqueeze(-1) / (n_t.to(torch.float64).unsqueeze(-1) - j)  # c/(n−j)
    log_miss = torch.log1p(-ratio.clamp(max=1.0)).sum(-1)  # log C(n−c,k)/C(n,k)
    return 0.0 - torch.expm1(log_miss)  # 0.0 - (...) turns -0.0 into 0.0


def _conf_correct(conf: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """Validate a confidence / correctness pair; return correctness as conf's dtype."""
    if not isinstance(conf, torch.Tensor) or conf.dim() != 1 or not conf.is_floating_point():
        raise ShapeError("`conf` must be a 1-D floating tensor [N] of probabilities")
    check_same_shape("conf", conf, correct=correct)
    if conf.numel() == 0:
        raise ShapeError("`conf` is empty")
    check_finite(conf, "conf")
    if bool(((conf < 0) | (conf > 1)).any()):
        raise PolicylabError(f"`conf` must lie in [0, 1], got range [{conf.min().item()}, {conf.max().item()}]")
    y = correct.to(conf.dtype)
    if not bool(((y == 0) | (y == 1)).all()):
        raise PolicylabError("`correct` must be 0/1 or bool")
    return y


# Confidences closer than this to a bin edge b/M are on the edge (in the upper bin). It
# absorbs representation error only: a stated confidence "0.7" stored as float32 is
# 0.699999988 (|error| <= 2^-25 ≈ 3e-8 for q <= 1), an fp64 value computed as 1 − 0.9 is
# 0.09999999999999998; a confidence 1e-4 below an edge stays below it.
ECE_EDGE_TOL = 1e-6


def ece_bins(conf: torch.Tensor, *, n_bins: int, edge_tol: float = ECE_EDGE_TOL) -> torch.Tensor:
    """The equal-width bin of every confidence, `[N]` long in [0, M − 1]: the bin index
    b(q) = ⌊M·q⌋ computed in fp64, except that q within `edge_tol` of an edge k/M is put
    in bin k (the last bin, M − 1, also holds 1.0). Bins are [b/M, (b+1)/M), left-closed.

    The one binning of the project: `ece` and the reliability diagrams
    (`policylab.eval.calibration.reliability_bins`) both use it, so a confidence stated
    as a decimal lands in the same bin whatever dtype carried it (⌊10·q⌋ on the float32
    0.7 = 0.699999988 gives 6)."""
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise PolicylabError(f"`n_bins` must be an int >= 1, got {n_bins!r}")
    if not 0 <= edge_tol < 0.5 / n_bins:
        raise PolicylabError(f"`edge_tol` must be in [0, 1/(2·n_bins)), got {edge_tol!r}")
    q = conf.detach().double()
    x = q * n_bins
    nearest = torch.round(x)
    on_edge = (q - nearest / n_bins).abs() <= edge_tol
    b = torch.where(on_edge, nearest, torch.floor(x))
    return b.clamp(0, n_bins - 1).long()


def ece(conf: torch.Tensor, correct: torch.Tensor, *, n_bins: int) -> torch.Tensor:
    """Expected calibration error with M equal-width bins.

        ECE = Σ_b (|B_b| / N) · |acc_b − conf_b|

    Bins [0, 1/M), [1/M, 2/M), ..., [(M−1)/M, 1] (left-closed; the last one also holds 1.0),
    assigned by `ece_bins` (fp64, exact at the edges k/M up to `ECE_EDGE_TOL`). Empty bins
    contribute 0. acc_b is the fraction correct and conf_b the mean confidence in bin b;
    the sums are accumulated in fp64. The one ECE of the project: the evaluation's
    calibration report and RLCR's logged calibration both call it.

    Args:
        conf: `[N]` confidence of the predicted answer, in [0, 1].
        correct: `[N]` bool or 0/1, whether that answer was right.
        n_bins: M >= 1.

    Returns:
        detached 0-dim tensor in conf's dtype.
    """
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise PolicylabError(f"`n_bins` must be an int >= 1, got {n_bins!r}")
    y = _conf_correct(conf, correct).double()
    q = conf.detach().double()
    bins = ece_bins(conf, n_bins=n_bins)
    conf_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bins, q)
    acc_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bins, y)
    # Σ_b (|B_b|/N)|acc_b − conf_b| = Σ_b |Σ_{i∈b} y_i − Σ_{i∈b} conf_i| / N  (empty bins: 0)
    return ((acc_sum - conf_sum).abs().sum() / conf.numel()).to(conf.dtype).detach()


def brier(conf: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """Brier score of binary correctness: mean_i (conf_i − correct_i)², detached 0-dim."""
    y = _conf_correct(conf, correct)
    return ((conf - y) ** 2).mean().detach()
