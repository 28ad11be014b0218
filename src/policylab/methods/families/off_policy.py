"""Registered methods for engine mismatch, staleness and off-policy tokens, and the trust-
region / sequence objectives that need them.

Corrections multiply a host loss (GRPO advantages, PPO clip on the policy ratio) by a
detached weight computed from the *engine ratio* k = π_old/μ: the training engine at the
sampling weights over the behavior engine that actually sampled. They need a behavior
engine that differs from the trainer (rollout.engine_dtype=bf16) to do anything; with
one engine k ≡ 1 and they are exact no-ops (tested). Each is a composition: the host
objective stage, the correction stage, and (where the method needs them) round stages;
no correction re-implements the host.
"""

from __future__ import annotations

from policylab.kernels.corrections import BatchLedger
from policylab.errors import PolicylabError
from policylab.kernels.objectives import DIVERGENCES, TOPOLOGIES
from policylab.methods.params import clip, group_std, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import Card, Param, RunShape, StateSpec, non_negative, positive
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses, rounds, sources
from policylab.methods.state import SeededGenerator

_ENGINE_ROLES = dict(
    samples="behavior μ = rollout engine (e.g. bf16) at the sampling weights; π_old = fp32 trainer at the same weights",
    learns="π_θ",
    reference="none",
)
_HOST = clip(0.2, 0.2) + group_std()


def _band(low: float, high: float, prefix: str, what: str) -> tuple[Param, ...]:
    return (Param(f"{prefix}_low", float, low, f"lower edge α of the {what} band (inclusive)", check=non_negative),
            Param(f"{prefix}_high", float, high, f"upper edge β of the {what} band (inclusive)", check=positive))


_TIS_CAP = Param("tis_cap", float, 2.0, "truncation C of the engine ratio (upper only)", check=positive)
_ICEPOP_BAND = _band(0.5, 5.0, "icepop", "engine-ratio")
_KPOP = (Param("kpop_delta", float, 0.01, "δ: both binary KLs (train↔serve) must be <= δ", check=positive),
         Param("kpop_weight", str, "ratio", "weight of a kept token: its engine ratio k, or 1", choices=("ratio", "one")))


_BF16 = {"rollout": {"engine_dtype": "bf16"}}  # a behavior engine that differs from the trainer
_STALE = {"rollout": {"staleness": 1}}  # batches trained a version after they were sampled


def _correction(name, *, card_kw, params, corrections=(), objective=losses.PPO_CLIP, source=sources.ON_POLICY,
                round_=(), state=(), checks=(), family="correction (engine mismatch)", samples=None,
                aggregation="token_mean", host=_HOST, exercise=_BF16):
    roles = dict(_ENGINE_ROLES)
    if samples:
        roles["samples"] = samples
    register(policy_gradient_method(
        name, Card(family=family, **roles, **card_kw),
        advantage=adv.GRPO, objective=objective, aggregation=aggregation, params=host + tuple(params),
        source=source, round_=round_, corrections=corrections, state=state, checks=checks, min_group_size=2,
        exercise=exercise,
    ))


def _single_update(run: RunShape, p) -> None:
    if run.epochs != 1 or run.minibatches != 1:
        raise PolicylabError(
            "online_icepop uses every batch for exactly one update: set train.epochs=1 and train.minibatches=1 "
            "(gradient accumulation over micro-batches is fine)")


_correction(
    "tis", card_kw=dict(
        title="Your Efficient RL Framework Secretly Brings You Off-Policy RL Training (technical blog)", arxiv="",
        summary="host loss x sg(min(π_old/μ, C)): upper-truncated engine ratio; small weights kept",
        not_established="staleness is not corrected; a bf16-vs-fp32 CPU pair is not a vLLM/FSDP validation",
        unconfirmed=("exact title wording", "default cap C = 2"),
        confirmed="truncated train/inference ratio as described by Yao, Liu et al.'s blog"),
    params=(_TIS_CAP,), corrections=(losses.TIS,),
)
_correction(
    "icepop", card_kw=dict(
        title="Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale Thinking Model (Ring-1T)",
        arxiv="2510.18855", summary="engine ratio kept inside [α, β] (inclusive), zero weight outside; PPO clip on π_θ/π_old",
        not_established="filters numerical mismatch, not text quality; no MoE cluster here",
        unconfirmed=("α = 0.5, β = 5", "inclusive bounds", "masked tokens stay in the normalizer"),
        confirmed="in-band tokens keep weight k (not 1), out-of-band get 0, combined with PPO clip (2510.18855)"),
    params=_ICEPOP_BAND, corrections=(losses.ICEPOP,),
)
_correction(
    "online_icepop", card_kw=dict(
        title="Online IcePop (single-use variant)", arxiv="",
        summary="IcePop band on sg(π_θ)/μ, no PPO clip; every batch is used for exactly one update at its own version",
        not_established="single use is enforced by the trainer's ledger (a round stage), not by the kernel",
        unconfirmed=("title/source of the online variant", "α, β")),
    params=_ICEPOP_BAND, host=group_std(), objective=losses.UNIT_POLICY_GRADIENT, corrections=(losses.ICEPOP_CURRENT,),
    round_=(rounds.SINGLE_USE,), checks=(_single_update,),
    state=(StateSpec("ledger", lambda p, seed: BatchLedger(), doc="batch ids already used for an update"),),
)
_correction(
    "kpop", card_kw=dict(
        title="Taming Training–Inference Mismatch in Reinforcement Learning with Adaptive Masking Regions", arxiv="",
        summary="keep a token only if both binary (token vs rest) KLs between train and serve are <= δ",
        not_established="token correctness; system-wide bias",
        unconfirmed=("δ", "in-region weight (ratio k or 1)", "publication venue"),
        confirmed="title and bidirectional binary-KL rule (Ant Group / NUS technical blog)"),
    params=_KPOP, corrections=(losses.KPOP,),
)
_correction(
    "mis", card_kw=dict(
        title="When Speed Kills Stability (sequence-level masked importance sampling)", arxiv="",
        summary="one engine ratio per sequence (geometric mean or product, in log space); mask the sequence outside [low, high]",
        not_established="the band; sequence masking discards whole responses",
        unconfirmed=("band", "geometric mean vs product as the default")),
    params=_band(0.5, 2.0, "mis", "sequence engine-ratio") + (
        Param("mis_kind", str, "geomean", "sequence ratio: geometric mean of the token ratios or their product",
              choices=("geomean", "product")),
        Param("mis_mode", str, "mask", "outside the band: weight 0 (mask) or the nearest edge (truncate)",
              choices=("mask", "truncate"))),
    corrections=(losses.MIS,),
)
_correction(
    "gmc", card_kw=dict(
        title="Asynchronous LLM Post-Training: Group-Mass Capping and Convergence Analysis", arxiv="",
        summary="trajectory weights (geometric-mean ratio current/behavior, detached) capped by one multiplier per group",
        not_established="convergence assumptions; arbitrary staleness is not repaired",
        unconfirmed=("title, id", "cap C and its relation to G (default 8 = group size of the configs)",
                     "trajectory weight form"),
        confirmed="weights computed once per round over whole groups (never per micro-batch), from the learner at "
                  "the start of the round"),
    params=(Param("gmc_cap", float, 8.0, "cap C on each group's total weight", check=positive),),
    round_=(rounds.GMC_WEIGHTS,), corrections=(losses.GMC,), family="correction (staleness)", exercise=_STALE,
    samples="behavior μ = a stale policy version (async mode: sampled k versions ago)",
)
_correction(
    "missing_old_logits", card_kw=dict(
        title="Missing Old Logits in Asynchronous Agentic RL: Semantic Mismatch and Repair Methods for Off-Policy Correction",
        arxiv="",
        summary="total ratio = engine d = π_old/μ x staleness s = π_θ/π_old; TIS on d, PPO clip on s; π_old recovered exactly "
                "(trainer forward at the sampling version, before any update: the snapshot route)",
        not_established="cluster deployment; approximate (EWMA) old log-probs are refused, not supported",
        unconfirmed=("title, id",)),
    params=(Param("engine_correction", str, "tis", "the correction applied to d = π_old/μ",
                  choices=("tis", "icepop", "kpop")), _TIS_CAP) + _ICEPOP_BAND + _KPOP,
    round_=(rounds.EXACT_OLD,), corrections=(losses.DECOUPLED_ENGINE,), family="correction (staleness + engine)",
    exercise={"rollout": {"staleness": 1, "engine_dtype": "bf16"}},
    samples="behavior μ = rollout engine at version v_b (possibly stale)",
)
_correction(
    "minirl", card_kw=dict(
        title="Stabilizing Reinforcement Learning with LLMs: Formulation and Practices", arxiv="2512.01374",
        summary="sg(engine ratio) x clipped policy term; MoE routing replay (refused on dense models)",
        not_established="routing replay needs an MoE model (none here); distributed MoE stability",
        unconfirmed=("normalization", "whether the engine weight is truncated"),
        confirmed="IS correction + clipping + routing replay (arXiv 2512.01374, Qwen team)"),
    params=(Param("engine_cap", float, None, "truncation of the engine weight (None: untruncated)", optional=True,
                  check=positive),),
    corrections=(losses.ENGINE_WEIGHT,),
)
_correction(
    "sis", card_kw=dict(
        title="Turning Off-Policy Tokens On-Policy: A Plug-in Approach for Improving LLM Alignment", arxiv="",
        summary="per-token rejection sampling against the behavior's top-K envelope: accepted tokens train as on-policy "
                "(ratio 1), rejected ones keep the host's ratio and clipping",
        not_established="the top-K envelope is approximate; prefixes remain off-policy history",
        unconfirmed=("title, id", "K", "adding the sampled token to the envelope set (library decision)")),
    params=(Param("sis_topk", int, 8, "K: behavior log-probs recorded per position for the envelope",
                  check=positive),),
    source=sources.ON_POLICY_TOPK, round_=(rounds.SIS_ACCEPT,), corrections=(losses.SIS_DENOMINATOR,),
    state=(StateSpec("sis_rng", lambda p, seed: SeededGenerator(seed + 29), doc="acceptance draws"),),
    family="correction (off-policy tokens)", exercise=_STALE,
    samples="behavior μ = a stale version or another engine; its top-K log-probs are recorded at sampling",
)


def _objective(name, *, card_kw, params, objective, advantage=adv.GRPO, aggregation="token_mean",
               family="objective (trust region)", reference="none", kl_placements=("loss", "reward")):
    register(policy_gradient_method(
        name, Card(family=family, samples="π_old (rollout at the current weights; reused over minibatches)",
                   learns="π_θ", reference=reference, **card_kw),
        advantage=advantage, objective=objective, aggregation=aggregation, params=tuple(params),
        kl_placements=kl_placements, min_group_size=2,
    ))


_objective(
    "ripo", card_kw=dict(
        title="RIPO (Fisher–Rao probability-dependent ratio bounds)", arxiv="",
        summary="clip bounds from the frozen old probability: a Fisher–Rao radius on the token-vs-rest Bernoulli",
        not_established="stability; bounds are a construction consistent with the description",
        unconfirmed=("title, id", "exact bound formula", "δ")),
    params=group_std() + (Param("delta", float, 0.2, "Fisher–Rao radius δ", check=positive),), objective=losses.RIPO,
)
_objective(
    "gppo_fdiv", card_kw=dict(
        title="Generalized proximal policy optimization with f-divergence trust regions", arxiv="",
        summary="per-token ratio interval solved from an f-divergence under an estimation topology (MC / atomic / binary)",
        not_established="that different instantiations train alike", unconfirmed=("title", "published pairings", "δ")),
    params=group_std() + (
        Param("divergence", str, "kl_old_new", "the f-divergence, under its literal name",
              choices=DIVERGENCES),
        Param("topology", str, "binary", "estimation topology", choices=TOPOLOGIES),
        Param("delta", float, 0.01, "trust-region radius δ", check=positive)),
    objective=losses.GPPO_FDIV,
)
_objective(
    "tapo", card_kw=dict(
        title="Trajectory-Aware Policy Optimization: Closing the State Distribution Gap in Long-Horizon LLM RL", arxiv="",
        summary="detached prefix geometric-mean ratio weights the current token; position-dependent trust interval",
        not_established="long-horizon benefit",
        unconfirmed=("schedule ε(t) = eps0/sqrt(1 + t/tau) is a library choice", "whether the prefix includes t")),
    params=group_std() + (Param("eps0", float, 0.2, "trust interval half-width at position 0", check=positive),
                          Param("tau", float, 64.0, "position scale of the tightening schedule", check=positive)),
    objective=losses.TAPO,
)
_objective(
    "luspo", card_kw=dict(
        title="Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response Length Variation in RLVR",
        arxiv="", summary="GSPO's sequence term times its length: token_mean over the batch gives Σℓ_i/Σ|y_i|",
        not_established="prevention of length collapse (needs long generations)",
        unconfirmed=("outer normalizer", "clip range")),
    params=clip(3e-4, 4e-4, dual=False) + group_std(), objective=losses.LUSPO, family="objective (sequence)",
)
_objective(
    "ggpo", card_kw=dict(
        title="Gibbs-Gap Policy Optimization for Off-Policy RL with Verifiable Rewards", arxiv="",
        summary="minimize the within-group Gibbs gap of reference-adjusted rewards; coefficients detached (computed once "
                "per round over whole groups from the learner at the start of the round); no behavior IS",
        not_established="off-policy data stays off-policy; filtered-batch statistics",
        unconfirmed=("exact published form (reconstruction)", "β", "coefficient clip c",
                     "coefficients frozen per round (library decision: per-step refresh would need a forward over "
                     "the whole batch at every optimizer step)")),
    params=(Param("beta", float, 0.1, "KL temperature β of the Gibbs target π* ∝ π_ref·exp(r/β)", check=positive),
            Param("coef_clip", float, 5.0, "clip c of the reference log-ratio inside the coefficients", check=positive)),
    advantage=adv.GIBBS, objective=losses.REINFORCE, aggregation="seq_mean_token_sum",
    reference="π_ref defines the Gibbs target π* ∝ π_ref·exp(r/β)", family="objective (off-policy)",
    kl_placements=("loss",),
)
