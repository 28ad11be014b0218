"""ERPO: question-side weights from the frozen reference's likelihood of each prompt.

Paper: "Beyond the Stability-Exploration Dilemma: Environmental Regularization for LLM
Policy Optimization" (OpenReview submission; arXiv id not confirmed). What its abstract
states and this module follows: the regularization acts on the input (query) side, not on
the answer distribution; a Query-KL compares a query distribution with a fixed reference
one; updates are reweighted by an estimate of each query's prevalence. The forms below are
policylab's (unconfirmed):

    τ(x)   = (1/|x|) Σ_j log π_ref(x_j | x_<j)     typicality of the question (its own tokens
                                                   in the chat template, reference frozen)
    ω      = argmax_w  (1/B) Σ_i w_i τ(x_i) − λ_Q·KL(q_w ‖ U),   q_w,i = w_i/B, mean w = 1
           → ω_i = B·softmax_i(τ(x_i)/λ_Q)          (the Query-KL penalty λ_Q > 0 in closed form)
    QKL    = KL(q_ω ‖ U) = (1/B) Σ_i ω_i log ω_i    the Query-KL of the weights actually used
    A'_i   = ω_i·A_i                                each prompt's loss scaled by its weight

U is the batch's own sampling distribution over its rows (each row 1/B). ω depends on the
prompts and π_ref only (never on rewards, correctness or the learner), is > 0 (it never
flips an advantage's sign) and has mean exactly 1 over the batch. λ_Q → ∞ gives ω = 1 (no
reweighting); small λ_Q concentrates the weight on the most typical questions. There is no
KL term on answer tokens.
"""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_mask
from policylab.errors import PolicylabError, ShapeError


def question_typicality(prompt_logp: torch.Tensor, question_mask: torch.Tensor) -> torch.Tensor:
    """τ [B]: mean of `prompt_logp` [B, P] over `question_mask` [B, P] (the question's
    tokens; template and padding excluded). A row without question tokens raises."""
    check_mask(question_mask, "question_mask")
    if prompt_logp.shape != question_mask.shape:
        raise ShapeError(f"`prompt_logp` {tuple(prompt_logp.shape)} and `question_mask` "
                         f"{tuple(question_mask.shape)} differ")
    n = question_mask.sum(-1)
    if bool((n == 0).any()):
        raise PolicylabError(f"row {int((n == 0).nonzero()[0])} has no question token to score")
    lp = torch.where(question_mask, prompt_logp.detach(), torch.zeros((), dtype=prompt_logp.dtype))
    return lp.sum(-1) / n.to(lp.dtype)


def question_weights(typicality: torch.Tensor, *, qkl_coef: float) -> tuple[torch.Tensor, dict]:
    """ω [B] = B·softmax(τ/λ_Q) (detached, mean 1) and {"erpo/query_kl", ...}."""
    if typicality.dim() != 1 or typicality.numel() == 0:
        raise ShapeError(f"`typicality` must be a non-empty [B], got {tuple(typicality.shape)}")
    if not qkl_coef > 0:
        raise PolicylabError(f"the Query-KL coefficient must be > 0 (its inverse tilts the weights), got {qkl_coef}")
    B = typicality.numel()
    t = typicality.detach().double()
    w = B * torch.softmax(t / qkl_coef, 0)
    qkl = (w * torch.log(w)).mean()
    info = {"erpo/query_kl": float(qkl), "erpo/weight_max": float(w.max()), "erpo/weight_min": float(w.min()),
            "erpo/typicality_mean": float(t.mean())}
    return w.to(typicality.dtype), info
