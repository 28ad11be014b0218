"""Registered mixed-policy methods: learning from tokens another policy, a solver, a
hinted context, a peer or an external model produced. Each is a source stage (where the
other sequences come from, with their provenance) plus the round, advantage and loss
stages that read that provenance; the trainer runs them like any other method.

Every one of them lists `SOURCE_METRICS`, so the log splits rewards, accuracy, counts and
lengths by source (`reward/mean@source=gold`, ...).
"""

from __future__ import annotations

from policylab.errors import PolicylabError
from policylab.methods.peers import FrozenModel, SuccessEma
from policylab.tasks.guidance import DEMONSTRATION_STYLES, HINT_KINDS
from policylab.methods.params import clip, group_std, max_new_tokens, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import Card, Param, RunShape, Stage, StateSpec, non_negative, positive, unit_interval
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses, mixed
from policylab.methods.stages.provenance import SOURCE_METRICS

_LEARNS = "π_θ on the deployment prompt (the only differentiable policy)"


def _fewer_than_group(param: str, what: str):
    def check(run: RunShape, p) -> None:
        k = p[param]
        if not 1 <= k < run.group_size:
            raise PolicylabError(f"{what}: method parameter {param} = {k} must be >= 1 and < rollout.group_size "
                                 f"({run.group_size}); the rest of each group is the learner's own rollouts")
    return check


def _half_group(run: RunShape) -> int:
    return max(1, run.group_size // 2)


def _twice_budget(run: RunShape) -> int:
    return 2 * run.max_new_tokens


def _frozen(name: str, param: str, role: str):
    """The state spec and model stage of a frozen second model named by `param`."""
    spec = StateSpec(name, lambda p, seed: FrozenModel(getattr(p, param), role), params=(param,),
                     doc=f"the {role} model, rebuilt from `{param}` (never stored in checkpoints)")
    return spec, Stage("model", mixed.build_frozen(name), name=f"build_{name}")


def _model_param(name: str, role: str) -> Param:
    return Param(name, str, "", f"the {role} model: a save_pretrained directory or a policylab checkpoint directory "
                 "(run_dir/checkpoints/step_N); '' = a frozen copy of the run's initial policy")


# ----------------------------------------------------------------------------- Off-Context GRPO

register(policy_gradient_method(
    "off_context_grpo",
    Card(
        title="Off-Context GRPO: Learning to Reason on Hard Problems using Privileged Information", arxiv="",
        family="mixed-policy (hinted context)",
        samples="μ = the current weights conditioned on prompt ⊕ hint (the hint from the task's solver, train split "
                "only); rows of an empty hint are native",
        learns=_LEARNS + "; the numerator π_θ(y|x) never sees the hint",
        reference="π_ref on the prompt alone (k3 KL in the loss, as GRPO; kl_coef=0 drops it); evaluation has no hint",
        summary="sample with a privileged hint, learn without it: ratio π_θ(y|x)/μ(y|x⊕h) with GRPO advantages and "
                "the PPO clip; an empty hint is GRPO exactly",
        not_established="that the hinted successes transfer to unhinted prompts; behavior of the clip under the large "
                        "initial mismatch between hinted and unhinted contexts",
        unconfirmed=("title and arXiv id (not found)", "clip range under a large initial mismatch (eps_low/eps_high, "
                     "GRPO's 0.2 by default)", "hint content and placement (a line after the prompt: library decision)"),
        confirmed="the denominator comes from the hinted sampler and the numerator from the unhinted prompt (a batch "
                  "where both sides saw the same context is refused, tested); hint_kind 'none' reproduces GRPO's "
                  "update exactly (tested)",
    ),
    source=mixed.HINTED, round_=(mixed.CONTEXT_CHECK, SOURCE_METRICS), corrections=(mixed.HINTED_DENOMINATOR,),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("hint_kind", str, "worked", "the privileged hint: 'worked' (the worked solution's steps without its "
              "result), 'answer' (the answer itself) or 'none' (no hint: GRPO)", choices=HINT_KINDS),),
    kl=(0.04, "k3", "loss"), min_group_size=2,
))

# ----------------------------------------------------------------------------- LUFFY

register(policy_gradient_method(
    "luffy",
    Card(
        title="Learning to Reason under Off-Policy Guidance", arxiv="2504.14945", family="mixed-policy (demonstrations)",
        samples="mixture: G − k rollouts of the current weights (native) and k demonstrations written by the task's "
                "solver (source demonstration; μ = 1 for their tokens: a deterministic producer)",
        learns=_LEARNS, reference="none (no KL in the paper's setting; kl_coef adds one)",
        summary="demonstrations mixed into the group; GRPO advantages over the mixed group; on demonstration tokens "
                "the shaped weight π/(π+γ) replaces the ratio (no clip); native tokens keep the PPO clip",
        not_established="that shaping avoids rigid imitation at this scale; demonstrations here are solver answers, "
                        "not a stronger model's reasoning traces",
        unconfirmed=("the aggregation (token_mean over native and demonstration tokens: library decision)",
                     "demonstrations per group (1 here)"),
        confirmed="mixed-group advantage normalization over on- and off-policy rewards, the shaping f(π) = π/(π+γ) "
                  "with γ = 0.1, and the demonstration's behavior probability taken as 1 (exact for a "
                  "deterministic solver); gradient coefficient π·γ/(π+γ)² tested at π = 0.01, 0.1, 0.5, 0.9",
    ),
    source=mixed.DEMONSTRATIONS, round_=(SOURCE_METRICS,), advantage=adv.GRPO, objective=mixed.LUFFY,
    aggregation="token_mean",
    params=clip(0.2, 0.2, dual=False) + group_std() + (
        Param("luffy_gamma", float, 0.1, "γ of the policy shaping f(π) = π/(π+γ) on demonstration tokens",
              check=positive),
        Param("demos_per_group", int, 1, "demonstrations per prompt group (the other G − k rows are rollouts)"),
        Param("demonstration_style", str, "answer", "what a demonstration says: the answer alone (the ideal reply to "
              "'reply with only the number') or the worked solution", choices=DEMONSTRATION_STYLES)),
    kl=(0.0, "k3", "loss"), kl_placements=("loss",), min_group_size=2,
    checks=(_fewer_than_group("demos_per_group", "luffy"),),
))

# ----------------------------------------------------------------------------- GRIN

register(policy_gradient_method(
    "grin",
    Card(
        title="From Memorization to Absorption: Mixed-Policy RL for Continual Knowledge Injection", arxiv="",
        family="mixed-policy (gold injection)",
        samples="native rollouts of the current weights; in a group where all of them fail, verified gold answers of "
                "the task's solver replace the last n samples (source gold; μ = 1 on their tokens)",
        learns=_LEARNS, reference="none by default (kl_coef > 0: π_ref as a KL anchor only, never the IS denominator)",
        summary="gold injected only into all-fail groups; ratio π_θ/q_mix with q_mix = (1 − α)·π_old + α·q_gold, α the "
                "group's real mixture weight; the injection rate decays as native success rises",
        not_established="knowledge absorption (arithmetic answers are not a knowledge-injection corpus); that the "
                        "per-token mixture with a fixed α is the paper's exact estimator",
        unconfirmed=("title and id (not found)", "the token-level mixture form and q_gold on native tokens (1 while they "
                     "follow the gold text)", "the schedule α·(1 − EMA of native success) and its decay",
                     "injection replaces failed samples (library decision: group size stays G)"),
        confirmed="no injection into a group with any native success; the denominator is the mixture, not π_ref "
                  "(tested); grin_alpha = 0 reproduces GRPO's update exactly (tested)",
    ),
    source=mixed.GOLD_INJECTION, round_=(mixed.GRIN_ROUND, SOURCE_METRICS), corrections=(mixed.MIXTURE_DENOMINATOR,),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("grin_alpha", float, 0.25, "target injection rate α: an all-fail group gets round(α_eff·G) gold rows "
              "(at most G − 1)", check=unit_interval),
        Param("grin_schedule", str, "success_decay", "α_eff = α (constant) or α·(1 − EMA of the native success rate)",
              choices=("constant", "success_decay")),
        Param("grin_ema_decay", float, 0.9, "decay d of the native-success EMA, m <- d·m + (1 − d)·rate",
              check=unit_interval)),
    state=(StateSpec("grin_success", lambda p, seed: SuccessEma(p.grin_ema_decay), params=("grin_ema_decay",),
                     doc="EMA of the native success rate (the injection schedule)"),),
    kl=(0.0, "k3", "loss"), min_group_size=2,
))

# ----------------------------------------------------------------------------- MOER

register(policy_gradient_method(
    "moer",
    Card(
        title="MOER: Mix-Policy Optimization under Expert Prefix Guidance with Selective Rollback", arxiv="",
        family="mixed-policy (expert prefixes)",
        samples="native: unguided rollouts; guided: an expert prefix (the task solver's worked solution) continued by "
                "the current weights; expert: the full worked solution when the guided continuation fails",
        learns=_LEARNS, reference="none",
        summary="shrinking expert prefixes, rollback to the full expert trace on a failed continuation; native rows "
                "take the PPO clip, guided and expert rows the unit ratio π_θ/sg(π_θ); A = r − mean_g r",
        not_established="that guided successes mean unguided reachability; expert traces here are solver-written "
                        "worked solutions",
        unconfirmed=("title and id (not found)", "whether the expert-prefix tokens of a guided trace are in the loss "
                     "(train_prefix, default false)", "the prefix schedule (linear decay of prefix_frac over "
                     "prefix_decay_steps: library decision)", "guided rows per group"),
        confirmed="unit ratio value 1 with gradient ∇lp (tested); a guided trace stays guided; rollback only on a "
                  "failed continuation; the schedule never lengthens (tested)",
    ),
    source=mixed.EXPERT_PREFIX, round_=(mixed.MOER_ROUND, SOURCE_METRICS), corrections=(mixed.UNIT_RATIO,),
    advantage=adv.DR_GRPO, objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.2) + (
        Param("guided_per_group", int, 1, "guided rows per prompt group (the other G − k rows are unguided)"),
        Param("prefix_frac", float, 0.5, "fraction of the expert trace given as prefix at step 0",
              check=lambda v: None if 0 <= v <= 1 else "must be in [0, 1]"),
        Param("prefix_decay_steps", int, 100, "steps over which the prefix fraction falls linearly to 0 (0: constant)",
              check=non_negative),
        Param("train_prefix", bool, False, "put the expert-prefix tokens of guided rows in the loss")),
    kl=(0.0, "k3", "loss"), kl_placements=("loss",), min_group_size=2,
    checks=(_fewer_than_group("guided_per_group", "moer"),),
))

# ----------------------------------------------------------------------------- GRAFT

_PEER_STATE, _PEER_MODEL = _frozen("peer", "peer_model", "peer")
register(policy_gradient_method(
    "graft",
    Card(
        title="Learning Beyond What You Sample: Off-Policy-Aware Cross-Model Trajectory Exchange for RLVR", arxiv="",
        family="mixed-policy (peer groups)",
        samples="the receiver's rollouts; when its group on a prompt all fails, a peer model's whole group on that "
                "prompt (source peer:<model>), re-tokenized for the receiver and re-scored",
        learns="the receiver π_θ", reference="none",
        summary="import a whole mixed-outcome peer group when the receiver group all fails; advantages inside the "
                "imported group; sequence compatibility c = exp(mean lp_recv − mean lp_peer), rows with c below a "
                "threshold weighted 0; receiver-side clipped ratios",
        not_established="that borrowed groups help beyond what the peer already knows; compatibility filtering does not "
                        "make the two policies the same",
        unconfirmed=("title and id (not found)", "compatibility threshold graft_min_compat", "dropped rows weighted 0 and "
                     "kept in the normalizer (library decision)"),
        confirmed="borrowing only when the receiver group all fails and the peer group is mixed; the whole group is "
                  "imported (no API takes one success alone); means in each model's own tokenization, position-wise "
                  "subtraction across tokenizations of different lengths raises (tested)",
    ),
    source=mixed.PEER_EXCHANGE, round_=(mixed.GRAFT_ROUND, SOURCE_METRICS), corrections=(mixed.COMPAT_WEIGHT,),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("graft_min_compat", float, 0.1, "threshold on the sequence compatibility c_i (inclusive: c >= it is kept)",
              check=non_negative),
        _model_param("peer_model", "peer")),
    model=(_PEER_MODEL,), state=(_PEER_STATE,), kl=(0.0, "k3", "loss"), min_group_size=2,
))

# ----------------------------------------------------------------------------- ERILS

_EXT_STATE, _EXT_MODEL = _frozen("external", "external_model", "external")
register(policy_gradient_method(
    "erils",
    Card(
        title="ERILS: external rollouts for diffusion-LM RL (title unconfirmed)", arxiv="",
        family="mixed-policy (external rollouts)",
        samples="G − k rollouts of the current weights and k of an external autoregressive model (source external), "
                "re-tokenized for the learner; external rows longer than L_ext are rejected",
        learns=_LEARNS, reference="none",
        summary="per-source normalization within each prompt group (external rows do not shift the native baseline); "
                "the external length cap enforced before anything sees the rows",
        not_established="the paper's setting is a diffusion LM learner, which is outside this machine: here the learner "
                        "is the autoregressive policy and the external source a second autoregressive model; "
                        "per-source normalization does not remove off-policy bias",
        unconfirmed=("title and id", "exact normalization form", "reject vs truncate at the cap (reject here, counted)",
                     "the objective on external rows (receiver-side PPO clip: library decision)"),
        confirmed="native [0.2, 0.4] with external [0.9, 1.0]: pooled normalization gives native [−1.271, −0.673], "
                  "per-source [−1, 1] (tested); over-length external rows never reach the loss (tested)",
    ),
    source=mixed.EXTERNAL, round_=(mixed.ERILS_ROUND, SOURCE_METRICS), advantage=mixed.ERILS,
    objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.2) + group_std(std="population") + (
        Param("external_per_group", int, None, "external rows sampled per prompt (None: half the group)", optional=True,
              resolve=_half_group),
        Param("external_cap", int, None, "L_ext: external rows with more learner tokens are rejected (None: "
              "rollout.max_new_tokens)", optional=True, check=positive, resolve=max_new_tokens),
        Param("external_max_new_tokens", int, None, "generation budget of the external model (None: twice "
              "rollout.max_new_tokens)", optional=True, check=positive, resolve=_twice_budget),
        _model_param("external_model", "external")),
    model=(_EXT_MODEL,), state=(_EXT_STATE,), kl=(0.0, "k3", "loss"), kl_placements=("loss",), min_group_size=2,
    checks=(_fewer_than_group("external_per_group", "erils"),),
))
