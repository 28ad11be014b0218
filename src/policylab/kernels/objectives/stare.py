"""STARE: surprisal-guided token advantage reweighting with a current-entropy gate.

Paper: "STARE: Surprisal-Guided Token-Level Advantage Reweighting for Policy Entropy
Stability", Luo et al., arXiv 2606.19236. Its abstract names the pieces (entropy-critical
tokens found by batch-internal surprisal quantiles, their effective advantages reweighted, a
closed-loop gate on a target entropy); the authors' released recipe fixes the forms that
are the defaults here: tokens split by the sign of their advantage, the top P% surprisal of
each side critical (P = 10%), ω = W on the positive side's critical tokens (W = 1.1) and,
in the two-sided variant, ω = M on the negative side's (M = 0.9; the default one-sided
variant leaves them at 1), applied only while the batch's mean entropy is below the target
(H_tgt = 0.3), then the clipped surrogate with ω·A.

    σ_t   = −lp_src,t              surprisal under ONE declared source (π_old or the behavior μ)
    C     = critical tokens, by `selection`:
            "per_sign": {t : A_t > 0, σ_t ≥ Q_q(σ | A > 0)} ∪ {t : A_t < 0, σ_t ≥ Q_q(σ | A < 0)}
            "batch":    {t : σ_t ≥ Q_q(σ)}   (one quantile over every valid token)
            Q_q: the q-quantile over the valid tokens of the whole batch (torch.quantile, linear
            interpolation between order statistics: deterministic, ties included); q = 1 − P
    e_t   = sign(A_t)                        ("advantage", the recipe: L+ and L− by the sign of A)
            sign(A_t)·sign(σ_t − H)            ("first_order": the first-order direction of the
            entropy change, a positive advantage on a rare token (σ > H) raises entropy, on a common
            one lowers it; it differs from "advantage" only on critical tokens with σ < H)
    w_t   = W (`amplify`) if e_t > 0, M (`attenuate`) if e_t < 0, 1 if e_t = 0
    g     = 1[H < H*] ("below", the recipe's gate), sign(H* − H) ("sign"), or
            clip(k·(H* − H), −1, 1) ("proportional")
    A'_t  = A_t·max(0, 1 + g·(w_t − 1)·1[t ∈ C])                  sign of A never flips

With g = 1 a critical token is weighted by exactly W or M; "first_order" with W = 1 + λ,
M = 1 − λ and the "sign" gate is the form A·max(0, 1 + λ·g·e) (a gate of −1 then swaps
the roles of W and M).

H is the current mean token entropy (full vocabulary, at the start of the round, over the
batch's valid tokens). Everything is detached and computed in the dtype of `logp_src` (an
fp64 call weighs a critical token by exactly 1.1, never fp32's 1.100000023841858). g = 0
(entropy at or above the target under "below", H = H* under the other gates) gives A' = A.
"""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_mask, expand_adv
from policylab.errors import PolicylabError, ShapeError

GATES = ("below", "sign", "proportional")
DIRECTIONS = ("advantage", "first_order")
SELECTIONS = ("per_sign", "batch")


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
    """g: 1[H < H*] ("below"), sign(H* − H) ("sign") or clip(gain·(H* − H), −1, 1)."""
    if gate == "below":
        return 1.0 if entropy < target else 0.0
    if gate == "sign":
        d = target - entropy
        return float((d > 0) - (d < 0))
    if gate == "proportional":
        return float(max(-1.0, min(1.0, gain * (target - entropy))))
    raise PolicylabError(f"`gate` must be one of {GATES}, got {gate!r}")


def critical_tokens(A: torch.Tensor, logp_src: torch.Tensor, mask: torch.Tensor, q: float,
                    selection: str) -> tuple[torch.Tensor, dict]:
    """C `[B, T]` bool and the thresholds used: per advantage sign ("per_sign": a side with
    no valid token selects nothing; tokens with A = 0 are never critical) or one quantile
    over every valid token ("batch")."""
    sig = -logp_src.detach()
    if selection == "batch":
        thr = surprisal_quantile(logp_src, mask, q)
        return mask & (sig >= thr), {"stare/threshold": float(thr)}
    if selection != "per_sign":
        raise PolicylabError(f"`selection` must be one of {SELECTIONS}, got {selection!r}")
    crit = torch.zeros_like(mask)
    info = {}
    for name, side in (("pos", A > 0), ("neg", A < 0)):
        m = mask & side
        if bool(m.any()):
            thr = surprisal_quantile(logp_src, m, q)
            crit = crit | (m & (sig >= thr))
            info[f"stare/threshold_{name}"] = float(thr)
    return crit, info


def stare_reweight(adv: torch.Tensor, logp_src: torch.Tensor, mask: torch.Tensor, *, entropy: float,
                   target: float, quantile: float, selection: str = "per_sign", gate: str = "below",
                   amplify: float = 1.1, attenuate: float = 1.0, gain: float = 1.0,
                   direction: str = "advantage") -> tuple[torch.Tensor, dict]:
    """A' `[B, T]` from A `[B]` or `[B, T]` (detached).

    entropy H, target H*, quantile level q (critical: σ at or above the q-quantile), selection
    "per_sign" | "batch", gate "below" | "sign" | "proportional" (gain k for the latter),
    amplify W >= 1 (critical tokens with e > 0), attenuate M in [0, 1] (e < 0; 1 = the
    one-sided variant), direction "advantage" | "first_order" (how e is read). Advantages are taken over the whole round batch (the
    quantiles are batch statistics). 0 outside `mask`."""
    check_mask(mask)
    if logp_src.shape != mask.shape:
        raise ShapeError(f"`logp_src` {tuple(logp_src.shape)} and `mask` {tuple(mask.shape)} differ")
    if amplify < 1.0:
        raise PolicylabError(f"`amplify` (W) must be >= 1, got {amplify}")
    if not 0.0 <= attenuate <= 1.0:
        raise PolicylabError(f"`attenuate` (M) must be in [0, 1], got {attenuate}")
    if direction not in DIRECTIONS:
        raise PolicylabError(f"`direction` must be one of {DIRECTIONS}, got {direction!r}")
    g = entropy_gate(entropy, target, gate=gate, gain=gain)
    A = expand_adv(adv.detach(), mask).to(logp_src.dtype)
    sig = -logp_src.detach()
    critical, info = critical_tokens(A, logp_src, mask, quantile, selection)
    e = torch.sign(A) if direction == "advantage" else torch.sign(A) * torch.sign(sig - entropy)
    # the weights in A's own dtype (a Python scalar in torch.where would make them fp32 first: 1.1 -> 1.1000000238)
    w = torch.where(e > 0, torch.full_like(A, amplify), torch.where(e < 0, torch.full_like(A, attenuate),
                                                                    torch.ones_like(A)))
    factor = torch.clamp(1.0 + g * (w - 1.0) * critical.to(A.dtype), min=0.0)
    out = torch.where(mask, A * factor, torch.zeros((), dtype=A.dtype))
    n = mask.sum().clamp(min=1)
    info.update({"stare/gate": g, "stare/critical_frac": float((critical.sum() / n)),
                 "stare/amplified_frac": float(((factor > 1) & mask).sum() / n),
                 "stare/damped_frac": float(((factor < 1) & mask).sum() / n)})
    return out, info
