"""GSPO: one length-normalized importance ratio and one clip decision per response.

Paper: "Group Sequence Policy Optimization", Zheng et al. (Qwen team), arXiv 2507.18071,
objective Eq. (5) with its length-normalized sequence ratio s_i (defined right after it;
that equation's number was not re-checked); GSPO-token variant in the same paper.

    s_i = exp( (1/|y_i|) Σ_t m_it (lp_it − lp_old,it) )     (geometric mean of token ratios)
    ℓ_i = −min(s_i A_i, clip(s_i, 1−ε_low, 1+ε_high) A_i)    Eq. (5)

Unclipped gradient: ∂ℓ_i/∂lp_it = −s_i A_i / |y_i| for every valid token t of response i;
in (A_i > 0, s_i > 1+ε_high) and (A_i < 0, s_i < 1−ε_low) the whole response gets exactly
zero gradient. Padding never enters s_i (masked log-ratios are replaced by 0 and |y_i| counts
valid tokens only).

Output contract of `gspo`: the per-sequence loss ℓ_i is written on EVERY valid token of
response i (0 elsewhere). Aggregating with `seq_mean_token_mean` gives
(1/N_seq) Σ_i (1/|y_i|) Σ_t ℓ_i = (1/N_seq) Σ_i ℓ_i, the paper's objective, with the right
gradient (autograd sums the |y_i| copies, each weighted 1/|y_i|). Other modes weight ℓ_i by
length (`token_mean`: |y_i|/N_tok) and are not the paper's objective.

`gspo_token`: s_it = sg(s_i)·exp(lp_it − sg(lp_it)) (value s_i, gradient s_i ∇lp_it), per-token
advantages A_it `[B, T]`, ℓ_it = −min(s_it A_it, clip(s_it) A_it). With A_it = A_i its loss
matrix and its `seq_mean_token_mean` gradient equal `gspo`'s.

Clip range: the paper sets the left/right clipping ranges of Eq. (5) to 3e-4 and 4e-4
(confirmed through a description quoting the paper; the values are still passed
explicitly). The token-level 0.2-scale ranges are meaningless here: `eps_low` and
`eps_high` are required, with no default.

Detached: `logp_old`, `adv` (and sg(s_i) in gspo_token). Deviations: the log-ratio guard
(`log_ratio_clamp`) acts on the sequence-mean log-ratio; a response with no valid token gets
s_i = 1 and contributes nothing. Metrics are token-weighted (each valid token carries its
sequence's s_i and region), matching the paper's "fraction of clipped tokens".
Engine mismatch and MoE routing replay are not addressed here.
"""

from __future__ import annotations

import torch

from policylab.errors import ShapeError
from policylab.kernels.checks import masked
from policylab.kernels.objectives.common import (
    DEFAULT_LOG_RATIO_CLAMP,
    check_eps,
    check_log_ratio_clamp,
    clip_regions,
    summarize,
    summarize_rows,
    token_inputs,
    unit_carrier,
)


def sequence_ratio(x, clamp: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(s [B], guard hit [B] bool, token log-ratio d [B, T]) from `token_inputs`:
    s_i = exp(clamp(Σ_t m·d_it / |y_i|)), d = lp − lp_old (0 at padding), |y_i| the valid
    tokens of row i (at least 1). Differentiable through lp."""
    d = x.lp - x.lp_old
    lengths = x.mask.sum(dim=-1).clamp(min=1).to(d.dtype)
    mean_log_ratio = d.sum(dim=-1) / lengths
    hit = mean_log_ratio.detach().abs() > clamp
    return torch.exp(mean_log_ratio.clamp(-clamp, clamp)), hit, d


def sequence_adv(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A_i `[B]` from advantages `[B]` (0 for a row without a valid token) or `[B, T]` that
    must be constant over each row's valid tokens (ShapeError otherwise)."""
    has = mask.any(dim=-1)
    if adv.dim() == 1:
        return torch.where(has, adv, torch.zeros((), dtype=adv.dtype, device=adv.device))
    hi = torch.where(mask, adv, float("-inf")).amax(dim=-1)
    lo = torch.where(mask, adv, float("inf")).amin(dim=-1)
    if bool((has & (hi != lo)).any()):
        row = int((has & (hi != lo)).nonzero()[0])
        raise ShapeError(
            f"`adv` varies across the valid tokens of sequence {row}: gspo takes one advantage "
            "per sequence ([B]); use gspo_token for per-token advantages"
        )
    return torch.where(has, hi, torch.zeros((), dtype=adv.dtype, device=adv.device))


def gspo(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO sequence-level clipped loss -> `(loss [B, T], metrics)`.

    ℓ_i = −min(s_i A_i, clip(s_i, 1−ε_low, 1+ε_high)·A_i) (arXiv 2507.18071, Eq. 5),
    written on every valid token of response i.

    logp, logp_old: `[B, T]`; mask: bool `[B, T]` (True = counts). adv: `[B]` (one per
    response), or `[B, T]` if constant over each response's valid tokens (else ShapeError;
    use `gspo_token`). Aggregate with `seq_mean_token_mean` for (1/B)Σ ℓ_i. eps_low in
    [0, 1), eps_high ≥ 0, required (paper: 3e-4 / 4e-4). Metrics: `gspo_metrics`.
    """
    check_eps(eps_low, eps_high)
    check_log_ratio_clamp(log_ratio_clamp, logp.dtype)
    x = token_inputs(logp, logp_old, adv, mask)
    a = sequence_adv(adv.detach() if adv.dim() == 1 else x.adv, mask).to(x.adv.dtype)  # A_i
    s, hit, _ = sequence_ratio(x, log_ratio_clamp)  # s_i
    clipped = torch.clamp(s, 1.0 - eps_low, 1.0 + eps_high)
    loss_seq = -torch.minimum(s * a, clipped * a)  # Eq. (5), [B]
    loss = masked(loss_seq.unsqueeze(-1).expand_as(x.lp), mask)
    return loss.to(logp.dtype), gspo_metrics(s, a, mask, eps_low=eps_low, eps_high=eps_high, clamped=hit)


def gspo_metrics(s, a, mask, *, eps_low: float, eps_high: float, clamped) -> dict[str, torch.Tensor]:
    """The `METRIC_KEYS`, token-weighted: every valid token of response i carries s_i, the
    region of (s_i, A_i) and the guard hit of row i. Counted from per-row values [B] and
    each row's number of valid tokens (no [B, T] tensor is built)."""
    return summarize_rows(s, mask.sum(dim=-1), a, eps_low, eps_high, clamped=clamped)


def gspo_token(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO-token: per-token advantages with the sequence ratio -> `(loss [B, T], metrics)`.

    s_it = sg(s_i)·exp(lp_it − sg(lp_it)); ℓ_it = −min(s_it A_it, clip(s_it, 1−ε_low,
    1+ε_high) A_it) (arXiv 2507.18071, GSPO-token objective). adv: `[B, T]` (or `[B]`, then
    identical to `gspo`). Unclipped gradient ∂ℓ_it/∂lp_it = −s_i A_it; zero in
    (A_it > 0, s_i > 1+ε_high) and (A_it < 0, s_i < 1−ε_low). The clip decision uses the
    sequence ratio, split by the sign of each token's advantage. Detached: sg(s_i), A.
    """
    check_eps(eps_low, eps_high)
    check_log_ratio_clamp(log_ratio_clamp, logp.dtype)
    x = token_inputs(logp, logp_old, adv, mask)
    s, hit, d = sequence_ratio(x, log_ratio_clamp)
    s_value = s.detach().unsqueeze(-1).expand_as(x.lp)  # sg(s_i) on every token of row i
    s_tok = s_value * unit_carrier(d)  # value s_i, gradient s_i·∇lp_it
    clipped = torch.clamp(s_tok, 1.0 - eps_low, 1.0 + eps_high)
    loss = -torch.minimum(s_tok * x.adv, clipped * x.adv)  # A = 0 at masked positions
    return loss.to(logp.dtype), gspo_token_metrics(s_value, x.adv, mask, eps_low=eps_low, eps_high=eps_high,
                                                   clamped=hit)


def gspo_token_metrics(s_value, adv, mask, *, eps_low: float, eps_high: float, clamped) -> dict[str, torch.Tensor]:
    """The `METRIC_KEYS` from sg(s_i) on every token [B, T], per-token advantages and the
    rows' guard hits [B]: regions of (s_i, A_it), zeroed = low_neg + high_pos."""
    reg = clip_regions(s_value, adv, mask, eps_low, eps_high)
    return summarize(s_value, mask, reg, zeroed=reg.low_neg | reg.high_pos,
                     clamped=clamped.unsqueeze(-1).expand_as(mask))
