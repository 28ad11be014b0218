"""TASCO: a soft prefix tuned on a frozen model for confidence and stability.

Paper: "Beyond Confidence: Stability-Aware Test-Time Adaptation for LLM Reasoning"
(arXiv id and the published equations could not be checked; the forms below are explicit
parameters and the card marks them unconfirmed).

    L(P) = −Conf(P; x) + λ · Instab(P; x)
    Conf(P; x)   = −(1/N) Σ_{i,t} H(π_{θ,P}(·|s_{i,t}))            (negative token entropy of
                   the replies sampled under the prefix P; N counted tokens)
    Instab(P; x) = (1/K) Σ_k (1/N) Σ_{i,t} D(lp_P(y_{i,t}), lp_{P+ξ_k}(y_{i,t}))

The perturbed log-probs come from copies of each sampled reply scored under the prefix
P + ξ_k (rows of the same batch, `copy_index` k ≥ 1, sharing `pair_id` with the clean row
k = 0). D is a per-token divergence estimate between the two prediction distributions on
the token the clean policy sampled (x = lp_{P+ξ} − lp_P):

    "k3":  exp(x) − x − 1   (≥ 0, = 0 iff equal; estimates KL(π_P ‖ π_{P+ξ}) on tokens from π_P)
    "k2":  x² / 2
    (the estimators of `policylab.kernels.kl.kl_estimate`, with d = −x)

Both sides are differentiable (the gradient reaches P through the clean and the perturbed
forwards), unlike `policylab.kernels.kl`, whose reference side is detached. The backbone is
frozen; only P learns (the model stage builds that, see `prefix_model`).

`tasco_loss` returns the per-token matrix that, aggregated with `token_mean` over the
clean rows and their K copies (equal token counts by construction: the same reply),
equals L exactly: clean tokens carry (K + 1)·H, perturbed tokens (K + 1)/K · λ · D, and
the normalizer is (K + 1)·N. The rows of one pair couple, so the objective declares
`row_coupling="group"` (a reply and its copies share the group id).
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite, check_mask, check_same_shape, group_index
from policylab.kernels.kl import kl_estimate
from policylab.errors import PolicylabError, ShapeError

DIVERGENCES = ("k3", "k2")


def _divergence(lp_clean: torch.Tensor, lp_pert: torch.Tensor, kind: str) -> torch.Tensor:
    """D = k(lp_P − lp_{P+ξ}) from the kernels' one estimator table (`kl.kl_estimate`):
    KL(π_P ‖ π_{P+ξ}) on the tokens π_P sampled; both sides stay differentiable."""
    return kl_estimate(lp_clean - lp_pert, kind)


def tasco_loss(logp: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor, copy_index: torch.Tensor,
               pair_id: torch.Tensor, *, lam: float, n_perturb: int, divergence: str) -> tuple[torch.Tensor, dict]:
    """TASCO's per-token loss `[B, T]` and detached metrics.

    Args:
        logp: `[B, T]` learner log-probs of the sampled tokens (clean rows under P, copies
            under P + ξ_k), differentiable.
        entropy: `[B, T]` learner token entropy, differentiable (read on clean rows only).
        mask: `[B, T]` bool; a copy's mask must equal its clean row's.
        copy_index: `[B]` long, 0 = clean reply, k in 1..n_perturb = scored under P + ξ_k.
        pair_id: `[B]` long, shared by a clean reply and its copies; every pair present in
            the batch must hold exactly one clean row and n_perturb copies (k = 1..K).
        lam: λ >= 0, weight of the instability term.
        n_perturb: K >= 1.
        divergence: "k3" or "k2" (see the module docstring).
    """
    check_mask(mask, "mask")
    if logp.dim() != 2:
        raise ShapeError(f"`logp` must be [B, T], got {tuple(logp.shape)}")
    check_same_shape("logp", logp, entropy=entropy, mask=mask)
    B = mask.shape[0]
    for name, t in (("copy_index", copy_index), ("pair_id", pair_id)):
        if t.shape != (B,) or t.is_floating_point() or t.dtype == torch.bool:
            raise ShapeError(f"`{name}` must be an integer [B] = ({B},) tensor, got {t.dtype} {tuple(t.shape)}")
    if isinstance(n_perturb, bool) or not isinstance(n_perturb, int) or n_perturb < 1:
        raise PolicylabError(f"`n_perturb` must be an int >= 1, got {n_perturb!r}")
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam) or lam < 0:
        raise PolicylabError(f"`lam` must be a finite number >= 0, got {lam!r}")
    if divergence not in DIVERGENCES:
        raise PolicylabError(f"`divergence` must be one of {', '.join(DIVERGENCES)}, got {divergence!r}")
    K = n_perturb
    if bool(((copy_index < 0) | (copy_index > K)).any()):
        raise PolicylabError(f"`copy_index` must lie in 0..{K}")
    dense, n_pairs = group_index(pair_id, B)
    # slot[p, k] = the row of pair p with copy index k (every slot filled exactly once)
    count = torch.zeros(n_pairs * (K + 1), dtype=torch.long).index_add_(
        0, dense * (K + 1) + copy_index, torch.ones(B, dtype=torch.long))
    if bool((count != 1).any()):
        raise PolicylabError(f"every pair needs exactly one clean row and one copy for each k = 1..{K} "
                             "(keep a reply and its copies in one micro-batch: whole groups)")
    slot = torch.empty(n_pairs * (K + 1), dtype=torch.long)
    slot[dense * (K + 1) + copy_index] = torch.arange(B)
    clean_row = slot.view(n_pairs, K + 1)[:, 0][dense]  # [B]: each row's clean partner
    if not torch.equal(mask, mask[clean_row]):
        raise PolicylabError("a perturbed copy's mask differs from its clean reply's mask")
    check_finite(logp.detach(), "logp", mask)
    check_finite(entropy.detach(), "entropy", mask)
    clean = (copy_index == 0).unsqueeze(-1)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    lp = torch.where(mask, logp, zero)
    d = _divergence(lp[clean_row], lp, divergence)
    conf_part = (K + 1) * torch.where(mask & clean, entropy, zero)
    stab_part = (K + 1) / K * float(lam) * torch.where(mask & ~clean, d, zero)
    loss = conf_part + stab_part
    n_clean = (mask & clean).sum().clamp(min=1)
    n_pert = (mask & ~clean).sum().clamp(min=1)
    metrics = {
        "tasco/entropy": (torch.where(mask & clean, entropy, zero).sum() / n_clean).detach(),
        "tasco/instability": (torch.where(mask & ~clean, d, zero).sum() / n_pert).detach(),
    }
    return loss, metrics


def no_advantage(batch_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """TASCO's advantage, `[B]`:

        A_i = 0   for every reply

    TASCO's loss is not a policy gradient (its gradient comes from the entropy and the
    divergence directly, through the prefix); the trainer's contract still asks every method
    for an advantage, and this one is never read by TASCO's objective."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise PolicylabError(f"`batch_size` must be an int >= 0, got {batch_size!r}")
    return torch.zeros(batch_size, dtype=dtype)
