"""Sequence-level engine ratios and MIS (sequence-level masked / truncated IS).

With d_t = lp_old,t - lp_mu,t on the counted tokens of sequence i (|y_i| of them):

    product   log R_i = Σ_t m·d_t              R_i = π_old(y_i) / μ(y_i), the sequence
                                               likelihood ratio (grows with length)
    geomean   log R_i = Σ_t m·d_t / |y_i|      per-token geometric mean (length-normalized)

Both are computed as log values in float64; a long sequence gives log R = -1000 (finite),
never an underflowed 0 whose log is -inf, nor a NaN. A plain value exp(log R) is returned
too, through an explicit guard clamp of log R to [-log_clamp, log_clamp] whose hits are
reported (`clamped`); the MIS decisions below are made on the unclamped log values.

    mis, mode "mask":      w_i = R_i if low <= R_i <= high (inclusive), else 0
    mis, mode "truncate":  w_i = min(R_i, high) if R_i >= low, else 0
                           (low = 0 gives plain sequence-level TIS)

Used as sequence weights: loss_{i,t} = sg(w_i) · loss^base_{i,t} (w[:, None] broadcasts).

Paper: the sequence-level masked IS of J. Liu, Y. Li et al., "When Speed Kills Stability:
Demystifying RL Collapse from the Training-Inference Mismatch" (blog, 2025; no arXiv id), where token-level masking is attributed to IcePop
(arXiv:2510.18855). Unconfirmed: the exact published band, whether their geometric
variant masks or rejects, and the name "MIS"; `low`, `high`, `kind` are required.
Library decisions: a sequence with no counted token has log R = 0 (R = 1) and weight 1
if 1 is in the band; `log_clamp` only affects the convenience value `ratio`.
Detached: the weights (from `logp_old` and `logp_behavior` only). No equation number: a
blog without numbered equations was the source. Deviations: the library decisions above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from policylab.kernels.corrections.common import (
    check_band,
    check_positive,
    check_roles,
    masked_log_ratio,
    prefixed,
    scalar,
)
from policylab.kernels.corrections.diagnostics import ess, mismatch_stats


@dataclass(frozen=True)
class SeqRatio:
    """A sequence ratio in log space plus a guarded plain value. All [B]."""

    log_ratio: torch.Tensor  # exact (float64 accumulation, cast back to the input dtype)
    ratio: torch.Tensor  # exp(clamp(log_ratio, -log_clamp, log_clamp))
    clamped: torch.Tensor  # bool: the guard changed this entry


def seq_log_ratio_sum(log_num: torch.Tensor, log_den: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_t m·(log_num - log_den) per sequence, accumulated in float64, returned in float64
    [B]. Inputs [B, T]; padding never enters (masked to 0 before the subtraction)."""
    d = masked_log_ratio(log_num.to(torch.float64), log_den.to(torch.float64), mask)
    return d.sum(-1)


def guarded_ratio(log_r64: torch.Tensor, like: torch.Tensor, log_clamp: float) -> SeqRatio:
    clamped = log_r64.abs() > log_clamp
    value = torch.exp(log_r64.clamp(-log_clamp, log_clamp))
    return SeqRatio(log_r64.to(like.dtype), value.to(like.dtype), clamped)


def seq_ratio_product(
    log_num: torch.Tensor, log_den: torch.Tensor, mask: torch.Tensor, *, log_clamp: float = 30.0
) -> SeqRatio:
    """Sequence likelihood ratio Π_t (num/den), as log Σ_t m·(log_num - log_den) [B]."""
    log_clamp = check_positive("log_clamp", log_clamp)
    return guarded_ratio(seq_log_ratio_sum(log_num, log_den, mask), log_num, log_clamp)


def seq_ratio_geomean(
    log_num: torch.Tensor, log_den: torch.Tensor, mask: torch.Tensor, *, log_clamp: float = 30.0
) -> SeqRatio:
    """Geometric mean of the token ratios, log = Σ_t m·(log_num - log_den) / |y_i| [B]
    (|y_i| = counted tokens; 0 for an empty sequence)."""
    log_clamp = check_positive("log_clamp", log_clamp)
    n = mask.sum(-1).to(torch.float64)
    log_r = seq_log_ratio_sum(log_num, log_den, mask) / n.clamp_min(1)
    return guarded_ratio(log_r, log_num, log_clamp)


def mis(
    logp_old: torch.Tensor,
    logp_behavior: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float,
    high: float,
    kind: Literal["product", "geomean"],
    mode: Literal["mask", "truncate"] = "mask",
    log_clamp: float = 30.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sequence weights from the engine ratio π_old/μ (see module doc).

    logp_old, logp_behavior, mask: [B, T]; 0 <= low < high; kind "product" | "geomean".
    Returns (weights [B] detached, use w[:, None] against [B, T]; metrics: fraction of
    sequences masked / truncated, log-ratio min/mean/max, guard hits, ESS).
    """
    check_roles("mis", mask, logp_old=logp_old, logp_behavior=logp_behavior)
    low, high = check_band(low, high)
    if kind not in ("product", "geomean"):
        raise ValueError(f"`kind` must be 'product' or 'geomean', got {kind!r}")
    if mode not in ("mask", "truncate"):
        raise ValueError(f"`mode` must be 'mask' or 'truncate', got {mode!r}")
    log_clamp = check_positive("log_clamp", log_clamp)
    # decisions on the float64 log value (no round trip through the input dtype)
    log_r = seq_log_ratio_sum(logp_old.detach(), logp_behavior.detach(), mask)  # log R_i = Σ_t m·d_t
    if kind == "geomean":
        log_r = log_r / mask.sum(-1).to(torch.float64).clamp_min(1)  # Σ_t m·d_t / |y_i|
    below = log_r < (math.log(low) if low > 0 else -math.inf)  # R_i < low
    above = log_r > math.log(high)  # R_i > high
    dropped = below | above if mode == "mask" else below  # truncate: above -> min(R, high) = high
    kept = torch.exp(log_r.clamp(max=math.log(high)))  # min(R_i, high); never overflows
    weight = torch.where(dropped, torch.zeros_like(kept), kept).to(logp_old.dtype)  # detached
    return weight, mis_metrics(log_r, weight, dropped, above, below, logp_old, logp_behavior, mask,
                               log_clamp=log_clamp)


def mis_metrics(log_r, weight, dropped, above, below, logp_old, logp_behavior, mask, *,
                log_clamp: float) -> dict[str, torch.Tensor]:
    """Metrics "mis/<name>": fractions of sequences masked / above / below the band, the
    sequence log-ratio's min / mean / max, the fraction whose plain value `exp(log R)` hit
    the guard, the weights' ESS, and the token-level engine-ratio statistics ("token_")."""
    sr = guarded_ratio(log_r, logp_old, log_clamp)
    like = weight
    metrics = {
        "frac_masked": scalar(dropped.to(torch.float64).mean(), like),
        "frac_above": scalar(above.to(torch.float64).mean(), like),
        "frac_below": scalar(below.to(torch.float64).mean(), like),
        "log_ratio_min": scalar(log_r.min(), like),
        "log_ratio_mean": scalar(log_r.mean(), like),
        "log_ratio_max": scalar(log_r.max(), like),
        "frac_guard_clamped": scalar(sr.clamped.to(torch.float64).mean(), like),
        "ess": ess(weight),
        **{f"token_{k}": v for k, v in mismatch_stats(logp_old, logp_behavior, mask).items()},
    }
    return prefixed("mis", metrics)
