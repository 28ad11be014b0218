"""VAPO pieces: length-adaptive λ, decoupled GAE, positive-example NLL, MC returns.

Paper: "VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks"
(Yue et al., arXiv:2504.05118). Confirmed against secondary summaries of the paper:
λ_policy = 1 − 1/(α·l) with α = 0.05, λ_critic = 1.0 for value targets, value
pretraining on Monte-Carlo returns. The paper's behaviour for l < 1/α (where the formula
goes negative) is **unconfirmed**; the clamp below is a library decision.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite, check_mask, check_same_shape
from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.advantages.gae import gae
from policylab.kernels.objectives.terms import masked_nll


def length_adaptive_lambda(lengths: torch.Tensor, *, alpha: float = 0.05) -> tuple[torch.Tensor, int]:
    """Per-sequence GAE λ for the policy, `[B]`, and how many entries were clamped.

        λ(l) = clamp(1 − 1/(α·l), 0, 1)        l = number of valid response tokens

    λ(100) = 0.8, λ(1000) = 0.98, λ(20) = 0 (α = 0.05). For l < 1/α the formula is
    negative (l = 0 gives −inf): library decision, clamp to 0 and count it, so the trainer
    can log how often very short responses fall back to λ = 0 (pure TD advantages).

    Args:
        lengths: `[B]` non-negative lengths (integer or floating).
        alpha: α > 0.
    Returns `(lam [B], n_clamped)`: lam has the dtype of `lengths` if floating, else the
    default float dtype; n_clamped is a Python int. Detached.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise PolicylabError(f"`alpha` must be a finite number > 0, got {alpha!r}")
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.dtype == torch.bool:
        raise ShapeError(f"`lengths` must be a [B] numeric tensor, got {getattr(lengths, 'shape', type(lengths))}")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    l = lengths.detach().to(dtype)
    check_finite(l, "lengths")
    if bool((l < 0).any()):
        raise PolicylabError(f"`lengths` must be >= 0, got {l[l < 0][0].item()}")
    raw = 1 - 1 / (alpha * l)
    clamped = (raw < 0) | (raw > 1)
    return raw.clamp(0.0, 1.0), int(clamped.sum())


def vapo_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    alpha: float,
    lam_critic: float = 1.0,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Decoupled GAE: `(adv_policy [B, T], returns_critic [B, T], info)`.

        adv_policy     = GAE(r, V; γ, λ_policy(l_i))   per sequence, l_i = Σ_t mask_{i,t}
        returns_critic = GAE(r, V; γ, λ_critic) + V     (λ_critic = 1: MC return, unbiased)

    The critic targets are computed from `lam_critic` alone and never depend on α or
    λ_policy. Both outputs are detached and exactly 0 where `mask` is False (`gae`'s mask
    rules). `info` (detached 0-dim): `lam_policy_mean`, `lam_policy_min`,
    `n_lambda_clamped` (see `length_adaptive_lambda`). Paper defaults: α = 0.05, γ = 1,
    λ_critic = 1.
    """
    check_mask(mask, "mask")
    lam_policy, n_clamped = length_adaptive_lambda(mask.sum(dim=-1), alpha=alpha)
    lam_policy = lam_policy.to(values.dtype)
    adv_policy, _ = gae(token_rewards, values, mask, gamma=gamma, lam=lam_policy)
    _, returns_critic = gae(token_rewards, values, mask, gamma=gamma, lam=lam_critic)
    info = {
        "lam_policy_mean": lam_policy.mean(),
        "lam_policy_min": lam_policy.min(),
        "n_lambda_clamped": torch.tensor(n_clamped, device=values.device),
    }
    return adv_policy, returns_critic, info


def positive_nll(logp: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """Positive-example LM loss, `[B, T]` (not aggregated):

        ℓ_{i,t} = −lp_{i,t}   if mask_{i,t} and correct_i,   else exactly 0

    VAPO adds μ·NLL over the tokens of correct responses (μ = 0.1 in the paper) to the
    PPO loss, token-mean over those tokens: aggregate with the mask
    `mask & correct[:, None]` and the trainer's normalizer. Differentiable through `logp`
    only at the selected tokens (NaN/inf stored elsewhere cannot reach loss or gradient).
    `correct` is the raw outcome (bool `[B]`), not a shaped reward.
    """
    check_mask(mask, "mask")
    check_mask(correct, "correct")
    if logp.dim() != 2:
        raise ShapeError(f"`logp` must be [B, T], got {tuple(logp.shape)}")
    check_same_shape("logp", logp, mask=mask)
    if correct.shape != (logp.shape[0],):
        raise ShapeError(f"`correct` must be [B] = ({logp.shape[0]},), got {tuple(correct.shape)}")
    return masked_nll(logp, mask & correct.unsqueeze(1), coef=1.0)


def mc_returns(token_rewards: torch.Tensor, mask: torch.Tensor, *, gamma: float) -> torch.Tensor:
    """Monte-Carlo returns for value pretraining, `[B, T]`:

        R_t = Σ_{u ≥ t, valid} γ^{(number of valid steps from t to u)} r_u

    (GAE with λ = 1 and V = 0, so the same mask rules as `gae`). Detached, 0 where
    `mask` is False.
    """
    check_mask(mask, "mask")
    if token_rewards.dim() != 2:
        raise ShapeError(f"`token_rewards` must be [B, T], got {tuple(token_rewards.shape)}")
    _, returns = gae(token_rewards, torch.zeros_like(token_rewards), mask, gamma=gamma, lam=1.0)
    return returns
