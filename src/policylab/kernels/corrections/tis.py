"""TIS: truncated importance sampling for the training/inference engine mismatch.

    k_t = exp(lp_old,t - lp_mu,t)          engine ratio: training engine vs rollout engine,
                                           SAME weights θ_old
    w_t = sg(min(k_t, C))                  upper truncation only; small ratios are kept
    loss_t = w_t · loss^base_t             (the caller multiplies its host per-token loss)

Paper: F. Yao, L. Liu, D. Zhang, C. Dong, J. Shang, J. Gao, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training" (blog / technical note, Aug. 2025,
fengyao.notion.site/off-policy-rl; no arXiv id). Confirmed against the note: authors,
that the correction is a truncated ratio π_train(θ_old)/π_infer(θ_old) applied to the
sampled tokens. Unconfirmed: the exact title wording and the default cap C (often quoted as 2); `cap` is therefore required.

Detached: the weight (the numerator is `logp_old`, never the live `logp`, so no gradient
can flow through it in any case). Positions where `mask` is False get weight 0.
Deviation: none known. Does not correct staleness (policy ratio); that is the host's clip.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import zero_outside_
from policylab.kernels.corrections.common import check_positive, check_roles, fraction, masked_log_ratio, prefixed
from policylab.kernels.corrections.diagnostics import ess_from_sums, log_ratio_stats


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
    finite = check_roles("tis", mask, logp_old=logp_old, logp_behavior=logp_behavior)
    cap = check_positive("cap", cap, allow_inf=True)
    log_cap = math.log(cap)
    n = int(torch.count_nonzero(mask))
    log_k = masked_log_ratio(logp_old.detach(), logp_behavior.detach(), mask, finite=finite)
    stats = log_ratio_stats(log_k, mask, log_k, n=n)
    if float(stats["log_ratio_max"]) <= log_cap:
        capped = 0.0  # nothing above the cap (the common case): no counting pass
    else:  # log k > log C, strictly; padding holds log k = 0, counted only if C < 1
        capped = torch.count_nonzero((log_k > log_cap) & mask)
    # min(k, C) = exp(min(log k, log C)): never forms an overflowing exp(log k). Built in
    # log k's buffer (no longer needed), 0 where the mask is False.
    w = zero_outside_(log_k.clamp_(max=log_cap).exp_(), mask)
    total = w.sum()
    metrics = {
        "frac_capped": fraction(capped, n, w),
        "weight_mean": fraction(total, n, w),
        "ess": ess_from_sums(total, w, n),
        **stats,
    }
    return w, prefixed("tis", metrics)
