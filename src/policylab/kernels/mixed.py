"""Kernels of the mixed-policy methods: learning from tokens another policy (or a solver,
a hinted context, a peer model) produced. Pure functions over tensors; the stages in
the family modules of `policylab.methods.families` call them.

Roles (docs/conventions.md rule 1): `logp` is the learner π_θ on the deployment prompt
(differentiable), `logp_old` π_old at the sampling weights, `logp_behavior` μ, whatever
emitted the token. A demonstration, gold answer or expert trace written by a
deterministic solver has μ(y_t) = 1 exactly (log 0.0); every kernel that needs μ for such
rows says so below.

    luffy_shaped_weight / luffy_loss      LUFFY (arXiv 2504.14945)
    grin_mixture_logp                     GRIN's sampling-mixture denominator
    unit_ratio_denominator                MOER's π_θ/sg(π_θ) on guided and expert rows
    behavior_denominator,
    check_context_separation              Off-Context GRPO's hinted μ in the denominator
    graft_should_borrow,
    graft_compatibility,
    graft_row_weight,
    tokenwise_log_ratio                   GRAFT's borrowing rule, compatibility and row weight
    erils_advantages, erils_length_keep   ERILS's per-source normalization and length cap
    mopd_advantages                       MOPD's per-token teacher signal (fusion)
"""

from __future__ import annotations

import hashlib
import math

import torch

from policylab.kernels import advantages as A
from policylab.kernels import objectives as O
from policylab.kernels.checks import check_mask, check_same_shape
from policylab.kernels.kl import kl_estimate
from policylab.errors import PolicylabError, ShapeError


class ContextError(PolicylabError):
    """Learner and behavior log-probs were computed on the same context where a method
    needs them on different ones (or the hint leaked into the learner's input)."""


def _check_rows(rows: torch.Tensor, B: int, name: str) -> None:
    check_mask(rows, name)
    if rows.shape != (B,):
        raise ShapeError(f"`{name}` must be [B] = ({B},), got {tuple(rows.shape)}")


# ----------------------------------------------------------------------------- LUFFY


def luffy_shaped_weight(logp: torch.Tensor, gamma: float) -> torch.Tensor:
    """f(π) = π/(π + γ) with π = exp(lp), differentiable through `logp`.

    "Learning to Reason under Off-Policy Guidance" (Yan et al., arXiv 2504.14945), policy
    shaping by regularized importance sampling. Its gradient with respect to lp is
    π·γ/(π + γ)²: largest (1/4) at π = γ, small for tokens the learner already finds
    likely, so rare but decisive demonstration tokens weigh most."""
    if not (isinstance(gamma, (int, float)) and not isinstance(gamma, bool) and math.isfinite(gamma) and gamma > 0):
        raise PolicylabError(f"`gamma` must be a finite number > 0, got {gamma!r}")
    p = logp.exp()
    return p / (p + gamma)


def luffy_loss(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
               off_policy: torch.Tensor, *, gamma: float, eps_low: float, eps_high: float
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """LUFFY's per-token loss on a mixed group -> (loss [B, T], metrics).

        native rows          ℓ = −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A),  ρ = π_θ/π_old
        off-policy rows      ℓ = −A · f(π_θ(y_t)),   f(π) = π/(π + γ)    (no ratio, no clip)

    The demonstration's behavior probability is taken as 1 (the solver writes it with
    certainty: μ = 1 exactly), so the importance ratio π_θ/μ is π_θ itself, and the
    shaping f replaces it. Gradient coefficient of a demonstration token: ∂ℓ/∂lp =
    −A·π·γ/(π+γ)². `logp_old` is read on native rows only (any value elsewhere). The
    advantages come from the whole mixed group (GRPO normalization over native and
    demonstration rewards together, the advantage stage). Paper: arXiv 2504.14945, the
    mixed-policy GRPO objective with policy shaping; γ = 0.1 in the paper.

    off_policy [B] bool: True for demonstration rows. Detached: adv, logp_old."""
    check_mask(mask, "mask")
    check_same_shape("logp", logp, logp_old=logp_old, mask=mask)
    _check_rows(off_policy, logp.shape[0], "off_policy")
    on_mask = mask & ~off_policy.unsqueeze(-1)
    off_mask = mask & off_policy.unsqueeze(-1)
    loss_on, m = O.ppo_clip(logp, logp_old, adv, on_mask, eps_low=eps_low, eps_high=eps_high)
    a = adv.detach()
    a2 = a.unsqueeze(-1).expand_as(logp) if a.dim() == 1 else a
    f = luffy_shaped_weight(logp, gamma)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    loss_off = torch.where(off_mask, -a2 * f, zero)
    loss = torch.where(off_mask, loss_off, loss_on)
    return loss, luffy_metrics(m, f, logp, off_mask)


def luffy_metrics(host: dict, f: torch.Tensor, logp: torch.Tensor, off_mask: torch.Tensor) -> dict:
    """The host's clip and ratio diagnostics (over native tokens only) plus, over the
    demonstration tokens, the mean shaped weight f(π), the mean π_θ(y_t) and their count."""
    metrics = dict(host)
    n_off = off_mask.sum()
    if bool(n_off > 0):
        metrics["luffy/shaped_weight_mean"] = f.detach()[off_mask].mean()
        metrics["luffy/demo_token_prob_mean"] = logp.detach().exp()[off_mask].mean()
    metrics["luffy/off_policy_tokens"] = n_off.to(logp.dtype)
    return metrics


# ----------------------------------------------------------------------------- GRIN


def grin_mixture_logp(logp_old: torch.Tensor, alpha: torch.Tensor, gold_match: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """log q_mix(y_t) = log((1 − α)·π_old(y_t) + α·q_gold(y_t)), detached, [B, T].

    GRIN ("From Memorization to Absorption: Mixed-Policy RL for Continual Knowledge
    Injection"; exact published form **unconfirmed**): the tokens of a group into which
    gold answers were injected were drawn from the mixture of the native sampler π_old and
    the gold source, so the ratio's denominator is that mixture, never the reference.
    q_gold is a point mass on the injected text: q_gold(y_t) = 1 when y_≤t follows the
    gold text (`gold_match` True: every gold row, and a native row for as long as it
    repeats the gold tokens), 0 otherwise. α [B] is the group's real mixture weight
    (injected rows / group size; 0 for groups without injection, where log q_mix = lp_old
    exactly). Computed in log space: logaddexp(log(1−α) + lp_old, log α) where q_gold = 1.

    alpha in [0, 1); 0 at masked positions of the result."""
    check_mask(mask, "mask")
    check_mask(gold_match, "gold_match")
    check_same_shape("logp_old", logp_old, gold_match=gold_match, mask=mask)
    if alpha.shape != (logp_old.shape[0],):
        raise ShapeError(f"`alpha` must be [B] = ({logp_old.shape[0]},), got {tuple(alpha.shape)}")
    if bool(((alpha < 0) | (alpha >= 1)).any()):
        raise PolicylabError(f"`alpha` must be in [0, 1) (a group cannot be all gold), got {alpha.tolist()}")
    lp = logp_old.detach()
    a = alpha.to(lp.dtype).unsqueeze(-1).expand_as(lp)
    native_part = torch.log1p(-a) + lp
    with torch.no_grad():
        log_a = torch.where(a > 0, a.clamp_min(1e-300).log(), torch.full_like(a, -math.inf))
        mixed = torch.where(gold_match & (a > 0), torch.logaddexp(native_part, log_a), native_part)
    return torch.where(mask, mixed, torch.zeros((), dtype=lp.dtype, device=lp.device))


# ----------------------------------------------------------------------------- MOER


def unit_ratio_denominator(logp: torch.Tensor, logp_old: torch.Tensor, off_rows: torch.Tensor) -> torch.Tensor:
    """The ratio denominator with sg(logp) on `off_rows` and `logp_old` elsewhere.

    MOER ("MOER: Mix-Policy Optimization under Expert Prefix Guidance with Selective
    Rollback"): guided and expert rows use the off-policy objective whose ratio is
    π_θ/sg(π_θ): value exactly 1 (never clipped), gradient ∇lp (not zero), so a host
    clipped surrogate becomes −A·𝟙 on those rows. Native rows keep π_old."""
    check_same_shape("logp", logp, logp_old=logp_old)
    _check_rows(off_rows, logp.shape[0], "off_rows")
    return torch.where(off_rows.unsqueeze(-1), logp.detach(), logp_old.detach())


# ----------------------------------------------------------------------------- Off-Context GRPO


def behavior_denominator(logp_old: torch.Tensor, logp_behavior: torch.Tensor, hinted: torch.Tensor) -> torch.Tensor:
    """Denominator of Off-Context GRPO: μ(y_t | x ⊕ h, y_<t) on hinted rows, π_old elsewhere.

    "Off-Context GRPO: Learning to Reason on Hard Problems using Privileged Information"
    (title as given; id **unconfirmed**): the sampler saw the prompt with a privileged
    hint, the learner learns on the prompt alone, so ρ_t = π_θ(y_t | x, y_<t) /
    μ(y_t | x ⊕ h, y_<t). Rows sampled without a hint are native and keep π_old, so an
    empty hint gives GRPO exactly."""
    check_same_shape("logp_old", logp_old, logp_behavior=logp_behavior)
    _check_rows(hinted, logp_old.shape[0], "hinted")
    return torch.where(hinted.unsqueeze(-1), logp_behavior.detach(), logp_old.detach())


def _contains(seq: list[int], sub: list[int]) -> bool:
    n = len(sub)
    return n > 0 and any(seq[i:i + n] == sub for i in range(len(seq) - n + 1))


def check_context_separation(learner_prompts: list[list[int]], behavior_prompts: list[list[int]],
                             hints: list[list[int]], hinted: list[bool]) -> None:
    """Refuse a hinted row whose learner and behavior contexts are the same.

    For every hinted row: the learner's prompt ids (the numerator's context) must differ
    from the behavior's (the denominator's), and must not contain the hint's ids; the
    behavior's prompt must contain them. Both sides with the hint, or both without, is a
    ContextError naming the row."""
    n = len(learner_prompts)
    if not (len(behavior_prompts) == len(hints) == len(hinted) == n):
        raise ShapeError("learner_prompts, behavior_prompts, hints and hinted must have one entry per row")
    for i in range(n):
        if not hinted[i]:
            continue
        lp, bp, h = list(learner_prompts[i]), list(behavior_prompts[i]), list(hints[i])
        if not h:
            raise ContextError(f"row {i} is labelled hinted but records no hint")
        if lp == bp:
            both = "with" if _contains(lp, h) else "without"
            raise ContextError(f"row {i}: numerator and denominator were both computed {both} the hint; Off-Context "
                               "GRPO needs the learner on the prompt alone and the behavior on prompt + hint")
        if _contains(lp, h):
            raise ContextError(f"row {i}: the learner's prompt contains the hint (the numerator must not see it)")
        if not _contains(bp, h):
            raise ContextError(f"row {i}: the behavior's prompt does not contain the hint it records")


def fingerprint(ids) -> int:
    """A stable 63-bit fingerprint of a token-id sequence."""
    h = hashlib.blake2b(",".join(str(int(i)) for i in ids).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1


def check_context_fingerprints(learner_prompts: list[list[int]], behavior_hash: list[int], hint_hash: list[int],
                               hint_len: list[int], hinted: list[bool]) -> None:
    """`check_context_separation` on what a batch records per row (fingerprints, since a
    batch keeps per-row [B] tensors): for every hinted row the learner's prompt has
    another fingerprint than the behavior's, and no window of it has the hint's."""
    for i, lp in enumerate(learner_prompts):
        if not hinted[i]:
            continue
        n = int(hint_len[i])
        if n <= 0:
            raise ContextError(f"row {i} is labelled hinted but records no hint")
        if fingerprint(lp) == int(behavior_hash[i]):
            raise ContextError(f"row {i}: numerator and denominator were computed on the same context; Off-Context "
                               "GRPO needs the learner on the prompt alone and the behavior on prompt + hint")
        if any(fingerprint(lp[j:j + n]) == int(hint_hash[i]) for j in range(len(lp) - n + 1)):
            raise ContextError(f"row {i}: the learner's prompt contains the hint (the numerator must not see it)")


# ----------------------------------------------------------------------------- GRAFT


def graft_should_borrow(receiver_correct: torch.Tensor, peer_correct: torch.Tensor) -> bool:
    """GRAFT's trigger for one prompt: the receiver's group failed entirely AND the peer's
    group on that prompt has at least one success and one failure ("Learning Beyond What
    You Sample: Off-Policy-Aware Cross-Model Trajectory Exchange for RLVR"). A uniform
    peer group carries no relative signal; a receiver with any success needs no help."""
    r, p = receiver_correct.bool(), peer_correct.bool()
    if r.dim() != 1 or p.dim() != 1 or r.numel() == 0 or p.numel() == 0:
        raise ShapeError("receiver_correct and peer_correct must be non-empty [G] outcomes of one prompt")
    return bool(not r.any() and p.any() and not p.all())


def graft_compatibility(lp_receiver: torch.Tensor, mask_receiver: torch.Tensor, lp_peer: torch.Tensor,
                        mask_peer: torch.Tensor) -> torch.Tensor:
    """c_i = exp(mean_t lp_recv(y_i) − mean_t lp_peer(y_i)), [N], each mean over that
    model's own tokenization of the same text (the two masks may count different numbers
    of tokens: no position-wise comparison is made). Sequence-level: a peer text the
    receiver finds far less likely per token than the peer did gets c ≪ 1. A row without
    any counted token on either side is refused."""
    check_mask(mask_receiver, "mask_receiver")
    check_mask(mask_peer, "mask_peer")
    check_same_shape("lp_receiver", lp_receiver, mask_receiver=mask_receiver)
    check_same_shape("lp_peer", lp_peer, mask_peer=mask_peer)
    if lp_receiver.shape[0] != lp_peer.shape[0]:
        raise ShapeError(f"{lp_receiver.shape[0]} receiver rows for {lp_peer.shape[0]} peer rows")
    nr, npeer = mask_receiver.sum(-1), mask_peer.sum(-1)
    if bool(((nr == 0) | (npeer == 0)).any()):
        raise ShapeError("a row has no counted token in one of the tokenizations")
    zero_r = torch.zeros((), dtype=lp_receiver.dtype, device=lp_receiver.device)
    zero_p = torch.zeros((), dtype=lp_peer.dtype, device=lp_peer.device)
    mr = torch.where(mask_receiver, lp_receiver.detach(), zero_r).sum(-1) / nr
    mp = torch.where(mask_peer, lp_peer.detach(), zero_p).sum(-1) / npeer
    return torch.exp(mr.double() - mp.double())


def graft_row_weight(compat: torch.Tensor, borrowed: torch.Tensor, *, min_compat: float,
                     cap: float) -> torch.Tensor:
    """w_i, [B], detached: the weight of row i's clipped surrogate.

        borrowed row:  w_i = 1[c_i ≥ min_compat] · min(c_i, cap)
        native row:    w_i = 1

    GRAFT ("Learning Beyond What You Sample: Off-Policy-Aware Cross-Model Trajectory
    Exchange for RLVR"; the paper's exact form of the bound is **unconfirmed**, this is a
    library decision): a borrowed row was sampled by the peer, so it is not receiver
    on-policy data and its update is bounded by how likely the receiver finds it. The
    method's loss on row i is the decoupled form

        ℓ_it = −w_i · min(ρ_it·A_i, clip(ρ_it, 1 − ε_low, 1 + ε_high)·A_i),   ρ_it = π_θ/π_old

    with π_old the receiver at the sampling weights (the trust region of its own steps,
    so every further epoch or minibatch is clipped as on native rows) and w_i a truncated
    importance weight of the receiver against the behavior μ = the peer:
    c_i = exp(mean_t lp_old(y_i) − mean_t lp_peer(y_i)) (`graft_compatibility`), the
    per-token geometric mean of π_old/μ over the row. So at the first update (ρ = 1) a
    kept borrowed row's gradient is −min(c_i, cap)·A_i·∇lp: a row of compatibility 0.5
    moves the policy half as much as one of compatibility 1, whatever the sign of A.

    Why this form: per-token μ exists only where the two tokenizations agree (the peer's
    log-probs are unknown elsewhere), while c_i is defined for any pair of tokenizers;
    the geometric mean is length-normalized, so long rows neither vanish nor explode as a
    product of per-token ratios would; truncating at `cap` (1 by default) keeps a borrowed
    row from weighing more than a native one (a c > 1 says the receiver already finds the
    text likelier than the peer did, not that it deserves a larger step); and a per-token
    ratio π_θ/μ inside PPO's clip would zero every negative-advantage token of a peer the
    receiver finds unlikely (ρ < 1 − ε) while letting those it finds likely grow without
    bound (the min keeps ρ·A for A < 0). Below `min_compat` (inclusive: c ≥ min_compat is
    kept) the row is dropped with weight 0 and stays in the normalizer and its group's
    advantages.

    compat [B] finite, > 0 (1 on native rows by convention, not read there); borrowed [B]
    bool; min_compat ≥ 0; cap > 0."""
    _check_rows(borrowed, compat.shape[0] if compat.dim() == 1 else -1, "borrowed")
    if compat.dim() != 1:
        raise ShapeError(f"`compat` must be [B], got {tuple(compat.shape)}")
    c = compat.detach()
    if not bool(torch.isfinite(c[borrowed]).all()) or bool((c[borrowed] <= 0).any()):
        raise PolicylabError("`compat` of a borrowed row must be finite and > 0 (exp of a mean log-prob difference)")
    if not (math.isfinite(min_compat) and min_compat >= 0):
        raise PolicylabError(f"`min_compat` must be finite and >= 0, got {min_compat}")
    if not (math.isfinite(cap) and cap > 0):
        raise PolicylabError(f"`cap` must be finite and > 0, got {cap}")
    one = torch.ones((), dtype=c.dtype, device=c.device)
    kept = torch.where(c >= min_compat, torch.clamp(c, max=cap), torch.zeros((), dtype=c.dtype, device=c.device))
    return torch.where(borrowed, kept, one)


def tokenwise_log_ratio(lp_a: torch.Tensor, mask_a: torch.Tensor, lp_b: torch.Tensor,
                        mask_b: torch.Tensor) -> torch.Tensor:
    """lp_a − lp_b position by position, only when both sides count the same positions.

    Two tokenizations of one text generally have different lengths; subtracting their
    per-token log-probs position by position compares unrelated tokens. This raises a
    ShapeError on any row whose counted positions differ (use `graft_compatibility`)."""
    check_mask(mask_a, "mask_a")
    check_mask(mask_b, "mask_b")
    if lp_a.shape != lp_b.shape or not torch.equal(mask_a, mask_b):
        la, lb = mask_a.sum(-1).tolist(), mask_b.sum(-1).tolist()
        raise ShapeError(f"position-wise log-ratio across tokenizations of different lengths ({la} vs {lb} counted "
                         "tokens): compare sequence means instead (graft_compatibility)")
    zero = torch.zeros((), dtype=lp_a.dtype, device=lp_a.device)
    return torch.where(mask_a, lp_a - lp_b, zero)


# ----------------------------------------------------------------------------- ERILS


def erils_advantages(rewards: torch.Tensor, group: torch.Tensor, external: torch.Tensor, *, std: str = "population",
                     eps: float = 1e-6, per_source: bool = True) -> torch.Tensor:
    """Per-source normalization inside each prompt group (ERILS; exact form **unconfirmed**):

        A_i = (r_i − mean_{g, src(i)} r) / (std_{g, src(i)} r + eps)

    so external rollouts, usually better (or worse) as a whole, do not make every native
    sample look bad (or good). `per_source=False` gives the pooled GRPO normalization over
    the whole group, for comparison. external [B] bool."""
    _check_rows(external, rewards.shape[0], "external")
    if not per_source:
        return A.grpo(rewards, group, std=std, eps=eps)
    key = group.long() * 2 + external.long()
    return A.grpo(rewards, key, std=std, eps=eps)


def erils_length_keep(lengths: torch.Tensor, external: torch.Tensor, cap: int) -> torch.Tensor:
    """[B] bool: rows that may reach the loss under the external length cap L_ext: every
    native row, and external rows with |y| <= cap (inclusive). The rest are rejected
    (library default; truncation is the alternative the spec leaves **unconfirmed**)."""
    _check_rows(external, lengths.shape[0], "external")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise PolicylabError(f"`cap` must be an int >= 1, got {cap!r}")
    return ~external | (lengths <= cap)


# ----------------------------------------------------------------------------- MOPD (fusion)


MOPD_HORIZONS = ("token", "sequence")


def mopd_advantages(logp_student: torch.Tensor, logp_teacher: torch.Tensor, mask: torch.Tensor, *,
                    horizon: str) -> torch.Tensor:
    """Per-token signal of multi-teacher on-policy distillation, detached, [B, T].

    On the student's own samples y ~ π_θ, each row scored by the teacher of its domain,
    with d_t = lp_student(y_t) − lp_teacher(y_t) (the per-token reverse-KL estimate):

        horizon "token"     A_t = −d_t
        horizon "sequence"  A_t = −Σ_{u ≥ t, counted} d_u   (the return-to-go of −d)

    used as the advantage of a REINFORCE-style loss −A_t·lp_t. "token" is the per-token
    form of on-policy distillation; "sequence" makes Σ_t A_t ∇lp_t the exact gradient
    estimate of −KL(π_θ ‖ π_teacher) over whole responses. "Consolidating RLVR
    Capabilities Across Domains: A Deep Dive into Fusion Paradigms" (MOPD route); the
    exact form is **unconfirmed**, so `horizon` has no default. Both inputs are detached
    (sg): the student's log-probs are those of the learner at the start of the round.
    0 at masked positions, which never enter a sum."""
    if horizon not in MOPD_HORIZONS:
        raise PolicylabError(f"`horizon` must be one of {', '.join(MOPD_HORIZONS)}, got {horizon!r}")
    check_mask(mask, "mask")
    check_same_shape("logp_student", logp_student, logp_teacher=logp_teacher, mask=mask)
    zero = torch.zeros((), dtype=logp_student.dtype, device=logp_student.device)
    for name, t in (("logp_student", logp_student), ("logp_teacher", logp_teacher)):
        if not bool(torch.isfinite(torch.where(mask, t, zero)).all()):
            raise PolicylabError(f"`{name}` is not finite at a counted position")
    # d_t = k1(lp_student − lp_teacher), the per-token reverse-KL estimate (kl.kl_estimate)
    a = torch.where(mask, -kl_estimate(logp_student.detach() - logp_teacher.detach(), "k1"), zero)
    if horizon == "sequence":
        a = torch.where(mask, a.flip(-1).cumsum(-1).flip(-1), zero)
    return a
