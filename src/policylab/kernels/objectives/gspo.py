"""GSPO: one length-normalized importance ratio and one clip decision per response.

Paper: "Group Sequence Policy Optimization", Zheng et al. (Qwen team), arXiv 2507.18071,
objective Eq. (5); GSPO-token variant in the same paper.

    s_i = exp( (1/|y_i|) Σ_t m_it (lp_it − lp_old,it) )          (geometric mean of token ratios)
    ℓ_i = −min(s_i A_i, clip(s_i, 1−ε_low, 1+ε_high) A_i)

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

from policylab.kernels.checks import zero_outside
from policylab.errors import ShapeError
from policylab.kernels.objectives.common import (
    DEFAULT_LOG_RATIO_CLAMP,
    check_eps,
    check_log_ratio_clamp,
    clip_regions,
    prepare,
    summarize,
    summarize_rows,
    unit_carrier,
)


def _sequence_ratio(tb, clamp: float, n_valid: torch.Tensor | None = None):
    """(s [B], clamped-hit [B], token log-ratio d [B, T]) from checked inputs."""
    d = tb.log_ratio()  # 0 at padding
    if n_valid is None:
        n_valid = tb.mask_f.sum(dim=-1)
    lengths = n_valid.clamp(min=1).to(d.dtype)
    mean_lr = d.sum(dim=-1) / lengths
    hit = mean_lr.detach().abs() > clamp
    return mean_lr.clamp(-clamp, clamp).exp(), hit, d


def _sequence_adv(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A_i `[B]` from `[B, T]` advantages that must be constant over each row's valid tokens."""
    hi = torch.where(mask, adv, float("-inf")).amax(dim=-1)
    lo = torch.where(mask, adv, float("inf")).amin(dim=-1)
    has = mask.any(dim=-1)
    if bool((has & (hi != lo)).any()):
        row = int((has & (hi != lo)).nonzero()[0])
        raise ShapeError(
            f"`adv` varies across the valid tokens of sequence {row}: gspo takes one advantage "
            "per sequence ([B]); use gspo_token for per-token advantages"
        )
    return torch.where(has, hi, torch.zeros((), dtype=adv.dtype, device=adv.device))


def _checks(eps_low, eps_high, clamp, logp):
    check_eps(eps_low, eps_high)
    check_log_ratio_clamp(clamp, logp.dtype)


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

    logp, logp_old: `[B, T]`; mask: bool `[B, T]` (True = counts). adv: `[B]` (one per
    response), or `[B, T]` if constant over each response's valid tokens (else ShapeError;
    use `gspo_token`). Returns ℓ_i on every valid token of response i (aggregate with
    `seq_mean_token_mean` for (1/B)Σ ℓ_i). eps_low in [0, 1), eps_high ≥ 0, required
    (paper: 3e-4 / 4e-4). Metrics: see `objectives._metrics`; regions use s_i.
    """
    _checks(eps_low, eps_high, log_ratio_clamp, logp)
    per_seq = isinstance(adv, torch.Tensor) and adv.dim() == 1  # one advantage per sequence already
    tb = prepare(logp, logp_old, adv, mask)
    n_valid = tb.mask_f.sum(dim=-1)  # valid tokens per row, from the float mask prepare() built
    if per_seq:
        a_seq = torch.where(n_valid > 0, adv.detach(), torch.zeros((), dtype=adv.dtype)).to(tb.adv.dtype)
    else:
        a_seq = _sequence_adv(tb.adv, tb.mask)
    s, hit, _ = _sequence_ratio(tb, log_ratio_clamp, n_valid)
    high_pos = (a_seq > 0) & (s.detach() > 1.0 + eps_high)
    low_neg = (a_seq < 0) & (s.detach() < 1.0 - eps_low)
    eff = torch.where(high_pos, 1.0 + eps_high, torch.where(low_neg, 1.0 - eps_low, s))
    loss_seq = -eff * a_seq  # [B], finite (s is clamped in log space)
    loss = (loss_seq.unsqueeze(-1) * tb.mask_f).to(logp.dtype)
    # s_i and A_i are constant over each row: the token-level metrics from per-row values
    metrics = summarize_rows(s, n_valid, a_seq, eps_low, eps_high, clamped=hit)
    return loss, metrics


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
    1+ε_high) A_it). adv: `[B, T]` (or `[B]`, then identical to `gspo`). Unclipped gradient
    ∂ℓ_it/∂lp_it = −s_i A_it; zero in (A_it > 0, s_i > 1+ε_high) and (A_it < 0, s_i < 1−ε_low).
    The clip decision uses the sequence ratio, split by the sign of each token's advantage.
    """
    _checks(eps_low, eps_high, log_ratio_clamp, logp)
    tb = prepare(logp, logp_old, adv, mask)
    s, hit, d = _sequence_ratio(tb, log_ratio_clamp)
    s_tok_value = s.detach().unsqueeze(-1).expand_as(tb.logp)
    s_tok = s_tok_value * unit_carrier(d)
    reg = clip_regions(s_tok_value, tb.adv, tb.mask, eps_low, eps_high)
    eff = torch.where(reg.high_pos, 1.0 + eps_high, torch.where(reg.low_neg, 1.0 - eps_low, s_tok))
    loss = zero_outside(-eff * tb.adv, tb.mask, tb.mask_f).to(logp.dtype)
    metrics = summarize(
        s_tok_value, tb.mask, reg, zeroed=reg.low_neg | reg.high_pos,
        clamped=hit.unsqueeze(-1).expand_as(tb.mask),
    )
    return loss, metrics
