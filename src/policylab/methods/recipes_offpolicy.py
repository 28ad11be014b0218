"""Registered methods for engine mismatch, staleness and off-policy tokens (METHODS.md
2.3), and the trust-region / sequence objectives of 2.2 that need them.

Corrections multiply a host loss (GRPO advantages, PPO clip on the policy ratio) by a
detached weight computed from the *engine ratio* k = π_old/μ: the training engine at the
sampling weights over the behavior engine that actually sampled. They need a behavior
engine that differs from the trainer (rollout.engine_dtype=bf16) to do anything; with
one engine k ≡ 1 and they are exact no-ops (tested).
"""

from __future__ import annotations

from .registry import Card, Recipe, register

_ENGINE_ROLES = dict(
    samples="behavior μ = rollout engine (e.g. bf16) at the sampling weights; π_old = fp32 trainer at the same weights",
    learns="π_θ",
    reference="none",
)
_HOST = dict(std="unbiased", eps=1e-6, eps_low=0.2, eps_high=0.2)
_KERNEL = "kernel verified; one trainer step on a tiny random Llama in the test suite"


def _correction(name, *, title, arxiv, summary, params, not_established, unconfirmed=(), confirmed="",
                correction=None, objective="ppo_clip", needs=("logp_old", "logp_behavior"), single_use=False,
                family="correction (engine mismatch)", samples=None, aggregation="token_mean"):
    roles = dict(_ENGINE_ROLES)
    if samples:
        roles["samples"] = samples
    register(Recipe(
        name=name,
        card=Card(title=title, arxiv=arxiv, family=family, summary=summary, status=_KERNEL,
                  not_established=not_established, unconfirmed=tuple(unconfirmed), confirmed=confirmed, **roles),
        advantage="grpo", objective=objective, aggregation=aggregation, params={**_HOST, **params},
        correction=correction, needs=needs, min_group_size=2, single_use=single_use,
    ))


_correction(
    "tis", title="Your Efficient RL Framework Secretly Brings You Off-Policy RL Training (technical blog)", arxiv="",
    summary="host loss x sg(min(π_old/μ, C)): upper-truncated engine ratio; small weights kept",
    params=dict(tis_cap=2.0), correction="tis",
    not_established="staleness is not corrected; a bf16-vs-fp32 CPU pair is not a vLLM/FSDP validation",
    unconfirmed=("exact title wording", "default cap C = 2"),
    confirmed="truncated train/inference ratio as described by Yao, Liu et al.'s blog",
)
_correction(
    "icepop", title="Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale Thinking Model (Ring-1T)",
    arxiv="2510.18855", summary="engine ratio kept inside [α, β] (inclusive), zero weight outside; PPO clip on π_θ/π_old",
    params=dict(icepop_low=0.5, icepop_high=5.0), correction="icepop",
    not_established="filters numerical mismatch, not text quality; no MoE cluster here",
    unconfirmed=("α = 0.5, β = 5", "inclusive bounds", "masked tokens stay in the normalizer"),
    confirmed="in-band tokens keep weight k (not 1), out-of-band get 0, combined with PPO clip (2510.18855)",
)
_correction(
    "online_icepop", title="Online IcePop (single-use variant)", arxiv="",
    summary="IcePop band on sg(π_θ)/μ, no PPO clip; every batch is used for exactly one update at its own version",
    params=dict(icepop_low=0.5, icepop_high=5.0), objective="online_icepop", needs=("logp_behavior",), single_use=True,
    not_established="single use is enforced by the trainer's ledger, not by the kernel",
    unconfirmed=("title/source of the online variant", "α, β"),
)
_correction(
    "kpop", title="Taming Training–Inference Mismatch in Reinforcement Learning with Adaptive Masking Regions", arxiv="",
    summary="keep a token only if both binary (token vs rest) KLs between train and serve are <= δ",
    params=dict(kpop_delta=0.01, kpop_weight="ratio"), correction="kpop",
    not_established="token correctness; system-wide bias",
    unconfirmed=("δ", "in-region weight (ratio k or 1)", "publication venue"),
    confirmed="title and bidirectional binary-KL rule (Ant Group / NUS technical blog)",
)
_correction(
    "mis", title="When Speed Kills Stability (sequence-level masked importance sampling)", arxiv="",
    summary="one engine ratio per sequence (geometric mean or product, in log space); mask the sequence outside [low, high]",
    params=dict(mis_low=0.5, mis_high=2.0, mis_kind="geomean", mis_mode="mask"), correction="mis",
    not_established="the band; sequence masking discards whole responses",
    unconfirmed=("band", "geometric mean vs product as the default"),
)
_correction(
    "gmc", title="Asynchronous LLM Post-Training: Group-Mass Capping and Convergence Analysis", arxiv="",
    summary="trajectory weights (geometric-mean ratio current/behavior, detached) capped by one multiplier per group",
    params=dict(gmc_cap=8.0), correction="gmc", needs=("logp_behavior",), family="correction (staleness)",
    samples="behavior μ = a stale policy version (async mode: sampled k versions ago)",
    not_established="convergence assumptions; arbitrary staleness is not repaired",
    unconfirmed=("title, id", "cap C and its relation to G (default 8 = group size of the configs)", "trajectory weight form"),
)
_correction(
    "missing_old_logits",
    title="Missing Old Logits in Asynchronous Agentic RL: Semantic Mismatch and Repair Methods for Off-Policy Correction",
    arxiv="", family="correction (staleness + engine)",
    summary="total ratio = engine d = π_old/μ x staleness s = π_θ/π_old; TIS on d, PPO clip on s; π_old recovered exactly "
            "(trainer forward at the sampling version, before any update: the snapshot route)",
    params=dict(engine_correction="tis", tis_cap=2.0, icepop_low=0.5, icepop_high=5.0, kpop_delta=0.01, kpop_weight="ratio"),
    objective="decoupled",
    samples="behavior μ = rollout engine at version v_b (possibly stale)",
    not_established="cluster deployment; approximate (EWMA) old log-probs are refused, not supported",
    unconfirmed=("title, id",),
)
_correction(
    "minirl", title="Stabilizing Reinforcement Learning with LLMs: Formulation and Practices", arxiv="2512.01374",
    summary="sg(engine ratio) x clipped policy term; MoE routing replay (refused on dense models)",
    params=dict(engine_cap=None), objective="minirl",
    not_established="routing replay needs an MoE model (none here); distributed MoE stability",
    unconfirmed=("normalization", "whether the engine weight is truncated"),
    confirmed="IS correction + clipping + routing replay (arXiv 2512.01374, Qwen team)",
)

_correction(
    "sis", title="Turning Off-Policy Tokens On-Policy: A Plug-in Approach for Improving LLM Alignment", arxiv="",
    summary="per-token rejection sampling against the behavior's top-K envelope: accepted tokens train as on-policy "
            "(ratio 1), rejected ones keep the host's ratio and clipping",
    params=dict(sis_topk=8), objective="sis", family="correction (off-policy tokens)",
    samples="behavior μ = a stale version or another engine; its top-K log-probs are recorded at sampling",
    not_established="the top-K envelope is approximate; prefixes remain off-policy history",
    unconfirmed=("title, id", "K", "adding the sampled token to the envelope set (library decision)"),
)


def _objective(name, *, title, arxiv, summary, params, objective, aggregation="token_mean", needs=(),
               not_established, unconfirmed=(), confirmed="", reference="none", family="objective (trust region)"):
    register(Recipe(
        name=name,
        card=Card(title=title, arxiv=arxiv, family=family, summary=summary, status=_KERNEL,
                  samples="π_old (rollout at the current weights; reused over minibatches)", learns="π_θ",
                  reference=reference, not_established=not_established, unconfirmed=tuple(unconfirmed), confirmed=confirmed),
        advantage="grpo", objective=objective, aggregation=aggregation,
        params={"std": "unbiased", "eps": 1e-6, **params}, needs=needs, min_group_size=2,
    ))


_objective(
    "ripo", title="RIPO (Fisher–Rao probability-dependent ratio bounds)", arxiv="",
    summary="clip bounds from the frozen old probability: a Fisher–Rao radius on the token-vs-rest Bernoulli",
    params=dict(delta=0.2), objective="ripo", not_established="stability; bounds are a construction consistent with the description",
    unconfirmed=("title, id", "exact bound formula", "δ"),
)
_objective(
    "gppo_fdiv", title="Generalized proximal policy optimization with f-divergence trust regions", arxiv="",
    summary="per-token ratio interval solved from an f-divergence under an estimation topology (MC / atomic / binary)",
    params=dict(divergence="kl_old_new", topology="binary", delta=0.01), objective="gppo_fdiv",
    not_established="that different instantiations train alike", unconfirmed=("title", "published pairings", "δ"),
)
_objective(
    "tapo", title="Trajectory-Aware Policy Optimization: Closing the State Distribution Gap in Long-Horizon LLM RL", arxiv="",
    summary="detached prefix geometric-mean ratio weights the current token; position-dependent trust interval",
    params=dict(eps0=0.2, tau=64.0), objective="tapo", not_established="long-horizon benefit",
    unconfirmed=("schedule ε(t) = eps0/sqrt(1 + t/tau) is a library choice", "whether the prefix includes t"),
)
_objective(
    "luspo", title="Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response Length Variation in RLVR",
    arxiv="", summary="GSPO's sequence term times its length: token_mean over the batch gives Σℓ_i/Σ|y_i|",
    params=dict(eps_low=3e-4, eps_high=4e-4), objective="luspo", family="objective (sequence)",
    not_established="prevention of length collapse (needs long generations)", unconfirmed=("outer normalizer", "clip range"),
)
_objective(
    "ggpo", title="Gibbs-Gap Policy Optimization for Off-Policy RL with Verifiable Rewards", arxiv="",
    summary="minimize the within-group Gibbs gap of reference-adjusted rewards; coefficients detached (computed from the "
            "learner's log-probs at each optimizer step: frozen within a step, refreshed between minibatches); no behavior IS",
    params=dict(beta=0.1, coef_clip=5.0), objective="ggpo", aggregation="seq_mean_token_sum",
    needs=("logp_ref", "rewards"), reference="π_ref defines the Gibbs target π* ∝ π_ref·exp(r/β)",
    family="objective (off-policy)", not_established="off-policy data stays off-policy; filtered-batch statistics",
    unconfirmed=("exact published form (reconstruction)", "β", "coefficient clip c"),
)
