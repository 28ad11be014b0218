"""KL regularization between the learner π_θ and the reference π_ref: KL(π_θ ‖ π_ref).

Per-token estimators on sampled tokens (J. Schulman, "Approximating KL Divergence", blog
note, 2020, http://joschu.net/blog/kl-approx.html). With lp = `logp` (learner, the only
differentiable input), lp_ref = `logp_ref`, x = lp_ref − lp = log(π_ref/π_θ):

    k1 = lp − lp_ref                    E_{π_θ}[k1] = KL          (unbiased, can be < 0)
    k2 = ½ (lp − lp_ref)²               E_{π_θ}[k2] ≠ KL          (biased, ≥ 0, exact to 2nd order)
    k3 = exp(x) − x − 1                 E_{π_θ}[k3] = KL          (unbiased, ≥ 0)

`kl_estimate(d, name)` is the library's one table of these three formulas (in the log-ratio
d of the sampling distribution over the other one); every KL estimate in the kernels
(these, `reward_penalty`, the mismatch diagnostics, TASCO's stability term) goes through it.

What each does as a LOSS term under autograd. Samples are drawn from π_θ and are not
reparameterized, so backprop differentiates only the explicit lp: the expected gradient of
a loss term k is g_k = E_{y~π_θ}[∂k/∂lp · ∇lp] (no score-function term k·∇log π_θ). The true
gradient is ∇KL(π_θ‖π_ref) = E_{π_θ}[(lp − lp_ref) ∇lp] (the extra E[∇lp] term is 0).

    k1: ∂k1/∂lp = 1                 g = E[∇lp] = 0. Zero in expectation: a k1 loss term
                                    adds only noise, it does not pull toward π_ref.
    k2: ∂k2/∂lp = lp − lp_ref       g = E[(lp − lp_ref)∇lp] = ∇KL(π_θ‖π_ref). Exact.
    k3: ∂k3/∂lp = 1 − π_ref/π_θ     g = −Σ_y π_ref(y) ∇log π_θ(y) = ∇KL(π_ref‖π_θ): the
                                    gradient of the *forward* KL, not of KL(π_θ‖π_ref). Both
                                    vanish at π_θ = π_ref and agree to first order around it;
                                    they differ away from it.

So the estimator that is unbiased in value (k3, k1) is not the one whose autograd gradient
is the KL gradient (k2). The opposite bookkeeping holds when the estimator enters the REWARD
and is optimized by a score-function policy gradient: that produces ∇E[k] = E[∇k + k ∇log π_θ],
which equals ∇KL for k1 and k3 (their expectation is KL for every θ) and not for k2.
GRPO ("DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
arXiv 2402.03300, the KL estimator right after the GRPO objective, Eq. 4 — number not
re-verified) puts k3 in the loss, i.e. follows the forward-KL gradient. On off-policy
minibatches (samples from π_old ≠ π_θ) all these expectations are under π_old instead.

`exact` computes the full-vocabulary KL per position from logits (no sampling noise).

Placement (conventions rule 2): KL enters either the reward (detached, computed from the
sampler's `logp_old`: `reward_penalty`) or the loss (differentiable through `logp`:
k1/k2/k3/exact), never both; `check_placement` enforces this.
"""

from __future__ import annotations

import enum
import math

import torch
from torch.utils.checkpoint import checkpoint

from policylab.kernels.checks import check_finite, check_mask, check_same_shape
from policylab.errors import NonFiniteError, ShapeError

ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(d: torch.Tensor, estimator: str) -> torch.Tensor:
    """The library's one table of per-sample KL estimators: KL(p ‖ q) estimated at samples
    y ~ p from d = log p(y) − log q(y) (Schulman 2020, whose r = q/p = e^(−d)):

        k1 = d                     (= −log r)             unbiased, can be < 0
        k2 = ½ d²                  (= ½ (log r)²)         biased, ≥ 0
        k3 = e^(−d) − 1 + d        (= (r − 1) − log r)    unbiased, ≥ 0; expm1(−d) + d

    Elementwise on any shape; no masking, no detach, no overflow check (each caller owns
    those: `k1`/`k2`/`k3` below for KL(π_θ ‖ π_ref) with d = lp − lp_ref,
    `corrections.mismatch_stats` for the engine mismatch, `testtime.tasco` for the
    stability term, where both sides are differentiable)."""
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d ** 2
    if estimator == "k3":
        return torch.expm1(-d) + d
    raise ValueError(f"`estimator` must be one of {ESTIMATORS}, got {estimator!r}")


def _prepare(logp, logp_ref, mask, name_ref="logp_ref", name_lp="logp"):
    """Shape/finite checks; values at masked positions replaced by 0 so no NaN reaches grad."""
    check_same_shape(name_lp, logp, **{name_ref: logp_ref})
    if mask is None:
        check_finite(logp, name_lp)
        check_finite(logp_ref, name_ref)
        return logp, logp_ref.detach()
    check_mask(mask, "mask")
    check_same_shape(name_lp, logp, mask=mask)
    check_finite(logp, name_lp, mask)
    check_finite(logp_ref, name_ref, mask)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    return torch.where(mask, logp, zero), torch.where(mask, logp_ref.detach(), zero)


def _masked(value: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return value
    return torch.where(mask, value, torch.zeros((), dtype=value.dtype, device=value.device))


def k1(logp: torch.Tensor, logp_ref: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    """k1 = lp − lp_ref, per token `[B, T]` (any matching shape).

    Value: unbiased estimate of KL(π_θ‖π_ref) on samples from π_θ (high variance, can be
    negative). Gradient as a loss term: ∇lp, whose expectation under π_θ is exactly 0 — a
    k1 loss does not move π_θ toward π_ref in expectation (use k1 in the reward instead).
    `logp_ref` is detached. `mask` (optional bool, True = counts): masked entries are 0.
    """
    lp, lp_ref = _prepare(logp, logp_ref, mask)
    return _masked(kl_estimate(lp - lp_ref, "k1"), mask)


def k2(logp: torch.Tensor, logp_ref: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    """k2 = ½ (lp − lp_ref)², per token `[B, T]`.

    Value: biased estimate of KL(π_θ‖π_ref) (its expectation is an f-divergence that matches
    KL to second order near π_θ = π_ref), always ≥ 0, low variance. Gradient as a loss term:
    (lp − lp_ref)∇lp, whose expectation under π_θ equals ∇KL(π_θ‖π_ref) exactly.
    `logp_ref` is detached. `mask` (optional bool, True = counts): masked entries are 0.
    """
    lp, lp_ref = _prepare(logp, logp_ref, mask)
    return _masked(kl_estimate(lp - lp_ref, "k2"), mask)


def k3(logp: torch.Tensor, logp_ref: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    """k3 = exp(lp_ref − lp) − (lp_ref − lp) − 1, per token `[B, T]` (GRPO's estimator).

    Value: unbiased estimate of KL(π_θ‖π_ref), ≥ 0, = 0 iff lp = lp_ref. Gradient as a loss
    term: ∂k3/∂lp = 1 − exp(lp_ref − lp); its expectation under π_θ is ∇KL(π_ref‖π_θ) (the
    forward KL), not ∇KL(π_θ‖π_ref) — equal only to first order around π_θ = π_ref.
    Computed as expm1(x) − x (x = lp_ref − lp, `kl_estimate`) for accuracy near 0. No
    clamp: if exp(x) overflows (x > ~88 in fp32) a NonFiniteError is raised instead of
    returning inf.
    `logp_ref` is detached. `mask` (optional bool, True = counts): masked entries are 0.
    """
    lp, lp_ref = _prepare(logp, logp_ref, mask)
    value = kl_estimate(lp - lp_ref, "k3")
    bad = ~torch.isfinite(value) if mask is None else (~torch.isfinite(value) & mask)
    if bool(bad.any()):
        idx = bad.nonzero()[0].tolist()
        x = (lp_ref - lp)[tuple(idx)].item()
        raise NonFiniteError(
            f"k3 overflowed at index {idx}: lp_ref − lp = {x:.4g} "
            "(the learner gives this token e^that less probability than the reference)"
        )
    return _masked(value, mask)


def _chunk_kl(z: torch.Tensor, z_ref: torch.Tensor, temperature: float) -> torch.Tensor:
    """Σ_v p_v (log p_v − log q_v) over the last axis, p = softmax(z/τ), q = softmax(z_ref/τ)."""
    log_p = torch.log_softmax(z / temperature, dim=-1)
    log_q = torch.log_softmax(z_ref / temperature, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def _check_exact_args(logits, ref_logits, temperature, chunk_size, mask) -> None:
    if logits.dim() != 3:
        raise ShapeError(f"`logits` must be [B, T, V], got shape {tuple(logits.shape)}")
    check_same_shape("logits", logits, ref_logits=ref_logits)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"`temperature` must be a positive finite number, got {temperature!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"`chunk_size` must be a positive int (positions per chunk), got {chunk_size!r}")
    if mask is not None:
        check_mask(mask, "mask")
        if mask.shape != logits.shape[:2]:
            raise ShapeError(f"`mask` has shape {tuple(mask.shape)} but `logits` is {tuple(logits.shape)}")


def exact(
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Full-vocabulary KL(π_θ‖π_ref) per position, `[B, T, V]` logits -> `[B, T]`.

        KL_bt = Σ_v p_v (log p_v − log q_v),  p = softmax(logits/τ), q = softmax(ref_logits/τ)

    `temperature` τ must be the sampler's (the policy being regularized is the sampled one).
    Computed in (at least) fp32 over chunks of `chunk_size` positions (rows of the flattened
    B·T axis). Under autograd each chunk is checkpointed, so only one chunk's [chunk, V]
    intermediates are alive at a time in forward and backward (memory bounded by chunk_size,
    not by B·T); the result is cast back to `logits.dtype`. Differentiable through `logits`;
    `ref_logits` is a frozen anchor (detached). Logits must be finite at counted positions
    (a −inf logit, e.g. from top-k filtering, is refused). `mask` (optional bool `[B, T]`):
    masked positions return 0 and are not checked.
    """
    _check_exact_args(logits, ref_logits, temperature, chunk_size, mask)
    B, T, V = logits.shape
    compute = torch.promote_types(logits.dtype, torch.float32)
    flat = logits.reshape(B * T, V)
    flat_ref = ref_logits.detach().reshape(B * T, V)
    keep = None if mask is None else mask.reshape(B * T, 1)
    use_ckpt = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for start in range(0, B * T, chunk_size):
        z, z_ref = flat[start:start + chunk_size], flat_ref[start:start + chunk_size]
        if keep is not None:
            k = keep[start:start + chunk_size]
            z, z_ref = torch.where(k, z, 0.0), torch.where(k, z_ref, 0.0)
        if not (bool(torch.isfinite(z).all()) and bool(torch.isfinite(z_ref).all())):
            raise NonFiniteError(
                f"`logits` or `ref_logits` has non-finite values in flattened positions "
                f"[{start}, {min(start + chunk_size, B * T)})"
            )
        z, z_ref = z.to(compute), z_ref.to(compute)
        if use_ckpt:
            parts.append(checkpoint(_chunk_kl, z, z_ref, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_kl(z, z_ref, temperature))
    out = torch.cat(parts).reshape(B, T).to(logits.dtype)
    return _masked(out, mask)


class Placement(str, enum.Enum):
    """Where a method's KL(π_θ‖π_ref) term goes."""

    NONE = "none"      # no KL term
    REWARD = "reward"  # detached per-token penalty on the sampler's logp_old (reward_penalty)
    LOSS = "loss"      # differentiable term on the learner's logp (k1/k2/k3/exact)


def check_placement(in_reward: bool, in_loss: bool) -> Placement:
    """The placement asked for; raises ValueError if it asks for both.

    KL in the reward and KL in the loss are two different regularizers of the same
    divergence (different gradients, conventions rule 2); a method that enabled both would count
    the penalty twice. Choose one.
    """
    if not isinstance(in_reward, bool) or not isinstance(in_loss, bool):
        raise ValueError(f"`in_reward` and `in_loss` must be bool, got {in_reward!r}, {in_loss!r}")
    if in_reward and in_loss:
        raise ValueError(
            "KL placement: KL both in the reward (detached, on logp_old) and in "
            "the loss (differentiable, on logp); choose exactly one"
        )
    if in_reward:
        return Placement.REWARD
    return Placement.LOSS if in_loss else Placement.NONE


def reward_penalty(
    logp_old: torch.Tensor,
    logp_ref: torch.Tensor,
    mask: torch.Tensor,
    *,
    coef: float,
    estimator: str = "k1",
) -> torch.Tensor:
    """Per-token KL penalty for KL-in-reward, `[B, T]`, detached: coef · k(lp_old, lp_ref).

    SUBTRACT it from the per-token rewards (InstructGPT-style shaping, "Training language
    models to follow instructions with human feedback", arXiv 2203.02155:
    r_t = r_t − β·(lp_old,t − lp_ref,t) with the default k1). It reads the SAMPLER's
    `logp_old` (the policy that produced the tokens, at sampling time), never the learner's
    `logp`: a `logp_old` that requires grad is refused. With k1 the penalty of a single
    token can be negative (a bonus); its expectation under the sampler is β·KL ≥ 0.
    `estimator` in {"k1", "k2", "k3"}; `coef` (β) ≥ 0. Masked positions are exactly 0.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"`estimator` must be one of {ESTIMATORS}, got {estimator!r}")
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef < 0:
        raise ValueError(f"`coef` must be a finite number >= 0, got {coef!r}")
    if logp_old.requires_grad:
        raise ValueError(
            "`logp_old` requires grad: the KL reward reads the sampler's detached log-probs, "
            "not the learner's `logp`"
        )
    check_mask(mask, "mask")
    check_same_shape("logp_old", logp_old, logp_ref=logp_ref, mask=mask)
    check_finite(logp_old, "logp_old", mask)
    fn = {"k1": k1, "k2": k2, "k3": k3}[estimator]
    with torch.no_grad():
        est = fn(logp_old, logp_ref, mask=mask)
    return _masked(coef * est, mask).detach()
