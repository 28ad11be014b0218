"""Registered methods whose reward reads more than a verifier's 0/1: a verbalized
confidence (RLCR), the class frequencies of a group (MaD-RL), the model's own answer
posterior (RLCPR), measured runtimes of sandboxed code (code_opt) and a frozen critic
(RFPO). Each adds reward stages (`stages/rewards_more.py`) over kernels in
`policylab.kernels.rewards`; none changes the trainer.

What a method needs made before it can run at all (RFPO: a critic trained on the base
model's rollouts) is made by `policylab.experiments.exercise.exercise_settings` for the
generic tests and the real-model benchmark.
"""

from __future__ import annotations

from pathlib import Path

from policylab.errors import PolicylabError
from policylab.kernels.rewards.distribution import MATCH_FORMS
from policylab.kernels.rewards.runtime import SCORE_FORMS
from policylab.methods.params import clip, group_std, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import Card, Param, StateSpec, non_negative, positive
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses, rewards
from policylab.methods.stages import rich_rewards as rm

# the system prompt of rlcr's exercise run: the answer format shown once, with a made-up example
RLCR_SYSTEM_PROMPT = ("You answer in exactly two lines. Line 1: the number. Line 2: 'Confidence: ' and the "
                      "probability from 0 to 1 that the number is right. Example:\n12\nConfidence: 0.7")

_ROLES = dict(
    samples="rollout engine at the current weights (G samples per prompt); π_old = trainer recompute at those weights",
    learns="π_θ (the only differentiable policy)",
)


register(policy_gradient_method(
    "rlcr",
    Card(
        title="Beyond Binary Rewards: Training LMs to Reason About Their Uncertainty", arxiv="2507.16806",
        family="reward (calibration)", **_ROLES, reference="none",
        summary="reward = correctness − Brier of the verbalized confidence, c − (q − c)²; strict confidence "
                "parse, an unparseable or out-of-range confidence takes an explicit penalty",
        not_established="that a 135M model learns calibrated confidences; verbalized confidence as the model's "
                        "belief; accuracy and calibration are logged apart (calibration/*), neither implies the other",
        unconfirmed=("the handling of a missing or malformed confidence (a penalty c − invalid_confidence_penalty: "
                     "library decision)", "the answer format (answer, then 'confidence: q'; the paper uses tags)",
                     "GRPO as the host estimator"),
        confirmed="the reward R = 1[y ≡ y*] − (q − 1[y ≡ y*])² of the paper (arXiv 2507.16806) and its "
                  "properness: the expected reward is maximal at q = p (tested on a grid)",
    ),
    rewards_=(rm.RLCR_CONFIDENCE,),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("invalid_confidence_penalty", float, 1.0, "the Brier term of a reply whose confidence is missing, "
              "malformed, ambiguous or outside [0, 1]: R = c − penalty (1.0: the worst parsed confidence; "
              "never a clamp)", check=non_negative),),
    min_group_size=2,
    # the two-line format shown in a system prompt, sampled at T = 0.3: at T = 1 the 135M model never wrote the
    # field (16 of 16 replies without it, with or without the system prompt); at T = 0.3 most replies carry it
    exercise={"task": {"name": "confidence", "reward": "confidence_answer", "system_prompt": RLCR_SYSTEM_PROMPT},
              "rollout": {"max_new_tokens": 24, "temperature": 0.3}},
))

register(policy_gradient_method(
    "mad_rl",
    Card(
        title="MaD-RL: Matching Distributions for Calibrating LLMs with Reinforcement Learning", arxiv="",
        family="reward (calibration of output frequencies)", **_ROLES, reference="none",
        summary="r = correct + λ·log(p̃*(c_i)/f̂_g(c_i)): each reply paid for its class's share of the distance "
                "between the group's detached class frequencies (invalid replies kept) and the target",
        not_established="matching frequencies does not make a reply correct, nor the converse; the task's "
                        "correctness is validity (a named outcome): there is no single right draw",
        unconfirmed=("title, arXiv id", "the match term (log ratio or gap)", "smoothing ε", "λ (match_coef)"),
        confirmed="not checked against the paper (title and id unconfirmed); tested: invalid replies stay in "
                  "f̂'s denominator (dropping them changes f̂), f̂ has no gradient path, a zero target entry "
                  "without smoothing raises, unsampled classes get nothing",
    ),
    rewards_=(rewards.VERIFIER, rm.MAD_MATCH),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("match_coef", float, 1.0, "λ: weight of the match reward next to correctness", check=non_negative),
        Param("target_smoothing", float, 0.01, "ε: p̃* = (1 − ε)p* + ε/K (0 refuses a target with a zero entry)",
              check=lambda v: None if 0 <= v < 1 else "must be in [0, 1)"),
        Param("match_form", str, "log_ratio", "log_ratio: log(p̃*(c_i)/f̂(c_i)) (a group sums to −G·KL(f̂‖p̃*)); "
              "gap: p̃*(c_i) − f̂(c_i)", choices=MATCH_FORMS)),
    min_group_size=2,
    # single_mention: the 135M model answers in sentences ("I'll draw a red marble."); with the exact mapper
    # every reply of a real run was invalid, all rewards equal, nothing to learn from
    exercise={"task": {"name": "distribution", "reward": "valid_outcome", "class_mapper": "single_mention"}},
))

register(policy_gradient_method(
    "rlcpr",
    Card(
        title="RLCPR: Rethinking Probability-Based Reinforcement Learning From Posterior Concentration", arxiv="",
        family="reward (shaping)", **_ROLES, reference="none",
        summary="relative length penalty only when every reply of the group is longer than L_thr and the model's "
                "own answer posteriors (a scoring forward: the probability of the reference answer after the "
                "reply) span less than τ",
        not_established="RL improvement from the shaping; the entropy-CDF stratified prompt mix is a kernel only "
                        "(the source samples prompts in stream order)",
        unconfirmed=("title, arXiv id", "the relative penalty form", "L_thr, τ_post, λ, eps defaults (set for "
                     "short-answer tasks here)", "how the posterior is read (the answer after posterior_prefix; "
                     "joint probability)"),
        confirmed="not checked against the paper (title and id unconfirmed); tested: both gates strict (minimum "
                  "length exactly L_thr, posterior range exactly τ_post: no penalty), one short reply disables the "
                  "group's penalty, the shortest reply is never penalized; the posteriors equal an unpadded "
                  "forward of the policy",
    ),
    rewards_=(rewards.VERIFIER, rm.RLCPR_POSTERIOR),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("posterior_prefix", str, "\nFinal answer:", "text appended after each reply (its EOS removed) before "
              "the reference answer whose probability is scored"),
        Param("posterior_form", str, "joint", "joint: p = Π p(answer tokens); token_geomean: per-token geometric "
              "mean", choices=("joint", "token_geomean")),
        Param("length_threshold", float, 4.0, "L_thr: the gate needs every reply longer than this (strict), in "
              "tokens", check=non_negative),
        Param("posterior_range", float, 0.1, "τ_post: the gate needs max p − min p below this (strict)",
              check=non_negative),
        Param("length_coef", float, 0.2, "λ: the largest penalty (the longest reply of a gated group)",
              check=non_negative),
        Param("length_eps", float, 1e-6, "eps in the relative length's denominator", check=non_negative)),
    min_group_size=2,
))


def _repeats(run, p) -> None:
    if p.timing_repeats < 2:
        raise PolicylabError(f"code_opt: timing_repeats must be >= 2 (one timing is not a distribution), "
                             f"got {p.timing_repeats}")


register(policy_gradient_method(
    "code_opt",
    Card(
        title="Reinforcement Learning for Code Optimization", arxiv="",
        family="reward (execution)", **_ROLES, reference="none",
        summary="sandboxed tests gate the reward; a correct program earns 1 + w·speed, speed from the median of "
                "repeated timings against the reference's measured runtimes, 0 inside the calibrated noise band",
        not_established="measured speed-ups of model-written code (the 135M model rarely writes a correct "
                        "function); timings come from inside the sandboxed process (see policylab.sandbox.runner)",
        unconfirmed=("title, arXiv id", "score form (percentile or log speedup)", "α, min_rel_band, speedup_cap",
                     "the +1 of a correct program and incorrect_reward", "stale/sparse-reward handling (compose "
                     "with a correction)"),
        confirmed="not checked against the paper (title and id unconfirmed); tested: incorrect code never gets "
                  "speed reward, a single timing raises, an improvement inside the noise band scores 0, every "
                  "score carries its provenance (measured here)",
    ),
    rewards_=(rm.CODE_RUNTIME,),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("timing_repeats", int, 7, "timed calls of candidate and reference each (n_min: fewer raises)",
              check=positive),
        Param("timing_warmup", int, 1, "untimed calls of each before timing", check=non_negative),
        Param("speed_form", str, "percentile", "percentile: share of reference runs slower than the candidate "
              "beyond the band; log_speedup: log(median ref / median candidate) / log(speedup_cap)",
              choices=SCORE_FORMS),
        Param("band_alpha", float, 0.1, "α: the noise band spans the reference's α and 1 − α quantiles",
              check=lambda v: None if 0 < v < 0.5 else "must be in (0, 0.5)"),
        Param("min_rel_band", float, 0.05, "the band is at least median(ref)·(1 ± this)",
              check=lambda v: None if 0 <= v < 1 else "must be in [0, 1)"),
        Param("speedup_cap", float, 4.0, "log_speedup: the speed-up that scores 1", check=lambda v: None if v > 1
              else "must be > 1"),
        Param("speed_weight", float, 0.5, "w: weight of the speed score next to the correctness reward 1",
              check=non_negative),
        Param("incorrect_reward", float, 0.0, "reward of a program that fails a test (no speed reward ever)")),
    checks=(_repeats,), min_group_size=2,
    exercise={"task": {"name": "code", "reward": "code_tests"}, "rollout": {"max_new_tokens": 96}},
))


def _frozen_critic(p, seed):
    from policylab.models.frozen_critic import FrozenCritic

    if not p.critic_path:
        raise PolicylabError("rfpo needs method_params.critic_path: a critic trained on the base model's own "
                             "rollouts (`policylab train-critic CONFIG --out DIR`)")
    return FrozenCritic(p.critic_path)


def _needs_critic(run, p) -> None:
    # a missing path is refused when the run's state is built (the Trainer, before any
    # rollout): resolving the method alone (e.g. for its card or figure) needs no critic
    if p.critic_path and not (Path(p.critic_path) / "critic.json").is_file():
        raise PolicylabError(f"rfpo: method_params.critic_path {p.critic_path!r} holds no critic.json; train it "
                             "with `policylab train-critic CONFIG --out DIR`")


register(policy_gradient_method(
    "rfpo",
    Card(
        title="Unlocking the Critic: Reward-Free Policy Optimization for LLM Post-Training", arxiv="",
        family="reward (critic-derived) + advantage", **_ROLES, reference="none",
        critic="frozen: a value head trained beforehand on the base model's labelled rollouts, on the frozen base "
               "model's hidden states; in no optimizer group, rebuilt from method_params.critic_path",
        summary="no verifier during RL: reward 1[V_ψ(y) − b(len y) ≥ τ] for finished replies (a flagged forecast for "
                "truncated ones), GAE with the frozen V_ψ(s_t) as baseline",
        not_established="critic scores are not capability evidence; freezing prevents drift, not bias; the toy "
                        "critic of a 135M model predicts little",
        unconfirmed=("title, arXiv id", "length-bias model (a line fitted on calibration rollouts)", "τ",
                     "forecast rule for truncated replies", "GAE γ, λ"),
        confirmed="not checked against the paper (title and id unconfirmed); tested: the critic has no gradient, "
                  "is in no optimizer group and is unchanged by a step, the τ tie goes to 1, a truncated reply is "
                  "a forecast never labelled verified, debiasing removes a synthetic linear length trend, the "
                  "reward never reads the gold answer",
    ),
    rewards_=(rm.RFPO_CRITIC,),
    advantage=rm.RFPO_GAE, objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.2) + (
        Param("critic_path", str, None, "the critic checkpoint directory written by `policylab train-critic`",
              optional=True),
        Param("tau", float, 0.5, "τ: a finished reply is rewarded 1 iff its debiased value is >= τ (ties to 1)"),
        Param("gamma", float, 1.0, "GAE discount γ", check=lambda v: None if 0 <= v <= 1 else "must be in [0, 1]"),
        Param("lam", float, 0.95, "GAE λ", check=lambda v: None if 0 <= v <= 1 else "must be in [0, 1]")),
    state=(StateSpec("frozen_critic", _frozen_critic, params=("critic_path",),
                     doc="the frozen critic, rebuilt from critic_path (its state holds the path and fingerprints)"),),
    checks=(_needs_critic,),
))
