"""KPop: keep a token only if the binary KL between the two engines is small both ways.

On the sampled token vs the rest of the vocabulary (a Bernoulli per position):

    p_tr = clamp(exp(lp_old), eps, 1 - eps)      training engine at θ_old
    p_sv = clamp(exp(lp_mu),  eps, 1 - eps)      serving (rollout) engine at θ_old
    D_f  = p_tr·log(p_tr/p_sv) + (1-p_tr)·log((1-p_tr)/(1-p_sv))     KL(train || serve)
    D_r  = the same with the roles swapped                            KL(serve || train)
    keep = 1[D_f <= δ and D_r <= δ]              both directions, inclusive
    w    = keep · (k = exp(lp_old - lp_mu)  if in_region_weight == "ratio"
                   1                         if in_region_weight == "one")
    loss_t = sg(w_t) · loss^base_t

Unlike a fixed ratio band, the same ratio can be kept at small probabilities and masked at
large ones: (0.02, 0.01) has D_f = 0.0039 and is kept at δ = 0.01, (0.8, 0.4) has
D_f = 0.335 and is masked.

Paper: J. Guo, Y. Sun et al. (Ant Group / NUS), "Taming Training–Inference Mismatch in
Reinforcement Learning with Adaptive Masking Regions" (technical blog,
ringtech.notion.site/kpop; no arXiv id found). Confirmed against the blog: title,
authors, that it is the successor of IcePop replacing the fixed ratio band. Unconfirmed:
δ's default, the in-region weight (k as in IcePop, or 1), the clamp value, and the venue;
all are explicit arguments. The clamp `eps` is recorded in the metrics (conventions rule 13).

Detached: the weight. Positions where `mask` is False get weight 0. D is floored at 0 to
remove round-off below zero (a binary KL is >= 0 exactly).
No equation number: a blog without numbered equations was the source. Deviations: the
probability clamp `eps` (recorded) and the floor at 0, both numerical.
"""

from __future__ import annotations

from typing import Literal

import torch

from policylab.kernels.checks import masked
from policylab.kernels.corrections.common import (
    check_positive,
    check_roles,
    masked_fraction,
    masked_log_ratio,
    prefixed,
    scalar,
)
from policylab.kernels.corrections.diagnostics import ess, mismatch_stats


def clamped_probs(logp: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, 1 - p) from log p, each clamped to [eps, 1 - eps]; 1 - p via expm1 for accuracy."""
    p = torch.exp(logp).clamp(eps, 1 - eps)
    q = (-torch.expm1(logp)).clamp(eps, 1 - eps)
    return p, q


def binary_kl(
    p_a: torch.Tensor, q_a: torch.Tensor, p_b: torch.Tensor, q_b: torch.Tensor
) -> torch.Tensor:
    """KL(Bern(p_a) || Bern(p_b)) = p_a log(p_a/p_b) + q_a log(q_a/q_b), q = 1 - p given
    separately (already clamped away from 0 and 1); floored at 0 against round-off."""
    d = p_a * (torch.log(p_a) - torch.log(p_b)) + q_a * (torch.log(q_a) - torch.log(q_b))
    return d.clamp_min(0)


def kpop(
    logp_old: torch.Tensor,
    logp_behavior: torch.Tensor,
    mask: torch.Tensor,
    *,
    delta: float,
    eps: float = 1e-6,
    in_region_weight: Literal["ratio", "one"],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KPop weights w = sg(1[D_f <= δ and D_r <= δ] · k) (or · 1), see the module doc.

    logp_old, logp_behavior, mask: [B, T]. delta > 0 (**unconfirmed**); eps in (0, 0.5)
    is the probability clamp (**unconfirmed**, recorded as metric `kpop/eps`);
    in_region_weight "ratio" | "one" (**unconfirmed**). Returns (weights [B, T] detached;
    metrics: fraction masked overall / by the forward KL / by the reverse KL, KL means and
    maxima, ESS, raw ratio statistics).
    """
    check_roles("kpop", mask, logp_old=logp_old, logp_behavior=logp_behavior)
    delta = check_positive("delta", delta)
    eps = float(eps)
    if not 0 < eps < 0.5:
        raise ValueError(f"`eps` must be in (0, 0.5), got {eps}")
    if in_region_weight not in ("ratio", "one"):
        raise ValueError(f"`in_region_weight` must be 'ratio' or 'one', got {in_region_weight!r}")
    lp_tr = masked(logp_old.detach(), mask).to(torch.float64)
    lp_sv = masked(logp_behavior.detach(), mask).to(torch.float64)
    p_tr, q_tr = clamped_probs(lp_tr, eps)  # training engine at θ_old
    p_sv, q_sv = clamped_probs(lp_sv, eps)  # serving engine at θ_old
    d_f = binary_kl(p_tr, q_tr, p_sv, q_sv)  # KL(train || serve)
    d_r = binary_kl(p_sv, q_sv, p_tr, q_tr)  # KL(serve || train)
    keep = (d_f <= delta) & (d_r <= delta) & mask  # both directions, inclusive
    if in_region_weight == "ratio":
        inside = torch.exp(masked_log_ratio(logp_old.detach(), logp_behavior.detach(), mask))  # k
    else:
        inside = torch.ones_like(logp_old, dtype=logp_old.dtype).detach()
    weight = torch.where(keep, inside, torch.zeros_like(inside))  # detached
    return weight, kpop_metrics(d_f, d_r, keep, weight, mask, delta=delta, eps=eps,
                                logp_old=logp_old, logp_behavior=logp_behavior)


def kpop_metrics(d_f, d_r, keep, weight, mask, *, delta: float, eps: float, logp_old,
                 logp_behavior) -> dict[str, torch.Tensor]:
    """Metrics "kpop/<name>": fractions masked overall / by the forward KL / by the reverse
    KL, the two KLs' means and maxima over counted tokens, the clamp `eps`, the weights'
    ESS and the raw engine-ratio statistics (`mismatch_stats`)."""
    d_f_c, d_r_c = d_f[mask], d_r[mask]
    any_tok = bool(mask.any())
    metrics = {
        "frac_masked": masked_fraction(~keep, mask, weight),
        "frac_masked_forward": masked_fraction(d_f > delta, mask, weight),
        "frac_masked_reverse": masked_fraction(d_r > delta, mask, weight),
        "kl_forward_mean": scalar(d_f_c.mean() if any_tok else 0.0, weight),
        "kl_forward_max": scalar(d_f_c.max() if any_tok else 0.0, weight),
        "kl_reverse_mean": scalar(d_r_c.mean() if any_tok else 0.0, weight),
        "kl_reverse_max": scalar(d_r_c.max() if any_tok else 0.0, weight),
        "eps": scalar(eps, weight),
        "ess": ess(weight, mask),
        **mismatch_stats(logp_old, logp_behavior, mask),
    }
    return prefixed("kpop", metrics)
