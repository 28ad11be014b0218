"""Probe-ERPO: answer-independent probe consistency decides, per prompt, whether the
update reinforces the top-ranked candidates or suppresses the low-ranked ones.

Paper: "Probe-ERPO" (the full title and arXiv id could not be confirmed; the mechanism is
implemented as described here, every form below is an explicit parameter and the card
marks it unconfirmed). No function here takes a gold answer (conventions rule 7).

For one prompt with G candidate replies:

    ranks      order of the candidates by a self-assessed score (votes for the reply's
               answer, then the reply's mean log-probability), 0 = top; `rank_candidates`
    PCR        probe consistency rate: the fraction of the prompt's probes (questions about
               intermediate quantities, never the final answer) whose answer is consistent
               with the top-ranked candidate's answer; `probes.probe_consistency`
    branch     PCR >= τ (inclusive): "high", else "low"; `probe_branch`
    high       A_i = +c_pos for the top_k ranked candidates, 0 for the others
    low        A_i = −c_neg for the ceil(f·G) lowest-ranked candidates, 0 for the others
               (no positive target at all), plus an entropy bonus on the group's tokens
               (`entropy_bonus`, aggregated on its own mask): minimizing −c_H·H raises H

The advantages are sequence-level `[B]`, detached, and feed the host objective (PPO clip).
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite, check_mask, group_index
from policylab.kernels.objectives.terms import entropy_bonus
from policylab.errors import PolicylabError, ShapeError


def _vec(t: torch.Tensor, name: str, B: int | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != 1:
        raise ShapeError(f"`{name}` must be a 1-D tensor [B], got {getattr(t, 'shape', type(t).__name__)}")
    if B is not None and t.shape[0] != B:
        raise ShapeError(f"`{name}` must be [B] = ({B},), got {tuple(t.shape)}")
    return t


def rank_candidates(votes: torch.Tensor, score: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Rank of every candidate inside its group, `[B]` long, 0 = top.

    Order: more `votes` first (the number of group members sharing the candidate's
    answer; 0 for an unparseable reply), then the higher `score` (e.g. the reply's mean
    token log-probability under the sampler), then the lower row index (a fixed,
    documented tie-break: library decision). A loop reference lives in the tests."""
    votes = _vec(votes, "votes")
    B = votes.shape[0]
    score = _vec(score, "score", B)
    if not score.is_floating_point():
        raise ShapeError(f"`score` must be floating point, got {score.dtype}")
    check_finite(score, "score")
    dense, _ = group_index(group, B)
    idx = torch.arange(B)
    # lexicographic sort: group, then −votes, then −score, then index (stable sorts, last key first)
    order = idx
    for key, desc in ((score.detach().double(), True), (votes.double(), True), (dense.double(), False)):
        order = order[torch.sort(key[order], descending=desc, stable=True).indices]
    ranks = torch.empty(B, dtype=torch.long)
    sorted_groups = dense[order]
    starts = torch.zeros(B, dtype=torch.long)
    if B:
        first = torch.ones(B, dtype=torch.bool)
        first[1:] = sorted_groups[1:] != sorted_groups[:-1]
        pos = torch.arange(B)
        starts = torch.cummax(torch.where(first, pos, torch.zeros_like(pos)), 0).values
        ranks[order] = pos - starts
    return ranks


def probe_branch(pcr: torch.Tensor, *, tau: float) -> torch.Tensor:
    """`[B]` bool, True = the row's prompt is in the low branch: PCR < τ (high iff PCR >= τ,
    inclusive; conventions rule 10). `pcr` `[B]` in [0, 1] (the prompt's PCR on each row)."""
    pcr = _vec(pcr, "pcr")
    if not pcr.is_floating_point():
        raise ShapeError(f"`pcr` must be floating point, got {pcr.dtype}")
    check_finite(pcr, "pcr")
    if bool(((pcr < 0) | (pcr > 1)).any()):
        raise PolicylabError("`pcr` must lie in [0, 1]")
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 <= float(tau) <= 1.0:
        raise PolicylabError(f"`tau` must be in [0, 1], got {tau!r}")
    return pcr < float(tau)


def probe_erpo_advantages(ranks: torch.Tensor, low: torch.Tensor, group: torch.Tensor, *, top_k: int,
                          suppress_frac: float, pos_coef: float, neg_coef: float) -> tuple[torch.Tensor, dict]:
    """Sequence advantages `[B]` (float32, detached) and counts.

        high group (low_i False):  A_i = +pos_coef  if rank_i < top_k            else 0
        low group  (low_i True):   A_i = −neg_coef  if rank_i >= G_g − ceil(f·G_g)  else 0

    G_g is the size of the row's group; `low` must be constant within a group. The low
    branch never produces a positive advantage (tested)."""
    ranks = _vec(ranks, "ranks")
    B = ranks.shape[0]
    check_mask(low, "low")
    _vec(low, "low", B)
    dense, n = group_index(group, B)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise PolicylabError(f"`top_k` must be an int >= 1, got {top_k!r}")
    if isinstance(suppress_frac, bool) or not isinstance(suppress_frac, (int, float)) or not 0 < suppress_frac <= 1:
        raise PolicylabError(f"`suppress_frac` must be in (0, 1], got {suppress_frac!r}")
    for name, v in (("pos_coef", pos_coef), ("neg_coef", neg_coef)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise PolicylabError(f"`{name}` must be a finite number >= 0, got {v!r}")
    size = torch.zeros(n, dtype=torch.long).index_add_(0, dense, torch.ones(B, dtype=torch.long))
    low_count = torch.zeros(n, dtype=torch.long).index_add_(0, dense, low.long())
    mixed = (low_count != 0) & (low_count != size)
    if bool(mixed.any()):
        raise PolicylabError("`low` must be the same for every row of a group (the branch is a prompt-level decision)")
    G = size[dense]
    if bool(((ranks < 0) | (ranks >= G)).any()):
        raise PolicylabError("`ranks` must lie in [0, G_g) for each row's group")
    n_suppress = torch.ceil(G.double() * float(suppress_frac)).long()
    reinforce = ~low & (ranks < top_k)
    suppress = low & (ranks >= G - n_suppress)
    adv = torch.zeros(B, dtype=torch.float32)
    adv = torch.where(reinforce, torch.full_like(adv, float(pos_coef)), adv)
    adv = torch.where(suppress, torch.full_like(adv, -float(neg_coef)), adv)
    info = {"reinforced": reinforce.sum(), "suppressed": suppress.sum(),
            "low_groups": (low_count > 0).sum(), "groups": torch.tensor(n)}
    return adv, info


# Probe-ERPO's exploration term on the low branch, `entropy_bonus` (imported above), is the
# library's entropy bonus (objectives.terms): ℓ(i, t) = −coef · H(π_θ(·|s_t)) where
# mask(i, t), else exactly 0; aggregated on its own mask.
__all__ = ["entropy_bonus", "probe_branch", "probe_erpo_advantages", "rank_candidates"]
