"""TTPO: split objectives for test-time adaptation without labels.

Paper: "TTPO: Test-Time Policy Optimization" (the arXiv id and the published equations
could not be checked, so every form below is an explicit, documented choice and the card
marks it unconfirmed).

Each unlabeled prompt gets G sampled replies; their extracted answers vote (the same
majority rule as TTRL, `policylab.kernels.rewards.majority_vote`). The replies are then split:

    agreeing  (answer = the group's majority):  self-distillation, token NLL on the
              model's own tokens,       ℓ_sd(i, t) = −w_sd · lp(i, t)
              except converged tokens,  p(i, t) > τ_conv  (they get exactly zero gradient)
    dissenting (every other reply of an eligible group, unparseable ones included):
              group-relative RL,        A(i, t) = w_rl · (r_i − mean_g r) / (std_g r + eps)
              with r_i = 1[answer_i = majority], on every token that passes the
              confident-error filter:   p(i, t) > τ_err (level "token"), or the reply's
              geometric-mean probability > τ_err (level "response"), is excluded.

p(i, t) = exp(logp_behavior): the probability the sampler gave the token it drew
(detached; conventions rule 3). The two terms are aggregated on their own masks with
their own normalizers (the distillation term on its mask, the RL term as the method's
policy term) and summed with the explicit weights w_sd and w_rl. Dissenting replies are
never deleted: they train unless the declared filter excludes them. Thresholds are
inclusive on the kept side: a token is kept iff p <= τ (conventions rule 10).
"""

from __future__ import annotations

import torch

from policylab.kernels.advantages import grpo
from policylab.kernels.checks import check_finite, check_mask, check_same_shape, float_mask
from policylab.kernels.objectives.terms import masked_nll
from policylab.errors import PolicylabError, ShapeError

ERR_LEVELS = ("token", "response")


def _threshold(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise PolicylabError(f"`{name}` must be a probability in (0, 1], got {value!r}")
    return float(value)


def _rows(t: torch.Tensor, name: str, B: int) -> torch.Tensor:
    check_mask(t, name)
    if t.shape != (B,):
        raise ShapeError(f"`{name}` must be [B] = ({B},), got {tuple(t.shape)}")
    return t


def ttpo_split(agree: torch.Tensor, eligible: torch.Tensor, logp_behavior: torch.Tensor, mask: torch.Tensor, *,
               tau_conv: float, tau_err: float, err_level: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The two token sets of TTPO, `[B, T]` bool each (detached, no gold argument).

    Args:
        agree: `[B]` bool, the reply's answer equals its group's majority answer.
        eligible: `[B]` bool, the reply's group has a majority (no tie, something parseable).
        logp_behavior: `[B, T]` log-probability of each sampled token under the sampler.
        mask: `[B, T]` bool loss mask (True = a response token).
        tau_conv: converged-token threshold in (0, 1]; agreeing tokens with p > tau_conv
            leave the distillation set (1.0: none leave). Unconfirmed: no default here.
        tau_err: confident-error threshold in (0, 1] on dissenting replies (1.0: no filter).
        err_level: "token" (filter each token on its own p) or "response" (filter a whole
            reply on its geometric-mean token probability exp(mean_t lp)).

    Returns:
        (distill_mask, rl_mask, info): info holds detached 0-dim counts and fractions:
        `distill_tokens`, `converged_tokens`, `rl_tokens`, `filtered_tokens`,
        `dissent_rows`, `agree_rows`.
    """
    check_mask(mask, "mask")
    if logp_behavior.dim() != 2:
        raise ShapeError(f"`logp_behavior` must be [B, T], got {tuple(logp_behavior.shape)}")
    check_same_shape("logp_behavior", logp_behavior, mask=mask)
    B = mask.shape[0]
    agree, eligible = _rows(agree, "agree", B), _rows(eligible, "eligible", B)
    tau_conv, tau_err = _threshold(tau_conv, "tau_conv"), _threshold(tau_err, "tau_err")
    if err_level not in ERR_LEVELS:
        raise PolicylabError(f"`err_level` must be one of {', '.join(ERR_LEVELS)}, got {err_level!r}")
    lp = logp_behavior.detach()
    check_finite(lp, "logp_behavior", mask)
    p = torch.where(mask, lp, torch.zeros((), dtype=lp.dtype)).exp()  # 1.0 outside the mask, never read there
    agree_rows = agree & eligible
    dissent_rows = eligible & ~agree
    distill_mask = mask & agree_rows.unsqueeze(-1) & (p <= tau_conv)
    if err_level == "token":
        keep = p <= tau_err
    else:
        n = mask.sum(-1).clamp(min=1)
        mean_lp = torch.where(mask, lp, torch.zeros((), dtype=lp.dtype)).sum(-1) / n
        keep = (mean_lp.exp() <= tau_err).unsqueeze(-1).expand_as(mask)
    rl_candidates = mask & dissent_rows.unsqueeze(-1)
    rl_mask = rl_candidates & keep
    info = {
        "distill_tokens": distill_mask.sum(),
        "converged_tokens": (mask & agree_rows.unsqueeze(-1) & ~(p <= tau_conv)).sum(),
        "rl_tokens": rl_mask.sum(),
        "filtered_tokens": (rl_candidates & ~keep).sum(),
        "dissent_rows": dissent_rows.sum(),
        "agree_rows": agree_rows.sum(),
    }
    return distill_mask, rl_mask, info


def ttpo_advantages(rewards: torch.Tensor, group: torch.Tensor, rl_mask: torch.Tensor, *, std: str, eps: float,
                    rl_coef: float) -> torch.Tensor:
    """Per-token advantages `[B, T]` of TTPO's RL term (detached):

        A(i, t) = rl_coef · grpo(r, group)_i   where rl_mask(i, t), else exactly 0

    `rewards` `[B]` are the 0/1 agreements with the group's majority (finite: ineligible
    groups must have been filtered out); the group statistics use every reply of the group,
    agreeing ones included (the baseline), but only the masked dissenting tokens carry the
    result. `std`/`eps` as in `advantages.grpo`."""
    check_mask(rl_mask, "rl_mask")
    if rl_mask.dim() != 2 or rl_mask.shape[0] != rewards.shape[0]:
        raise ShapeError(f"`rl_mask` must be [B, T] with B = {rewards.shape[0]}, got {tuple(rl_mask.shape)}")
    if isinstance(rl_coef, bool) or not isinstance(rl_coef, (int, float)) or rl_coef < 0:
        raise PolicylabError(f"`rl_coef` must be a number >= 0, got {rl_coef!r}")
    a = grpo(rewards, group, std=std, eps=eps)
    return (float(rl_coef) * a).unsqueeze(-1) * float_mask(rl_mask, a.dtype)


# TTPO's self-distillation term is the library's masked NLL (objectives.terms):
#     ℓ(i, t) = −coef · lp(i, t)   where mask(i, t) (the distillation set), else exactly 0
# Minimizing it raises the probability of the model's own majority-agreeing tokens.
self_distill_nll = masked_nll
