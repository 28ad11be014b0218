"""Diagnostics for a pair of log-prob tensors and for importance weights.

`mismatch_stats(logp_a, logp_b, mask)` describes how far distribution a is from the
distribution b that sampled the tokens (typically a = `logp_old`, the training engine, and
b = `logp_behavior`, the rollout engine, at the same weights). With r = lp_a - lp_b on the
counted tokens (samples y ~ b), and d = −r = log(b/a) fed to the kernels' one KL-estimator
table (`kl.kl_estimate`, J. Schulman, "Approximating KL Divergence", 2020; no arXiv id):

    kl_k1          mean(k1(d)) = mean(-r)            unbiased estimate of KL(b || a), can be < 0
    kl_k3          mean(k3(d)) = mean(e^r - 1 - r)   unbiased, always >= 0, estimate of KL(b || a)
    abs_dlogp_mean mean |r|,  abs_dlogp_max  max |r|
    frac_far       fraction of tokens with |e^r - 1| > `far_threshold` (strict; default 0.2)
    ratio_min / ratio_mean / ratio_max   of e^r, before any clamping (computed in float64,
                   so they can only overflow past ~1e308; log_ratio_min/max are also given)
    n_tokens       number of counted tokens (every statistic is 0 when it is 0)

`ess(weights, mask)`: normalized effective sample size (Σw)² / (n·Σw²) over the n counted
entries, in (0, 1]; 1 = all weights equal, 1/n = one weight carries everything. 0 if every
weight is 0. Weights must be >= 0 and finite.

Healthy engine mismatch: kl_k3 around 1e-4 or less, ratio within [0.5, 2], frac_far ~ 0.

Elementwise work runs in float64 for float64 input or when max r > 80 (e^r would overflow
float32), else in float32 (a diagnostic: ~1e-7 relative error per term); sums in float64.
`fast=True` (the default) computes the same numbers with one [B, T] temporary
(`corrections.fast.log_ratio_stats_fast`), equal in fp64 (tests/kernels/corrections/
test_correction_fast_paths.py).
"""

from __future__ import annotations

import torch

from policylab.errors import ShapeError
from policylab.kernels.checks import check_finite, check_mask
from policylab.kernels.corrections.common import (
    STAT_KEYS,
    check_roles,
    ess_from_sums,
    masked_log_ratio,
    masked_min_max,
    scalar,
    stats_dict,
)
from policylab.kernels.corrections.fast import log_ratio_stats_fast
from policylab.kernels.kl import kl_estimate


def mismatch_stats(
    logp_a: torch.Tensor,
    logp_b: torch.Tensor,
    mask: torch.Tensor,
    *,
    far_threshold: float = 0.2,
    fast: bool = True,
) -> dict[str, torch.Tensor]:
    """Mismatch statistics of a against the sampling distribution b (see module doc).

    logp_a, logp_b, mask: [B, T]; returns detached 0-dim tensors in the dtype of logp_a.
    """
    check_roles("mismatch_stats", mask, logp_a=logp_a, logp_b=logp_b)
    r = masked_log_ratio(logp_a.detach(), logp_b.detach(), mask)
    return log_ratio_stats(r, mask, logp_a, far_threshold=far_threshold, fast=fast)


def log_ratio_stats(r: torch.Tensor, mask: torch.Tensor, like: torch.Tensor, *,
                    far_threshold: float = 0.2, n: int | None = None, fast: bool = True) -> dict[str, torch.Tensor]:
    """`mismatch_stats` from a log-ratio r = lp_a - lp_b that is exactly 0 outside the
    mask (as `masked_log_ratio` makes it), for corrections that already computed it
    (`n` = number of counted positions, if the caller has it). Zeros outside the mask add
    nothing to any sum and are never "far"."""
    if fast:
        return log_ratio_stats_fast(r, mask, like, far_threshold=far_threshold, n=n)
    if n is None:
        n = int(torch.count_nonzero(mask))
    if n == 0:
        return {k: scalar(0.0, like) for k in STAT_KEYS}
    f64 = torch.float64
    work = r.detach() if r.dtype == f64 else r.detach().float()
    lo, hi = masked_min_max(work, mask, n)
    if work.dtype != f64 and float(hi) > 80.0:
        work = work.to(f64)  # e^r would overflow float32
    d = -work  # log(b / a): the sampler's log-prob over the other's, as the KL table reads it
    ratio_minus_1 = torch.expm1(work)  # e^r − 1, accurate near 0
    far = torch.count_nonzero(ratio_minus_1.abs() > far_threshold).to(f64)  # |e^r − 1| > threshold
    return stats_dict(kl_estimate(d, "k1").sum().to(f64) / n, kl_estimate(d, "k3").sum().to(f64) / n,
                      work.abs().sum().to(f64) / n, far / n, ratio_minus_1.sum().to(f64) / n, lo, hi, n, like)


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
