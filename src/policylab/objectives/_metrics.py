"""Shared machinery of the ratio objectives: input checks, the guarded policy ratio, the
clip regions, and the diagnostics every objective returns.

Policy ratio ρ = exp(lp − lp_old) (learner `logp` over the sampler-weights `logp_old`),
always computed as the exp of a log-ratio. Guard: the log-ratio is clamped to
[−log_ratio_clamp, +log_ratio_clamp] (default 20, so ρ ∈ [2.1e-9, 4.9e8]) before the exp,
so ρ and ρ·A can never overflow to inf (fp32/bf16/fp64; with fp16 log-probs pass a clamp
≤ 11). The clamp has zero gradient outside its range, so a token past the guard gets no
gradient *through ρ*. Where that changes anything (PPO/GPPO with A < 0 and ρ > e^20,
whose unclipped gradient −ρA would be astronomically large) it acts like a dual clip at
e^20; elsewhere ρ is clipped anyway or ρ < 2e-9 makes the gradient negligible. Gradients
carried by a unit carrier exp(d − sg(d)) (GPPO bounds, GSPO-token) use the unclamped d and
are unaffected. Every hit is counted in `log_ratio_clamped`: a nonzero count means
`logp_old` and `logp` disagree wildly (wrong role, stale or corrupted log-probs).

Metric keys — identical for every objective of this package; detached 0-dim tensors over
valid tokens only (n = number of valid tokens). Bounds are strict: a ratio exactly on a
bound is inside. Tokens with A = 0 belong to no sign-split region.

  clip_frac/low_pos    ρ < 1−ε_low,  A > 0. PPO takes the unclipped branch: gradient flows
                       (coefficient ρ). Not a zeroing region.
  clip_frac/low_neg    ρ < 1−ε_low,  A < 0. PPO/GSPO: gradient ZERO. GPPO: coefficient
                       1−ε_low. CISPO: weight 1−ε_low (never zero).
  clip_frac/high_pos   ρ > 1+ε_high, A > 0. PPO/GSPO: gradient ZERO. GPPO: 1+ε_high.
                       CISPO: weight 1+ε_high.
  clip_frac/high_neg   ρ > 1+ε_high, A < 0. PPO/GPPO: unclipped, coefficient ρ (unless dual
                       clip). CISPO: weight capped at 1+ε_high.
  clip_frac            fraction of valid tokens whose policy gradient this objective sets to
                       exactly zero by clipping: low_neg + high_pos + dual_clip_frac for
                       PPO and GSPO; always 0 for CISPO, GPPO and REINFORCE (they never zero
                       a token — their region fractions above still show where bounds bind).
  dual_clip_frac       A < 0 and ρ > c (PPO `dual_clip` c): gradient zero. A subset of
                       high_neg when c ≥ 1+ε_high; 0 when the objective has no dual clip.
  ratio/min|mean|max   ρ over valid tokens (GSPO: the sequence ratio s_i repeated on each of
                       its valid tokens; REINFORCE: its detached weight, 1 without one).
                       Healthy: mean ≈ 1, min/max near the clip range.
  log_ratio_clamped    number of valid tokens whose log-ratio hit the guard (should be 0).

For CISPO without a lower bound (eps_low=None) the two low_* fractions are 0.

A mask with no valid token is legal (a micro-batch whose sequences are all masked out): the
loss matrix is all 0 (so under a shared normalizer the micro-batch contributes exactly 0,
see `policylab.aggregate`), fractions and counts are 0, ratio/mean is 0, and ratio/min /
ratio/max are +inf / −inf, the identities of min and max, so combining micro-batch metrics
(min of mins, max of maxes, means weighted by valid-token counts) is unaffected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._checks import check_finite, check_mask, check_same_shape, expand_adv, zero_outside
from ..errors import ShapeError

DEFAULT_LOG_RATIO_CLAMP = 20.0

METRIC_KEYS = (
    "clip_frac",
    "clip_frac/low_pos",
    "clip_frac/low_neg",
    "clip_frac/high_pos",
    "clip_frac/high_neg",
    "dual_clip_frac",
    "ratio/min",
    "ratio/mean",
    "ratio/max",
    "log_ratio_clamped",
)


@dataclass(frozen=True)
class TokenBatch:
    """Checked inputs. Entries at masked positions are replaced by 0 (so NaN/inf in padding
    never reach a value or a gradient); `logp_old` and `adv` are detached."""

    logp: torch.Tensor             # [B, T] differentiable
    logp_old: torch.Tensor | None  # [B, T] detached
    adv: torch.Tensor              # [B, T] detached (a [B] input is broadcast)
    mask: torch.Tensor             # [B, T] bool, True = counts
    mask_f: torch.Tensor | None = None  # the mask as logp's dtype (for fast masking products)


def prepare(logp, logp_old, adv, mask, *, zero_adv: bool = True) -> TokenBatch:
    """Validate the per-token inputs of an objective (logp_old may be None for REINFORCE).
    `zero_adv=False` (a caller that reads only its own per-sequence advantages) leaves
    `adv` as the broadcast, unzeroed [B, T] view: one [B, T] product fewer."""
    check_mask(mask, "mask")
    if not isinstance(logp, torch.Tensor) or logp.dim() != 2:
        raise ShapeError(f"`logp` must be a [B, T] tensor, got {getattr(logp, 'shape', type(logp))}")
    check_same_shape("logp", logp, logp_old=logp_old, mask=mask)
    if not isinstance(adv, torch.Tensor):
        raise ShapeError(f"`adv` must be a tensor [B] or [B, T], got {type(adv).__name__}")
    adv = expand_adv(adv, logp)
    check_finite(logp, "logp", mask)
    check_finite(adv, "adv", mask)
    mf = mask.to(logp.dtype)
    if logp_old is not None:
        check_finite(logp_old, "logp_old", mask)
        logp_old = zero_outside(logp_old.detach(), mask, mf if logp_old.dtype == logp.dtype else None)
    adv = adv.detach()
    if zero_adv:
        adv = zero_outside(adv, mask, mf if adv.dtype == logp.dtype else None)
    return TokenBatch(zero_outside(logp, mask, mf), logp_old, adv, mask, mf)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_eps(eps_low, eps_high, *, allow_no_low: bool = False) -> None:
    """eps_low in [0, 1) (lower bound 1−eps_low > 0), eps_high ≥ 0, both finite numbers.

    With `allow_no_low` (CISPO), eps_low may be None (no lower bound) or any value ≥ 0
    (≥ 1 puts the lower bound at or below 0, i.e. no effective bound)."""
    if allow_no_low:
        if eps_low is not None and not (_is_number(eps_low) and eps_low >= 0):
            raise ValueError(f"`eps_low` must be None (no lower bound) or a finite number >= 0, got {eps_low!r}")
    elif not (_is_number(eps_low) and 0 <= eps_low < 1):
        raise ValueError(f"`eps_low` must be a number in [0, 1) (lower bound 1 - eps_low > 0), got {eps_low!r}")
    if not (_is_number(eps_high) and eps_high >= 0):
        raise ValueError(f"`eps_high` must be a finite number >= 0, got {eps_high!r}")


def check_log_ratio_clamp(clamp, dtype: torch.dtype) -> None:
    """Positive, and exp(clamp) must be representable in `dtype`."""
    if not (_is_number(clamp) and clamp > 0):
        raise ValueError(f"`log_ratio_clamp` must be a positive finite number, got {clamp!r}")
    if dtype.is_floating_point and clamp >= math.log(torch.finfo(dtype).max):
        raise ValueError(
            f"`log_ratio_clamp`={clamp} overflows {dtype} (exp({clamp}) > {torch.finfo(dtype).max:.4g}); "
            f"use a value below {math.log(torch.finfo(dtype).max):.2f}"
        )


def guarded_log_ratio(logp, logp_old, mask, clamp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(clamped lp − lp_old, bool hits on valid tokens). Zero gradient past the clamp."""
    d = logp - logp_old
    hit = (d.detach().abs() > clamp) & mask
    return d.clamp(-clamp, clamp), hit


def unit_carrier(d: torch.Tensor) -> torch.Tensor:
    """exp(d − sg(d)): value exactly 1, gradient ∂d (attaches a constant to the lp path)."""
    return torch.exp(d - d.detach())


@dataclass(frozen=True)
class Regions:
    """Detached bool [B, T] masks (valid tokens only) of the four clip regions."""

    low_pos: torch.Tensor
    low_neg: torch.Tensor
    high_pos: torch.Tensor
    high_neg: torch.Tensor


def clip_regions(ratio, adv, mask, eps_low: float | None, eps_high: float) -> Regions:
    """Regions of a (detached) ratio against [1−eps_low, 1+eps_high], split by sign of A.
    Strict inequalities; eps_low=None means no lower bound (empty low regions)."""
    ratio, adv = ratio.detach(), adv.detach()
    pos, neg = (adv > 0) & mask, (adv < 0) & mask
    high = ratio > 1.0 + eps_high
    low = ratio < 1.0 - eps_low if eps_low is not None else torch.zeros_like(mask)
    return Regions(low & pos, low & neg, high & pos, high & neg)


def summarize(ratio, mask, regions: Regions, *, zeroed, dual=None, clamped=None, mask_f=None,
              pad_value: float | None = None) -> dict:
    """The metric dict (keys `METRIC_KEYS`) over valid tokens; all detached 0-dim tensors.

    `pad_value`: the value `ratio` is known to hold at every masked position (1.0 for
    exp of a log-ratio zeroed there); it lets min / max skip the masked pass unless the
    extreme equals it. Every ratio-like quantity here is >= 0."""
    ratio = ratio.detach()
    dtype, device = ratio.dtype, ratio.device
    zero = torch.zeros((), dtype=dtype, device=device)
    n_valid = int(torch.count_nonzero(mask))
    n = torch.tensor(float(max(n_valid, 1)), dtype=dtype, device=device)  # empty mask: counts 0, 0 / 1 = 0

    def count(m: torch.Tensor | None) -> torch.Tensor:
        return zero if m is None else torch.count_nonzero(m & mask).to(dtype)

    # masked reductions without boolean indexing or torch.where (slow on CPU with a bool
    # condition); an empty mask gives the identities +inf / -inf of min / max, mean 0
    inf = torch.full((), math.inf, dtype=dtype, device=device)
    mf = mask_f if mask_f is not None and mask_f.dtype == dtype else mask.to(dtype)
    masked = zero_outside(ratio, mask, mf)
    mean = masked.sum() / n
    lo = hi = None
    if n_valid == 0:
        lo, hi = inf, -inf
    elif n_valid == mask.numel():
        lo, hi = torch.aminmax(ratio)
    elif pad_value is not None:
        lo, hi = torch.aminmax(ratio)
        if float(lo) == pad_value or float(hi) == pad_value:
            lo = hi = None  # the extreme may be padding: exact pass below
    if lo is None:
        hi = masked.max()  # padding zeros never exceed a ratio >= 0
        lo = (masked + (1.0 - mf) * torch.finfo(dtype).max).min()
    return {
        "clip_frac": count(zeroed) / n,
        "clip_frac/low_pos": count(regions.low_pos) / n,
        "clip_frac/low_neg": count(regions.low_neg) / n,
        "clip_frac/high_pos": count(regions.high_pos) / n,
        "clip_frac/high_neg": count(regions.high_neg) / n,
        "dual_clip_frac": count(dual) / n,
        "ratio/min": lo,
        "ratio/mean": mean,
        "ratio/max": hi,
        "log_ratio_clamped": count(clamped),
    }


def summarize_rows(ratio: torch.Tensor, n_valid: torch.Tensor, adv: torch.Tensor, eps_low: float,
                   eps_high: float, *, clamped: torch.Tensor) -> dict:
    """`summarize` for a ratio and an advantage that are constant over each row's valid
    tokens (sequence-level objectives: GSPO's s_i and A_i), from per-row values [B] and the
    rows' valid-token counts [B]: every token-level count is a row flag times its count, so
    no [B, T] tensor is built. Same keys and conventions as `summarize`, with the PPO
    zeroing regions (low_neg + high_pos)."""
    ratio, adv = ratio.detach(), adv.detach()
    dtype, device = ratio.dtype, ratio.device
    w = n_valid.to(dtype)
    has = n_valid > 0
    n = w.sum().clamp(min=1)
    pos, neg = (adv > 0) & has, (adv < 0) & has
    high = ratio > 1.0 + eps_high
    low = ratio < 1.0 - eps_low

    def count(m: torch.Tensor) -> torch.Tensor:
        return (m.to(dtype) * w).sum()

    inf = torch.full((), math.inf, dtype=dtype, device=device)
    if bool(has.any()):
        lo = torch.where(has, ratio, inf).min()
        hi = torch.where(has, ratio, -inf).max()
    else:
        lo, hi = inf, -inf
    zero = torch.zeros((), dtype=dtype, device=device)
    return {
        "clip_frac": count((low & neg) | (high & pos)) / n,
        "clip_frac/low_pos": count(low & pos) / n,
        "clip_frac/low_neg": count(low & neg) / n,
        "clip_frac/high_pos": count(high & pos) / n,
        "clip_frac/high_neg": count(high & neg) / n,
        "dual_clip_frac": zero,
        "ratio/min": lo,
        "ratio/mean": (ratio * w).sum() / n,
        "ratio/max": hi,
        "log_ratio_clamped": count(clamped & has),
    }
