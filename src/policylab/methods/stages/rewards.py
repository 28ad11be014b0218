"""Reward stages: scores and shaping, computed from the decoded text.

The raw outcome (the verifier's correctness, `outcome["correct"]`) is kept apart from
the shaped reward (`rewards`); filters read the raw outcome only.
"""

from __future__ import annotations

import math

import torch

from policylab.errors import NonFiniteError, PolicylabError
from policylab.kernels import rewards as rw
from policylab.methods.context import Sampled, StageContext
from policylab.methods.spec import Stage


def verifier_scores(ctx: StageContext, texts: list[str], answers: list[str], who: str) -> torch.Tensor:
    """[B] float32 scores of the task's own verifier (None from it is refused, naming `who`)."""
    vals = ctx.task_reward(texts, answers)
    if any(v is None for v in vals):
        raise PolicylabError(f"{who}: the task verifier returned None: a verifier must score every reply")
    return torch.tensor([float(v) for v in vals], dtype=torch.float32)


def scorer(verifier_fn, shaping=()):
    """The reward protocol a run hands its stages as `ctx.score`: the task verifier (weight
    1) plus the configured shaping functions [(name, fn, weight), ...]. The returned
    function maps (texts, examples) to (total [B], per-function values, the verifier's raw
    value [B]). A function that raises, or returns NaN/inf, stops the step with an error
    naming the function and the sample; so does a verifier that cannot score a response
    (None)."""
    name = getattr(verifier_fn, "__name__", "verifier")

    def score(texts: list[str], examples: list):
        total, per_fn = rw.combine_rewards([(name, verifier_fn, 1.0), *shaping], texts, [e.answer for e in examples],
                                           prompts=[e.prompt for e in examples])
        gold = per_fn[name].float()
        if bool(torch.isnan(gold).any()):
            i = int(torch.isnan(gold).nonzero()[0])
            raise NonFiniteError(f"the verifier `{name}` returned None for sample {i}: a verifier must score every "
                                 "response")
        return total, per_fn, gold

    return score


def verifier(s: Sampled, ctx: StageContext):
    """rewards = task verifier (weight 1) + configured shaping functions; the verifier's
    raw value is the outcome `correct` that filters and accuracy read."""
    total, per_fn, gold = ctx.score(s.texts, s.examples)
    info = {f"reward/{k}": float(torch.nanmean(v)) for k, v in per_fn.items()} if len(per_fn) > 1 else {}
    return {"rewards": total.float(), "outcome": {"correct": gold.clone()}, "extras": {"gold_correct": gold}}, info


def majority_vote(s: Sampled, ctx: StageContext):
    """TTRL: reward 1 when a sample's extracted answer equals its group's majority answer
    (`policylab.kernels.rewards.ttrl_rewards`, no gold argument). Groups without a majority (a
    tie, nothing parseable) get NaN rewards and `outcome["eligible"] = False`: the
    `ELIGIBLE` filter must remove them (anything that reads them first fails on the NaN).
    The gold answers are read only for `gold_correct` and the pseudo-label agreement, both
    evaluator-side diagnostics that never reach rewards, filters or advantages."""
    rewards, eligible, tinfo = rw.ttrl_rewards(s.texts, s.batch.group)
    eligible = torch.as_tensor(eligible, dtype=torch.bool)
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    gold = torch.as_tensor(ctx.task_reward(s.texts, [e.answer for e in s.examples]), dtype=torch.float32)
    info = {f"ttrl/{k}": v for k, v in tinfo.items() if isinstance(v, (int, float))}
    if bool(eligible.any()):
        info["ttrl/pseudo_label_agreement"] = float(rw.pseudo_label_agreement(rewards, gold, eligible))
    info["ttrl/ineligible_fraction"] = float((~eligible).float().mean())
    return {"rewards": rewards, "outcome": {"correct": rewards.clone(), "eligible": eligible},
            "extras": {"gold_correct": gold}}, info


def overlong_cache(p) -> int:
    """L_cache = max(1, floor(overlong_cache_frac · L_max))."""
    return max(1, math.floor(p.overlong_cache_frac * p.overlong_max + 1e-9))


def overlong(s: Sampled, ctx: StageContext):
    """DAPO soft overlong punishment added to the reward (`rewards.overlong_penalty`), with
    L_max = `overlong_max` and L_cache = `overlong_cache_frac` · L_max."""
    p = ctx.p
    s.batch.require("overlong shaping", "rewards")
    pen = rw.overlong_penalty(s.batch.response_lengths, max_len=int(p.overlong_max), cache_len=overlong_cache(p))
    pen = pen.to(s.batch.rewards.dtype)
    return {"rewards": s.batch.rewards + pen}, {"reward/overlong_penalty_mean": float(pen.mean())}


def greedy_baseline(s: Sampled, ctx: StageContext):
    """ReMax: decode every prompt greedily with the current weights and score the reply
    with the same reward protocol as the samples (`ctx.score`: the verifier and the
    configured shaping functions); the greedy tokens never enter the loss."""
    g_ids = ctx.rollout.greedy(s.prompt_ids, max_new_tokens=ctx.run.max_new_tokens)
    texts = [ctx.decode(ids) for ids in g_ids]
    total, _, _ = ctx.score(texts, s.group_examples)
    return {"greedy_rewards": total.float().repeat_interleave(ctx.run.group_size)}, {}


def line_steps(s: Sampled, ctx: StageContext):
    """Rule-based process rewards for `grpo_process`: a response's lines are its steps,
    each scored by the task verifier (`rewards.process.line_steps`)."""
    from policylab.kernels.rewards.process import line_steps as steps

    if not hasattr(ctx.rollout, "tokenizer"):
        raise PolicylabError("line_steps needs the rollout backend's tokenizer to split responses into lines")
    out = steps(ctx.rollout.tokenizer, s.batch.response_tokens, s.batch.loss_mask,
                [e.answer for e in s.examples], ctx.task_reward)
    return {"extras": out}, {}


VERIFIER = Stage("reward", verifier,
                 writes=("rewards", "outcome.correct", "extras.gold_correct"))
MAJORITY_VOTE = Stage("reward", majority_vote, kernels=(rw.ttrl_rewards,),
                      writes=("rewards", "outcome.correct", "outcome.eligible", "extras.gold_correct"))
OVERLONG = Stage("reward", overlong, kernels=(rw.overlong_penalty,), params=("overlong_max", "overlong_cache_frac"),
                 reads=("rewards",), writes=("rewards",))
GREEDY_BASELINE = Stage("reward", greedy_baseline, needs=("rollout.greedy",), writes=("greedy_rewards",))
LINE_STEPS = Stage("reward", line_steps, writes=("extras.step_rewards", "extras.step_ends", "extras.step_mask"))


def interval_judge(s: Sampled, ctx: StageContext):
    """A judge's [low, high] reward interval per reply (`rewards.graded`), for
    estimators that read intervals (Range-GRPO)."""
    from policylab.kernels.rewards.graded import INTERVAL_JUDGES

    iv = INTERVAL_JUDGES[ctx.p.interval_judge](s.texts, [e.answer for e in s.examples])
    info = {"reward/interval_low_mean": float(iv[:, 0].mean()),
            "reward/interval_width_mean": float((iv[:, 1] - iv[:, 0]).mean())}
    return {"reward_intervals": iv}, info


def reward_dimensions(s: Sampled, ctx: StageContext):
    """D rule-based reward dimensions per reply (`rewards.graded`), [B, D], for
    estimators that normalize each dimension on its own (GPRL)."""
    from policylab.kernels.rewards.graded import parse_dimensions, reward_vectors

    names = parse_dimensions(ctx.p.dimensions)
    v = reward_vectors(s.texts, [e.answer for e in s.examples], names)
    return {"reward_vectors": v}, {f"reward/{n}": float(v[:, d].mean()) for d, n in enumerate(names)}


INTERVAL_JUDGE = Stage("reward", interval_judge, kernels=(rw.numeric_interval,), params=("interval_judge",),
                       writes=("reward_intervals",))
REWARD_DIMENSIONS = Stage("reward", reward_dimensions, kernels=(rw.reward_vectors,), params=("dimensions",),
                          writes=("reward_vectors",))
