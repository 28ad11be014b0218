"""Aggregation: per-token loss matrix `[B, T]` -> one scalar, with an explicit normalizer.

Objectives return a loss matrix ℓ `[B, T]`; this module is the one place where it becomes
a scalar. Notation: m = `mask` (bool `[B, T]`, True = the token counts), |y_i| = Σ_t m_it
(valid tokens of sequence i), N_tok = Σ_it m_it, N_seq = number of sequences with at least
one valid token.

Modes (formula over the whole optimizer batch):

    token_mean               Σ_it m·ℓ / N_tok
    seq_mean_token_mean      (1/N_seq) Σ_i [ Σ_t m·ℓ / |y_i| ]        (original GRPO)
    seq_mean_token_sum       Σ_it m·ℓ / N_seq
    seq_mean_token_sum_norm  Σ_it m·ℓ / (N_seq · L_norm)              (Dr. GRPO, L_norm fixed)

Length bias. Under `token_mean` every valid token carries weight 1/N_tok, so a sequence's
total weight grows with its length |y_i| (DAPO, arXiv 2503.14476, chooses this on purpose
so long responses are not under-weighted). Under `seq_mean_token_mean` every sequence
carries weight 1/N_seq and each of its tokens 1/(N_seq·|y_i|): tokens of short sequences
weigh more, so for a negative advantage the per-token penalty of a long response is diluted
and long wrong answers are penalized less (the length bias that "Understanding R1-Zero-Like
Training: A Critical Perspective", Dr. GRPO, arXiv 2503.20783, points out). Under
`seq_mean_token_sum` every token carries weight 1/N_seq whatever its sequence length (the
sum grows with length); `seq_mean_token_sum_norm` divides by the constant L_norm instead of
any length, which removes the length-dependent weighting (Dr. GRPO's fix).

Micro-batches. The denominator (N_tok, N_seq, or N_seq·L_norm) must be computed ONCE per
optimizer step over the full optimizer batch's final mask, with `normalizer(mask, mode)`,
and passed to `aggregate(..., normalizer=...)` for every micro-batch (and every rank). Each
micro-batch then returns its *local numerator* divided by that shared denominator, and the
micro-batch losses sum exactly to the full-batch loss, so the accumulated gradient does not
depend on the split. (Sequences are never split across micro-batches, so the per-sequence
1/|y_i| of `seq_mean_token_mean` is local.) With `normalizer=None` the denominator is
computed from the local mask: correct only when the micro-batch *is* the optimizer batch.

Sequences with no valid token contribute 0 to every numerator and are not counted in N_seq
(padding never enters normalizers). A mask with no valid token at all has no defined mean:
with `normalizer=None` it raises; with a positive shared normalizer it contributes exactly 0.

`seq_mean` (1/B Σ_i ℓ_i for sequence-level losses) is obtained by writing the
sequence loss ℓ_i on every valid token of sequence i and using `seq_mean_token_mean` (the
contract of `objectives.gspo`).
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite, check_mask, check_same_shape
from policylab.errors import PolicylabError, ShapeError

MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


def _check_mode(mode: str, L_norm: float | None, *, uses_L_norm: bool = True) -> None:
    """Valid mode; L_norm required and positive when this call uses it (only the
    `seq_mean_token_sum_norm` denominator does); otherwise it is ignored."""
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}")
    if uses_L_norm and mode == "seq_mean_token_sum_norm":
        if L_norm is None:
            raise ValueError("`L_norm` is required for mode 'seq_mean_token_sum_norm' (Dr. GRPO constant)")
        if isinstance(L_norm, bool) or not isinstance(L_norm, (int, float)) \
                or not math.isfinite(L_norm) or L_norm <= 0:
            raise ValueError(f"`L_norm` must be a positive finite number, got {L_norm!r}")


def _check_matrix(loss: torch.Tensor, mask: torch.Tensor) -> None:
    check_mask(mask, "mask")
    if loss.dim() != 2:
        raise ShapeError(f"`loss` must be [B, T], got shape {tuple(loss.shape)}")
    check_same_shape("loss", loss, mask=mask)


def _denominator(mask: torch.Tensor, mode: str, L_norm: float | None) -> float:
    if mode == "token_mean":
        return float(mask.sum())
    n_seq = float(mask.any(dim=-1).sum())
    return n_seq * L_norm if mode == "seq_mean_token_sum_norm" else n_seq


def normalizer(mask: torch.Tensor, mode: str, *, L_norm: float | None = None) -> float:
    """The denominator of `mode` over `mask` (bool `[B, T]`): N_tok, N_seq or N_seq·L_norm.

    Call it once per optimizer step on the full optimizer batch's final mask (after every
    filter), all-reduce-summed over ranks if data-parallel, and pass the result to
    `aggregate(..., normalizer=...)` for each micro-batch. `L_norm` is required by
    `seq_mean_token_sum_norm` and ignored by the other modes. Raises when the mask has no
    valid token (a step without data must be skipped, not taken on a zero loss).
    """
    check_mask(mask, "mask")
    if mask.dim() != 2:
        raise ShapeError(f"`mask` must be [B, T], got shape {tuple(mask.shape)}")
    _check_mode(mode, L_norm)
    return _nonzero_denominator(mask, mode, L_norm)


def _nonzero_denominator(mask: torch.Tensor, mode: str, L_norm: float | None) -> float:
    denom = _denominator(mask, mode, L_norm)
    if denom <= 0:
        raise PolicylabError(
            "`mask` has no valid token: the normalizer would be 0 (0/0 mean). "
            "Skip this optimizer step instead of stepping on an empty batch."
        )
    return denom


def _numerator(loss: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    masked = torch.where(mask, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    if mode != "seq_mean_token_mean":
        return masked.sum()
    lengths = mask.sum(dim=-1).clamp(min=1).to(loss.dtype)  # empty rows: 0 / 1 = 0
    return (masked.sum(dim=-1) / lengths).sum()


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    normalizer: float | torch.Tensor | None = None,
    L_norm: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss matrix `loss` `[B, T]` to a scalar (0-dim, dtype of `loss`).

        token_mean               Σ_it m·ℓ / N_tok
        seq_mean_token_mean      Σ_i [Σ_t m·ℓ / |y_i|] / N_seq      (empty rows add 0)
        seq_mean_token_sum       Σ_it m·ℓ / N_seq
        seq_mean_token_sum_norm  Σ_it m·ℓ / (N_seq · L_norm)

    `mask`: bool `[B, T]`, True = the token counts. Entries of `loss` at masked positions
    are ignored (NaN/inf there cannot leak; `torch.where`, not multiplication).
    `normalizer`: the denominator computed once per optimizer step by `normalizer(...)` over
    the full optimizer batch; this micro-batch's numerator is divided by it, so summing the
    micro-batch results reproduces the full-batch value and gradient exactly. It already
    contains L_norm, so `L_norm` is then ignored. `L_norm` (the Dr. GRPO constant) is used
    only by `seq_mean_token_sum_norm` and ignored by the other modes, so a trainer can pass
    one value for every mode. `normalizer=None`: the denominator is
    computed from this `mask` (single-batch convenience; raises on an all-False mask).
    """
    _check_matrix(loss, mask)
    check_finite(loss, "loss", mask)
    if normalizer is None:
        _check_mode(mode, L_norm)
        denom: float | torch.Tensor = _nonzero_denominator(mask, mode, L_norm)
    else:
        _check_mode(mode, L_norm, uses_L_norm=False)  # already inside the shared normalizer
        denom = _check_normalizer(normalizer)
    return (_numerator(loss, mask, mode) / denom).to(loss.dtype)


def _check_normalizer(value: float | torch.Tensor) -> float | torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ShapeError(f"`normalizer` must be a scalar, got shape {tuple(value.shape)}")
        if value.requires_grad:
            raise ValueError("`normalizer` must be a constant (it requires grad)")
        scalar = float(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        scalar = float(value)
    else:
        raise ValueError(f"`normalizer` must be a float or a 0-dim tensor, got {type(value).__name__}")
    if not math.isfinite(scalar) or scalar <= 0:
        raise ValueError(f"`normalizer` must be positive and finite, got {scalar}")
    return value.reshape(()) if isinstance(value, torch.Tensor) else scalar
