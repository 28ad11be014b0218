"""Collecting one training batch: prompts -> engine samples -> rewards -> filters.

The engine records the behavior log-prob of every sampled token. Rewards are computed
from the decoded text; the raw outcome (correctness) is kept apart from the shaped
reward, and dynamic sampling decides on the raw outcome only. Filtered groups are
replaced by sampling more prompts, never by padding with zero-advantage data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .batch import RolloutBatch, SamplingSettings, concat_batches
from .errors import NonFiniteError
from .methods.registry import Recipe


@dataclass
class Scored:
    """What the reward stage adds to a batch; `gold_correct` is for metrics only."""

    rewards: torch.Tensor  # [B] shaped reward used for advantages
    outcome: dict[str, torch.Tensor]  # raw metrics [B] (never shaped)
    gold_correct: torch.Tensor | None  # [B] correctness against gold (evaluator-side for TTRL)
    info: dict = field(default_factory=dict)


def score(recipe: Recipe, texts: list[str], answers: list[str], group: torch.Tensor, lengths: torch.Tensor,
          reward_fn, *, extra: tuple = (), prompts: list[str] | None = None,
          overlong: tuple[int, int] | None = None) -> Scored:
    """Rewards for decoded responses.

    `reward_fn(texts, answers, **context) -> list[float]` is the task's verifier: its raw
    value is the outcome (`correct`) that filters and accuracy read. `extra` holds
    (name, fn, weight) shaping terms; the shaped reward is `combine_rewards` over the
    verifier (weight 1) and the extras (None = not applicable to that sample). With
    `reward_source == "majority_vote"` (TTRL) the gold answers are read only to report
    `gold_correct`, never to build the reward. A function that raises, or returns NaN/inf,
    stops the step with an error naming the function and the sample."""
    from .rewards import combine_rewards

    name = getattr(reward_fn, "__name__", "verifier")
    total, per_fn = combine_rewards([(name, reward_fn, 1.0), *extra], texts, answers, prompts=prompts)
    gold = per_fn[name].float()
    if bool(torch.isnan(gold).any()):
        i = int(torch.isnan(gold).nonzero()[0])
        raise NonFiniteError(f"the verifier `{name}` returned None for sample {i}: a verifier must score every response")
    info: dict = {f"reward/{k}": float(torch.nanmean(v)) for k, v in per_fn.items()} if extra else {}
    if recipe.reward_source == "majority_vote":
        from .rewards import pseudo_label_agreement, ttrl_rewards

        rewards, eligible, tinfo = ttrl_rewards(texts, group)
        eligible = torch.as_tensor(eligible, dtype=torch.bool)
        rewards = torch.as_tensor(rewards, dtype=torch.float32)
        info.update({f"ttrl/{k}": v for k, v in tinfo.items() if isinstance(v, (int, float))})
        if bool(eligible.any()):  # evaluator-side diagnostic: gold never reaches the reward
            info["ttrl/pseudo_label_agreement"] = float(pseudo_label_agreement(rewards, gold, eligible))
        info["ttrl/ineligible_fraction"] = float((~eligible).float().mean())
        # ineligible groups (tied vote, nothing parseable) have NaN rewards by design: they are
        # removed by `keep_groups` before anything reads them; carry a finite placeholder only
        # so the batch validates, and the `eligible` outcome that removes them
        rewards = torch.where(eligible, rewards, torch.zeros_like(rewards))
        outcome = {"correct": rewards.clone(), "eligible": eligible}
    else:
        rewards = total.float()
        outcome = {"correct": gold.clone()}
    if overlong is not None:
        from .rewards import overlong_penalty

        pen = overlong_penalty(lengths, max_len=overlong[0], cache_len=overlong[1]).to(rewards.dtype)
        rewards = rewards + pen
        info["reward/overlong_penalty_mean"] = float(pen.mean())
    return Scored(rewards=rewards, outcome=outcome, gold_correct=gold, info=info)


def attach(batch: RolloutBatch, scored: Scored, greedy_rewards: torch.Tensor | None = None) -> RolloutBatch:
    extras = dict(batch.extras)
    if scored.gold_correct is not None:
        extras["gold_correct"] = scored.gold_correct
    return batch.replace(rewards=scored.rewards, outcome=scored.outcome, greedy_rewards=greedy_rewards, extras=extras)


def keep_groups(recipe: Recipe, batch: RolloutBatch, *, tol: float = 0.0) -> tuple[torch.Tensor, dict]:
    """[B] bool: sequences whose group trains. Dynamic sampling reads the raw outcome."""
    keep = torch.ones(batch.size, dtype=torch.bool)
    info: dict = {}
    if recipe.filter == "dynamic_sampling":
        from .filters import dynamic_sampling_keep

        keep, finfo = dynamic_sampling_keep(batch.outcome["correct"], batch.group, tol=tol)
        info.update({f"filter/{k}": v for k, v in finfo.items()})
    if "eligible" in batch.outcome:  # TTRL: tied majorities are not trained on
        keep = keep & batch.outcome["eligible"]
    return keep, info


def merge(parts: list[RolloutBatch], batch_id: str) -> RolloutBatch:
    return concat_batches(parts, batch_id)


def sampling_from(cfg) -> SamplingSettings:
    return SamplingSettings(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
