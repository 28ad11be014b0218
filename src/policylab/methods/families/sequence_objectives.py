"""Registered sequence, token and turn objectives: conspo, zcpo, stare, reco, erpo,
tlm_dre and rlid. Each is a composition of existing stages (the PPO-clip host, GRPO
advantages) with the stages of `methods.stages.more`; none adds a branch to the trainer.
What they need beyond the sampled-token log-probs comes from generic backend capabilities
(full-vocabulary entropy / KL per position, prompt log-likelihood, log-probs at given ids)
called from round stages, and from two sources (a multi-turn dialogue, a menu of labels)."""

from __future__ import annotations

import dataclasses

from policylab.errors import PolicylabError
from policylab.methods.params import clip, group_std, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import Card, Param, non_negative, positive, unit_interval
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import filters, losses
from policylab.methods.stages import sequence_objectives as st

_ROLES = dict(
    samples="rollout engine at the current weights (G samples per prompt); π_old = trainer recompute at those weights",
    learns="π_θ (the only differentiable policy)",
)


def _level(v) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be in [0, 1]"


def _at_least_one(v) -> str | None:
    return None if v >= 1.0 else "must be >= 1"


def _no_kl(why: str):
    def check(run, p) -> None:
        if p.kl_coef > 0:
            raise PolicylabError(f"{why}: set method_params.kl_coef=0")
    return check


def _zcpo_skip(run, p) -> None:
    if p.kl_coef > 0 or p.entropy_coef > 0:
        raise PolicylabError(
            "zcpo has no separate KL loss (the drift is inside its coefficients), and a step with no eligible group "
            "must be skipped, which a KL or entropy term in the loss would prevent (it has a gradient on every row): "
            "set method_params.kl_coef=0 and entropy_coef=0")


def _group_size(run) -> int:
    return run.group_size


_VERDICT = Param("verdict_threshold", float, 0.5, "a response is positive iff the verifier's raw outcome is >= this "
                 "(inclusive)")

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
                     "normalization: the mean over the round's positives"),
        confirmed="from the paper's abstract (arXiv 2605.12969v3): length-normalized sequence log-probabilities "
                  "as rollout scores in place of clipped ratio scores, verified positives contrasted with negatives "
                  "of the same group, a group-wise InfoNCE-style objective, a curriculum-scheduled margin that goes "
                  "from coarse ordering early to stronger separation later (a rising margin, as the ramp here); "
                  "the gradient's form (∂ℓ/∂s_n = softmax_n/τ) is tested",
    ),
    filters=(filters.DYNAMIC_SAMPLING,), round_=(st.CONSPO_ROUND,),
    advantage=st.VERDICT, objective=st.CONSPO, aggregation="seq_mean_token_mean",
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
    round_=(st.ZCPO_DRIFT,), advantage=st.ZCPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + (
        Param("drift_coef", float, 1.0, "β: weight of the centred KL drift against the centred reward",
              check=non_negative),
        Param("std", str, "population", "std convention of the group reward spread",
              choices=("unbiased", "population"))),
    kl_placements=("loss",), checks=(_zcpo_skip,), min_group_size=2,
))

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
    round_=(st.STARE_ROUND_OLD, st.STARE_ROUND_BEHAVIOR),
    advantage=st.STARE, objective=losses.PPO_CLIP, aggregation="token_mean",
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
    objective=losses.PPO_CLIP, corrections=(st.RECO,), aggregation="seq_mean_token_mean",
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
    round_=(st.ERPO_ROUND,), advantage=st.ERPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("qkl_coef", float, 1.0, "λ_Q: the Query-KL penalty on the weights (large: weights near 1)",
              check=positive),),
    kl_placements=("loss",), checks=(_no_kl("erpo regularizes the question side; a KL on answer tokens is another "
                                            "method"),), min_group_size=2,
))

register(policy_gradient_method(
    "tlm_dre",
    Card(
        title="Turn-level Multiscale Density Ratio Estimation for LLM Agents", arxiv="",
        family="objective (multi-turn weighting)",
        samples="rollout engine at the current weights, a whole dialogue per sample (the multi-turn source)",
        learns=_ROLES["learns"], reference="frozen π_ref: its turn confidence sets the turn weights, and the token "
                                           "terms act on log(π_θ/π_ref)",
        summary="turn weights decreasing in the reference's mean log-prob of the turn; positive trajectories push "
                "log(π_θ/π_ref) up, negative ones down with a saturating curve",
        not_established="low reference likelihood is not wrongness; no tool environment is provided (a two-turn "
                        "arithmetic dialogue stands in)",
        unconfirmed=("arXiv id", "λ = K·softmax(−c/τ) over a trajectory's turns", "ψ curves (linear / tanh(κu)/κ)",
                     "polarity from the verifier's outcome with an inclusive threshold", "turn_tau, kappa_pos, "
                     "kappa_neg defaults (library decisions)"),
        confirmed="from the paper's abstract (ACL ARR 2026 January submission, OpenReview Z8U7gDyF73; no arXiv id "
                  "found): different weights on the turns of a trajectory, asymmetric token-level training for "
                  "positive and negative samples; the specification's invariants are tested",
    ),
    source=st.MULTI_TURN, advantage=st.VERDICT, objective=st.TLM_DRE, aggregation="token_mean",
    params=(Param("turn_tau", float, 1.0, "τ of the turn weights K·softmax(−c_k/τ)", check=positive),
            Param("kappa_pos", float, 0.0, "κ₊ of ψ for positive trajectories (0: linear)", check=non_negative),
            Param("kappa_neg", float, 1.0, "κ₋ of ψ for negative trajectories (tanh(κu)/κ saturates the push-down)",
                  check=non_negative),
            _VERDICT),
    kl_placements=("loss",), exercise={"task": {"name": "two_turn_arithmetic"}},
))

_rlid = policy_gradient_method(
    "rlid",
    Card(
        title="RLiD: Reinforcement Learning in the Decision Plane for Language Agents and LLMs", arxiv="",
        family="objective (action parameterization)",
        samples="rollout engine at the current weights, restricted to the menu's single-token labels "
                "(one token per decision)",
        learns="π_θ over the menu labels (softmax renormalized over the menu)", reference="none",
        summary="a policy over single-token menu labels: PPO clip on the menu-renormalized ratio, episode-length "
                "weights, a KL(uniform ‖ label marginal) regularizer against label bias",
        not_established="no ALFWorld-level claim; the built-in menu task has one-decision episodes (every weight "
                        "L̄/L_e is 1 there); the regularizer's gradient is an unbiased estimate through the sampled "
                        "labels, not the exact gradient",
        unconfirmed=("arXiv id", "marginal over the round batch (the specification says micro-batch)",
                     "the regularizer's trainer gradient: score-function form with frozen m̄ and a baseline",
                     "marginal_coef (0.1: library decision)", "mixing of several menu groups (decision-weighted)"),
        confirmed="the specification's hand-worked values (rows [0.9,0.1] and [0.1,0.9] → R 0; m̄ [0.8,0.2] → "
                  "0.2231; episode lengths 2 and 1 → weights 0.75 and 1.5) and that the sampled estimator's "
                  "expectation equals ∇R exactly (tested); the paper itself was not found",
    ),
    source=st.MENU, round_=(st.RLID_ROUND,), advantage=adv.GRPO,
    objective=losses.PPO_CLIP, corrections=(st.RLID_EPISODE_WEIGHT,), aggregation="token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("marginal_coef", float, 0.1, "β_R of the label-marginal KL(U ‖ m̄) (0: off)", check=non_negative),),
    exercise={"task": {"name": "menu_arithmetic", "reward": "menu_label"}}, min_group_size=2,
)
register(dataclasses.replace(_rlid, addends=_rlid.addends + (st.RLID_MARGINAL,)))
