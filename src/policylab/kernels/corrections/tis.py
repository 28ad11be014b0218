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
min(k, C) is computed as exp(min(log k, log C)), which never forms an overflowing exp(log k).
No equation number: a technical note without numbered equations was the source.

`tis(..., fast=False)` runs the equation as written below; `fast=True` (the default, what
the trainer runs) runs `corrections.fast.tis_fast` (built in place in the log-ratio's
buffer), equal in fp64 (tests/kernels/corrections/test_correction_fast_paths.py).
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import masked
from policylab.kernels.corrections.common import (
    check_positive,
    check_roles,
    ess_from_sums,
    fraction,
    masked_log_ratio,
    prefixed,
)
from policylab.kernels.corrections.diagnostics import log_ratio_stats
from policylab.kernels.corrections.fast import tis_fast


def tis(
    logp_old: torch.Tensor,
    logp_behavior: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float,
    fast: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated engine-ratio weights w = sg(min(exp(logp_old - logp_behavior), cap)).

    logp_old, logp_behavior, mask: [B, T]. cap > 0 (**unconfirmed** default, so required).
    fast: the in-place variant (default) or the plain equation (False). Returns (weights
    [B, T] detached, 0 where mask is False; `tis_metrics`).
    """
    finite = check_roles("tis", mask, logp_old=logp_old, logp_behavior=logp_behavior)
    cap = check_positive("cap", cap, allow_inf=True)
    if fast:
        return tis_fast(logp_old, logp_behavior, mask, cap=cap, finite=finite)
    log_k = masked_log_ratio(logp_old.detach(), logp_behavior.detach(), mask)  # log k, 0 at masked positions
    weight = masked(torch.exp(torch.clamp(log_k, max=math.log(cap))), mask)  # min(k, C), detached
    return weight, tis_metrics(log_k, weight, mask, cap=cap)


def tis_metrics(log_k, weight, mask, *, cap: float) -> dict[str, torch.Tensor]:
    """Metrics "tis/<name>": the fraction of counted tokens truncated (k > cap, strict), the
    weights' mean and ESS, and the raw engine-ratio statistics (`mismatch_stats` keys)."""
    n = int(torch.count_nonzero(mask))
    capped = torch.count_nonzero((log_k > math.log(cap)) & mask)
    total = weight.sum()
    metrics = {
        "frac_capped": fraction(capped, n, weight),
        "weight_mean": fraction(total, n, weight),
        "ess": ess_from_sums(total, weight, n),
        **log_ratio_stats(log_k, mask, log_k, n=n, fast=False),
    }
    return prefixed("tis", metrics)
