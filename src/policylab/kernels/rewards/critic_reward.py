"""RFPO: rewards from a frozen, calibrated critic instead of a verifier.

Paper: "Unlocking the Critic: Reward-Free Policy Optimization for LLM Post-Training"
(arXiv id not confirmed). A critic V_ψ(prefix) ≈ P(eventual success | prefix), trained
beforehand on the base model's own labelled rollouts and frozen, gives both the reward and
the baseline; no verifier is read during RL.

    v̂_i = V_ψ(x, y_i) − b(|y_i|)        b: length-bias model fitted on calibration data
    finished reply:  r_i = 1[v̂_i ≥ τ]     (ties go to 1: ≥, library decision)
    truncated reply: r_i = v̂_i            a forecast, flagged `forecast`; never `verified`,
                                          never labelled correct
    advantages: GAE over the token rewards with the detached V_ψ(s_t) as the baseline

Here b(L) = a + β·L is the least-squares line of the critic's error V_ψ(y) − label
against the length on the calibration split (`fit_length_bias`): on data whose critic
error grows linearly with length, v̂ has no length trend left (tested). Unconfirmed
(explicit arguments): the form of b, τ, the forecast rule, GAE's γ and λ.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite
from policylab.errors import ShapeError


def fit_length_bias(values: torch.Tensor, labels: torch.Tensor, lengths: torch.Tensor) -> tuple[float, float]:
    """(a, β) of the least-squares line e ≈ a + β·L, e = values − labels (the critic's
    error), over the calibration rollouts. All [N]; N ≥ 2 with two distinct lengths, else
    β = 0 and a = mean error."""
    if not (values.dim() == 1 and values.shape == labels.shape == lengths.shape) or values.numel() == 0:
        raise ShapeError(f"values, labels, lengths must be non-empty [N]; got {tuple(values.shape)}, "
                         f"{tuple(labels.shape)}, {tuple(lengths.shape)}")
    e = values.double() - labels.double()
    L = lengths.double()
    check_finite(e, "values - labels")
    if L.numel() < 2 or float(L.var(unbiased=False)) == 0.0:
        return float(e.mean()), 0.0
    Lc = L - L.mean()
    beta = float((Lc * (e - e.mean())).sum() / (Lc * Lc).sum())
    return float(e.mean() - beta * L.mean()), beta


def debias(values: torch.Tensor, lengths: torch.Tensor, bias: tuple[float, float]) -> torch.Tensor:
    """v̂ = V − (a + β·|y|)."""
    a, beta = bias
    return values - (a + beta * lengths.to(values.dtype))


def rfpo_rewards(values: torch.Tensor, lengths: torch.Tensor, finished: torch.Tensor, *,
                 bias: tuple[float, float], tau: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rewards [B], verdict [B] bool: finished and v̂ ≥ τ, forecast [B] bool: truncated).

    values    [B] V_ψ of the whole reply (the state after its last counted token), detached
    lengths   [B] counted response tokens
    finished  [B] bool, True = the reply ended (EOS) within the budget"""
    if not (values.dim() == 1 and values.shape == lengths.shape == finished.shape):
        raise ShapeError("values, lengths, finished must be [B]")
    if finished.dtype != torch.bool:
        raise ShapeError(f"`finished` must be bool, got {finished.dtype}")
    if not math.isfinite(tau):
        raise ValueError(f"`tau` must be finite, got {tau}")
    check_finite(values, "values")
    v = debias(values.detach(), lengths, bias)
    verdict = finished & (v >= tau)
    rewards = torch.where(finished, verdict.to(v.dtype), v)
    return rewards.detach(), verdict, ~finished
