"""Stages of the pipeline methods: the frozen reward model's score (ppo_rlhf's PPO stage)
and multi-teacher on-policy distillation (fusion's MOPD route)."""

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
