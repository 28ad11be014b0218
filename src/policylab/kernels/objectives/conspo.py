"""ConSPO: a group InfoNCE over length-normalized sequence log-probabilities.

Paper: "Revisiting Reinforcement Learning with Verifiable Rewards from a Contrastive
Perspective", Zhang et al., arXiv 2605.12969 (ConSPO objective; the abstract describes the
score, the group-wise InfoNCE and the curriculum margin; the equation numbers and the
published defaults were not checked).

    s_i = (1/|y_i|) Σ_t m_it·lp_it                                   (differentiable score)
    for a positive p of group g with negatives N_g (verifier verdicts, 1 = correct):
    ℓ_p = −log [ e^{(s_p − m)/τ} / (e^{(s_p − m)/τ} + Σ_{n∈N_g} e^{s_n/τ}) ]   (logsumexp)
    L   = mean of ℓ_p over the positives of eligible groups (≥ 1 positive and ≥ 1 negative)

Gradients (one positive p, softmax σ over {p} ∪ N_g of the scaled scores):
∂ℓ_p/∂s_p = −(1 − σ_p)/τ and ∂ℓ_p/∂s_n = σ_n/τ: a poorly separated positive (small σ_p)
gets a large push up, a high-scoring negative a large push down. Through s_i, every valid
token of response i receives ∂ℓ/∂s_i / |y_i|.

Unconfirmed and therefore explicit: τ (`tau`) and the margin m (`margin`, a number the
caller's schedule gives; `margin_at` is policylab's linear ramp); other positives of the
group are not in the denominator (each positive is contrasted with the negatives only);
no ratio to an old policy enters (the score uses the learner's log-probs only, so the
loss is an on-policy objective, like REINFORCE).

Output contract (as `gspo`): ℓ_p is written on every valid token of positive p, 0 on
negatives and on ineligible groups; aggregating with `seq_mean_token_mean` gives
(1/N_seq)·Σ_p ℓ_p. `row_scale` [B] (detached) multiplies each row's ℓ; the method passes
N_seq/N_trained of the round (`row_scale`), N_trained the positives of eligible groups
(`trained_positives`), so that the aggregate is the mean over those positives: a group
without a contrast adds nothing and does not shrink the loss. All-positive and
all-negative groups contribute exactly 0 (no NaN). Rows with no valid token have no
score: they are neither positives nor negatives and never enter a softmax.
"""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_finite, check_mask, group_index
from policylab.errors import PolicylabError, ShapeError


def conspo_scores(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """s_i = mean of the valid tokens' log-probs of response i, `[B]` (0 for an empty row);
    differentiable through `logp`."""
    m = mask.to(logp.dtype)
    lengths = m.sum(-1)
    total = torch.where(mask, logp, torch.zeros((), dtype=logp.dtype)).sum(-1)
    return total / lengths.clamp(min=1)


def trained_positives(group: torch.Tensor, positive: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The positives that enter L, `[B]` bool: a row with at least one valid token, marked
    positive, in a group that has at least one such positive and at least one negative
    WITH a valid token. A row without any valid token is neither positive nor negative (it
    has no score): a group whose only "negative" is empty is not eligible. The method's
    round stage counts these rows for the row scale, and `conspo` trains exactly these."""
    check_mask(mask)
    B = mask.shape[0]
    if positive.shape != (B,) or positive.dtype != torch.bool:
        raise ShapeError(f"`positive` must be a bool [B] = ({B},) verdict, got {positive.dtype} {tuple(positive.shape)}")
    dense, n = group_index(group, B)
    has = mask.any(-1)
    pos, neg = positive & has, ~positive & has
    n_pos = torch.zeros(n, dtype=torch.long, device=mask.device).index_add_(0, dense, pos.long())
    n_neg = torch.zeros(n, dtype=torch.long, device=mask.device).index_add_(0, dense, neg.long())
    eligible = (n_pos > 0) & (n_neg > 0)
    return pos & eligible[dense]


def row_scale(group: torch.Tensor, positive: torch.Tensor, mask: torch.Tensor) -> float:
    """N_seq / N_trained over the round: with `seq_mean_token_mean` (1/N_seq per counted
    row), ℓ_p·N_seq/N_trained on the trained positives makes the aggregate the mean of ℓ_p
    over the positives of eligible groups, L = (1/N_trained) Σ_p ℓ_p, so groups without a
    contrast (all positive, all negative, or negatives without a valid token) neither add
    to L nor shrink it. N_seq counts rows with a valid token; 1.0 when nothing is trained
    (the loss is 0 then)."""
    n_seq = int(mask.any(-1).sum())
    n_tr = int(trained_positives(group, positive, mask).sum())
    return n_seq / n_tr if n_tr else 1.0


def margin_at(step: int, *, margin_max: float, ramp_steps: int) -> float:
    """policylab's curriculum for the margin: 0 at step 0, rising linearly to `margin_max`
    at `ramp_steps` and constant after (ramp_steps = 0: `margin_max` from the start). The
    paper's schedule is unconfirmed; this is a library decision."""
    if margin_max < 0 or ramp_steps < 0:
        raise PolicylabError(f"margin_max and ramp_steps must be >= 0, got {margin_max}, {ramp_steps}")
    if ramp_steps == 0:
        return float(margin_max)
    return float(margin_max) * min(1.0, max(0, int(step)) / ramp_steps)


def conspo(logp: torch.Tensor, mask: torch.Tensor, group: torch.Tensor, positive: torch.Tensor, *, tau: float,
           margin: float, row_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """ConSPO loss matrix `[B, T]` (see the module doc) and detached metrics.

    logp [B, T] learner log-probs; mask [B, T] bool; group [B] ids; positive [B] bool (the
    verifier's verdict); tau > 0; margin >= 0 (the schedule's value now); row_scale [B]
    optional detached per-row factor. Every group must be whole in the call (the method
    declares row_coupling="group")."""
    check_mask(mask)
    if logp.shape != mask.shape or logp.dim() != 2:
        raise ShapeError(f"`logp` must be [B, T] like `mask` {tuple(mask.shape)}, got {tuple(logp.shape)}")
    B = logp.shape[0]
    if positive.shape != (B,) or positive.dtype != torch.bool:
        raise ShapeError(f"`positive` must be a bool [B] = ({B},) verdict, got {positive.dtype} {tuple(positive.shape)}")
    if not tau > 0:
        raise PolicylabError(f"`tau` must be > 0, got {tau}")
    if not margin >= 0:
        raise PolicylabError(f"`margin` must be >= 0, got {margin}")
    check_finite(logp, "logp", mask)
    dense, n = group_index(group, B)
    has = mask.any(-1)
    s = conspo_scores(logp, mask)
    pos, neg = positive & has, ~positive & has
    trained = trained_positives(group, positive, mask)
    eligible = torch.zeros(n, dtype=torch.bool, device=logp.device).index_fill_(0, dense[trained], True)
    # log Σ_{n ∈ N_g} e^{s_n/τ} per group, by a masked logsumexp over [n_groups, B]
    z = s / tau
    member = (dense.unsqueeze(0) == torch.arange(n, device=logp.device).unsqueeze(1)) & neg.unsqueeze(0)
    neg_lse = torch.where(member, z.unsqueeze(0), torch.full((), float("-inf"), dtype=z.dtype)).logsumexp(-1)
    zp = (s - margin) / tau
    row_neg = neg_lse[dense]
    denom = torch.logaddexp(zp, torch.where(trained, row_neg, torch.zeros((), dtype=z.dtype)))
    ell = torch.where(trained, denom - zp, torch.zeros((), dtype=z.dtype))  # −log softmax_p
    if row_scale is not None:
        if row_scale.shape != (B,):
            raise ShapeError(f"`row_scale` must be [B] = ({B},), got {tuple(row_scale.shape)}")
        ell = ell * row_scale.detach().to(ell.dtype)
    loss = torch.where(mask, ell.unsqueeze(-1).expand_as(logp), torch.zeros((), dtype=logp.dtype))
    return loss, conspo_metrics(s, denom - zp, trained, eligible, pos, neg)


def conspo_metrics(s, neg_log_softmax, trained, eligible, pos, neg) -> dict[str, torch.Tensor]:
    """Detached float64 "conspo/<name>": the fraction of eligible groups, the positives'
    mean softmax probability σ_p = exp(−ℓ_p) (before `row_scale`), the mean score gap
    between positives and negatives, and the number of trained positives."""
    with torch.no_grad():
        sp = torch.exp(-neg_log_softmax.detach())
        n_tr = int(trained.sum())
        return {
            "conspo/eligible_group_frac": eligible.double().mean(),
            "conspo/positive_softmax_mean": (sp[trained].double().mean() if n_tr else torch.zeros((), dtype=torch.float64)),
            "conspo/score_gap": score_gap(s.detach(), pos, neg),
            "conspo/positives_count": torch.tensor(float(n_tr), dtype=torch.float64),
        }


def score_gap(s: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """mean s over positives − mean s over negatives (0 when either side is empty)."""
    if not bool(pos.any()) or not bool(neg.any()):
        return torch.zeros((), dtype=torch.float64)
    return (s[pos].double().mean() - s[neg].double().mean())
