"""Round stages: once per update round, after the role passes and before advantages.

They fold per-token quantities into the batch that every later stage reads the same way
for the whole round, whatever the minibatch and micro-batch split: the KL penalty of
KL-in-reward, SIS's acceptance draws, GMC's group-capped weights; and they enforce
provenance rules (single use, exact old log-probs).
"""

from __future__ import annotations

import torch

from policylab.kernels import corrections as corr
from policylab.kernels import kl as kl_mod
from policylab.batch import RolloutBatch
from policylab.errors import PolicylabError
from policylab.methods.context import StageContext
from policylab.methods.spec import Stage


def _metrics(prefix: str, m: dict) -> dict:
    return {f"{prefix}/{k}": float(v) for k, v in m.items()}


def kl_reward_penalty(batch: RolloutBatch, ctx: StageContext):
    """KL in the reward: extras["kl_penalty"] = β·k(lp_old, lp_ref) [B, T], detached,
    from the sampler's `logp_old` (`kl.reward_penalty`). Advantage stages subtract it
    once: summed over the response for scalar rewards, per token for token rewards."""
    batch.require("KL in the reward", "logp_old", "logp_ref")
    pen = kl_mod.reward_penalty(batch.logp_old, batch.logp_ref, batch.loss_mask, coef=ctx.p.kl_coef,
                                estimator=ctx.p.kl_estimator)
    return {"extras": {"kl_penalty": pen}}, {"kl/reward_penalty_mean": float(pen.sum(-1).mean())}


def kl_in_reward(p) -> bool:
    return p.kl_placement == "reward" and p.kl_coef > 0


def single_use(batch: RolloutBatch, ctx: StageContext):
    """Mark the batch consumed in the method's `BatchLedger`; a second use of its id, or a
    batch sampled by other weights than the current ones, raises BatchReuseError."""
    ctx.state["ledger"].consume(batch.batch_id, batch.policy_version, ctx.policy_version)
    return {}, {}


def exact_old_logprobs(batch: RolloutBatch, ctx: StageContext):
    """Refuse old log-probs that are not the training engine at exactly the version that
    sampled (`corrections.require_exact_old`): the trainer records the version of its
    old-logprob pass in extras["logp_old_version"]."""
    batch.require("missing_old_logits", "logp_old", "logp_behavior")
    versions = batch.policy_version
    if int(versions.min()) != int(versions.max()):
        raise PolicylabError("missing_old_logits: the batch mixes policy versions; tag each slice separately")
    old_version = batch.extras.get("logp_old_version")
    if old_version is None:
        raise PolicylabError("missing_old_logits: the batch does not record which weights computed logp_old")
    old = corr.VersionedLogprobs(batch.logp_old, int(torch.as_tensor(old_version).reshape(-1)[0]), "trainer", "exact")
    beh = corr.VersionedLogprobs(batch.logp_behavior, int(versions[0]), batch.engine, "exact")
    corr.require_exact_old(old, beh)
    return {}, {}


def sis_accept(batch: RolloutBatch, ctx: StageContext):
    """SIS: draw acceptance once for the round from the current weights (the role pass
    `logp_current`, and the current log-probs at the behavior's recorded top-K ids),
    with the method's seeded generator. Writes extras["sis_accepted"] [B, T] bool."""
    batch.require("sis", "logp_current", "logp_behavior")
    if "behavior_topk_ids" not in batch.extras:
        raise PolicylabError("sis needs the behavior's top-K log-probs recorded at sampling (a source that records them)")
    ids = batch.extras["behavior_topk_ids"]
    cur_topk = ctx.worker.logprobs_at(batch, ids)
    accepted, m = corr.sis(batch.logp_current, ids, batch.extras["behavior_topk_logp"], cur_topk,
                           batch.response_tokens, batch.logp_behavior, batch.loss_mask,
                           generator=ctx.state["sis_rng"].generator)
    return {"extras": {"sis_accepted": accepted}}, _metrics("correction", m)


def gmc_weights(batch: RolloutBatch, ctx: StageContext):
    """GMC: trajectory weights w_i = geometric-mean ratio of the current weights (the
    role pass `logp_current`, detached) to the behavior that sampled, capped by one
    multiplier per group over the whole batch (`corrections.gmc`). Frozen for the round:
    every minibatch and micro-batch reads the same weights."""
    batch.require("gmc", "logp_current", "logp_behavior")
    r = corr.seq_ratio_geomean(batch.logp_current, batch.logp_behavior, batch.loss_mask)
    w, m = corr.gmc(r.ratio.to(batch.logp_current.dtype), batch.group, cap=ctx.p.gmc_cap)
    return {"extras": {"gmc_weight": w}}, _metrics("correction", m)


KL_REWARD_PENALTY = Stage("round", kl_reward_penalty, kernels=(kl_mod.reward_penalty,),
                          params=("kl_coef", "kl_estimator", "kl_placement"), reads=("logp_old", "logp_ref"),
                          writes=("extras.kl_penalty",), active=kl_in_reward)
SINGLE_USE = Stage("round", single_use, reads=("batch_id", "policy_version"))
EXACT_OLD = Stage("round", exact_old_logprobs, kernels=(corr.require_exact_old,), reads=("logp_old", "logp_behavior"))
SIS_ACCEPT = Stage("round", sis_accept, needs=("worker.logprobs_at",), kernels=(corr.sis,), reads=("logp_current", "logp_behavior"),
                   writes=("extras.sis_accepted",))
GMC_WEIGHTS = Stage("round", gmc_weights, kernels=(corr.seq_ratio_geomean, corr.gmc), params=("gmc_cap",),
                    reads=("logp_current", "logp_behavior"), writes=("extras.gmc_weight",))
