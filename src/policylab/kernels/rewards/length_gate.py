"""RLCPR: length shaping gated on the concentration of the answer posteriors.

Paper: "RLCPR: Rethinking Probability-Based Reinforcement Learning From Posterior
Concentration" (arXiv id not confirmed). For a group g of G replies to one prompt, with
valid reasoning lengths len_i (counted response tokens), answer posteriors p_i (the
probability the model itself assigns to the reference answer after reply i: a scoring
forward of the policy, `LocalWorker.continuation_logprobs`) and base rewards r_i:

    gate_g = 1[min_i len_i > L_thr] · 1[max_i p_i − min_i p_i < τ_post]      (both strict)
    r'_i   = r_i − λ · (len_i − min_j len_j) / (max_j len_j − min_j len_j + eps)   if gate_g
    r'_i   = r_i                                                               otherwise

When every reply is long and the posteriors agree (the reasoning does not move the
model's belief in the answer), the longer replies pay for their length relative to the
shortest, which is never penalized. Unconfirmed (explicit arguments): the relative form
of the penalty, L_thr, τ_post, λ, eps.

Separately, before sampling, prompts are stratified by the empirical CDF of a per-prompt
entropy estimate, F(h_x) = #{h_j < h_x} / N over the pool (strict): `entropy_cdf`.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite, group_index
from policylab.errors import ShapeError


def rlcpr_shaping(rewards: torch.Tensor, lengths: torch.Tensor, posteriors: torch.Tensor, group: torch.Tensor, *,
                  length_threshold: float, posterior_range: float, coef: float, eps: float
                  ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(shaped rewards [B], gate per row [B] bool, info). All inputs [B]; posteriors in
    [0, 1]; lengths ≥ 0. Detached (a reward). Group statistics over whole groups."""
    for name, t in (("lengths", lengths), ("posteriors", posteriors), ("group", group)):
        if t.shape != rewards.shape or rewards.dim() != 1:
            raise ShapeError(f"`{name}` must be [B] like `rewards` {tuple(rewards.shape)}, got {tuple(t.shape)}")
    check_finite(rewards, "rewards")
    check_finite(posteriors.double(), "posteriors")
    if bool(((posteriors < 0) | (posteriors > 1)).any()):
        raise ValueError("`posteriors` must be probabilities in [0, 1]")
    if bool((lengths < 0).any()):
        raise ValueError("`lengths` must be >= 0")
    for name, v in (("length_threshold", length_threshold), ("posterior_range", posterior_range),
                    ("coef", coef), ("eps", eps)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"`{name}` must be finite and >= 0, got {v}")
    dense, n = group_index(group, n=rewards.numel())
    L = lengths.double()
    p = posteriors.double()
    big = torch.finfo(torch.float64).max
    lmin = torch.full((n,), big, dtype=torch.float64).scatter_reduce(0, dense, L, "amin")
    lmax = torch.full((n,), -big, dtype=torch.float64).scatter_reduce(0, dense, L, "amax")
    pmin = torch.full((n,), big, dtype=torch.float64).scatter_reduce(0, dense, p, "amin")
    pmax = torch.full((n,), -big, dtype=torch.float64).scatter_reduce(0, dense, p, "amax")
    gate_g = (lmin > length_threshold) & ((pmax - pmin) < posterior_range)
    rel = (L - lmin[dense]) / (lmax[dense] - lmin[dense] + eps)
    gate = gate_g[dense]
    shaped = torch.where(gate, rewards.double() - coef * rel, rewards.double()).to(rewards.dtype)
    info = {"gated_groups": int(gate_g.sum()), "groups": n, "posterior_range_mean": float((pmax - pmin).mean()),
            "penalty_mean": float(torch.where(gate, coef * rel, torch.zeros_like(rel)).mean())}
    return shaped.detach(), gate, info


def entropy_cdf(entropies: torch.Tensor) -> torch.Tensor:
    """F(h_x) = #{j : h_j < h_x} / N for each prompt of the pool (strict), [N]."""
    if entropies.dim() != 1 or entropies.numel() == 0:
        raise ShapeError(f"`entropies` must be a non-empty [N], got {tuple(entropies.shape)}")
    check_finite(entropies.double(), "entropies")
    h = entropies.double()
    return (h.unsqueeze(0) < h.unsqueeze(1)).double().sum(-1) / h.numel()


def answer_posteriors(answer_logprob: torch.Tensor, n_tokens: torch.Tensor, *, form: str) -> torch.Tensor:
    """p_i from the summed log-prob of the reference answer's tokens after reply i:
    "joint" exp(Σ log p) (the probability of the whole answer string), or "token_geomean"
    exp(Σ log p / n) (per-token geometric mean; unconfirmed alternative)."""
    if form == "joint":
        return answer_logprob.exp()
    if form == "token_geomean":
        if bool((n_tokens <= 0).any()):
            raise ValueError("every answer needs at least one scored token")
        return (answer_logprob / n_tokens.to(answer_logprob.dtype)).exp()
    raise ValueError(f"`form` must be joint or token_geomean, got {form!r}")
