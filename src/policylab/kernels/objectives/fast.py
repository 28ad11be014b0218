"""Fast paths of `ppo_clip` and `cispo`: the same values and gradients as the plain
equations in `objectives.ppo` / `objectives.cispo`, computed with fewer [B, T] buffers.

What makes them fast (on CPU, where a bool [B, T] select or a fresh allocation costs
about as much as the arithmetic):

* `TokenBatch` builds the zeroed inputs lazily, and the masked log-ratio with one product
  by the float mask written in place (no zeroed copies when every input is finite);
* the ratio is exponentiated in place in the log-ratio's buffer;
* with advantages given per sequence [B] (GRPO and every group method), PPO's min/clip pair
  is a one-sided clamp per row and CISPO's weight is built in place in the ratio's buffer;
  the clip regions are counted from per-row sums (`band_counts`), with no bool [B, T] mask.

These are what the trainer runs (the `fast=True` default of both kernels). Their fp64
equality with the plain kernels — value, gradient and every metric, with NaN/inf/huge
values at masked positions and ratios exactly on 1 − ε_low and 1 + ε_high — is pinned by
tests/kernels/objectives/test_objective_fast_paths.py. Inputs are validated by the public
function (`check_eps`, ...) before these run.
"""

from __future__ import annotations

import math
from functools import cached_property

import torch

from policylab.kernels.checks import float_mask, zero_outside
from policylab.kernels.objectives.common import (
    check_inputs,
    clip_regions,
    from_counts,
    guard,
    ratio_summary,
    summarize,
)


class TokenBatch:
    """Checked inputs of an objective. `logp_old` and `adv` are detached. The zeroed
    tensors (`logp`, `logp_old`, `adv` [B, T], entries at masked positions replaced by 0 so
    NaN/inf in padding never reach a value or a gradient) are built on first use: a kernel
    that only needs the masked log-ratio and per-row advantages never pays for them."""

    def __init__(self, logp, logp_old, adv, mask, finite: dict[str, bool]):
        self._logp, self._logp_old, self._adv, self._finite = logp, logp_old, adv, finite
        self.mask = mask
        self.mask_f = float_mask(mask, logp.dtype)  # [B, T] 0/1 in logp's dtype
        # advantages given per sequence [B] (None when they are per token)
        self.adv_row = adv if adv.dim() == 1 else None

    def _zeroed(self, t, name):
        mf = self.mask_f if t.dtype == self.mask_f.dtype else None
        return zero_outside(t, self.mask, mf, finite=self._finite[name])

    @cached_property
    def logp(self) -> torch.Tensor:
        """[B, T] differentiable, 0 at masked positions."""
        return self._zeroed(self._logp, "logp")

    @cached_property
    def logp_old(self) -> torch.Tensor:
        """[B, T] detached, 0 at masked positions."""
        return self._zeroed(self._logp_old, "logp_old")

    @cached_property
    def adv(self) -> torch.Tensor:
        """[B, T] detached (a [B] input broadcast over the row), 0 at masked positions."""
        if self.adv_row is not None:
            r = self.adv_row.unsqueeze(-1)
            return r * (self.mask_f if r.dtype == self.mask_f.dtype else float_mask(self.mask, r.dtype))
        return self._zeroed(self._adv, "adv")

    @property
    def logp_for_product(self) -> torch.Tensor:
        """`logp` itself when every entry is finite (for a caller that multiplies it by a
        factor that is 0 at masked positions: value and gradient are 0 there), else the
        zeroed `logp`, so NaN/inf in padding never meet that product."""
        return self._logp if self._finite["logp"] else self.logp

    def log_ratio(self) -> torch.Tensor:
        """lp − lp_old at the counted positions, exactly 0 elsewhere; differentiable in lp
        only. With finite inputs one product by the float mask, no zeroed copies."""
        if self._finite["logp"] and self._finite["logp_old"]:
            return (self._logp - self._logp_old).mul_(self.mask_f)  # in place on the fresh difference
        return self.logp - self.logp_old


def prepare(logp, logp_old, adv, mask) -> TokenBatch:
    """`common.check_inputs`, kept lazy (see `TokenBatch`)."""
    adv, logp_old, finite = check_inputs(logp, logp_old, adv, mask)
    return TokenBatch(logp, logp_old, adv, mask, finite)


def band_counts(ratio, adv_row, lower: float | None, upper: float) -> dict:
    """Token counts of the four clip regions for advantages given per sequence, without a
    bool [B, T] mask: {low_pos, low_neg, high_pos, high_neg} as 0-dim tensors of ratio's
    dtype (float32 for half precision).

    ratio: detached [B, T], exactly 1 at masked positions (exp of a log-ratio zeroed
    there), and lower <= 1 <= upper, so a masked position is never outside the band.
    adv_row: [B]. Strict bounds (a ratio on a bound is inside); lower=None: no lower bound.
    How: sign(ρ − clip(ρ)) is +1 above the band, −1 below, 0 inside; its row sum is
    (#above − #below) and the row sum of its absolute value (#above + #below)."""
    if (lower is not None and lower > 1.0) or upper < 1.0:
        raise ValueError(f"band_counts needs lower <= 1 <= upper, got [{lower}, {upper}]")
    r = ratio if ratio.dtype in (torch.float32, torch.float64) else ratio.float()
    s = r.clamp(min=lower, max=upper)
    torch.sub(r, s, out=s).sign_()  # one [B, T] buffer
    net = s.sum(dim=-1)             # above − below, per row
    both = s.abs_().sum(dim=-1)     # above + below, per row
    above, below = (both + net) * 0.5, (both - net) * 0.5
    pos, neg = (adv_row > 0).to(r.dtype), (adv_row < 0).to(r.dtype)
    return {"low_pos": torch.dot(below, pos), "low_neg": torch.dot(below, neg),
            "high_pos": torch.dot(above, pos), "high_neg": torch.dot(above, neg)}


def row_flag_count(ratio, threshold: float, adv_row) -> torch.Tensor:
    """Number of tokens with ratio > threshold (strict) in rows with A < 0 (the dual-clip
    region), for a ratio that is exactly 1 at masked positions and threshold >= 1."""
    r = ratio if ratio.dtype in (torch.float32, torch.float64) else ratio.float()
    above = (r - threshold).clamp_(min=0).sign_().sum(dim=-1)
    return torch.dot(above, (adv_row < 0).to(r.dtype))


def ppo_clip_fast(logp, logp_old, adv, mask, *, eps_low: float, eps_high: float, dual_clip,
                  log_ratio_clamp: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`objectives.ppo_clip` (checked arguments), fast path: see the module doc."""
    tb = prepare(logp, logp_old, adv, mask)
    log_ratio, clamped = guard(tb.log_ratio(), log_ratio_clamp)
    ratio = log_ratio.exp_()  # in place on the fresh log-ratio; exactly 1 at masked positions
    lower, upper = 1.0 - eps_low, 1.0 + eps_high
    if tb.adv_row is not None:
        return _ppo_rows(ratio, tb, lower, upper, dual_clip, clamped, logp.dtype)
    reg = clip_regions(ratio, tb.adv, tb.mask, eps_low, eps_high)
    # the ratio each token's surrogate actually uses: a constant in the zeroing regions
    eff = torch.where(reg.high_pos, upper, torch.where(reg.low_neg, lower, ratio))
    dual = None
    if dual_clip is not None:
        dual = (tb.adv < 0) & tb.mask & (ratio.detach() > dual_clip)
        eff = torch.where(dual, float(dual_clip), eff)
    loss = (-eff * tb.adv).to(logp.dtype)  # A is 0 outside the mask and eff finite: 0 there
    zeroed = reg.low_neg | reg.high_pos
    if dual is not None:
        zeroed = zeroed | dual
    metrics = summarize(ratio, tb.mask, reg, zeroed=zeroed, dual=dual, clamped=clamped, mask_f=tb.mask_f, pad_value=1.0)
    return loss, metrics


def _ppo_rows(ratio, tb, lower: float, upper: float, dual_clip, clamped, dtype):
    """`ppo_clip_fast` for advantages given per sequence: the min/clip pair becomes a
    one-sided clamp per row (A > 0: min(ρ, 1+ε_high); A < 0: max(ρ, 1−ε_low), then min(·, c)
    with a dual clip). A clamp passes the gradient on its bound, so a ratio exactly on a
    bound is inside, as in the plain kernel; region counts come from per-row sums."""
    a = tb.adv_row
    inf = torch.full((), math.inf, dtype=ratio.dtype, device=ratio.device)
    pos, neg = a > 0, a < 0
    hi = torch.where(pos, torch.full_like(inf, upper), inf)
    if dual_clip is not None:
        hi = torch.where(neg, torch.full_like(inf, float(dual_clip)), hi)
    lo = torch.where(neg, torch.full_like(inf, lower), -inf)
    # −eff·A, built in place in the clamp's output (the clamp's backward needs its input,
    # not its output); 0 at masked positions (eff is finite there)
    loss = ratio.clamp(lo.unsqueeze(-1), hi.unsqueeze(-1)).mul_((-a).unsqueeze(-1)).mul_(tb.mask_f)
    r = ratio.detach()
    counts = band_counts(r, a, lower, upper)
    dual = torch.zeros((), dtype=counts["low_pos"].dtype) if dual_clip is None else row_flag_count(r, dual_clip, a)
    summary = ratio_summary(r, tb.mask, tb.mask_f, pad_value=1.0)
    metrics = from_counts(counts, summary, zeroed=counts["low_neg"] + counts["high_pos"] + dual,
                          dual=dual, clamped=clamped)
    return loss.to(dtype), metrics


def cispo_fast(logp, logp_old, adv, mask, *, eps_low: float | None, eps_high: float,
               log_ratio_clamp: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`objectives.cispo` (checked arguments), fast path: see the module doc."""
    tb = prepare(logp, logp_old, adv, mask)
    log_ratio, clamped = guard(tb.log_ratio().detach(), log_ratio_clamp)  # w is detached: no graph
    ratio = log_ratio.exp_()  # exactly 1 at masked positions
    lower = None if eps_low is None else 1.0 - eps_low
    if tb.adv_row is not None:
        summary = ratio_summary(ratio, tb.mask, tb.mask_f, pad_value=1.0)
        counts = band_counts(ratio, tb.adv_row, lower, 1.0 + eps_high)
        zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
        # −w·A on the counted positions (0 elsewhere), built in place in the ratio's buffer
        coef = ratio.clamp_(min=lower, max=1.0 + eps_high).mul_((-tb.adv_row).unsqueeze(-1)).mul_(tb.mask_f)
        loss = (coef * tb.logp_for_product).to(logp.dtype)
        return loss, from_counts(counts, summary, zeroed=zero, dual=zero, clamped=clamped)
    weight = ratio.clamp(min=lower, max=1.0 + eps_high)
    loss = (-weight * tb.adv * tb.logp).to(logp.dtype)  # A and lp are 0 outside the mask, weight finite
    reg = clip_regions(ratio, tb.adv, tb.mask, eps_low, eps_high)
    metrics = summarize(ratio, tb.mask, reg, zeroed=None, clamped=clamped, mask_f=tb.mask_f, pad_value=1.0)
    return loss, metrics
