"""RLiD: a policy over single-token menu labels, episode-length weights, a label-marginal KL.

Paper: "RLiD: Reinforcement Learning in the Decision Plane for Language Agents and LLMs"
(arXiv id not confirmed). The kernel follows the specification; the forms that could not be
checked against the paper are marked below.

Each decision d offers a menu of K labels compiled to single tokens (`compile_menu`); the
policy over the menu is the softmax of the labels' logits at the decision position,
renormalized over the menu only (one forward, no free-text parsing):

    π_θ(a|o)  = softmax_{k ∈ menu}(z_k)_a
    ρ_d       = π_θ(a_d|o_d) / π_old(a_d|o_d)           both over the SAME menu (refused otherwise)
    ℓ_d       = −min(ρ_d A_d, clip(ρ_d, 1 − ε_low, 1 + ε_high) A_d)          PPO clip
    w_d       = L̄ / L_e(d)        L̄ = mean episode length over the batch's episodes
    L_policy  = (1/N_dec) Σ_d w_d ℓ_d                      (no second division by Σ w)
    m̄_g       = mean over the decisions of menu group g of π_θ(·|o)
    R         = Σ_g (N_g/N_dec)·KL(U ‖ m̄_g),  KL(U‖m̄) = Σ_k (1/K) log((1/K)/m̄_k)
    L         = L_policy + β_R·R

Unconfirmed: the mixing of several menu groups in R (decision-weighted here), and over
which decisions m̄ is averaged: the specification says "the micro-batch"; policylab
averages over the whole round batch, because a statistic over a micro-batch changes with
the micro-batch size (docs/conventions.md rule 4).

In the trainer the learner's forward yields the log-prob of the sampled label only, not
the whole menu row. R's gradient is then taken through the sampled labels
(`marginal_coefficients`): with m̄ frozen at the round's start,
    ∇R = Σ_d Σ_k (∂R/∂π_dk)·∇π_dk = (1/N) Σ_d E_{a∼π_d}[(c_da − b_d)·∇log π_d(a)]
with c_dk = −1/(K·m̄_gk) and the baseline b_d = Σ_k π_dk c_dk (E[∇log π] = 0, so it only
lowers the variance). Each sampled decision contributes (c_da − b_d)·ρ_d, whose gradient is
an unbiased estimate of ∇R (exact in expectation over the draws; `rlid_loss` computes R
itself when the whole menu logits are at hand).
"""

from __future__ import annotations

import torch

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.objectives.ppo import ppo_clip


class MenuError(PolicylabError):
    """A menu that cannot be a single-token action space, or log-probs over another menu."""


def compile_menu(tokenizer, labels) -> tuple[int, ...]:
    """The token id of each label (in order). Every label must encode to exactly one token
    (no special tokens added) and the ids must be distinct."""
    labels = list(labels)
    if len(labels) < 2:
        raise MenuError(f"a menu needs at least 2 labels, got {labels}")
    ids = []
    for lab in labels:
        enc = tokenizer.encode(lab, add_special_tokens=False)
        if len(enc) != 1:
            raise MenuError(f"menu label {lab!r} is {len(enc)} tokens {enc}: a decision is one token, so every menu "
                            "label must encode to exactly one token (use single letters or digits)")
        ids.append(int(enc[0]))
    if len(set(ids)) != len(ids):
        raise MenuError(f"menu labels {labels} share a token id: {ids}")
    return tuple(ids)


def check_same_menu(menu_ids: torch.Tensor, old_menu_ids: torch.Tensor) -> None:
    """Refuse old log-probs computed over another menu than the decision's."""
    if menu_ids.shape != old_menu_ids.shape or not torch.equal(menu_ids, old_menu_ids):
        bad = "shapes differ" if menu_ids.shape != old_menu_ids.shape else \
            f"decision {int((menu_ids != old_menu_ids).any(-1).nonzero()[0])} differs"
        raise MenuError(f"the old log-probs were computed over another menu than the decision's ({bad}): a ratio "
                        "π_θ(a)/π_old(a) needs both renormalized over the same labels; recompute π_old over this menu")


def episode_weights(episode_id: torch.Tensor, episode_len: torch.Tensor) -> torch.Tensor:
    """w_d = L̄ / L_e(d) [N], L̄ the mean length over the distinct episodes of the batch."""
    if episode_id.dim() != 1 or episode_len.shape != episode_id.shape:
        raise ShapeError(f"`episode_id` and `episode_len` must both be [N], got {tuple(episode_id.shape)}, "
                         f"{tuple(episode_len.shape)}")
    if bool((episode_len < 1).any()):
        raise PolicylabError("episode lengths must be >= 1")
    uniq, first = _first_index(episode_id)
    if not torch.equal(episode_len[first][torch.searchsorted(uniq, episode_id)], episode_len):
        raise PolicylabError("the decisions of one episode carry different episode lengths")
    L = episode_len.double()
    L_bar = L[first].mean()
    return (L_bar / L).to(torch.float64 if not episode_len.is_floating_point() else episode_len.dtype)


def _first_index(ids: torch.Tensor):
    uniq, inv = torch.unique(ids, sorted=True, return_inverse=True)
    first = torch.full((uniq.numel(),), ids.numel(), dtype=torch.long)
    first = first.scatter_reduce(0, inv, torch.arange(ids.numel()), "amin")
    return uniq, first


def _menu_log_softmax(menu_logits: torch.Tensor) -> torch.Tensor:
    if menu_logits.dim() != 2 or menu_logits.shape[1] < 2:
        raise ShapeError(f"`menu_logits` must be [N, K] with K >= 2, got {tuple(menu_logits.shape)}")
    return torch.log_softmax(menu_logits.float() if menu_logits.dtype == torch.float16 else menu_logits, -1)


def _group_means(p: torch.Tensor, menu_group: torch.Tensor):
    uniq, inv = torch.unique(menu_group, return_inverse=True)
    n = torch.bincount(inv, minlength=uniq.numel()).to(p.dtype)
    mbar = torch.zeros((uniq.numel(), p.shape[1]), dtype=p.dtype).index_add_(0, inv, p) / n.unsqueeze(-1)
    return inv, n, mbar


def label_marginal_kl(menu_logp: torch.Tensor, menu_group: torch.Tensor) -> torch.Tensor:
    """R = Σ_g (N_g/N)·Σ_k (1/K)·log((1/K)/m̄_gk), m̄_g the mean menu distribution of group g
    (differentiable through `menu_logp` [N, K], normalized log-probs)."""
    N, K = menu_logp.shape
    inv, n, mbar = _group_means(menu_logp.exp(), menu_group)
    kl_g = (torch.log(torch.tensor(1.0 / K, dtype=mbar.dtype)) - torch.log(mbar)).mean(-1)
    return (n / N * kl_g).sum()


def marginal_coefficients(menu_logp: torch.Tensor, chosen: torch.Tensor,
                          menu_group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_{d,a_d} − b_d [N], R) from the menu log-probs at the round's start (detached): the
    per-decision coefficient whose ρ-weighted sum, divided by N, has gradient E = ∇R (see
    the module doc)."""
    lp = menu_logp.detach().double()
    N, K = lp.shape
    if chosen.shape != (N,):
        raise ShapeError(f"`chosen` must be [N] = ({N},), got {tuple(chosen.shape)}")
    p = lp.exp()
    inv, _, mbar = _group_means(p, menu_group)
    c = -1.0 / (K * mbar[inv])  # [N, K] = N·∂R/∂π_dk
    b = (p * c).sum(-1)
    coef = c.gather(1, chosen.long().unsqueeze(-1)).squeeze(-1) - b
    return coef.to(menu_logp.dtype), label_marginal_kl(lp, menu_group)


def rlid_loss(menu_logits: torch.Tensor, chosen: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, *,
              episode_id: torch.Tensor, episode_len: torch.Tensor, menu_group: torch.Tensor, eps_low: float,
              eps_high: float, reg_coef: float, menu_ids: torch.Tensor | None = None,
              old_menu_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The whole RLiD loss (a scalar) from full menu logits [N, K] (differentiable), the
    chosen index [N], the old log-prob of the chosen label over the same menu [N], advantages
    [N], episode ids and lengths [N], menu groups [N]; `menu_ids` / `old_menu_ids` [N, K]
    are compared when given. Returns (loss, metrics)."""
    if menu_ids is not None or old_menu_ids is not None:
        if menu_ids is None or old_menu_ids is None:
            raise MenuError("pass both `menu_ids` and `old_menu_ids` to check that the old log-probs share the menu")
        check_same_menu(menu_ids, old_menu_ids)
    if not reg_coef >= 0:
        raise PolicylabError(f"`reg_coef` must be >= 0, got {reg_coef}")
    lsm = _menu_log_softmax(menu_logits)
    N, K = lsm.shape
    if bool(((chosen < 0) | (chosen >= K)).any()):
        raise ShapeError(f"`chosen` must index the menu [0, {K})")
    lp = lsm.gather(1, chosen.long().unsqueeze(-1))  # [N, 1]
    mask = torch.ones_like(lp, dtype=torch.bool)
    ell, m = ppo_clip(lp, logp_old.reshape(N, 1).to(lp.dtype), adv.reshape(N).to(lp.dtype), mask,
                      eps_low=eps_low, eps_high=eps_high)
    w = episode_weights(episode_id, episode_len).to(lp.dtype)
    policy = (w * ell.squeeze(-1)).sum() / N
    R = label_marginal_kl(lsm, menu_group)
    return policy + reg_coef * R, {"rlid/policy_loss": policy.detach(), "rlid/label_marginal_kl": R.detach(),
                                   "rlid/clip_frac": m.get("clip_frac", torch.zeros(()))}
