"""PPO critic loss with optional value clipping, per token."""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite, check_mask, check_same_shape
from policylab.errors import PolicylabError, ShapeError


def _masked_var(x: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """Population variance of `x` over the True entries of `mask` (n > 0 of them)."""
    mean = torch.where(mask, x, 0).sum() / n
    d = torch.where(mask, x - mean, 0)
    return (d * d).sum() / n


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 − Var(R − V) / Var(R) over valid tokens, detached 0-dim.

    1 = the critic predicts the returns exactly, 0 = no better than their mean, < 0 =
    worse than the mean. When Var(R) = 0 the ratio is undefined; we report 1 if also
    Var(R − V) = 0 and 0 otherwise (the same finite convention as scikit-learn's
    `explained_variance_score(force_finite=True)`). With no valid token: 0.
    """
    n = int(mask.sum())
    v, r = values.detach(), returns.detach()
    if n == 0:
        return v.new_zeros(())
    var_r = _masked_var(r, mask, n)
    var_res = _masked_var(r - v, mask, n)
    if float(var_r) == 0.0:
        return v.new_tensor(1.0 if float(var_res) == 0.0 else 0.0)
    return 1 - var_res / var_r


def value_loss(
    values: torch.Tensor,
    values_old: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped critic loss, `(loss [B, T], metrics)`; never aggregates.

        V_clip = V_old + clip(V − V_old, −ε_v, ε_v)
        ℓ_t    = ½ · max((V − R)², (V_clip − R)²)          (clip_eps = ε_v)
        ℓ_t    = ½ · (V − R)²                              (clip_eps = None)

    Source: the critic of "Proximal Policy Optimization Algorithms" (arXiv:1707.06347)
    regresses V on returns; the *clipped* value loss is not in the paper but in OpenAI's
    baselines PPO2 implementation, and is common in RLHF codebases. The paper's combined
    objective uses c₁·(V − R)²; the ½ factor here is a convention (it scales the gradient
    by ½; set the critic coefficient accordingly).

    Args:
        values: `[B, T]` current critic outputs; the only differentiable input.
        values_old: `[B, T]` critic values at rollout time (detached).
        returns: `[B, T]` targets R_t, e.g. from `gae` (detached).
        mask: `[B, T]` bool, True = the token counts.
        clip_eps: ε_v > 0, or None to disable clipping.

    The loss is exactly 0 where `mask` is False, and no NaN/inf stored at masked
    positions can reach the loss or the gradient (inputs are masked with torch.where
    before any arithmetic). Gradient: where the clipped term is strictly larger, the
    token gets zero gradient (V moved more than ε_v away from V_old in the wrong
    direction); elsewhere ∂ℓ/∂V = V − R.

    Metrics (detached 0-dim):
        clip_frac           fraction of valid tokens where the clipped term is strictly
                            larger, i.e. the critic gets no gradient there (healthy: small;
                            same key as the policy objectives — the caller namespaces it,
                            e.g. `value/clip_frac`).
        explained_variance  1 − Var(R − V)/Var(R) over valid tokens, V = `values`
                            (healthy: rising towards 1; see `explained_variance`).
    """
    check_mask(mask, "mask")
    if values.dim() != 2:
        raise ShapeError(f"`values` must be [B, T], got {tuple(values.shape)}")
    check_same_shape("values", values, values_old=values_old, returns=returns, mask=mask)
    for name, t in (("values", values), ("values_old", values_old), ("returns", returns)):
        if not t.is_floating_point():
            raise ShapeError(f"`{name}` must be floating point, got {t.dtype}")
        check_finite(t.detach(), name, mask)
    if clip_eps is not None and (
        isinstance(clip_eps, bool) or not isinstance(clip_eps, (int, float))
        or not math.isfinite(clip_eps) or clip_eps <= 0
    ):
        raise PolicylabError(f"`clip_eps` must be a finite number > 0 or None, got {clip_eps!r}")

    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    v = torch.where(mask, values, zero)
    v_old = torch.where(mask, values_old.detach(), zero)
    r = torch.where(mask, returns.detach(), zero)
    unclipped = (v - r) ** 2
    if clip_eps is None:
        per_token = unclipped
        clipped_wins = torch.zeros_like(mask)
    else:
        v_clip = v_old + torch.clamp(v - v_old, -clip_eps, clip_eps)
        clipped = (v_clip - r) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clipped_wins = mask & (clipped.detach() > unclipped.detach())
    loss = torch.where(mask, 0.5 * per_token, zero)

    n = int(mask.sum())
    metrics = {
        "clip_frac": (clipped_wins.sum() / max(n, 1)).to(values.dtype).detach(),
        "explained_variance": explained_variance(v, r, mask),
    }
    return loss, metrics
