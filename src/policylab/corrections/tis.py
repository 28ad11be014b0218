"""TIS: truncated importance sampling for the training/inference engine mismatch.

    k_t = exp(lp_old,t - lp_mu,t)          engine ratio: training engine vs rollout engine,
                                           SAME weights θ_old
    w_t = sg(min(k_t, C))                  upper truncation only; small ratios are kept
    loss_t = w_t · loss^base_t             (the caller multiplies its host per-token loss)

Paper: F. Yao, L. Liu, D. Zhang, C. Dong, J. Shang, J. Gao, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training" (blog / technical note, Aug. 2025,
fengyao.notion.site/off-policy-rl; no arXiv id). Confirmed with the search tool: authors,
that the correction is a truncated ratio π_train(θ_old)/π_infer(θ_old) applied to the
sampled tokens. Unconfirmed: the exact title wording (from memory, consistent with the
pages found) and the default cap C (often quoted as 2); `cap` is therefore required.

Detached: the weight (the numerator is `logp_old`, never the live `logp`, so no gradient
can flow through it in any case). Positions where `mask` is False get weight 0.
Deviation: none known. Does not correct staleness (policy ratio); that is the host's clip.
"""

from __future__ import annotations

import math

import torch

from ._common import check_positive, check_roles, masked_fraction, masked_log_ratio, masked_mean, prefixed
from .diagnostics import ess_unchecked, log_ratio_stats


def tis(
    logp_old: torch.Tensor,
    logp_behavior: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated engine-ratio weights w = min(exp(logp_old - logp_behavior), cap).

    logp_old, logp_behavior, mask: [B, T]. cap > 0 (**unconfirmed** default, so required).
    Returns (weights [B, T] detached, 0 where mask is False; metrics with the fraction of
    tokens truncated (k > cap, strict), the weights' ESS and the raw ratio statistics).
    """
    check_roles("tis", mask, logp_old=logp_old, logp_behavior=logp_behavior)
    cap = check_positive("cap", cap, allow_inf=True)
    log_k = masked_log_ratio(logp_old.detach(), logp_behavior.detach(), mask)
    # min(k, C) = exp(min(log k, log C)): never forms an overflowing exp(log k).
    w = torch.exp(torch.clamp(log_k, max=math.log(cap)))
    w.masked_fill_(~mask, 0.0)
    metrics = {
        "frac_capped": masked_fraction(log_k > math.log(cap), mask, w),
        "weight_mean": masked_mean(w, mask, w, zero_outside=True),
        "ess": ess_unchecked(w, mask, zero_outside=True),
        **log_ratio_stats(log_k, mask, w),
    }
    return w, prefixed("tis", metrics)
