"""Objectives over a whole group instead of one reply at a time: ConSPO (a group InfoNCE
over length-normalized sequence log-probabilities, positives against the group's
negatives) and ZCPO (zero-sum group coefficients from the rewards and the exact
full-vocabulary KL drift to the reference, in place of the advantage). Both freeze their
per-round statistics in round stages over whole groups; kernels in
`policylab.kernels.objectives.conspo` and `.zcpo`.
"""

from __future__ import annotations

import torch

from policylab.batch import RolloutBatch
from policylab.errors import PolicylabError
from policylab.kernels.advantages.verdict import verdict_polarity
from policylab.kernels.checks import masked_mean
from policylab.kernels.objectives import conspo as conspo_k
from policylab.kernels.objectives import zcpo as zcpo_k
from policylab.methods.context import StageContext
from policylab.methods.params import ON_POLICY_ROLES as _ROLES
from policylab.methods.params import VERDICT_THRESHOLD as _VERDICT
from policylab.methods.params import clip, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import (
    Advantages,
    Card,
    LossInputs,
    Param,
    Stage,
    non_negative,
    positive,
)
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import filters, losses
from policylab.methods.stages.advantages import scalar_rewards


def conspo_round(batch: RolloutBatch, ctx: StageContext):
    """The margin of this step (`conspo.margin_at(ctx.step)`) and the row scale
    N_seq/N_trained of the round (`conspo.row_scale`: N_trained counts the positives of
    eligible groups only, so the aggregate is the mean of ℓ_p over them), as 0-dim extras."""
    p = ctx.p
    margin = conspo_k.margin_at(ctx.step, margin_max=p.conspo_margin_max, ramp_steps=p.conspo_margin_ramp_steps)
    verdict = _verdict(batch, p.verdict_threshold)
    pos = verdict & batch.loss_mask.any(-1)
    trained = conspo_k.trained_positives(batch.group, verdict, batch.loss_mask)
    scale = conspo_k.row_scale(batch.group, verdict, batch.loss_mask)
    return ({"extras": {"conspo_margin": torch.tensor(margin), "conspo_row_scale": torch.tensor(float(scale))}},
            {"conspo/margin": margin, "conspo/positive_frac": float(pos.double().mean()),
             "conspo/eligible_positives": float(trained.sum())})


def _verdict(batch: RolloutBatch, threshold: float) -> torch.Tensor:
    batch.require("verdicts", "outcome.correct")
    return verdict_polarity(batch.outcome["correct"], threshold) > 0


def zcpo_drift(batch: RolloutBatch, ctx: StageContext):
    """κ [B, T]: the exact full-vocabulary KL(π_θ‖π_ref) per position at the round's start
    (`LocalWorker.vocab_stats`, chunked over positions and vocabulary), detached."""
    batch.require("zcpo", "logp_ref")
    kl = ctx.worker.vocab_stats(batch, kl_to_reference=True)["kl"]
    sampled = (batch.logp_current if batch.logp_current is not None else batch.logp_behavior) - batch.logp_ref
    return ({"extras": {"zcpo_kl": kl}},
            {"zcpo/kl_full_token_mean": float(masked_mean(kl, batch.loss_mask)),
             "zcpo/sampled_log_ratio_mean": float(masked_mean(sampled, batch.loss_mask))})


CONSPO_ROUND = Stage("round", conspo_round, kernels=(conspo_k.margin_at, conspo_k.row_scale),
                     params=("conspo_margin_max", "conspo_margin_ramp_steps", "verdict_threshold"),
                     reads=("outcome.correct",), writes=("extras.conspo_margin", "extras.conspo_row_scale"))


ZCPO_DRIFT = Stage("round", zcpo_drift, needs=("worker.vocab_stats", "worker.vocab_kl"), kernels=(zcpo_k.full_vocab_kl,), reads=("logp_ref",),
                   writes=("extras.zcpo_kl",))


def zcpo(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """c_i from rewards and the round's full-vocabulary drift (extras["zcpo_kl"])."""
    if "zcpo_kl" not in batch.extras:
        raise PolicylabError("zcpo needs extras['zcpo_kl'] (the full-vocabulary KL, written by the ZCPO_DRIFT round "
                             "stage)")
    r = scalar_rewards(batch, "zcpo")
    c, info = zcpo_k.zcpo_coefficients(r, batch.group, zcpo_k.from_worker(batch.extras["zcpo_kl"]), batch.loss_mask,
                                       beta=ctx.p.drift_coef, std=ctx.p.std)
    return Advantages(c, info=info)


ZCPO = Stage("advantage", zcpo, kernels=(zcpo_k.zcpo_coefficients,), params=("drift_coef", "std"),
             reads=("rewards", "group", "extras.zcpo_kl"))


def conspo(inp: LossInputs, p):
    ex = inp.batch.extras
    if "conspo_margin" not in ex:
        raise PolicylabError("conspo needs the round's margin (extras['conspo_margin'], the CONSPO round stage)")
    positive = (torch.where(inp.mask, inp.adv if inp.adv.dim() == 2 else inp.adv.unsqueeze(-1), 0.0) > 0).any(-1)
    scale = torch.full((inp.mask.shape[0],), float(ex["conspo_row_scale"]), dtype=inp.logp.dtype)
    return conspo_k.conspo(inp.logp, inp.mask, inp.batch.group, positive, tau=p.conspo_tau,
                           margin=float(ex["conspo_margin"]), row_scale=scale)


CONSPO = Stage("objective", conspo, kernels=(conspo_k.conspo,), params=("conspo_tau",),
               reads=("logp", "group", "extras.conspo_margin"), row_coupling="group")


def _zcpo_skip(run, p) -> None:
    if p.kl_coef > 0 or p.entropy_coef > 0:
        raise PolicylabError(
            "zcpo has no separate KL loss (the drift is inside its coefficients), and a step with no eligible group "
            "must be skipped, which a KL or entropy term in the loss would prevent (it has a gradient on every row): "
            "set method_params.kl_coef=0 and entropy_coef=0")


register(policy_gradient_method(
    "conspo",
    Card(
        title="Revisiting Reinforcement Learning with Verifiable Rewards from a Contrastive Perspective",
        arxiv="2605.12969", family="objective", **_ROLES, reference="none",
        summary="group InfoNCE over length-normalized sequence log-probs: each verified positive against its "
                "group's negatives, with a margin that grows over training",
        not_established="relative separation of scores is not absolute correctness; that the margin curriculum "
                        "helps at this scale",
        unconfirmed=("temperature τ (conspo_tau = 1.0: library decision)",
                     "the margin schedule (a linear ramp 0 → conspo_margin_max over conspo_margin_ramp_steps "
                     "steps: library decision)",
                     "other positives are not in the denominator", "no old-policy ratio enters the score",
                     "normalization: the mean of ℓ_p over the positives of eligible groups (the specification's "
                     "form; not checked in the paper's text)"),
        confirmed="from the paper's abstract (arXiv 2605.12969v3): length-normalized sequence log-probabilities "
                  "as rollout scores in place of clipped ratio scores, verified positives contrasted with negatives "
                  "of the same group, a group-wise InfoNCE-style objective, a curriculum-scheduled margin that goes "
                  "from coarse ordering early to stronger separation later (a rising margin, as the ramp here); "
                  "the gradient's form (∂ℓ/∂s_n = softmax_n/τ) is tested; the loss is the mean over the positives "
                  "of eligible groups only, and a row without a valid token is neither positive nor negative "
                  "(tested: until issue 24 the row scale counted every positive of the round, so groups without a "
                  "contrast shrank the loss)",
    ),
    filters=(filters.DYNAMIC_SAMPLING,), round_=(CONSPO_ROUND,),
    advantage=adv.VERDICT, objective=CONSPO, aggregation="seq_mean_token_mean",
    params=(Param("conspo_tau", float, 1.0, "InfoNCE temperature τ", check=positive),
            Param("conspo_margin_max", float, 0.1, "the margin m subtracted from a positive's score, reached after "
                  "the ramp (nats per token)", check=non_negative),
            Param("conspo_margin_ramp_steps", int, 100, "rollout steps over which the margin rises linearly from 0 "
                  "(0: the full margin from the start)", check=non_negative),
            _VERDICT),
    kl_placements=("loss",), min_group_size=2,
))


register(policy_gradient_method(
    "zcpo",
    Card(
        title="When KL Regularization Misfires in Group Policy Optimization", arxiv="",
        family="objective", **_ROLES, reference="π_ref (initial policy): its full-vocabulary KL drift enters the "
                                                "coefficients, never a separate loss",
        summary="zero-sum group coefficients mixing the centred reward and the centred exact KL drift to the "
                "reference, in place of the advantage; no eligible group → no step",
        not_established="that this anchor improves results; the KL drift is exact per position but its mean over a "
                        "response is a library choice of aggregation",
        unconfirmed=("title/arXiv id", "the combination form c = (Δr − β·ΔK)/σ_r",
                     "drift_coef β (1.0: library decision)", "std convention (population, as the specification)"),
        confirmed="the specification's hand-worked coefficients (rewards [1,0,0,1], K [0.1,0.3,0.2,0.2] → "
                  "[1.2,−1.2,−1,1]) and that a step without eligible groups leaves the weights bit-identical under "
                  "weight decay (tested); the paper itself was not found",
    ),
    round_=(ZCPO_DRIFT,), advantage=ZCPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + (
        Param("drift_coef", float, 1.0, "β: weight of the centred KL drift against the centred reward",
              check=non_negative),
        Param("std", str, "population", "std convention of the group reward spread",
              choices=("unbiased", "population"))),
    kl_placements=("loss",), checks=(_zcpo_skip,), min_group_size=2,
))
