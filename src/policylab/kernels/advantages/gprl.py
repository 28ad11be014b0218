"""GPRL: standardize each reward dimension within its group, then a context-weighted sum."""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_finite
from policylab.errors import GroupError, PolicylabError, ShapeError
from policylab.kernels.advantages.group import Groups, check_nonneg, check_rewards, std_ddof


def _weights_per_row(weights: torch.Tensor, rewards: torch.Tensor, groups: Groups, group: torch.Tensor) -> torch.Tensor:
    """`[D]` or `[B, D]` context weights as `[B, D]`; per-row weights must be constant
    within a group (they are w(x), a function of the prompt)."""
    B, D = rewards.shape
    if not isinstance(weights, torch.Tensor) or weights.shape not in ((D,), (B, D)):
        raise ShapeError(f"`weights` must be [D] = ({D},) or [B, D] = ({B}, {D}), got {getattr(weights, 'shape', None)}")
    if not weights.is_floating_point():
        raise ShapeError(f"`weights` must be floating point, got {weights.dtype}")
    check_finite(weights, "weights")
    w = weights.detach().to(rewards.dtype)
    if w.dim() == 1:
        return w.expand(B, D)
    varies = ~groups.flat(w).all(dim=1)
    if bool(varies.any()):
        ids = torch.unique(group[varies[groups.dense]]).tolist()[:10]
        raise GroupError(f"gprl: `weights` differ between members of group id(s) {ids}; w(x) is per prompt")
    return w


def gprl(
    rewards: torch.Tensor,
    group: torch.Tensor,
    weights: torch.Tensor,
    *,
    std: str | None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Multi-dimensional group-relative advantage per sequence, `[B]`.

        A_i^(d) = (r_i^(d) − mean_g r^(d)) / (std_g r^(d) + eps)     for each d separately
        A_i     = Σ_d w_d(x) · A_i^(d)

    Paper: title **unconfirmed**; "General Preference Reinforcement Learning"
    (arXiv:2605.18721) describes per-dimension group-relative advantages, each normalized
    on its own scale, combined with context-dependent weights, which is the formula here;
    the weights w(x) are an input (how the paper derives them is out of scope).

    Args:
        rewards: `[B, D]` floating, finite.
        group: `[B]` arbitrary integer prompt ids.
        weights: `[D]` (same for every prompt) or `[B, D]` (w(x_i), equal within a group;
            GroupError otherwise), finite.
        std: "unbiased", "population" or None (centring only) — required, explicit.
        eps: >= 0.

    A dimension with zero spread in a group (all equal, singletons included) contributes
    exactly 0 there. Summing first and normalizing after is a different estimator (the
    format score would swamp correctness). Positive affine rescaling of one dimension
    leaves A unchanged (exactly with eps = 0). Detached; dtype of `rewards`.
    """
    check_rewards(rewards, ndim=2)
    groups = Groups.of(group, rewards.shape[0])
    ddof = std_ddof(std)
    check_nonneg(eps, "eps")
    w = _weights_per_row(weights, rewards, groups, group)
    per_dim = groups.standardize(rewards.detach(), ddof, eps)
    return (per_dim * w).sum(dim=1)


def gprl_stats(
    rewards: torch.Tensor,
    group: torch.Tensor,
    weights: torch.Tensor,
    *,
    std: str,
    eps: float = 1e-6,
) -> dict[str, torch.Tensor]:
    """Per-dimension diagnostics, detached 0-dim tensors keyed `dim{d}/...`:

        mean              average over groups of the group mean of dimension d
        std               average over groups of the group std (convention `std`)
        effective_weight  average over rows whose group has spread in d of
                          w_d / (std_g + eps): what one unit of raw reward d is worth in
                          A. Equal scale is not equal importance; compare these.
    """
    check_rewards(rewards, ndim=2)
    groups = Groups.of(group, rewards.shape[0])
    ddof = std_ddof(std)
    if ddof is None:
        raise PolicylabError("gprl_stats needs a std convention ('unbiased' or 'population'), got None")
    check_nonneg(eps, "eps")
    w = _weights_per_row(weights, rewards, groups, group)
    x = rewards.detach()
    c, flat = groups.centre(x)
    spread = groups.spread(c, ddof)
    live = ~flat[groups.dense]
    eff = torch.where(live, w / (spread[groups.dense] + eps), torch.zeros_like(w))
    n_live = live.sum(dim=0).clamp(min=1)
    means = groups.mean(x)
    out = {}
    for d in range(x.shape[1]):  # loop over reward dimensions (few), not over groups
        out[f"dim{d}/mean"] = means[:, d].mean()
        out[f"dim{d}/std"] = spread[:, d].mean()
        out[f"dim{d}/effective_weight"] = eff[:, d].sum() / n_live[d]
    return out
