"""GGPO: Gibbs-gap coefficients for off-policy RL against a KL-regularized Gibbs target.

Target π* ∝ π_ref·exp(r/β). Per response i of group g (G_g members):

    ℓr_i = Σ_t m·(lp − lp_ref)                         sequence log-ratio to the reference
    a_i  = r_i/β − clip(sg(ℓr_i), −c, c)               adjusted reward (clip only here)
    κ_i  = sg(softmax_g(a)_i − 1/G_g)                  Σ_{i in g} κ_i = 0
    Γ_g  = log((1/G_g)·Σ_i e^{a_i}) − (1/G_g)·Σ_i a_i   Gibbs gap, >= 0 (diagnostic)
    L    = −(1/B)·Σ_i κ_i·Σ_t m·lp_{i,t}               gradient through the unclipped lp

Returned as a [B, T] matrix with entries −κ_i·lp_{i,t} at counted tokens; reduce with
`aggregate(..., "seq_mean_token_sum")` (Σ of all entries / N_seq) for L. a = [1, 0, 0] gives softmax
[0.5761, 0.2119, 0.2119], κ = [0.2428, −0.1214, −0.1214], Γ = 0.1195.

The behavior policy that sampled the data (any frozen earlier policy or buffer) is never
read: there is no behavior log-prob argument. Refreshing π_ref changes later κ, never the
provenance of stored samples (this function touches no batch metadata).
Group filtering and normalization happen on the full batch before this call.

Paper: "Gibbs-Gap Policy Optimization for Off-Policy RL with Verifiable Rewards" — title
**unconfirmed**; no arXiv id. The kernel is a
**reconstruction**; its exact published form is unconfirmed (β and c are required).
Detached: κ, Γ, the clipped ℓr. Group ids may be arbitrary integers.
Metrics: the shared `METRIC_KEYS` (no ratio and no clip here: clip fractions 0, ratio/* = 1)
plus `ggpo/gap_mean` (Γ averaged over sequences), `ggpo/kappa_abs_mean`,
`ggpo/frac_ref_ratio_clipped` (|ℓr| > c), `ggpo/ref_log_ratio_mean`.
No equation number: the paper could not be checked. Deviations: unknown (a
reconstruction, see above).
"""

from __future__ import annotations

import torch

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.checks import check_finite, float_mask, group_index, masked
from policylab.kernels.corrections.common import check_positive, check_roles, masked_log_ratio, scalar
from policylab.kernels.objectives.common import Regions, summarize


def gibbs_coefficients(
    seq_log_ratio: torch.Tensor,
    rewards: torch.Tensor,
    group: torch.Tensor,
    *,
    beta: float,
    coef_clip: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(κ [B], Γ of each sequence's group [B], adjusted reward a [B]), all detached.

    seq_log_ratio: [B] ℓr_i = Σ_t m·(lp − lp_ref); rewards: [B]; group: [B] ids."""
    B = rewards.shape[0]
    if rewards.dim() != 1 or seq_log_ratio.shape != (B,):
        raise ShapeError(f"`rewards` and `seq_log_ratio` must both be [B], got "
                         f"{tuple(rewards.shape)} and {tuple(seq_log_ratio.shape)}")
    check_finite(rewards, "rewards")
    check_finite(seq_log_ratio, "seq_log_ratio")
    beta = check_positive("beta", beta)
    c = check_positive("coef_clip", coef_clip)
    dense, n = group_index(group, B)
    f64 = torch.float64
    a = rewards.detach().to(f64) / beta - seq_log_ratio.detach().to(f64).clamp(-c, c)
    amax = torch.full((n,), -torch.inf, dtype=f64, device=a.device)
    amax = amax.scatter_reduce(0, dense, a, reduce="amax", include_self=True)
    e = torch.exp(a - amax[dense])
    z = torch.zeros(n, dtype=f64, device=a.device).index_add_(0, dense, e)
    size = torch.zeros(n, dtype=f64, device=a.device).index_add_(0, dense, torch.ones_like(a))
    mean_a = torch.zeros(n, dtype=f64, device=a.device).index_add_(0, dense, a) / size
    kappa = e / z[dense] - 1 / size[dense]
    gap = torch.log(z / size) + amax - mean_a
    dt = rewards.dtype if rewards.is_floating_point() else seq_log_ratio.dtype
    return kappa.to(dt), gap.clamp_min(0)[dense].to(dt), a.to(dt)


def ggpo(
    logp: torch.Tensor,
    logp_ref: torch.Tensor,
    rewards: torch.Tensor,
    group: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float,
    coef_clip: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GGPO loss matrix (see module doc).

    logp: [B, T] learner (differentiable); logp_ref, mask: [B, T]; rewards: [B] scalar
    rewards; group: [B] group ids; beta > 0 (KL temperature), coef_clip = c > 0.
    Returns (loss [B, T], 0 where mask is False, row sums −κ_i·Σ_t lp; metrics).
    An empty mask raises (nothing to optimize), as in every objective.
    """
    check_roles("ggpo", mask, logp=logp, logp_ref=logp_ref)
    if not bool(mask.any()):
        raise PolicylabError("`mask` has no valid token: nothing to optimize (skip this batch)")
    ref_log_ratio = masked_log_ratio(logp.detach(), logp_ref.detach(), mask).sum(-1)  # ℓr_i, detached
    kappa, gap, _ = gibbs_coefficients(ref_log_ratio, rewards, group, beta=beta, coef_clip=coef_clip)
    kappa = kappa.to(logp.dtype)
    loss = masked(-kappa.unsqueeze(-1) * masked(logp, mask), mask)  # −κ_i·lp_{i,t}
    return loss, ggpo_metrics(kappa, gap, ref_log_ratio, mask, coef_clip=coef_clip, like=logp)


def ggpo_metrics(kappa, gap, ref_log_ratio, mask, *, coef_clip: float, like) -> dict[str, torch.Tensor]:
    """The shared `METRIC_KEYS` (no ratio, no clip: fractions 0, ratio/* = 1) plus the
    Gibbs gap, |κ| and the reference log-ratio statistics (module doc)."""
    none = torch.zeros_like(mask)
    metrics = summarize(float_mask(mask, like.dtype), mask, Regions(none, none, none, none), zeroed=None)
    metrics.update({
        "ggpo/gap_mean": scalar(gap.mean(), like),
        "ggpo/kappa_abs_mean": scalar(kappa.abs().mean(), like),
        "ggpo/frac_ref_ratio_clipped": scalar((ref_log_ratio.abs() > float(coef_clip)).to(torch.float64).mean(), like),
        "ggpo/ref_log_ratio_mean": scalar(ref_log_ratio.mean(), like),
    })
    return metrics
