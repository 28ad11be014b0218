"""ReCo: redundancy-corrected weights (expected response counts, token variance ratio).

Paper: title and arXiv id unconfirmed (cited as "ReCo"); every form below is the
specification's and unconfirmed, so each choice is an explicit argument.

    n̂_i  = G·exp(Σ_t m_it·lp_old,it)        expected number of copies of response i among G
                                             draws from π_old (in log space: log G + Σ lp_old)
    w_i  = 1 / max(1, n̂_i)                   continuous down-weighting of likely (redundant)
                                             responses; not deduplication
    v_t  = p_t(1 − p_t) / max(p_old,t(1 − p_old,t), ε_v)   token-vs-rest Bernoulli variance of
                                             the current policy p_t = π_θ (detached) over that
                                             of π_old, the policy that sampled
    g(v) = clip(v, g_min, g_max)              bounded and monotone (form unconfirmed)
    A'_it = A_i·w_i·g(v_t)                    all weights detached

With the current probability on both sides v would be 1 whatever happened: v compares the
live learner with the recorded old log-probs, so it moves away from 1 only after an update
on the batch (a second epoch or minibatch, a stale batch). p_old → 0 or 1 hits the ε_v
floor (no Inf).
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite, check_mask
from policylab.errors import PolicylabError, ShapeError


def expected_counts(logp_old: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """log n̂_i = log G + Σ_t m·lp_old `[B]` (log space: a long response's probability
    underflows, its log does not)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise PolicylabError(f"`group_size` must be an int >= 1, got {group_size!r}")
    seq = torch.where(mask, logp_old.detach(), torch.zeros((), dtype=logp_old.dtype)).sum(-1)
    return math.log(group_size) + seq


def reco_weights(logp: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor, *, group_size: int, eps_v: float,
                 g_min: float, g_max: float) -> tuple[torch.Tensor, dict]:
    """w_i·g(v_t) `[B, T]` (detached; 0 outside `mask`) and diagnostics."""
    check_mask(mask)
    if logp.shape != mask.shape or logp_old.shape != mask.shape:
        raise ShapeError(f"`logp` {tuple(logp.shape)}, `logp_old` {tuple(logp_old.shape)} and `mask` "
                         f"{tuple(mask.shape)} must all be [B, T]")
    if not eps_v > 0:
        raise PolicylabError(f"`eps_v` must be > 0 (the variance floor), got {eps_v}")
    if not 0 <= g_min <= 1 <= g_max:
        raise PolicylabError(f"the bounds of g must satisfy 0 <= g_min <= 1 <= g_max, got {g_min}, {g_max}")
    check_finite(logp_old, "logp_old", mask)
    log_n = expected_counts(logp_old, mask, group_size)
    w = torch.exp(-log_n.clamp(min=0.0))  # 1 / max(1, n̂)
    p = logp.detach().exp()
    p_old = logp_old.detach().exp()
    var_old = p_old * (1 - p_old)
    floored = var_old < eps_v
    v = p * (1 - p) / torch.clamp(var_old, min=eps_v)
    g = v.clamp(g_min, g_max)
    out = torch.where(mask, w.unsqueeze(-1).to(g.dtype) * g, torch.zeros((), dtype=g.dtype))
    n = mask.sum().clamp(min=1)
    info = {"reco/response_weight_mean": w.double().mean(),
            "reco/frac_responses_downweighted": (w < 1).double().mean(),
            "reco/variance_ratio_mean": (torch.where(mask, v, 0.0).sum() / n).double(),
            "reco/frac_variance_floor": ((floored & mask).sum() / n).double()}
    return out, info
