"""ZCPO: zero-sum group coefficients from rewards and the full-vocabulary KL drift.

Paper: "When KL Regularization Misfires in Group Policy Optimization" (arXiv id not
confirmed). The combination of reward and drift below is the specification's reading of
it; the exact published form is unconfirmed.

    κ_it = Σ_v π_θ(v|s_it)·(log π_θ(v|s_it) − log π_ref(v|s_it))    exact KL, detached
    K_i  = (1/|y_i|) Σ_t m_it κ_it                                    mean drift of response i
    σ_g  = std_g(r)  (convention explicit);  group g eligible iff G_g ≥ 2 and σ_g > 0
    c_i  = ((r_i − mean_g r) − β·(K_i − mean_g K)) / σ_g     eligible groups; 0 otherwise

Σ_{i∈g} c_i = 0 in every group (both centred terms sum to zero). c replaces the advantage
in the host's clipped surrogate; there is no separate KL loss. A group whose rewards are
all equal is ineligible even when its drifts differ (the drift only re-orders credit
within a group that has a reward signal). When no group of an optimizer step is eligible,
every coefficient is 0 and the step is skipped entirely (no backward, no weight decay, no
scheduler or step-counter advance: conventions rule 6; the trainer does so for any
A-proportional objective whose rows all have zero advantage).

κ must be the full-vocabulary KL: a sampled-token log-ratio lp − lp_ref is a one-sample
estimate of it (its mean over the sampled tokens is KL only in expectation, and it is
negative for some tokens), so it is refused: `zcpo_coefficients` takes a `FullVocabKL`,
which only `full_vocab_kl` (from [B, T, V] log-probs) and `from_worker` (the chunked
`LocalWorker.vocab_stats(batch, kl_to_reference=True)`) produce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from policylab.kernels.checks import check_finite, check_mask
from policylab.kernels.advantages.group import Groups, check_rewards, std_ddof
from policylab.errors import PolicylabError, ShapeError

_HOW = ("compute it from the full next-token distributions: objectives.zcpo.full_vocab_kl(logp_full, "
        "logp_ref_full, mask) with [B, T, V] log-probs, or, without building [B, T, V], "
        "LocalWorker.vocab_stats(batch, kl_to_reference=True) wrapped by objectives.zcpo.from_worker")


@dataclass(frozen=True)
class FullVocabKL:
    """Per-position exact KL(π_θ‖π_ref) `[B, T]` (detached, >= 0) and where it came from."""

    values: torch.Tensor
    source: str


def full_vocab_kl(logp_full: torch.Tensor, logp_ref_full: torch.Tensor, mask: torch.Tensor) -> FullVocabKL:
    """κ [B, T] from full-vocabulary log-probs `[B, T, V]` of π_θ (detached here) and
    π_ref; 0 outside `mask`. A `[B, T]` input (the sampled token's log-prob) is refused."""
    for name, t in (("logp_full", logp_full), ("logp_ref_full", logp_ref_full)):
        if t.dim() != 3:
            raise ShapeError(
                f"zcpo needs full-vocabulary log-probs [B, T, V] for `{name}`, got {tuple(t.shape)}: a [B, T] tensor "
                f"holds the sampled token's log-prob only, and a sampled-token log-ratio is not the KL; {_HOW}")
    if logp_full.shape != logp_ref_full.shape or logp_full.shape[:2] != mask.shape:
        raise ShapeError(f"`logp_full` {tuple(logp_full.shape)}, `logp_ref_full` {tuple(logp_ref_full.shape)} and "
                         f"`mask` {tuple(mask.shape)} must agree on [B, T, V]")
    check_mask(mask)
    lp, lq = logp_full.detach(), logp_ref_full.detach()
    p = lp.exp()
    fin = torch.isfinite(lp)  # p = 0 where lp = -inf (a truncated policy): those terms are 0
    terms = torch.where(fin, p * (lp - torch.where(fin, lq, torch.zeros((), dtype=lq.dtype))),
                        torch.zeros((), dtype=lp.dtype))
    kl = torch.where(mask, terms.sum(-1), torch.zeros((), dtype=lp.dtype))
    return FullVocabKL(kl, "full_vocab_kl")


def from_worker(kl: torch.Tensor) -> FullVocabKL:
    """Wrap the `kl` entry of `LocalWorker.vocab_stats(batch, kl_to_reference=True)`."""
    return FullVocabKL(kl.detach(), "LocalWorker.vocab_stats")


def response_drift(drift: FullVocabKL, mask: torch.Tensor) -> torch.Tensor:
    """K_i = mean over the valid tokens of response i of κ_it, `[B]` (0 for an empty row)."""
    if not isinstance(drift, FullVocabKL):
        got = f"a tensor of shape {tuple(drift.shape)}" if isinstance(drift, torch.Tensor) else type(drift).__name__
        raise PolicylabError(f"zcpo needs the full-vocabulary KL drift per position, got {got} (a sampled-token "
                             f"log-ratio such as logp − logp_ref cannot stand in for it); {_HOW}")
    v = drift.values
    check_mask(mask)
    if v.shape != mask.shape:
        raise ShapeError(f"the KL drift has shape {tuple(v.shape)}, the mask {tuple(mask.shape)}")
    check_finite(v, "KL drift", mask)
    if bool((torch.where(mask, v, torch.zeros((), dtype=v.dtype)) < -1e-6).any()):
        raise PolicylabError(f"the KL drift ({drift.source}) is negative at a counted position: an exact KL is >= 0; "
                             f"this looks like a sampled-token log-ratio; {_HOW}")
    m = mask.to(v.dtype)
    return (v * m).sum(-1) / m.sum(-1).clamp(min=1)


def zcpo_coefficients(rewards: torch.Tensor, group: torch.Tensor, drift: FullVocabKL, mask: torch.Tensor, *,
                      beta: float, std: str) -> tuple[torch.Tensor, dict]:
    """c [B] (detached; see the module doc) and diagnostics (eligible fraction, mean K).

    rewards [B]; group [B] ids, whole groups; drift: a FullVocabKL [B, T]; mask [B, T];
    beta >= 0; std "unbiased" | "population" (required: the paper's convention is not
    confirmed)."""
    check_rewards(rewards)
    if not (isinstance(beta, (int, float)) and beta >= 0):
        raise PolicylabError(f"`beta` must be >= 0, got {beta!r}")
    ddof = std_ddof(std)
    if ddof is None:
        raise PolicylabError("zcpo divides by the group std: `std` must be 'unbiased' or 'population'")
    K = response_drift(drift, mask).to(rewards.dtype)
    if K.shape != rewards.shape:
        raise ShapeError(f"rewards {tuple(rewards.shape)} and the drift's rows {tuple(K.shape)} differ")
    g = Groups.of(group, rewards.shape[0])
    cr, flat = g.centre(rewards)
    ck, _ = g.centre(K)
    sigma = g.spread(cr, ddof)
    eligible = (g.sizes >= 2) & ~flat & (sigma > 0)
    safe = torch.where(eligible, sigma, torch.ones((), dtype=sigma.dtype))
    c = torch.where(g.rows(eligible), (cr - beta * ck) / g.rows(safe), torch.zeros((), dtype=rewards.dtype))
    info = {"zcpo/eligible_group_frac": float(eligible.double().mean()),
            "zcpo/kl_full_mean": float(K.double().mean()),
            "zcpo/coef_abs_mean": float(c.abs().double().mean())}
    return c.detach(), info
