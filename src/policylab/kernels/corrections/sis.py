"""SIS: turn stale (off-policy) tokens on-policy by per-token rejection sampling.

At each position t, with π the current policy (detached) and μ the stale behavior policy:

    S_t   = TopK_μ(t) ∪ {y_t}               the behavior's top-K ids plus the sampled token
    M_t   = max(1, max_{v in S_t} π(v)/μ(v))       top-K estimate of the envelope sup π/μ
    acc_t = u_t < π(y_t) / (M_t · μ(y_t)),   u_t ~ U[0, 1) from a seeded generator
    accepted token:  ratio replaced by the unit carrier exp(lp - sg(lp))  (value 1, ∇lp)
    rejected token:  keeps the host's ratio and clipping (nothing is dropped)

Because y_t is in S_t, π(y_t)/(M_t μ(y_t)) <= 1: the acceptance probability is exactly
that quotient, never more than 1. With π = μ every quotient is 1, M = 1 and every token is
accepted. π(y) = 0.3, μ(y) = 0.5, M = 1.5 gives 0.6 / 1.5 = 0.4.

Paper: "Turning Off-Policy Tokens On-Policy: A Plug-in Approach for Improving LLM
Alignment" — title **unconfirmed** (no copy of the paper was checked); no arXiv id. Library decisions: (1) the sampled token is added to the set the envelope is
taken over when it lies outside the behavior top-K; (2) M_t is floored at 1, because the
exact envelope sup_v π(v)/μ(v) is >= 1 for any two distributions, so the floor only
moves the top-K estimate towards the true value; (3) one uniform is drawn for every [B, T]
position (masked ones included), so the acceptance of a position does not depend on the
mask of the others. Acceptance is decided once per update round from detached inputs.
No equation number: the paper could not be checked. Deviations: the library decisions
(1)–(3) above.
"""

from __future__ import annotations

import torch

from policylab.errors import ShapeError
from policylab.kernels.corrections.common import check_roles, masked_fraction, masked_log_ratio, masked_mean, prefixed
from policylab.kernels.corrections.diagnostics import mismatch_stats


def _check_topk(ids: torch.Tensor, lp_mu: torch.Tensor, lp_pi: torch.Tensor, mask: torch.Tensor) -> None:
    want = tuple(mask.shape)
    for name, t in (("behavior_topk_ids", ids), ("behavior_topk_logp", lp_mu),
                    ("current_topk_logp", lp_pi)):
        if t is None:
            raise ShapeError(f"sis needs `{name}` [B, T, K]; record it at rollout time")
        if t.dim() != 3 or tuple(t.shape[:2]) != want or t.shape != ids.shape:
            raise ShapeError(f"`{name}` must be [B, T, K] with [B, T] = {want}, got {tuple(t.shape)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise ShapeError(f"`behavior_topk_ids` must be an integer tensor, got {ids.dtype}")
    if ids.shape[-1] < 1:
        raise ShapeError("`behavior_topk_ids` needs K >= 1")
    for name, t in (("behavior_topk_logp", lp_mu), ("current_topk_logp", lp_pi)):
        if not t.is_floating_point():
            raise ShapeError(f"`{name}` must be floating point, got {t.dtype}")
        if bool((~torch.isfinite(t) & mask.unsqueeze(-1)).any()):
            raise ShapeError(f"`{name}` has non-finite values at counted positions")


def sis(
    logp: torch.Tensor,
    behavior_topk_ids: torch.Tensor,
    behavior_topk_logp: torch.Tensor,
    current_topk_logp: torch.Tensor,
    tokens: torch.Tensor,
    logp_behavior_token: torch.Tensor,
    mask: torch.Tensor,
    *,
    generator: torch.Generator,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Acceptance mask of the rejection test (see module doc).

    logp: [B, T] current-policy log-prob of the sampled token (used detached);
    behavior_topk_ids / behavior_topk_logp / current_topk_logp: [B, T, K] the behavior's
    top-K ids, μ's and π's log-probs at those ids; tokens: [B, T] sampled ids;
    logp_behavior_token: [B, T] μ's log-prob of the sampled token; mask: [B, T] bool.
    generator: owned, seeded torch.Generator (save its state in checkpoints).
    Returns (accepted [B, T] bool, False where mask is False; metrics: acceptance rate and
    mean probability, envelope, fraction of sampled tokens outside the top-K, fraction of
    floored envelopes, and the π/μ ratio statistics of the sampled tokens).
    """
    check_roles("sis", mask, logp=logp, logp_behavior_token=logp_behavior_token)
    _check_topk(behavior_topk_ids, behavior_topk_logp, current_topk_logp, mask)
    if tokens.shape != mask.shape:
        raise ShapeError(f"`tokens` must be [B, T] = {tuple(mask.shape)}, got {tuple(tokens.shape)}")
    if not isinstance(generator, torch.Generator):
        raise TypeError("`generator` must be a seeded torch.Generator (randomness is owned)")
    f64 = torch.float64
    log_q_y = masked_log_ratio(logp.detach(), logp_behavior_token.detach(), mask).to(f64)  # log π(y)/μ(y)
    m3 = mask.unsqueeze(-1).expand_as(behavior_topk_logp)
    log_q_topk = masked_log_ratio(current_topk_logp.detach().to(f64),
                                  behavior_topk_logp.detach().to(f64), m3)  # log π(v)/μ(v), v in TopK_μ
    log_sup = torch.maximum(log_q_topk.max(-1).values, log_q_y)  # max over S_t = TopK_μ ∪ {y_t}
    log_env = log_sup.clamp_min(0.0)  # log M_t, M_t = max(1, ·)
    accept_prob = torch.exp(log_q_y - log_env)  # π(y)/(M_t·μ(y)) <= 1 because y_t is in S_t
    u = torch.rand(mask.shape, generator=generator, dtype=f64, device=generator.device)
    accepted = (u < accept_prob) & mask
    return accepted, sis_metrics(accepted, accept_prob, log_env, log_sup, behavior_topk_ids, tokens,
                                 logp, logp_behavior_token, mask)


def sis_metrics(accepted, accept_prob, log_env, log_sup, topk_ids, tokens, logp, logp_behavior_token,
                mask) -> dict[str, torch.Tensor]:
    """Metrics "sis/<name>": acceptance rate and mean probability, mean log envelope,
    fraction of sampled tokens outside the behavior top-K, fraction of floored envelopes,
    and the π/μ ratio statistics of the sampled tokens (`mismatch_stats`)."""
    in_topk = (topk_ids == tokens.unsqueeze(-1)).any(-1)
    like = logp
    metrics = {
        "accept_rate": masked_fraction(accepted, mask, like),
        "accept_prob_mean": masked_mean(accept_prob, mask, like),
        "log_envelope_mean": masked_mean(log_env, mask, like),
        "frac_sampled_outside_topk": masked_fraction(~in_topk, mask, like),
        "frac_envelope_floored": masked_fraction(log_sup < 0, mask, like),
        **mismatch_stats(logp, logp_behavior_token, mask),
    }
    return prefixed("sis", metrics)
