"""STARE: surprisal-guided token advantage reweighting with a current-entropy gate.

Paper: "STARE: Surprisal-Guided Token-Level Advantage Reweighting for Policy Entropy
Stability", Luo et al., arXiv 2606.19236. Its abstract confirms the pieces: entropy-critical
tokens found by batch-internal surprisal quantiles, their effective advantages reweighted,
and a closed-loop gate on a target entropy. The exact gate and weight forms below are the
specification's and stay unconfirmed (each is an explicit argument).

    σ_t   = −lp_src,t              surprisal under ONE declared source (π_old or the behavior μ)
    Q_q   = q-quantile of σ over the valid tokens of the whole batch (linear interpolation
            between order statistics, torch.quantile: deterministic, ties included)
    C     = {t : σ_t ≥ Q_q}  (inclusive), optionally ∪ {t : σ_t ≤ Q_low} (a low tail)
    e_t   = sign(A_t)·sign(σ_t − H)        first-order direction of the entropy change:
            a positive advantage on a rare token (σ > H) raises entropy, on a common one lowers it
    g     = sign(H* − H)  ("sign")  or  clip(k·(H* − H), −1, 1)  ("proportional")
    A'_t  = A_t·max(0, 1 + λ·g·e_t·1[t ∈ C])                      sign of A never flips

H is the current mean token entropy (full vocabulary, at the start of the round, over the
batch's valid tokens). Everything is detached. H = H* gives g = 0 and A' = A.
"""

from __future__ import annotations

import torch

from .._checks import check_mask, expand_adv
from ..errors import PolicylabError, ShapeError

GATES = ("sign", "proportional")


def surprisal_quantile(logp_src: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """Q_q of σ = −logp_src over the valid tokens only (padding never enters), 0-dim."""
    check_mask(mask)
    if logp_src.shape != mask.shape:
        raise ShapeError(f"`logp_src` {tuple(logp_src.shape)} and `mask` {tuple(mask.shape)} differ")
    if not 0.0 <= q <= 1.0:
        raise PolicylabError(f"quantile level must be in [0, 1], got {q}")
    sig = (-logp_src.detach())[mask]
    if sig.numel() == 0:
        raise PolicylabError("no valid token: the surprisal quantile is undefined")
    return torch.quantile(sig.double(), q, interpolation="linear")


def entropy_gate(entropy: float, target: float, *, gate: str, gain: float = 1.0) -> float:
    """g in [−1, 1]: sign(H* − H) or clip(gain·(H* − H), −1, 1)."""
    if gate == "sign":
        d = target - entropy
        return float((d > 0) - (d < 0))
    if gate == "proportional":
        return float(max(-1.0, min(1.0, gain * (target - entropy))))
    raise PolicylabError(f"`gate` must be one of {GATES}, got {gate!r}")


def stare_reweight(adv: torch.Tensor, logp_src: torch.Tensor, mask: torch.Tensor, *, entropy: float,
                   target: float, threshold: float, strength: float, gate: str, gain: float = 1.0,
                   low_threshold: float | None = None) -> tuple[torch.Tensor, dict]:
    """A' `[B, T]` from A `[B]` or `[B, T]` (detached) and the batch's threshold Q_q.

    entropy H, target H*, threshold Q_q (`surprisal_quantile`), strength λ >= 0, gate
    "sign" | "proportional" (gain k for the latter), low_threshold Q_low or None (no low
    tail). 0 outside `mask`."""
    check_mask(mask)
    if logp_src.shape != mask.shape:
        raise ShapeError(f"`logp_src` {tuple(logp_src.shape)} and `mask` {tuple(mask.shape)} differ")
    if strength < 0:
        raise PolicylabError(f"`strength` must be >= 0, got {strength}")
    A = expand_adv(adv.detach(), mask).to(logp_src.dtype)
    sig = -logp_src.detach()
    g = entropy_gate(entropy, target, gate=gate, gain=gain)
    critical = mask & (sig >= threshold)
    if low_threshold is not None:
        critical = critical | (mask & (sig <= low_threshold))
    e = torch.sign(A) * torch.sign(sig - entropy)
    factor = torch.clamp(1.0 + strength * g * e * critical.to(A.dtype), min=0.0)
    out = torch.where(mask, A * factor, torch.zeros((), dtype=A.dtype))
    n = mask.sum().clamp(min=1)
    info = {"stare/gate": g, "stare/critical_frac": float((critical.sum() / n)),
            "stare/amplified_frac": float(((factor > 1) & mask).sum() / n),
            "stare/damped_frac": float(((factor < 1) & mask).sum() / n)}
    return out, info
