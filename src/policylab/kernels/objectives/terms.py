"""Token terms added next to a policy objective: the masked NLL and the entropy bonus.

Each returns a `[B, T]` loss matrix (exactly 0 where `mask` is False, not aggregated); the
method aggregates it on its own mask with its own normalizer. These are the library's one
implementation of each term: `testtime.self_distill_nll` and `testtime.entropy_bonus` are
the same functions under their methods' names.

    masked_nll     ℓ_t = −c · lp_t               where mask_t        (maximum likelihood)
    entropy_bonus  ℓ_t = −c · H(π_θ(·|s_t))       where mask_t        (minimizing it raises H)

Both are differentiable through their tensor input (the learner's `logp` or its per-token
entropy) at the counted positions only; NaN/inf/huge values stored at masked positions
reach neither the value nor the gradient (`checks.masked`, a select). c is a finite number
>= 0. Nothing is detached. Neither is a paper's own formula: the NLL is the supervised
log-likelihood loss, used on their own masks by VAPO's positive-example LM loss ("VAPO:
Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks", arXiv
2504.05118; no equation number checked) and TTPO's self-distillation; the entropy bonus is
the exploration term β·H(π) of "Asynchronous Methods for Deep Reinforcement Learning"
(Mnih et al., arXiv 1602.01783, Sec. 4, in the text, not a numbered equation), used by
Probe-ERPO's low branch and the `entropy_coef` addend.
"""

from __future__ import annotations

import math

import torch

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.checks import check_finite, check_mask, check_same_shape, masked


def check_token_term(t: torch.Tensor, mask: torch.Tensor, coef, name: str) -> None:
    """`t` [B, T] like the bool `mask`, finite where it counts; coef a finite number >= 0."""
    check_mask(mask, "mask")
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise ShapeError(f"`{name}` must be [B, T], got {tuple(getattr(t, 'shape', ()))}")
    check_same_shape(name, t, mask=mask)
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef < 0:
        raise PolicylabError(f"`coef` must be a finite number >= 0, got {coef!r}")
    check_finite(t.detach(), name, mask)


def masked_nll(logp: torch.Tensor, mask: torch.Tensor, *, coef: float) -> torch.Tensor:
    """ℓ_t = −coef · lp_t where `mask` counts, exactly 0 elsewhere, `[B, T]` (not aggregated).

    logp: `[B, T]` the learner's log-probs of the target tokens (differentiable); mask: bool
    `[B, T]`, the tokens to learn; coef: finite, >= 0."""
    check_token_term(logp, mask, coef, "logp")
    return -float(coef) * masked(logp, mask)


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, *, coef: float) -> torch.Tensor:
    """ℓ_t = −coef · H(π_θ(·|s_t)) where `mask` counts, exactly 0 elsewhere, `[B, T]`.

    entropy: `[B, T]` the learner's own per-token entropy (differentiable); minimizing ℓ
    increases H. coef: finite, >= 0."""
    check_token_term(entropy, mask, coef, "entropy")
    return -float(coef) * masked(entropy, mask)
