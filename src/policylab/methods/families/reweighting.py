"""Methods that reweight GRPO's tokens or responses: STARE (surprisal-guided amplification
or attenuation of critical tokens, gated on the current entropy), ReCo (redundancy-
corrected weights from expected response counts and the token variance ratio) and ERPO
(question-side weights from the frozen reference's likelihood of each prompt). Each keeps
the PPO-clip host; the weights are frozen per round; kernels in
`policylab.kernels.objectives.stare`, `.reco` and `.erpo`.
"""

from __future__ import annotations

import torch

from policylab.batch import RolloutBatch
from policylab.errors import PolicylabError
from policylab.kernels import advantages as A
from policylab.kernels.checks import masked_mean
from policylab.kernels.objectives import erpo as erpo_k
from policylab.kernels.objectives import reco as reco_k
from policylab.kernels.objectives import stare as stare_k
from policylab.methods.context import StageContext
from policylab.methods.params import ON_POLICY_ROLES as _ROLES
from policylab.methods.params import clip, group_std, policy_gradient_method
from policylab.methods.params import group_size_of as _group_size
from policylab.methods.registry import register
from policylab.methods.spec import (
    Advantages,
    Card,
    LossInputs,
    Param,
    Stage,
    Weighting,
    non_negative,
    positive,
    unit_interval,
)
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses
from policylab.methods.stages.advantages import scalar_rewards


def _stare_round(batch: RolloutBatch, ctx: StageContext):
    ent = ctx.worker.vocab_stats(batch)["entropy"]
    H = float(masked_mean(ent, batch.loss_mask))
    return {"extras": {"stare_entropy": torch.tensor(H)}}, {"stare/entropy": H,
                                                            "stare/target": ctx.p.stare_target_entropy}


def stare_round_old(batch: RolloutBatch, ctx: StageContext):
    """STARE with surprisal under π_old: the current mean entropy H (full vocabulary, the
    whole batch's valid tokens), frozen for the round (the surprisal quantiles are taken by
    the advantage stage, which sees the whole batch and the advantages' signs)."""
    batch.require("stare", "logp_old")
    return _stare_round(batch, ctx)


def stare_round_behavior(batch: RolloutBatch, ctx: StageContext):
    """As `stare_round_old`, with surprisal under the behavior μ (the rollout engine)."""
    batch.require("stare", "logp_behavior")
    return _stare_round(batch, ctx)


def _question_mask(batch: RolloutBatch, ctx: StageContext) -> torch.Tensor:
    """[B, P] bool: the question's own tokens inside each templated prompt (the chat
    template's fixed prefix and suffix around the user content, found by encoding a
    marker, are excluded, as is padding)."""
    mark = "QQQ"
    ids = ctx.encode(mark)
    m = ctx.tokenizer.encode(mark, add_special_tokens=False)
    at = [i for i in range(len(ids) - len(m) + 1) if ids[i: i + len(m)] == m]
    if not at:
        raise PolicylabError("erpo: the chat template does not place the user message verbatim")
    pre, suf = ids[: at[-1]], ids[at[-1] + len(m):]
    P = batch.prompt_width
    out = torch.zeros((batch.size, P), dtype=torch.bool)
    for i in range(batch.size):
        real = batch.tokens[i, :P][batch.attention_mask[i, :P]].tolist()
        start = P - len(real)
        if real[: len(pre)] != pre or real[len(real) - len(suf):] != suf or len(real) <= len(pre) + len(suf):
            raise PolicylabError(f"erpo: prompt {i} is not the chat template around a user message; the question's "
                                 "tokens cannot be told apart from the template's")
        out[i, start + len(pre): start + len(real) - len(suf)] = True
    return out


def erpo_round(batch: RolloutBatch, ctx: StageContext):
    """ω [B]: question weights from the frozen reference's length-normalized likelihood of
    each question (`LocalWorker.prompt_logprobs("logp_ref", ...)` over the question's own
    tokens), exponentially tilted under the Query-KL penalty (`objectives.erpo`)."""
    lp = ctx.worker.prompt_logprobs("logp_ref", batch)
    tau = erpo_k.question_typicality(lp, _question_mask(batch, ctx))
    w, info = erpo_k.question_weights(tau, qkl_coef=ctx.p.qkl_coef)
    return {"extras": {"erpo_weight": w}}, info


_STARE_P = ("stare_target_entropy",)


_STARE_W = ("extras.stare_entropy",)


STARE_ROUND_OLD = Stage("round", stare_round_old, needs=("worker.vocab_stats",),
                        params=_STARE_P + ("surprisal_source",), reads=("logp_old",), writes=_STARE_W,
                        active=lambda p: p.surprisal_source == "logp_old")


STARE_ROUND_BEHAVIOR = Stage("round", stare_round_behavior, needs=("worker.vocab_stats",),
                             params=_STARE_P + ("surprisal_source",), reads=("logp_behavior",), writes=_STARE_W,
                             active=lambda p: p.surprisal_source == "logp_behavior")


ERPO_ROUND = Stage("round", erpo_round, needs=("worker.prompt_logprobs",), kernels=(erpo_k.question_typicality, erpo_k.question_weights),
                   params=("qkl_coef",), reads=("logp_ref",), writes=("extras.erpo_weight",))


def stare(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """GRPO advantages reweighted per token by STARE's gate (`objectives.stare`), over the
    whole round batch (the critical sets are batch quantiles per advantage sign)."""
    p, ex = ctx.p, batch.extras
    if "stare_entropy" not in ex:
        raise PolicylabError("stare needs the round's current entropy (extras['stare_entropy'], the STARE round "
                             "stage)")
    r = scalar_rewards(batch, "stare")
    a = A.grpo(r, batch.group, std=p.std, eps=p.eps)
    src = batch.logp_old if p.surprisal_source == "logp_old" else batch.logp_behavior
    out, info = stare_k.stare_reweight(a, src, batch.loss_mask, entropy=float(ex["stare_entropy"]),
                                       target=p.stare_target_entropy, quantile=p.stare_quantile,
                                       selection=p.stare_selection, gate=p.stare_gate, amplify=p.stare_amplify,
                                       attenuate=p.stare_attenuate, gain=p.stare_gain,
                                       direction=p.stare_direction)
    return Advantages(out, info={**A.group_stats(r, batch.group), **info})


def erpo(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """GRPO advantages scaled by the question weight ω of their prompt."""
    if "erpo_weight" not in batch.extras:
        raise PolicylabError("erpo needs extras['erpo_weight'] (written by the ERPO round stage)")
    r = scalar_rewards(batch, "erpo")
    a = A.grpo(r, batch.group, std=ctx.p.std, eps=ctx.p.eps)
    return Advantages(a * batch.extras["erpo_weight"].to(a.dtype), info=A.group_stats(r, batch.group))


STARE = Stage("advantage", stare, kernels=(A.grpo, stare_k.critical_tokens, stare_k.stare_reweight),
              params=("std", "eps", "surprisal_source", "stare_target_entropy", "stare_quantile", "stare_selection",
                      "stare_gate", "stare_amplify", "stare_attenuate", "stare_gain", "stare_direction"),
              reads=("rewards", "group", "extras.stare_entropy"))


ERPO = Stage("advantage", erpo, kernels=(A.grpo,), params=("std", "eps"),
             reads=("rewards", "group", "extras.erpo_weight"))


def reco(inp: LossInputs, p) -> Weighting:
    """ReCo's detached weight w_i·g(v_t) on the host loss: v compares the live learner
    (sg(logp)) with the host's ratio denominator π_old (`inp.logp_old`)."""
    w, m = reco_k.reco_weights(inp.logp, inp.logp_old, inp.mask, group_size=int(p.reco_group_size),
                               eps_v=p.reco_eps_v, g_min=p.reco_g_min, g_max=p.reco_g_max)
    return Weighting(weight=w, metrics=m)


RECO = Stage("correction", reco, kernels=(reco_k.reco_weights,),
             params=("reco_group_size", "reco_eps_v", "reco_g_min", "reco_g_max"), reads=("logp",))


def _level(v) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be in [0, 1]"


def _at_least_one(v) -> str | None:
    return None if v >= 1.0 else "must be >= 1"


def _no_kl(why: str):
    def check(run, p) -> None:
        if p.kl_coef > 0:
            raise PolicylabError(f"{why}: set method_params.kl_coef=0")
    return check


register(policy_gradient_method(
    "stare",
    Card(
        title="STARE: Surprisal-Guided Token-Level Advantage Reweighting for Policy Entropy Stability",
        arxiv="2606.19236", family="objective (advantage reweighting)",
        samples=_ROLES["samples"] + "; surprisal from one declared source (surprisal_source)",
        learns=_ROLES["learns"], reference="none",
        summary="advantages of the highest-surprisal tokens of each advantage sign amplified (positive side) or "
                "damped (negative side, two-sided variant) while the current entropy is below a target",
        not_established="surprise is not a correctness label; higher entropy is not a goal in itself; entropy "
                        "stability over thousands of steps; the target 0.3 nats was set for 7B math models, not a "
                        "135M model",
        unconfirmed=("the paper's equations themselves (the forms come from the abstract and the authors' released "
                     "recipe)", "the alternative gates 'sign' and 'proportional', the 'batch' selection and the "
                     "'first_order' direction sign(A)·sign(σ − H) (library options after the four-quadrant "
                     "analysis, not the recipe)"),
        confirmed="abstract (arXiv 2606.19236): entropy-critical tokens by batch-internal surprisal quantiles, "
                  "their effective advantages reweighted, a closed-loop target-entropy gate. The authors' released "
                  "recipe (README and default run script): tokens split by advantage sign, top 10% surprisal of "
                  "each side critical, ω = W = 1.1 on the positive side (default one-sided variant O1; the "
                  "two-sided C2 adds ω = M = 0.9 on the negative side), gate 1[batch mean entropy < H_tgt = 0.3], "
                  "ω multiplying A inside the clipped surrogate (clip 0.2 / 0.28, token mean): these are the "
                  "defaults here; the recipe's dynamic-sampling filter (shared with its GRPO baseline) is not "
                  "part of the method and is not switched on",
    ),
    round_=(STARE_ROUND_OLD, STARE_ROUND_BEHAVIOR),
    advantage=STARE, objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.28) + group_std() + (
        Param("surprisal_source", str, "logp_old", "which recorded log-probs give the surprisal σ = −lp",
              choices=("logp_old", "logp_behavior")),
        Param("stare_target_entropy", float, 0.3, "target mean token entropy H* (nats; the authors' recipe)",
              check=non_negative),
        Param("stare_quantile", float, 0.9, "q: tokens with σ >= the q-quantile are critical (0.9: the top 10% "
              "of the recipe)", check=_level),
        Param("stare_selection", str, "per_sign", "quantiles per advantage sign (the recipe) or one over the batch",
              choices=("per_sign", "batch")),
        Param("stare_amplify", float, 1.1, "W: weight of the positive side's critical tokens", check=_at_least_one),
        Param("stare_attenuate", float, 1.0, "M: weight of the negative side's critical tokens (1: the one-sided "
              "variant O1; 0.9: the two-sided C2)", check=_level),
        Param("stare_direction", str, "advantage", "which critical tokens get W and which M: by the sign of A "
              "(the recipe) or by sign(A)·sign(σ − H)", choices=("advantage", "first_order")),
        Param("stare_gate", str, "below", "g = 1[H < H*] (the recipe), sign(H* − H), or clip(gain·(H* − H), −1, 1)",
              choices=("below", "sign", "proportional")),
        Param("stare_gain", float, 1.0, "gain of the proportional gate", check=positive)),
    min_group_size=2,
))


register(policy_gradient_method(
    "reco",
    Card(
        title="ReCo (redundancy-corrected weighting; title unconfirmed)", arxiv="",
        family="objective (reweighting)", **_ROLES, reference="none",
        summary="likely (redundant) responses down-weighted by their expected count among G draws; each token "
                "weighted by the ratio of the current to the old token-vs-rest Bernoulli variance",
        not_established="candidate-level tests do not show pass@k gains; the variance ratio is 1 on a single "
                        "on-policy update (it needs a second epoch/minibatch or staleness)",
        unconfirmed=("title/arXiv id", "every form: n̂ = G·π_old(y), w = 1/max(1, n̂), v = p(1−p)/max(p_old(1−p_old), "
                     "ε_v), g = clip(v, g_min, g_max)", "reco_eps_v, reco_g_min, reco_g_max (library decisions)"),
        confirmed="the specification's hand-worked numbers (p_old 0.5, p 0.9 → v 0.36; probabilities 0.5 and 0.01 "
                  "with G = 8 → weights 0.25 and 1); the paper itself was not found",
    ),
    advantage=adv.GRPO,
    objective=losses.PPO_CLIP, corrections=(RECO,), aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("reco_group_size", int, None, "G of the expected count (None: rollout.group_size)", optional=True,
              check=positive, resolve=_group_size),
        Param("reco_eps_v", float, 1e-3, "floor ε_v of the old Bernoulli variance", check=positive),
        Param("reco_g_min", float, 0.1, "lower bound of g(v)", check=unit_interval),
        Param("reco_g_max", float, 4.0, "upper bound of g(v)", check=lambda v: None if v >= 1 else "must be >= 1")),
    exercise={"train": {"minibatches": 2}}, min_group_size=2,
))


register(policy_gradient_method(
    "erpo",
    Card(
        title="Beyond the Stability-Exploration Dilemma: Environmental Regularization for LLM Policy Optimization",
        arxiv="", family="objective (input-side regularization)", **_ROLES,
        reference="frozen π_ref scores each question's likelihood; no KL on answer tokens",
        summary="each prompt's advantages scaled by a question weight from the frozen reference's length-normalized "
                "likelihood of the question, tilted under a Query-KL penalty (mean weight 1)",
        not_established="token-level typicality under a small reference is not natural-question prevalence; that "
                        "the reweighting stabilizes training",
        unconfirmed=("arXiv id", "the weight form ω = B·softmax(τ/λ_Q) (the closed form of a Query-KL-penalized "
                     "reweighting; library decision)", "qkl_coef λ_Q (1.0: library decision)",
                     "sign: more typical questions weigh more"),
        confirmed="from the paper's abstract (ICLR 2026 submission, OpenReview eUVOUBYKyr; no arXiv id found): "
                  "regularization moved to the input (query) side rather than the responses, a Query-KL between the "
                  "evolving query distribution and a fixed reference, a query-weighted advantage by estimated query "
                  "prevalence; ω depends on π_ref and the prompt only, is positive and has mean 1 (tested)",
    ),
    round_=(ERPO_ROUND,), advantage=ERPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("qkl_coef", float, 1.0, "λ_Q: the Query-KL penalty on the weights (large: weights near 1)",
              check=positive),),
    kl_placements=("loss",), checks=(_no_kl("erpo regularizes the question side; a KL on answer tokens is another "
                                            "method"),), min_group_size=2,
))
