"""Stages of the pipeline methods: the reward model's score (ppo_rlhf's PPO stage) and
multi-teacher on-policy distillation (fusion's MOPD route)."""

from __future__ import annotations

import torch

from ...errors import PolicylabError
from ...mixedpolicy import kernels as K
from ...pipelines import preferences
from ...pipelines.reward_model import RewardModelState
from ..context import Sampled, StageContext
from ..spec import Advantages, Stage
from . import sources


def build_reward_model(model, setup):
    """Build the run's reward model (`pipelines.reward_model.RewardModelState`) next to the policy."""
    setup.state["reward_model"].build(model, setup.tokenizer)
    return model


def reward_model_score(s: Sampled, ctx: StageContext):
    """rewards = r_ψ(x, y), the reward model's score of prompt + response, once per
    sequence (the advantage stage places it at the last valid token). The verifier's
    outcome stays in `outcome["correct"]` (a diagnostic); the known preference score of
    the procedural preference set, where the task has one, is logged next to it."""
    rm: RewardModelState = ctx.state["reward_model"]
    scores = rm.score(s.batch).to(torch.float32)
    info = {"rlhf/rm_score_mean": float(scores.mean()), "rlhf/rm_score_std": float(scores.std(unbiased=False))}
    if all({"op", "a", "b"} <= set(e.meta) for e in s.examples):
        true = [preferences.true_score(e, t) for e, t in zip(s.examples, s.texts)]
        info["rlhf/true_score_mean"] = sum(true) / len(true)
    return {"rewards": scores, "extras": {"rm_score": scores}}, info


def _rm_state(p, seed):
    return RewardModelState(p.reward_model)


REWARD_MODEL = Stage("model", build_reward_model, name="build_reward_model")
REWARD_MODEL_SCORE = Stage("reward", reward_model_score, reads=("tokens",), writes=("rewards", "extras.rm_score"))


# ----------------------------------------------------------------------------- MOPD (fusion)


def with_domains(n_prompts: int, ctx: StageContext) -> Sampled:
    """The learner's own rollouts (as `sources.ON_POLICY`), each row tagged with the domain
    of its prompt (extras["domain"] [B], an index into the task's `DOMAINS`)."""
    from ...tasks.mixture import domain_index

    s = sources.on_policy(n_prompts, ctx)
    d = torch.tensor([domain_index(e) for e in s.examples], dtype=torch.long)
    s.batch = s.batch.replace(extras={**s.batch.extras, "domain": d}).validate()
    return s


def teacher_logprobs(batch, ctx: StageContext):
    """Each row's log-probs under the teacher of its domain (frozen), once per round."""
    from ...tasks.mixture import DOMAINS

    teachers = ctx.state["teachers"]
    if "domain" not in batch.extras:
        raise PolicylabError("fusion (MOPD) needs extras['domain'] per row (its source tags it)")
    dom = batch.extras["domain"]
    out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
    info = {}
    for d in torch.unique(dom).tolist():
        rows = (dom == d).nonzero().squeeze(-1)
        sub = batch.select(rows)
        out[rows] = teachers.for_domain(DOMAINS[d]).logprobs(sub).to(out.dtype)
    return {"extras": {"logp_teacher": out}}, info


def mopd(batch, ctx: StageContext) -> Advantages:
    """A_t = −(lp_student − lp_teacher) per token (student: the learner at the round's start)."""
    from ...tasks.mixture import DOMAINS

    batch.require("fusion", "logp_current")
    a = K.mopd_advantages(batch.logp_current, batch.extras["logp_teacher"].to(batch.logp_current.dtype),
                          batch.loss_mask)
    info = {}
    m = batch.loss_mask
    for d in torch.unique(batch.extras["domain"]).tolist():
        rows = (batch.extras["domain"] == d).unsqueeze(-1) & m
        gap = (batch.logp_current - batch.extras["logp_teacher"])[rows]
        info[f"mopd/teacher_gap@domain={DOMAINS[d]}"] = gap.mean() if gap.numel() else torch.zeros(())
    return Advantages(a.to(batch.logp_current.dtype), info=info)


WITH_DOMAINS = Stage("source", with_domains, writes=("tokens", "loss_mask", "logp_behavior", "group",
                                                       "policy_version", "source", "extras.domain"))
TEACHER_LOGPROBS = Stage("round", teacher_logprobs, reads=("extras.domain",), writes=("extras.logp_teacher",))
MOPD = Stage("advantage", mopd, kernels=(K.mopd_advantages,), reads=("logp_current", "extras.logp_teacher"))
