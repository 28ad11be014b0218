"""Shared pieces of the ratio objectives: input checks and masked inputs (`token_inputs`),
the log-ratio guard, the clip regions, and the diagnostics every objective returns. No
formula lives here: each objective's public function writes its own equation; the fast
(in-place, per-row) variants of PPO and CISPO live in `objectives.fast`.

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
see `policylab.kernels.aggregate`), fractions and counts are 0, ratio/mean is 0, and ratio/min /
ratio/max are +inf / −inf, the identities of min and max, so combining micro-batch metrics
(min of mins, max of maxes, means weighted by valid-token counts) is unaffected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from policylab.kernels.checks import (
    check_finite,
    check_mask,
    check_same_shape,
    count_true,
    expand_adv,
    float_mask,
    masked,
)
from policylab.errors import NonFiniteError, ShapeError

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


class TokenInputs(NamedTuple):
    """Checked inputs of a formula kernel, each [B, T] and exactly 0 at masked positions
    (so NaN/inf/huge values in padding never reach a value or a gradient)."""

    lp: torch.Tensor              # the learner's log-probs, differentiable
    lp_old: torch.Tensor | None   # detached (None for REINFORCE)
    adv: torch.Tensor             # detached; a [B] input broadcast over its row
    mask: torch.Tensor            # bool, True = the token counts


def check_inputs(logp, logp_old, adv, mask) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, bool]]:
    """Validate the per-token inputs of an objective (logp_old may be None for REINFORCE):
    shapes, a bool mask, no NaN/inf at counted positions (padding may hold anything).
    Returns (adv detached, logp_old detached, {role: every entry finite}); a [B] advantage
    of a row without a counted token may be NaN/inf and is returned as 0 there."""
    check_mask(mask, "mask")
    if not isinstance(logp, torch.Tensor) or logp.dim() != 2:
        raise ShapeError(f"`logp` must be a [B, T] tensor, got {getattr(logp, 'shape', type(logp))}")
    check_same_shape("logp", logp, logp_old=logp_old, mask=mask)
    if not isinstance(adv, torch.Tensor):
        raise ShapeError(f"`adv` must be a tensor [B] or [B, T], got {type(adv).__name__}")
    expand_adv(adv, logp)  # shape check: [B] or [B, T]
    adv = adv.detach()
    finite = {"logp": check_finite(logp, "logp", mask)}
    if adv.dim() == 1:
        if not bool(torch.isfinite(adv.sum())):
            # a row without a counted token may hold anything: it never reaches a counted position
            has = mask.any(dim=-1) if mask.numel() else mask.new_zeros(adv.shape)
            bad = ~torch.isfinite(adv) & has
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                raise NonFiniteError(f"`adv` has {int(bad.sum())} non-finite value(s), first at index [{i}]: {adv[i].item()}")
            adv = torch.where(has, adv, torch.zeros((), dtype=adv.dtype, device=adv.device))
        finite["adv"] = True
    else:
        finite["adv"] = check_finite(adv, "adv", mask)
    if logp_old is not None:
        logp_old = logp_old.detach()
        finite["logp_old"] = check_finite(logp_old, "logp_old", mask)
    return adv, logp_old, finite


def token_inputs(logp, logp_old, adv, mask) -> TokenInputs:
    """`check_inputs`, then every tensor masked to 0 outside `mask` (`checks.masked`)."""
    adv, logp_old, _ = check_inputs(logp, logp_old, adv, mask)
    return TokenInputs(
        lp=masked(logp, mask),
        lp_old=None if logp_old is None else masked(logp_old, mask),
        adv=masked(expand_adv(adv, logp), mask),
        mask=mask,
    )


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


def check_dual_clip(dual_clip) -> None:
    """None, or a finite number c > 1 (PPO's dual clip)."""
    if dual_clip is None:
        return
    if not _is_number(dual_clip) or dual_clip <= 1:
        raise ValueError(f"`dual_clip` must be None or a finite number > 1, got {dual_clip!r}")


def check_log_ratio_clamp(clamp, dtype: torch.dtype) -> None:
    """Positive, and exp(clamp) must be representable in `dtype`."""
    if not (_is_number(clamp) and clamp > 0):
        raise ValueError(f"`log_ratio_clamp` must be a positive finite number, got {clamp!r}")
    if dtype.is_floating_point and clamp >= math.log(torch.finfo(dtype).max):
        raise ValueError(
            f"`log_ratio_clamp`={clamp} overflows {dtype} (exp({clamp}) > {torch.finfo(dtype).max:.4g}); "
            f"use a value below {math.log(torch.finfo(dtype).max):.2f}"
        )


def guard(d: torch.Tensor, clamp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-ratio guard (module doc) for a log-ratio d that is exactly 0 at masked
    positions (so they never hit): (d clamped to ±clamp, number of hits as a 0-dim tensor
    of d's dtype). One min/max pass decides; when nothing is past the guard, d is returned
    as is (the clamp would be the identity, in value and in gradient)."""
    zero = torch.zeros((), dtype=d.dtype, device=d.device)
    if d.numel() == 0:
        return d, zero
    lo, hi = torch.aminmax(d.detach())
    if float(lo) >= -clamp and float(hi) <= clamp:
        return d, zero
    hits = torch.count_nonzero(d.detach().abs() > clamp).to(d.dtype)
    return d.clamp(-clamp, clamp), hits


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
    """The metric dict (keys `METRIC_KEYS`) over valid tokens from bool region masks; all
    detached 0-dim tensors.

    `pad_value`: the value `ratio` is known to hold at every masked position (1.0 for
    exp of a log-ratio zeroed there); it lets min / max skip the masked pass unless the
    extreme equals it. Every ratio-like quantity here is >= 0."""
    ratio = ratio.detach()
    dtype = ratio.dtype
    zero = torch.zeros((), dtype=dtype, device=ratio.device)

    def count(m: torch.Tensor | None) -> torch.Tensor:
        if m is None:
            return zero
        if m.dim() == 0:  # already a count (from `guard`)
            return m.to(dtype)
        return torch.count_nonzero(m & mask).to(dtype)

    counts = {"low_pos": count(regions.low_pos), "low_neg": count(regions.low_neg),
              "high_pos": count(regions.high_pos), "high_neg": count(regions.high_neg)}
    mf = mask_f if mask_f is not None and mask_f.dtype == dtype else float_mask(mask, dtype)
    return from_counts(counts, ratio_summary(ratio, mask, mf, pad_value=pad_value),
                       zeroed=count(zeroed), dual=count(dual), clamped=count(clamped))


def ratio_summary(ratio, mask, mask_f, *, pad_value: float | None = None) -> dict:
    """{n, ratio/min, ratio/mean, ratio/max} of a detached ratio over the counted positions
    (`mask_f` = the mask in ratio's dtype). Masked reductions without boolean indexing or
    torch.where (slow on CPU with a bool condition): the mean is a dot product with the
    float mask; an empty mask gives the identities +inf / -inf of min / max and mean 0.
    `pad_value`: see `summarize`."""
    dtype, device = ratio.dtype, ratio.device
    n_valid = int(count_true(mask, mask_f))
    n = torch.tensor(float(max(n_valid, 1)), dtype=dtype, device=device)  # empty mask: 0 / 1 = 0
    inf = torch.full((), math.inf, dtype=dtype, device=device)
    if n_valid == 0:
        return {"n": n, "ratio/min": inf, "ratio/mean": torch.zeros((), dtype=dtype, device=device), "ratio/max": -inf}
    flat, mflat = ratio.reshape(-1), mask_f.reshape(-1)
    if dtype in (torch.float32, torch.float64):
        total = torch.dot(flat, mflat)
    else:  # half precision: accumulate in float32
        total = torch.dot(flat.float(), mflat.float()).to(dtype)
    lo = hi = None
    if n_valid == mask.numel():
        lo, hi = torch.aminmax(ratio)
    elif pad_value is not None:
        lo, hi = torch.aminmax(ratio)
        if float(lo) == pad_value or float(hi) == pad_value:
            lo = hi = None  # the extreme may be padding: exact pass below
    if lo is None:
        masked = ratio * mask_f
        hi = masked.max()  # padding zeros never exceed a ratio >= 0
        lo = (masked + (1.0 - mask_f) * torch.finfo(dtype).max).min()
    return {"n": n, "ratio/min": lo, "ratio/mean": total / n, "ratio/max": hi}


def from_counts(counts: dict, summary: dict, *, zeroed, dual, clamped) -> dict:
    """The metric dict (keys `METRIC_KEYS`) from region token counts, the counts of zeroed,
    dual-clipped and guard-clamped tokens (0-dim tensors) and a `ratio_summary`."""
    n = summary["n"]
    dtype = n.dtype

    def frac(c) -> torch.Tensor:
        return c.to(dtype) / n

    return {
        "clip_frac": frac(zeroed),
        "clip_frac/low_pos": frac(counts["low_pos"]),
        "clip_frac/low_neg": frac(counts["low_neg"]),
        "clip_frac/high_pos": frac(counts["high_pos"]),
        "clip_frac/high_neg": frac(counts["high_neg"]),
        "dual_clip_frac": frac(dual),
        "ratio/min": summary["ratio/min"],
        "ratio/mean": summary["ratio/mean"],
        "ratio/max": summary["ratio/max"],
        "log_ratio_clamped": clamped.to(dtype),
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
