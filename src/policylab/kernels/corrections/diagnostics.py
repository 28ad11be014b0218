"""Diagnostics for a pair of log-prob tensors and for importance weights.

`mismatch_stats(logp_a, logp_b, mask)` describes how far distribution a is from the
distribution b that sampled the tokens (typically a = `logp_old`, the training engine, and
b = `logp_behavior`, the rollout engine, at the same weights). With r = lp_a - lp_b on the
counted tokens (samples y ~ b):

    kl_k1          mean(-r)               unbiased estimate of KL(b || a), can be < 0
    kl_k3          mean(e^r - 1 - r)      unbiased, always >= 0, estimate of KL(b || a)
    abs_dlogp_mean mean |r|,  abs_dlogp_max  max |r|
    frac_far       fraction of tokens with |e^r - 1| > `far_threshold` (strict; default 0.2)
    ratio_min / ratio_mean / ratio_max   of e^r, before any clamping (computed in float64,
                   so they can only overflow past ~1e308; log_ratio_min/max are also given)
    n_tokens       number of counted tokens (every statistic is 0 when it is 0)

`ess(weights, mask)`: normalized effective sample size (Σw)² / (n·Σw²) over the n counted
entries, in (0, 1]; 1 = all weights equal, 1/n = one weight carries everything. 0 if every
weight is 0. Weights must be >= 0 and finite.

Healthy engine mismatch: kl_k3 around 1e-4 or less, ratio within [0.5, 2], frac_far ~ 0.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite, check_mask
from policylab.errors import ShapeError
from policylab.kernels.corrections.common import check_roles, masked_log_ratio, scalar


def mismatch_stats(
    logp_a: torch.Tensor,
    logp_b: torch.Tensor,
    mask: torch.Tensor,
    *,
    far_threshold: float = 0.2,
) -> dict[str, torch.Tensor]:
    """Mismatch statistics of a against the sampling distribution b (see module doc).

    logp_a, logp_b, mask: [B, T]; returns detached 0-dim tensors in the dtype of logp_a.
    """
    check_roles("mismatch_stats", mask, logp_a=logp_a, logp_b=logp_b)
    r = masked_log_ratio(logp_a.detach(), logp_b.detach(), mask)
    return log_ratio_stats(r, mask, logp_a, far_threshold=far_threshold)


_KEYS = ("kl_k1", "kl_k3", "abs_dlogp_mean", "abs_dlogp_max", "frac_far",
         "ratio_min", "ratio_mean", "ratio_max", "log_ratio_min", "log_ratio_max")


def log_ratio_stats(r: torch.Tensor, mask: torch.Tensor, like: torch.Tensor, *,
                    far_threshold: float = 0.2, n: int | None = None,
                    scratch: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """`mismatch_stats` from a log-ratio r = lp_a - lp_b that is exactly 0 outside the
    mask (as `masked_log_ratio` makes it), for corrections that already computed it
    (`n` = number of counted positions, if the caller has it; `scratch` = a buffer shaped
    like r that the caller reuses afterwards, used for the temporary when its dtype fits).

    Masked reductions, no boolean indexing and one float [B, T] temporary (each can cost
    a page-faulting allocation at this size): zeros outside the mask add nothing to the
    sums of r, |r|, expm1(r) and expm1(r) − r, and are never "far". Elementwise work runs in
    float64 for float64 input or when max r > 80 (e^r would overflow float32), else in
    float32 (a diagnostic: ~1e-7 relative error per term, sums of same-sign terms for kl_k3)."""
    if n is None:
        n = int(torch.count_nonzero(mask))
    if n == 0:
        out = {k: scalar(0.0, like) for k in _KEYS}
        out["n_tokens"] = scalar(0.0, like)
        return out
    f64 = torch.float64
    work = r.detach()
    work = work if work.dtype == f64 else work.float()
    lo, hi = _masked_min_max(work, mask, n)
    if work.dtype != f64 and float(hi) > 80.0:
        work = work.to(f64)  # e^r would overflow float32
    # the one [B, T] buffer: |r| first, then expm1(r)
    if scratch is not None and scratch.dtype == work.dtype and scratch.shape == work.shape:
        e = torch.abs(work, out=scratch)
    else:
        e = torch.abs(work)
    sum_abs = e.sum().to(f64)
    torch.expm1(work, out=e)  # ratio - 1, accurate near 0
    sum_r, sum_e = work.sum().to(f64), e.sum().to(f64)
    side = torch.gt(e, far_threshold)  # one bool buffer for both sides
    far = torch.count_nonzero(side).to(f64) + torch.count_nonzero(torch.lt(e, -far_threshold, out=side))
    del side
    k3 = e.sub_(work).sum().to(f64) / n  # e^r - 1 - r >= 0 termwise: no cancellation in the sum
    return {
        "kl_k1": scalar(-sum_r / n, like),
        "kl_k3": scalar(k3, like),
        "abs_dlogp_mean": scalar(sum_abs / n, like),
        "abs_dlogp_max": scalar(torch.maximum(hi.abs(), lo.abs()), like),
        "frac_far": scalar(far / n, like),
        "ratio_min": scalar(torch.exp(lo), like),
        "ratio_mean": scalar(1.0 + sum_e / n, like),
        "ratio_max": scalar(torch.exp(hi), like),
        "log_ratio_min": scalar(lo, like),
        "log_ratio_max": scalar(hi, like),
        "n_tokens": scalar(float(n), like),
    }


def _masked_min_max(r: torch.Tensor, mask: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of r over the counted entries, as float64 0-dim tensors, for r that is 0
    outside the mask. The plain min/max is right unless it is that padding 0: a min < 0 or
    a max > 0 is attained by a counted entry; only an exact 0 needs the masked pass."""
    lo, hi = torch.aminmax(r)
    if n < r.numel() and (float(lo) == 0.0 or float(hi) == 0.0):
        lo = torch.where(mask, r, torch.full((), math.inf, dtype=r.dtype)).min()
        hi = torch.where(mask, r, torch.full((), -math.inf, dtype=r.dtype)).max()
    return lo.to(torch.float64), hi.to(torch.float64)


def ess(weights: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Normalized effective sample size (Σw)² / (n·Σw²) of the counted weights.

    weights: [B, T] with a bool mask [B, T], or [B] (mask optional, [B]). Returns a detached
    0-dim tensor in the dtype of `weights` (0 when nothing counts or every weight is 0).
    """
    if mask is None:
        mask = torch.ones_like(weights, dtype=torch.bool)
    check_mask(mask, "mask")
    if mask.shape != weights.shape:
        raise ShapeError(f"`weights` {tuple(weights.shape)} and `mask` {tuple(mask.shape)} differ")
    check_finite(weights, "weights", mask)
    if bool(((weights < 0) & mask).any()):
        raise ValueError("`weights` must be >= 0 for an effective sample size")
    w = weights.detach().to(torch.float64).masked_fill(~mask, 0.0)  # float64: no overflow of w²
    return scalar(ess_from_sums(w.sum(), w, int(torch.count_nonzero(mask))), weights)


def ess_from_sums(total: torch.Tensor, weights: torch.Tensor, n: int) -> torch.Tensor:
    """`ess` from Σw (already computed by the caller) and weights that are >= 0, finite and
    0 outside the mask, with n counted entries; Σw² as a squared 2-norm (no overflow)."""
    sq = torch.linalg.vector_norm(weights.detach(), 2).to(torch.float64) ** 2
    if n == 0 or float(sq) == 0.0:
        return scalar(0.0, weights)
    return scalar(total.to(torch.float64) ** 2 / (n * sq), weights)
