"""tlm-DRE: turn-level weights from the reference's turn confidence, asymmetric token terms.

Paper: "Turn-level Multiscale Density Ratio Estimation for LLM Agents" (ACL ARR 2026
submission; no arXiv id found). Its abstract confirms weights per turn and asymmetric
token-level training for positive and negative trajectories; the forms below are the
specification's and stay unconfirmed (explicit arguments):

    c_k    = (1/|turn_k|) Σ_{t∈k} lp_ref,t         the reference's confidence in turn k
    λ_k    = K_i·softmax_k(−c_k/τ)                 over the K_i turns of trajectory i: decreasing
                                                   in c_k, mean 1 over the turns (library decision)
    u_t    = lp_t − lp_ref,t                       the learner's log density ratio to π_ref
    ℓ_t    = −λ_k·ω_t·ψ(u_t; κ₊)   positive trajectory (polarity +1)
           = +λ_k·ω_t·ψ(u_t; κ₋)   negative trajectory (polarity −1);   0 for polarity 0
    ψ(u;κ) = u (κ = 0)  or  tanh(κ·u)/κ (κ > 0)    slope 1 at u = 0, saturating for κ > 0
    ω_t    = |y_i| / (K_i·|turn_k|)   turn_norm = "turn" (default): normalize per turn, then weight turns
           = 1                       turn_norm = "token": the plain per-token mean (the earlier form)

The method aggregates with `token_mean` (Σ ℓ / N_tok over the optimizer batch). With
"turn", trajectory i keeps the share |y_i|/N_tok of the update that the token mean gives
it, and inside it turn k gets (λ_k/K_i) of that share however many tokens it has, spread
evenly over its tokens: Σ_{t∈k} ℓ_t/N_tok = (|y_i|/N_tok)·(λ_k/K_i)·mean_{t∈k}(∓ψ(u_t)).
A 2-token decisive turn next to a 10-token one gets the same weight at equal confidence
(the plain token mean gives it 1/5 of the other's). When every turn of a trajectory has
the same length, ω = 1 and both forms are the same. The paper's point is that a short
decisive turn is not drowned by a verbose one; its exact normalization is unconfirmed, the
form of ω is a library decision (`turn_norm`).

λ and ω are detached; the gradient flows through lp only: ∂ℓ_t/∂lp_t = −λ_k·ω_t·ψ'(u_t)
for a positive token, +λ_k·ω_t·ψ'(u_t) for a negative one. κ₊ = κ₋ gives the symmetric
variant (ℓ_neg(u) = −ℓ_pos(u)); the default pushes positives linearly and saturates the
push-down of negatives.

Turn ids [B, T] (long): the turn index of each response position, −1 where the position
is not part of a turn (a user message inserted between turns, padding). A counted
position must have a turn id.
"""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_finite, check_mask
from policylab.errors import MissingQuantityError, PolicylabError, ShapeError

HOW_TURNS = ("Train on a multi-turn task whose source records the turn of every response token in "
             "extras['turn_ids'] [B, T] (task.name=two_turn_arithmetic with the multi-turn source; -1 outside turns)")


def check_turn_ids(turn_ids, mask: torch.Tensor, method: str = "tlm_dre") -> torch.Tensor:
    if turn_ids is None:
        raise MissingQuantityError(method, "extras.turn_ids", HOW_TURNS)
    if not isinstance(turn_ids, torch.Tensor) or turn_ids.shape != mask.shape or turn_ids.is_floating_point():
        got = tuple(turn_ids.shape) if isinstance(turn_ids, torch.Tensor) else type(turn_ids).__name__
        raise ShapeError(f"`turn_ids` must be an integer [B, T] = {tuple(mask.shape)} tensor, got {got}")
    if bool((mask & (turn_ids < 0)).any()):
        raise ShapeError("a counted position has no turn (turn id -1): every loss token must belong to a turn")
    return turn_ids.long()


TURN_NORMS = ("turn", "token")


def turn_sizes(turn_ids: torch.Tensor, mask: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """n [B, K]: the counted tokens of each turn, K = 1 + the largest turn id."""
    check_mask(mask)
    turn_ids = check_turn_ids(turn_ids, mask)
    K = int(turn_ids[mask].max()) + 1 if bool(mask.any()) else 1
    onehot = (turn_ids.unsqueeze(-1) == torch.arange(K, device=mask.device)) & mask.unsqueeze(-1)  # [B, T, K]
    return onehot.to(dtype).sum(1)


def turn_confidence(logp_ref: torch.Tensor, turn_ids: torch.Tensor, mask: torch.Tensor):
    """(c [B, K] mean lp_ref per turn, present [B, K] bool), K = 1 + the largest turn id."""
    check_mask(mask)
    turn_ids = check_turn_ids(turn_ids, mask)
    K = int(turn_ids[mask].max()) + 1 if bool(mask.any()) else 1
    onehot = (turn_ids.unsqueeze(-1) == torch.arange(K, device=mask.device)) & mask.unsqueeze(-1)  # [B, T, K]
    f = onehot.to(logp_ref.dtype)
    n = f.sum(1)
    total = (f * torch.where(mask, logp_ref, torch.zeros((), dtype=logp_ref.dtype)).unsqueeze(-1)).sum(1)
    return total / n.clamp(min=1), n > 0


def turn_token_weights(turn_ids: torch.Tensor, mask: torch.Tensor, turn_norm: str, dtype=torch.float64) -> torch.Tensor:
    """ω [B, T] (detached, 0 outside `mask`): |y_i|/(K_i·|turn_k|) for "turn", 1 for "token"."""
    if turn_norm not in TURN_NORMS:
        raise PolicylabError(f"`turn_norm` must be one of {', '.join(TURN_NORMS)}, got {turn_norm!r}")
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    if turn_norm == "token":
        return torch.where(mask, torch.ones((), dtype=dtype, device=mask.device), zero)
    n = turn_sizes(turn_ids, mask, dtype)  # [B, K]
    K_i = (n > 0).sum(-1, keepdim=True).to(dtype)  # present turns per row
    y_i = mask.sum(-1, keepdim=True).to(dtype)  # counted tokens per row
    tid = turn_ids.long().clamp(min=0).clamp(max=n.shape[1] - 1)
    n_t = torch.gather(n, 1, tid)
    return torch.where(mask, y_i / (K_i.clamp(min=1) * n_t.clamp(min=1)), zero)


def turn_weights(conf: torch.Tensor, present: torch.Tensor, *, tau: float) -> torch.Tensor:
    """λ [B, K] = K_i·softmax over the present turns of −c/τ (0 for absent turns)."""
    if not tau > 0:
        raise PolicylabError(f"`tau` must be > 0, got {tau}")
    z = torch.where(present, -conf / tau, torch.full((), float("-inf"), dtype=conf.dtype))
    z = torch.where(present.any(-1, keepdim=True), z, torch.zeros_like(z))  # rows without turns: no NaN
    w = torch.softmax(z, -1) * present.sum(-1, keepdim=True).to(conf.dtype)
    return torch.where(present, w, torch.zeros((), dtype=conf.dtype))


def psi(u: torch.Tensor, kappa: float) -> torch.Tensor:
    """ψ(u; κ): u for κ = 0, tanh(κu)/κ for κ > 0."""
    if kappa < 0:
        raise PolicylabError(f"`kappa` must be >= 0, got {kappa}")
    return u if kappa == 0 else torch.tanh(kappa * u) / kappa


def tlm_dre(logp: torch.Tensor, logp_ref: torch.Tensor, polarity: torch.Tensor, turn_ids: torch.Tensor,
            mask: torch.Tensor, *, tau: float, kappa_pos: float, kappa_neg: float,
            turn_norm: str = "turn") -> tuple[torch.Tensor, dict]:
    """Loss matrix `[B, T]` (0 outside `mask`) and detached metrics; polarity [B] in
    {+1, 0, −1} (or [B, T] constant per row, as advantages are broadcast); `turn_norm`
    "turn" (normalize per turn, then weight turns) or "token" (per-token mean), see ω in
    the module doc."""
    check_mask(mask)
    if logp.shape != mask.shape or logp_ref.shape != mask.shape:
        raise ShapeError(f"`logp` {tuple(logp.shape)} and `logp_ref` {tuple(logp_ref.shape)} must be [B, T] "
                         f"= {tuple(mask.shape)}")
    check_finite(logp_ref, "logp_ref", mask)
    pol = polarity.detach()
    if pol.dim() == 2:
        pol = torch.where(mask, pol, torch.zeros((), dtype=pol.dtype)).sum(-1).sign()
    if pol.shape != (mask.shape[0],):
        raise ShapeError(f"`polarity` must be [B], got {tuple(polarity.shape)}")
    conf, present = turn_confidence(logp_ref, turn_ids, mask)
    lam = turn_weights(conf, present, tau=tau).detach()
    tid = turn_ids.long().clamp(min=0)
    lam_t = torch.gather(lam, 1, tid.clamp(max=lam.shape[1] - 1)).to(logp.dtype)
    u = logp - logp_ref.detach()
    sgn = pol.sign().to(logp.dtype).unsqueeze(-1)
    pos_term = -psi(u, kappa_pos)
    neg_term = psi(u, kappa_neg)
    omega = turn_token_weights(turn_ids, mask, turn_norm, logp.dtype).detach()
    ell = lam_t * omega * torch.where(sgn > 0, pos_term, torch.where(sgn < 0, neg_term, torch.zeros_like(u)))
    loss = torch.where(mask, ell, torch.zeros((), dtype=logp.dtype))
    return loss, tlm_dre_metrics(lam, conf, present, u, pol, mask)


def tlm_dre_metrics(lam, conf, present, u, pol, mask) -> dict[str, torch.Tensor]:
    """Detached float64 "tlm_dre/<name>": the largest turn weight, the mean reference
    confidence over present turns, the mean log density ratio u over counted tokens and
    the fraction of positive trajectories."""
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        zero = torch.zeros((), dtype=torch.float64)
        any_turn = bool(present.any())
        return {"tlm_dre/turn_weight_max": lam[present].max().double() if any_turn else zero,
                "tlm_dre/ref_confidence_mean": conf[present].double().mean() if any_turn else zero,
                "tlm_dre/log_ratio_mean": (torch.where(mask, u.detach(), 0.0).sum() / n).double(),
                "tlm_dre/positive_frac": (pol > 0).double().mean()}
