"""Advantage stages: rewards (and roles) of the whole round -> detached advantages.

Scalar rewards are the batch's `rewards` minus the response's summed KL penalty when the
method puts KL in the reward (`extras["kl_penalty"]`, written by the round stage
`KL_REWARD_PENALTY`, applied here once); token rewards place the outcome at the last
valid token and subtract the penalty per token.
"""

from __future__ import annotations

import torch

from policylab.batch import RolloutBatch
from policylab.errors import PolicylabError
from policylab.kernels import advantages as A
from policylab.kernels import objectives as O
from policylab.kernels.advantages.verdict import verdict_polarity
from policylab.kernels.corrections.common import masked_log_ratio
from policylab.methods.context import StageContext
from policylab.methods.spec import Advantages, Stage


def scalar_rewards(batch: RolloutBatch, method: str) -> torch.Tensor:
    """[B] rewards, minus Σ_t of the KL penalty when the method put KL in the reward."""
    batch.require(method, "rewards")
    pen = batch.extras.get("kl_penalty")
    return batch.rewards if pen is None else batch.rewards - pen.sum(-1)


def token_rewards(batch: RolloutBatch, method: str) -> torch.Tensor:
    """[B, T]: the batch's token rewards, or its scalar reward at the last valid token;
    minus the per-token KL penalty when the method put KL in the reward."""
    if batch.token_rewards is not None:
        tr = batch.token_rewards
    else:
        batch.require(method, "rewards")
        mask = batch.loss_mask
        pos = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = torch.where(mask, pos, torch.full_like(pos, -1)).max(-1).values  # [B], -1 if empty
        tr = torch.zeros(mask.shape, dtype=batch.rewards.dtype, device=mask.device)
        has = last >= 0
        tr[has.nonzero().squeeze(-1), last[has]] = batch.rewards[has]
    pen = batch.extras.get("kl_penalty")
    return tr if pen is None else tr - pen


def grpo(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    r = scalar_rewards(batch, "grpo advantages")
    return Advantages(A.grpo(r, batch.group, std=ctx.p.std, eps=ctx.p.eps), info=A.group_stats(r, batch.group))


def dr_grpo(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    r = scalar_rewards(batch, "dr_grpo advantages")
    return Advantages(A.dr_grpo(r, batch.group), info=A.group_stats(r, batch.group))


def rloo(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    r = scalar_rewards(batch, "rloo advantages")
    return Advantages(A.rloo(r, batch.group), info=A.group_stats(r, batch.group))


def remax(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    batch.require("remax", "greedy_rewards")
    return Advantages(A.remax(scalar_rewards(batch, "remax"), batch.greedy_rewards))


def reinforce_pp(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """Return-to-go of the reward minus the per-token KL penalty, whitened over the batch."""
    batch.require("reinforce_pp", "rewards")
    return Advantages(A.reinforce_pp(batch.rewards, batch.extras.get("kl_penalty"), batch.loss_mask))


def reinforce_pp_baseline(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    r = scalar_rewards(batch, "reinforce_pp_baseline")
    scale = ctx.p.scale
    ema = ctx.state["ema_scale"] if scale == "ema" else None
    a = A.reinforce_pp_baseline(r, batch.group, scale=scale, ema=ema, update=True,
                                batch_id=batch.batch_id if ema is not None else None)
    return Advantages(a, info=A.group_stats(r, batch.group))


def gae(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    batch.require("gae", "values")
    adv, ret = A.gae(token_rewards(batch, "gae"), batch.values, batch.loss_mask, gamma=ctx.p.gamma, lam=ctx.p.lam)
    if ctx.p.whiten:
        adv = A.whiten(adv, batch.loss_mask, eps=1e-8)
    return Advantages(adv, returns=ret)


def vapo(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    batch.require("vapo", "values")
    adv, ret, info = A.vapo_advantages(token_rewards(batch, "vapo"), batch.values, batch.loss_mask,
                                       alpha=ctx.p.alpha, lam_critic=ctx.p.lam_critic, gamma=ctx.p.gamma)
    return Advantages(adv, returns=ret, info=info)


def grpo_process(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    ex = batch.extras
    for key in ("step_rewards", "step_ends", "step_mask"):
        if key not in ex:
            raise PolicylabError(
                f"grpo_process needs per-step rewards: batch.extras['{key}'] is missing. Score each reasoning "
                "step (a process reward model or a rule) and record step_rewards [B, K], step_ends [B, K] and "
                "step_mask [B, K].")
    a = A.grpo_process(ex["step_rewards"], ex["step_ends"], ex["step_mask"], batch.group,
                       T=batch.loss_mask.shape[1], std=ctx.p.std, eps=ctx.p.eps)
    return Advantages(a)


def gibbs(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """GGPO coefficients κ_i over whole groups, from the learner at the start of the round
    (`logp_current`) and the reference: they play the advantage's part in −κ·Σ_t lp."""
    batch.require("ggpo", "logp_current", "logp_ref", "rewards")
    ratio = masked_log_ratio(batch.logp_current, batch.logp_ref, batch.loss_mask).sum(-1)
    kappa, gap, _ = O.gibbs_coefficients(ratio, batch.rewards, batch.group, beta=ctx.p.beta, coef_clip=ctx.p.coef_clip)
    info = {"ggpo/gap_mean": gap.mean(), "ggpo/kappa_abs_mean": kappa.abs().mean(),
            "ggpo/frac_ref_ratio_clipped": (ratio.abs() > ctx.p.coef_clip).double().mean(),
            "ggpo/ref_log_ratio_mean": ratio.mean()}
    return Advantages(kappa.to(batch.logp_current.dtype), info=info)


_STD = ("std", "eps")
GRPO = Stage("advantage", grpo, kernels=(A.grpo,), params=_STD, reads=("rewards", "group"))
DR_GRPO = Stage("advantage", dr_grpo, kernels=(A.dr_grpo,), reads=("rewards", "group"))
RLOO = Stage("advantage", rloo, kernels=(A.rloo,), reads=("rewards", "group"))
REMAX = Stage("advantage", remax, kernels=(A.remax,), reads=("rewards", "greedy_rewards"))
REINFORCE_PP = Stage("advantage", reinforce_pp, kernels=(A.reinforce_pp,), reads=("rewards",))
REINFORCE_PP_BASELINE = Stage("advantage", reinforce_pp_baseline, kernels=(A.reinforce_pp_baseline,),
                              params=("scale",), reads=("rewards", "group"))
GAE = Stage("advantage", gae, kernels=(A.gae,), params=("gamma", "lam", "whiten"), reads=("values",))
VAPO = Stage("advantage", vapo, kernels=(A.vapo_advantages,), params=("alpha", "lam_critic", "gamma"),
             reads=("values",))
GRPO_PROCESS = Stage("advantage", grpo_process, kernels=(A.grpo_process,), params=_STD,
                     reads=("extras.step_rewards", "group"))
GIBBS = Stage("advantage", gibbs, kernels=(O.gibbs_coefficients,), params=("beta", "coef_clip"),
              reads=("logp_current", "logp_ref", "rewards", "group"))


def range_grpo(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """Advantages from the determinate pairwise relations of the judge's intervals."""
    batch.require("range_grpo", "reward_intervals")
    return Advantages(A.range_grpo(batch.reward_intervals.to(torch.float64), batch.group).float())


def dimension_weights(spec: str, n: int) -> torch.Tensor:
    """[D] weights from "1,0.5,...", one per reward dimension."""
    try:
        w = [float(x) for x in spec.split(",")]
    except ValueError:
        raise PolicylabError(f"dimension_weights {spec!r}: use comma-separated numbers") from None
    if len(w) != n:
        raise PolicylabError(f"dimension_weights {spec!r} has {len(w)} weights for {n} reward dimensions")
    return torch.tensor(w)


def gprl(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """Each reward dimension standardized within its group, then weighted and summed."""
    batch.require("gprl", "reward_vectors")
    r = batch.reward_vectors
    w = dimension_weights(ctx.p.dimension_weights, r.shape[1]).to(r.dtype)
    a = A.gprl(r, batch.group, w, std=ctx.p.std, eps=ctx.p.eps)
    return Advantages(a, info={f"gprl/{k}": v for k, v in A.gprl_stats(r, batch.group, w, std=ctx.p.std,
                                                                     eps=ctx.p.eps).items()})


RANGE_GRPO = Stage("advantage", range_grpo, kernels=(A.range_grpo,), reads=("reward_intervals", "group"))
GPRL = Stage("advantage", gprl, kernels=(A.gprl,), params=("dimension_weights", "std", "eps"),
             reads=("reward_vectors", "group"))


def verdict(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """±1 per response from the verifier's raw outcome: +1 iff outcome["correct"] >=
    `verdict_threshold` (inclusive). ConSPO reads positives from it, tlm-DRE polarities."""
    batch.require("verdicts", "outcome.correct")
    adv = verdict_polarity(batch.outcome["correct"], ctx.p.verdict_threshold)
    return Advantages(adv, info={"positive_frac": float((adv > 0).double().mean())})


VERDICT = Stage("advantage", verdict, kernels=(verdict_polarity,), params=("verdict_threshold",),
                reads=("outcome.correct",))
