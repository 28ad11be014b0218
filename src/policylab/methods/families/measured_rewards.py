"""Rewards from measurements other than a verifier's 0/1: code_opt (a correctness-gated
reward from calibrated, repeated runtimes of sandboxed code) and RFPO (rewards forecast by
a frozen, calibrated critic, with GAE over them). What RFPO needs made before it can run,
its critic trained on the base model's own labelled rollouts, is made by `policylab
train-critic` (and by `policylab.experiments.exercise` for the tests and benchmarks).
"""

from __future__ import annotations

from pathlib import Path

import torch

from policylab.errors import PolicylabError
from policylab.kernels import advantages as A
from policylab.kernels.rewards import critic_reward as crit
from policylab.kernels.rewards import runtime as rt
from policylab.kernels.rewards.runtime import SCORE_FORMS
from policylab.methods.context import Sampled, StageContext
from policylab.methods.params import ON_POLICY_ROLES as _ROLES
from policylab.methods.params import clip, group_std, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import (
    Advantages,
    Card,
    Param,
    Stage,
    StateSpec,
    non_negative,
    positive,
)
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses
from policylab.methods.stages.advantages import token_rewards


# ----------------------------------------------------------------------------- code_opt
def code_runtime(s: Sampled, ctx: StageContext):
    """Run every reply in the sandbox: the tests, then (when they pass) timed calls on
    fresh performance inputs, each output checked against the reference's and each call
    timed by the parent as the candidate process's CPU time, interleaved with a sandboxed
    process of the reference on the same inputs (`tasks.code.CodeVerifier`); reward = the
    correctness-gated speed score (`rewards.runtime`), provenance "measured". A wrong,
    missing or late timed output makes the candidate incorrect."""
    p = ctx.p
    verifier = ctx.task_reward
    if not hasattr(verifier, "run_timed"):
        raise PolicylabError("code_opt needs the code task's sandboxed verifier: task.name=code, task.reward=code_tests")
    outs = verifier.run_timed(s.texts, [e.answer for e in s.examples], repeats=p.timing_repeats,
                              warmup=p.timing_warmup)
    rewards, scores = rt.code_opt_rewards(
        [o.correct for o in outs], [o.candidate_ns for o in outs], [o.reference_ns for o in outs],
        timed_out=[o.timed_out for o in outs], form=p.speed_form, alpha=p.band_alpha, min_rel_band=p.min_rel_band,
        n_min=p.timing_repeats, speedup_cap=p.speedup_cap, speed_weight=p.speed_weight,
        incorrect_reward=p.incorrect_reward, provenance="measured")
    correct = torch.tensor([float(o.correct) for o in outs])
    speed = torch.tensor([sc.speed if sc is not None else 0.0 for sc in scores], dtype=torch.float32)
    scored = torch.tensor([sc is not None for sc in scores])
    info = {"code/correct_frac": float(correct.mean()), "code/timed_frac": float(scored.float().mean()),
            "code/speed_mean": float(speed[scored].mean()) if bool(scored.any()) else 0.0,
            "code/timing_over_limit_frac": sum(o.timed_out for o in outs) / len(outs)}
    for st in ("ok", "timeout", "cpu_limit", "memory", "violation", "forked", "output_limit", "error"):
        info[f"code/status_{st}_frac"] = sum(o.status == st for o in outs) / len(outs)
    return {"rewards": rewards, "outcome": {"correct": correct.clone()},
            "extras": {"gold_correct": correct, "speed_score": speed, "speed_scored": scored}}, info


CODE_RUNTIME = Stage("reward", code_runtime, kernels=(rt.code_opt_rewards, rt.speed_score, rt.noise_band),
                     params=("timing_repeats", "timing_warmup", "speed_form", "band_alpha", "min_rel_band",
                             "speedup_cap", "speed_weight", "incorrect_reward"),
                     writes=("rewards", "outcome.correct", "extras.gold_correct", "extras.speed_score",
                             "extras.speed_scored"))


# ----------------------------------------------------------------------------- rfpo
def rfpo_critic(s: Sampled, ctx: StageContext):
    """The frozen critic's values of every prefix (the baseline) and of the whole reply
    (the reward after length debiasing and thresholding; truncated replies get the
    debiased value as a flagged forecast). No verifier is called during RL: the critic's
    forecast is the reward and the verdict (`outcome.correct` = finished and v̂ ≥ τ), so
    a training step needs no gold answer and no task verifier. Accuracy against the gold
    answers is measured only by the evaluation, on held-out data."""
    b = s.batch
    critic = ctx.state["frozen_critic"]
    values, final = critic.values(b.tokens, b.attention_mask, b.loss_mask, b.prompt_width)
    if "truncated" not in b.extras:
        raise PolicylabError("rfpo needs extras['truncated'] from the rollout engine (which replies ended)")
    finished = ~b.extras["truncated"].bool()
    r, verdict, forecast = crit.rfpo_rewards(final, b.response_lengths, finished, bias=critic.length_bias,
                                             tau=ctx.p.tau)
    info = {"rfpo/critic_final_mean": float(final.mean()), "rfpo/verdict_frac": float(verdict.float().mean()),
            "rfpo/forecast_frac": float(forecast.float().mean())}
    return {"rewards": r.float(), "outcome": {"correct": verdict.float()},
            "extras": {"critic_values": values.to(b.logp_behavior.dtype), "forecast": forecast}}, info


RFPO_CRITIC = Stage("reward", rfpo_critic, kernels=(crit.rfpo_rewards, crit.debias), params=("tau",),
                    writes=("rewards", "outcome.correct", "extras.critic_values", "extras.forecast"))


def rfpo_gae(batch, ctx: StageContext) -> Advantages:
    """GAE over the token rewards (the critic-derived reward at the last counted token,
    minus a KL penalty when KL is in the reward) with the frozen critic's V_ψ(s_t) as the
    baseline; no returns (nothing trains the critic)."""
    if "critic_values" not in batch.extras:
        raise PolicylabError("rfpo advantages need extras['critic_values'] from the rfpo_critic reward stage")
    adv, _ = A.gae(token_rewards(batch, "rfpo"), batch.extras["critic_values"].to(batch.rewards.dtype),
                   batch.loss_mask, gamma=ctx.p.gamma, lam=ctx.p.lam)
    return Advantages(adv.detach())


RFPO_GAE = Stage("advantage", rfpo_gae, kernels=(A.gae,), params=("gamma", "lam"),
                 reads=("rewards", "extras.critic_values"))


# ----------------------------------------------------------------------------- registration

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
                        "function); timings are CPU time of the whole candidate process around each call, so they "
                        "include decoding the arguments and encoding the result (the same in the reference's process); "
                        "the amortization of untimed CPU over the timed calls and the fresh input per call are library "
                        "decisions, not the paper's",
        unconfirmed=("title, arXiv id", "score form (percentile or log speedup)", "α, min_rel_band, speedup_cap",
                     "the +1 of a correct program and incorrect_reward", "stale/sparse-reward handling (compose "
                     "with a correction)"),
        confirmed="not checked against the paper (title and id unconfirmed); tested: incorrect code never gets "
                  "speed reward, a single timing raises, an improvement inside the noise band scores 0, every "
                  "score carries its provenance (measured here). Changed (issue 24): every timed output is checked "
                  "against the reference's (a program right only on the small tests, or one that runs out of the "
                  "limits on the timed inputs, now earns incorrect_reward instead of 1 + w or 1 − w); the child "
                  "never holds the reference, an expected value or a timing, cannot read policylab's files, and "
                  "is timed by the parent from its CPU clock; hostile replies that earned the maximum before earn "
                  "nothing now (tests/adversarial/test_code_execution.py)",
    ),
    rewards_=(CODE_RUNTIME,),
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
                        "critic of a 135M model predicts little; training steps log no accuracy against gold "
                        "answers (no verifier runs during RL: the evaluation measures it on held-out data)",
        unconfirmed=("title, arXiv id", "length-bias model (a line fitted on calibration rollouts)", "τ",
                     "forecast rule for truncated replies", "GAE γ, λ"),
        confirmed="not checked against the paper (title and id unconfirmed); tested: the critic has no gradient, "
                  "is in no optimizer group and is unchanged by a step, the τ tie goes to 1, a truncated reply is "
                  "a forecast never labelled verified, debiasing removes a synthetic linear length trend, the "
                  "reward never reads the gold answer, and the reward stage never calls the task verifier (a verifier "
                  "that raises is never reached; until issue 24 it was called on every reply for a logged "
                  "agreement diagnostic, which stopped the step when it returned None)",
    ),
    rewards_=(RFPO_CRITIC,),
    advantage=RFPO_GAE, objective=losses.PPO_CLIP, aggregation="token_mean",
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
