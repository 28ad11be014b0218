"""Fast paths of `icepop`, `tis` and the mismatch diagnostics: the same weights and
metrics as the plain equations in `corrections.icepop` / `corrections.tis` /
`corrections.diagnostics`, with at most one or two [B, T] buffers (each can cost a
page-faulting allocation at the sizes the trainer sees: on CPU about as much as the
arithmetic). How:

* the weights are built in place in the buffer of the masked log-ratio (it is not needed
  afterwards), and the statistics' temporary is reused for the weights;
* IcePop's band test is sign(k − clip(k, α, β)) (+1 above, −1 below, 0 inside), so its two
  sums give both counts without a bool [B, T] mask;
* the diagnostics take |r|, then expm1(r), then expm1(r) − r in one buffer.

These are what the trainer runs (the `fast=True` default). Their fp64 equality with the
plain kernels (weights and every metric, exactly; NaN/inf at masked positions; ratios
exactly on the band's bounds and on the cap) is pinned by
tests/kernels/corrections/test_correction_fast_paths.py. Arguments are validated by the
public function before these run.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import zero_outside_
from policylab.kernels.corrections.common import (
    STAT_KEYS,
    ess_from_sums,
    fraction,
    masked_log_ratio,
    masked_min_max,
    prefixed,
    scalar,
    stats_dict,
)


def band_sides(x: torch.Tensor, low: float, high: float, mask: torch.Tensor | None = None, *,
               out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where a detached `x` [B, T] lies against the band [low, high] (bounds inclusive):
    (side [B, T] = +1 above, −1 below, 0 inside or where the bool `mask` is False; number above;
    number below). No bool [B, T] mask and at most one [B, T] allocation (none with a
    fitting `out` buffer): sign(x − clip(x)), two sums (side² = |side| for values in
    {−1, 0, 1})."""
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()  # counts in a half-precision sum would be inexact past 256
    fits = out is not None and out.dtype == x.dtype and out.shape == x.shape
    side = torch.clamp(x, low, high, out=out) if fits else x.clamp(low, high)
    torch.sub(x, side, out=side).sign_()
    if mask is not None:
        zero_outside_(side, mask)
    flat = side.view(-1)
    net = flat.sum()  # above − below
    both = torch.dot(flat, flat)  # above + below
    return side, (both + net) * 0.5, (both - net) * 0.5


def band_weight(log_k: torch.Tensor, mask: torch.Tensor, low: float, high: float, *,
                out: torch.Tensor | None = None, scratch: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(M(k) [B, T] with k = exp(log k), 0 outside the band and where the mask is False;
    number of counted tokens above the band; number below) from a masked log engine ratio.
    The weights are written into `out` and the band sides into `scratch` when given
    (buffers shaped like log_k that the caller gives up, e.g. log_k itself for `scratch`)."""
    # k, with log k capped just above log(high): every k above the band stays above it and
    # finite (an inf would turn the product below into NaN); values in or below the band
    # are untouched
    cap = math.log(high) + 1.0 if math.isfinite(high) else math.inf
    w = torch.clamp(log_k, max=cap, out=out).exp_() if out is not None else log_k.clamp(max=cap).exp_()
    # side: +1 above the band, −1 below, 0 inside and at masked positions
    side, n_high, n_low = band_sides(w, low, high, mask, out=scratch)
    # M(k) = k inside the band, 0 outside: k · (1 − |side|) · mask
    zero_outside_(w.mul_(side.abs_().neg_().add_(1.0)), mask)
    return w, n_high, n_low


def icepop_fast(logp_old, logp_behavior, mask, *, low: float, high: float,
                finite: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`corrections.icepop` (checked arguments; `finite` from `check_roles`), fast path."""
    n = int(torch.count_nonzero(mask))
    log_k = masked_log_ratio(logp_old.detach(), logp_behavior.detach(), mask, finite=finite)
    w = torch.empty_like(log_k)  # the statistics' temporary, then the weights
    stats = log_ratio_stats_fast(log_k, mask, log_k, n=n, scratch=w)
    w, n_high, n_low = band_weight(log_k, mask, low, high, out=w, scratch=log_k)
    del log_k  # its buffer held the band sides
    total = w.sum()
    metrics = {
        "frac_masked": fraction(n_low + n_high, n, w),
        "frac_masked_low": fraction(n_low, n, w),
        "frac_masked_high": fraction(n_high, n, w),
        "weight_mean": fraction(total, n, w),
        "ess": ess_from_sums(total, w, n),
        **stats,
    }
    return w, prefixed("icepop", metrics)


def tis_fast(logp_old, logp_behavior, mask, *, cap: float,
             finite: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`corrections.tis` (checked arguments; `finite` from `check_roles`), fast path."""
    log_cap = math.log(cap)
    n = int(torch.count_nonzero(mask))
    log_k = masked_log_ratio(logp_old.detach(), logp_behavior.detach(), mask, finite=finite)
    stats = log_ratio_stats_fast(log_k, mask, log_k, n=n)
    if float(stats["log_ratio_max"]) <= log_cap:
        capped = 0.0  # nothing above the cap (the common case): no counting pass
    else:  # log k > log C, strictly; padding holds log k = 0, counted only if C < 1
        capped = torch.count_nonzero((log_k > log_cap) & mask)
    # min(k, C) = exp(min(log k, log C)), built in log k's buffer, 0 where the mask is False
    w = zero_outside_(log_k.clamp_(max=log_cap).exp_(), mask)
    total = w.sum()
    metrics = {
        "frac_capped": fraction(capped, n, w),
        "weight_mean": fraction(total, n, w),
        "ess": ess_from_sums(total, w, n),
        **stats,
    }
    return w, prefixed("tis", metrics)


def log_ratio_stats_fast(r: torch.Tensor, mask: torch.Tensor, like: torch.Tensor, *,
                         far_threshold: float = 0.2, n: int | None = None,
                         scratch: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """`diagnostics.log_ratio_stats` with one float [B, T] temporary (written into
    `scratch`, a buffer shaped like r that the caller reuses afterwards, when its dtype
    fits): |r| first, then expm1(r), then expm1(r) − r."""
    if n is None:
        n = int(torch.count_nonzero(mask))
    if n == 0:
        return {k: scalar(0.0, like) for k in STAT_KEYS}
    f64 = torch.float64
    work = r.detach()
    work = work if work.dtype == f64 else work.float()
    lo, hi = masked_min_max(work, mask, n)
    if work.dtype != f64 and float(hi) > 80.0:
        work = work.to(f64)  # e^r would overflow float32
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
    return stats_dict(-sum_r / n, k3, sum_abs / n, far / n, sum_e / n, lo, hi, n, like)
