"""REINFORCE: the plain score-function policy-gradient loss, with an optional detached weight.

Paper: R. J. Williams, "Simple Statistical Gradient-Following Algorithms for Connectionist
Reinforcement Learning", Machine Learning 8 (1992) (no arXiv id). Used on-policy by RLOO,
ReMax and REINFORCE++ (their advantages live in `policylab.kernels.advantages`).

    ℓ = −sg(w) · A · lp                  carrier "logp" (default; w = 1 when `weight` is None)
    ℓ = −sg(w) · A · exp(lp − sg(lp))    carrier "unit": value −w·A, the same gradient

Gradient: ∂ℓ/∂lp = −w·A on every valid token; no ratio, no clipping. The unit carrier
(value exactly 1, gradient ∇lp) makes the loss value the policy-gradient surrogate at
ratio 1, i.e. what a ratio objective shows on its first update (used when each batch
gets exactly one update). `weight` is a detached
per-token (or per-sequence) importance weight from `policylab.kernels.corrections` (e.g. a TIS
weight π_old/μ when the sampler's numerics differ from the trainer's); it must be finite
and ≥ 0. REINFORCE assumes the tokens were sampled by the learner's current weights: with
stale data use a ratio objective (ppo_clip, cispo, ...) or an explicit weight.

Detached: `adv`, `weight`. Loss values are weighted log-probs, not comparable with PPO
surrogate values. Metrics use the shared key scheme (`objectives.common`): no clipping
(every clip fraction is 0), `ratio/*` describe the weight w (exactly 1 without one), and
`log_ratio_clamped` is 0.
Equation: Williams' REINFORCE update Δθ ∝ (r − b)·∇log π (the paper's equation number was
not checked). Deviations: none; the optional weight and the unit carrier are additions
(the unit carrier changes the loss value, never the gradient).
"""

from __future__ import annotations

import torch

from policylab.errors import ShapeError
from policylab.kernels.checks import check_finite, expand_adv, float_mask, masked
from policylab.kernels.objectives.common import Regions, summarize, token_inputs


def _check_weight(weight: torch.Tensor, like: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        raise ShapeError(f"`weight` must be a tensor [B] or [B, T], got {type(weight).__name__}")
    try:
        w = expand_adv(weight, like)
    except ShapeError:
        raise ShapeError(
            f"`weight` must be [B] or [B, T] = {tuple(like.shape)}, got {tuple(weight.shape)}"
        ) from None
    check_finite(w, "weight", mask)
    if bool(((w < 0) & mask).any()):
        raise ValueError("`weight` has negative entries at valid positions; importance weights are >= 0")
    return masked(w.detach(), mask)


def reinforce(
    logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    carrier: str = "logp",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE loss per token, −sg(w)·A·lp -> `(loss [B, T], metrics)`.

    logp: `[B, T]` learner log-probs; adv: `[B]` or `[B, T]`; mask: bool `[B, T]`
    (True = counts; loss exactly 0 elsewhere). weight: optional `[B]` or `[B, T]`, ≥ 0,
    detached here. carrier: "logp" (−A·lp) or "unit" (−A·exp(lp − sg(lp))).
    """
    if carrier not in ("logp", "unit"):
        raise ValueError(f"`carrier` must be 'logp' or 'unit', got {carrier!r}")
    x = token_inputs(logp, None, adv, mask)  # 0 at masked positions; A detached
    w = float_mask(mask, x.lp.dtype) if weight is None else _check_weight(weight, x.lp, mask)
    lp = x.lp if carrier == "logp" else torch.exp(x.lp - x.lp.detach())
    loss = masked(-w * x.adv * lp, mask)  # ℓ = −sg(w)·A·lp
    return loss.to(logp.dtype), reinforce_metrics(w.to(logp.dtype), mask)


def reinforce_metrics(weight: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The `METRIC_KEYS` of REINFORCE: no clip region, `ratio/*` describe the weight w."""
    none = torch.zeros_like(mask)
    return summarize(weight, mask, Regions(none, none, none, none), zeroed=None)
