"""The trainable stages of the pipeline methods. `ppo_rlhf` is the PPO stage of
InstructGPT's three-stage RLHF ("Training language models to follow instructions with
human feedback", arXiv 2203.02155): a frozen reward model's score (written once at the
response's last token, read by GAE) with a per-token KL penalty to the SFT reference.
`fusion`'s MOPD stage learns from frozen domain teachers. The other stages of those
pipelines (SFT, the reward model, the experts, the merge) are ordinary training runs
(`policylab.pipelines`); these are the parts the trainer runs as methods.
"""

from __future__ import annotations

import torch
from policylab.errors import PolicylabError
from policylab.kernels import mixed as K
from policylab.methods.peers import Teachers
from policylab.tasks import preferences
from policylab.models.reward_model import RewardModelState
from policylab.methods.context import Sampled, StageContext
from policylab.methods.spec import Advantages, Stage
from policylab.methods.stages import sources
from policylab.kernels.mixed import MOPD_HORIZONS
from policylab.methods.params import clip, on_policy_only, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import Card, CriticSpec, Param, StateSpec, positive
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses, rewards
from policylab.methods.stages.provenance import DOMAIN_METRICS


# ----------------------------------------------------------------------------- ppo_rlhf


def reward_model_state(p, seed):
    return RewardModelState(p.reward_model)


def build_reward_model(model, setup):
    """Build the run's frozen reward model (`pipelines.reward_model.RewardModelState`)
    next to the policy, before the optimizer exists (it is never one of its groups)."""
    setup.state["reward_model"].build(model, setup.tokenizer)
    return model


def reward_model_score(s: Sampled, ctx: StageContext):
    """rewards = r_ψ(x, y), the frozen reward model's score of prompt + response, one
    scalar per sequence; the GAE stage places it at the last counted token (once) and
    subtracts the per-token KL penalty. The verifier's outcome stays in
    `outcome["correct"]` (accuracy, a diagnostic); for the arithmetic task the known
    preference score of `pipelines.preferences` is logged next to the RM score."""
    rm: RewardModelState = ctx.state["reward_model"]
    scores = rm.score(s.batch).to(torch.float32)
    info = {"rlhf/rm_score_mean": float(scores.mean()), "rlhf/rm_score_std": float(scores.std(unbiased=False))}
    if s.examples and all(preferences.has_true_preference(e) for e in s.examples):
        true = [preferences.true_score(e, t) for e, t in zip(s.examples, s.texts)]
        info["rlhf/true_score_mean"] = sum(true) / len(true)
    return {"rewards": scores, "extras": {"rm_score": scores}}, info


REWARD_MODEL = Stage("model", build_reward_model, name="build_reward_model")
REWARD_MODEL_SCORE = Stage("reward", reward_model_score, kernels=(preferences.true_score,), reads=("tokens",),
                           writes=("rewards", "extras.rm_score"))


# ----------------------------------------------------------------------------- MOPD (fusion)


def teachers_state(p, seed):
    return Teachers(p.teachers)


def build_teachers(model, setup):
    """Build the frozen domain teachers (`mixedpolicy.state.Teachers`) before the
    optimizer exists."""
    setup.state["teachers"].build(model, setup.tokenizer)
    return model


def with_domains(n_prompts: int, ctx: StageContext) -> Sampled:
    """The learner's own rollouts (as `sources.ON_POLICY`), each row tagged with the domain
    of its prompt (extras["domain"] [B], an index into `tasks.mixture.DOMAINS`)."""
    from policylab.tasks.mixture import domain_index

    s = sources.on_policy(n_prompts, ctx)
    d = torch.tensor([domain_index(e) for e in s.examples], dtype=torch.long)
    s.batch = s.batch.replace(extras={**s.batch.extras, "domain": d}).validate()
    return s


def teacher_logprobs(batch, ctx: StageContext):
    """Each row's log-probs under the (frozen) teacher of its domain, once per round."""
    from policylab.tasks.mixture import DOMAINS

    if "domain" not in batch.extras:
        raise PolicylabError("fusion (MOPD) needs extras['domain'] per row (its source tags it)")
    teachers: Teachers = ctx.state["teachers"]
    dom = batch.extras["domain"]
    out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32, device=batch.loss_mask.device)
    for d in torch.unique(dom).tolist():
        rows = (dom == d).nonzero().squeeze(-1)
        out[rows] = teachers.for_domain(DOMAINS[d]).logprobs(batch.select(rows)).to(out.dtype)
    return {"extras": {"logp_teacher": out}}, {}


def mopd(batch, ctx: StageContext) -> Advantages:
    """A = −(lp_student − lp_teacher) per token (or its return-to-go, `mopd_horizon`);
    the student is the learner at the round's start (`logp_current`). Logs the mean
    per-token gap to the teacher per domain, never only its average."""
    from policylab.tasks.mixture import DOMAINS

    batch.require("fusion", "logp_current")
    if "logp_teacher" not in batch.extras or "domain" not in batch.extras:
        raise PolicylabError("fusion (MOPD) needs extras['logp_teacher'] and extras['domain'] (its round stage "
                             "and source write them)")
    lp_t = batch.extras["logp_teacher"].to(batch.logp_current.dtype)
    a = K.mopd_advantages(batch.logp_current, lp_t, batch.loss_mask, horizon=ctx.p.mopd_horizon)
    info = {}
    dom, m = batch.extras["domain"], batch.loss_mask
    for d in torch.unique(dom).tolist():
        sel = (dom == d).unsqueeze(-1) & m
        if bool(sel.any()):
            info[f"mopd/teacher_gap@domain={DOMAINS[d]}"] = float((batch.logp_current - lp_t)[sel].mean())
    return Advantages(a, info=info)


TEACHERS = Stage("model", build_teachers, name="build_teachers")
WITH_DOMAINS = Stage("source", with_domains, writes=("tokens", "loss_mask", "logp_behavior", "group",
                                                       "policy_version", "source", "extras.domain"))
TEACHER_LOGPROBS = Stage("round", teacher_logprobs, reads=("extras.domain",), writes=("extras.logp_teacher",))
MOPD = Stage("advantage", mopd, kernels=(K.mopd_advantages,), params=("mopd_horizon",),
             reads=("logp_current", "extras.logp_teacher", "extras.domain"))


# ----------------------------------------------------------------------------- registration

_UNIT = lambda v: None if 0 <= v <= 1 else "must be in [0, 1]"  # noqa: E731


register(policy_gradient_method(
    "ppo_rlhf",
    Card(
        title="Training language models to follow instructions with human feedback", arxiv="2203.02155",
        family="pipeline (SFT -> reward model -> PPO)",
        samples="π_old: the policy at the current weights, initialized from the SFT checkpoint (stage 1)",
        learns="π_θ; critic V_φ (value head on a copy of the SFT policy)",
        reference="π_ref = the SFT policy (the run's initial weights): per-token KL in the reward, β·(lp_old − lp_ref)",
        critic="value head on a copy of the policy backbone (the SFT weights), clipped value loss; the paper "
               "initializes the value function from the reward model (not done here: library decision)",
        summary="stage 3 of InstructGPT: PPO with GAE whose per-token reward is −β·(lp_old − lp_ref) at every counted "
                "token plus a frozen reward model's score r_ψ(x, y) once at the last counted token; stages 1 (SFT on "
                "demonstrations) and 2 (pairwise reward model on ranked comparisons) run in `policylab pipeline "
                "ppo_rlhf CONFIG`",
        not_established="human preference data, reward-model quality at scale or an RLHF result: the preferences are "
                        "procedural (a known score of the reply: correct and terse beats correct and verbose beats "
                        "wrong), the RM sees a few hundred pairs of four reply templates; clipping and the reference "
                        "KL do not prevent reward hacking",
        unconfirmed=("β = 0.02, γ = 1, λ = 0.95 as the paper's PPO settings (not re-checked against its appendix)",
                     "pretraining mix (PPO-ptx, γ_ptx) not implemented: off, as in the paper's plain PPO runs",
                     "the critic starts from the SFT policy, not from the reward model"),
        confirmed="RM loss −log σ(r_w − r_l) averaged over the C(K, 2) ordered pairs of a prompt, all pairs of a prompt in "
                  "one batch element (the paper's Eq. 1; equal scores give log 2 = 0.6931, swapping winner and loser "
                  "flips the margin: tested); the RL reward is the RM score at the end minus the per-token KL to the SFT "
                  "policy (the paper's Eq. 2 without the ptx term): the score is added once per sequence at the last "
                  "counted token, the KL reads the sampler's lp_old (a learner-side lp that requires grad is refused), "
                  "replacing π_ref changes only the shaped reward and replacing the learner's lp only the ratios "
                  "(tested; lp_old is both the ratio's denominator and the sampler the KL reads); the RM is frozen (no "
                  "optimizer group, no gradient) and its weights are fingerprinted in checkpoints (tested)",
    ),
    rewards_=(rewards.VERIFIER, REWARD_MODEL_SCORE),
    advantage=adv.GAE, objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.2) + (
        Param("gamma", float, 1.0, "discount γ", check=_UNIT),
        Param("lam", float, 0.95, "GAE λ", check=_UNIT),
        Param("whiten", bool, False, "whiten the advantages over the batch's counted tokens"),
        Param("value_clip", float, 0.2, "clip range ε_v of the value loss (None: unclipped)", optional=True,
              check=positive),
        Param("reward_model", str, "", "the reward model: a directory the pipeline's RM stage wrote, or 'untrained' "
              "(a random head on a copy of the initial policy: plumbing tests only); '' is refused")),
    kl=(0.02, "k1", "reward"), kl_placements=("reward",), critic=CriticSpec(clip_param="value_clip"),
    model=(REWARD_MODEL,),
    state=(StateSpec("reward_model", reward_model_state, params=("reward_model",),
                     doc="the frozen reward model, rebuilt from its directory (checkpointed as its spec and a weight "
                         "fingerprint, never its weights)"),),
    exercise={"method_params": {"reward_model": "untrained"}},
))


register(policy_gradient_method(
    "fusion",
    Card(
        title="Consolidating RLVR Capabilities Across Domains: A Deep Dive into Fusion Paradigms", arxiv="",
        family="pipeline (Merge / Mix RL / MOPD)",
        samples="the student (the learner) on prompts pooled from several task domains, each row tagged with its domain",
        learns="the student π_θ",
        reference="the domain teachers (frozen RL experts, one per domain) give the per-token signal; no KL anchor",
        summary="MOPD: on the student's own samples, each token's advantage is −(lp_student − lp_teacher) under the "
                "teacher of the prompt's domain (mopd_horizon 'token'), or its sum over the rest of the response "
                "('sequence'), in a REINFORCE-style loss; the pipeline adds Merge (task-vector arithmetic) and Mix RL "
                "(ordinary RL on pooled data) and reports every route per domain",
        not_established="that a student inherits each teacher's capability, or that one route is better; similar "
                        "averages do not mean per-domain equivalence (every report and log is per domain)",
        unconfirmed=("title and arXiv id (not found)",
                     "the exact MOPD signal: the negated per-token log-ratio to the domain teacher, with the horizon an "
                     "explicit parameter (mopd_horizon)",
                     "teachers '' = frozen copies of the initial policy (a plumbing default; the pipeline passes the "
                     "trained experts)"),
        confirmed="Merge: θ = θ_base + Σ_k α_k (θ_k − θ_base); base [1, 1], experts [2, 1] and [1, 3] at α = 0.5 each "
                  "give [1.5, 2.0]; one expert at α = 1 returns it; another layout or vocabulary is refused (tested); "
                  "MOPD's student samples, the teacher of each row's domain scores them, a teacher equal to the student "
                  "gives zero advantages (tested)",
    ),
    source=WITH_DOMAINS, round_=(TEACHER_LOGPROBS, DOMAIN_METRICS), advantage=MOPD,
    objective=losses.REINFORCE, aggregation="token_mean",
    params=(Param("teachers", str, "", "domain teachers, 'domain=PATH,...' (save_pretrained or policylab checkpoint "
                  "directories); a domain not named: a frozen copy of the initial policy"),
            Param("mopd_horizon", str, "token", "MOPD signal: 'token' (A_t = −(lp_t − lp_teacher,t), the per-token "
                  "reverse-KL estimate) or 'sequence' (its sum from t to the end of the response); unconfirmed",
                  choices=MOPD_HORIZONS)),
    model=(TEACHERS,),
    state=(StateSpec("teachers", teachers_state, params=("teachers",),
                     doc="the frozen domain teachers (checkpointed as their specs and weight fingerprints)"),),
    kl_placements=("loss",), checks=(on_policy_only("fusion's MOPD loss is REINFORCE-style (no ratio)"),),
    exercise={"task": {"name": "mixture"}},
))
