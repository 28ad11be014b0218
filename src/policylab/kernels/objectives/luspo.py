"""LUSPO: GSPO's sequence ratio with a length-proportional sequence loss.

(Relation to `objectives.gspo`: the loss matrices are identical; only the reduction differs.)

    s_i = exp((1/|y_i|)·Σ_t m·(lp − lp_old))           GSPO's length-normalized ratio
    ℓ_i = −|y_i| · min(s_i A_i, clip(s_i, 1 − eps_low, 1 + eps_high) A_i)
    L   = Σ_i ℓ_i / Σ_i |y_i|                           (default normalizer, **unconfirmed**)

Returned as a [B, T] matrix whose entries at the |y_i| counted tokens of sequence i all
equal −min(s_i A_i, clip(s_i) A_i), so the row sum is ℓ_i. Reducing the matrix with
`token_mean` (Σ of entries / Σ_i |y_i|) gives the default normalizer above; the
normalizer is the caller's aggregation choice, as for every objective. (Reducing it with
`seq_mean_token_mean` instead gives back GSPO's (1/B)·Σ_i of the sequence value.)

Unclipped gradient: ∂ℓ_i/∂lp_{i,t} = −s_i·A_i for every token, whatever |y_i| (GSPO's is
−s_i·A_i/|y_i|); a clipped sequence (A > 0 and s > 1 + eps_high, or A < 0 and
s < 1 − eps_low) gets zero gradient on all its tokens, as in GSPO.

Paper: "Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response
Length Variation in RLVR" — title **unconfirmed**; no arXiv id. Unconfirmed: the outer normalizer (see above) and clip ranges (required).
Detached: the advantages, the clip bounds. adv is per sequence [B] only.
Deviation: the shared log-ratio guard (`log_ratio_clamp`, default 20) on the sequence mean
log-ratio before the exp, as in `gspo`; a sequence with no counted token gets s = 1 and
contributes nothing. A ratio exactly on a bound is inside.
No equation number: the paper could not be checked.
"""

from __future__ import annotations

import torch

from policylab.errors import ShapeError
from policylab.kernels.checks import masked
from policylab.kernels.corrections.common import check_roles
from policylab.kernels.objectives.common import (
    DEFAULT_LOG_RATIO_CLAMP,
    check_eps,
    check_log_ratio_clamp,
    clip_regions,
    summarize,
    token_inputs,
)
from policylab.kernels.objectives.gspo import sequence_adv, sequence_ratio


def luspo(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """LUSPO loss matrix (see module doc).

    logp: [B, T] learner (differentiable); logp_old, mask: [B, T]; adv: [B] per sequence.
    eps_low in [0, 1), eps_high >= 0 on the sequence ratio s (required). log_ratio_clamp:
    guard on the sequence mean log-ratio. Returns (loss [B, T], 0 where mask is False, row
    sums = ℓ_i; metrics: the shared `METRIC_KEYS`, token-weighted with each token carrying
    its sequence's s_i, as in `gspo`, plus `luspo/length_mean`).
    """
    check_roles("luspo", mask, logp=logp, logp_old=logp_old)
    if not isinstance(adv, torch.Tensor) or adv.shape != (mask.shape[0],):
        got = tuple(getattr(adv, "shape", ()))
        raise ShapeError(f"`adv` must be per sequence [B] = ({mask.shape[0]},), got {got}")
    check_eps(eps_low, eps_high)
    check_log_ratio_clamp(log_ratio_clamp, logp.dtype)
    x = token_inputs(logp, logp_old, adv, mask)  # 0 at masked positions; lp_old, A detached
    # the per-sequence advantage itself, never read from a token position (position 0 may
    # be masked); a row without counted tokens contributes nothing
    a = sequence_adv(adv.detach(), mask).to(x.adv.dtype)
    s, hit, _ = sequence_ratio(x, log_ratio_clamp)  # GSPO's s_i
    clipped = torch.clamp(s, 1.0 - eps_low, 1.0 + eps_high)
    seq_value = -torch.minimum(s * a, clipped * a)  # [B]: GSPO's ℓ; LUSPO's ℓ_i is |y_i| times it
    loss = masked(seq_value.unsqueeze(-1).expand_as(x.lp), mask)  # row sums = ℓ_i
    return loss, luspo_metrics(s, x.adv, mask, eps_low=eps_low, eps_high=eps_high, clamped=hit)


def luspo_metrics(s, adv, mask, *, eps_low: float, eps_high: float, clamped) -> dict[str, torch.Tensor]:
    """The `METRIC_KEYS`, token-weighted with each valid token carrying its sequence's s_i
    (as `gspo`), plus `luspo/length_mean` (mean |y_i| over the non-empty rows)."""
    s_tok = s.detach().unsqueeze(-1).expand_as(mask)
    reg = clip_regions(s_tok, adv, mask, eps_low, eps_high)
    metrics = summarize(s_tok, mask, reg, zeroed=reg.low_neg | reg.high_pos,
                        clamped=clamped.unsqueeze(-1).expand_as(mask))
    n = mask.sum(-1)
    metrics["luspo/length_mean"] = n[n > 0].to(s.dtype).mean().detach()
    return metrics
