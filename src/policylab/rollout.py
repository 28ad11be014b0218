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
from .errors import NonFiniteError, PolicylabError
from .methods.registry import Recipe


@dataclass
class Scored:
    """What the reward stage adds to a batch; `gold_correct` is for metrics only."""

    rewards: torch.Tensor  # [B] shaped reward used for advantages
    outcome: dict[str, torch.Tensor]  # raw metrics [B] (never shaped)
    gold_correct: torch.Tensor | None  # [B] correctness against gold (evaluator-side for TTRL)
    info: dict = field(default_factory=dict)


class RewardError(PolicylabError):
    """A reward function raised or returned a non-finite value."""


def score(recipe: Recipe, texts: list[str], answers: list[str], group: torch.Tensor, lengths: torch.Tensor,
          reward_fn, *, overlong: tuple[int, int] | None) -> Scored:
    """Rewards for decoded responses. `reward_fn(texts, answers) -> list[float]` is the
    task's verifier; with `reward_source == "majority_vote"` (TTRL) gold answers are read
    only to report `gold_correct`, never to build the reward."""
    gold = _call_reward(reward_fn, texts, answers)
    info: dict = {}
    if recipe.reward_source == "majority_vote":
        from .rewards import ttrl_rewards

        from .rewards import pseudo_label_agreement

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
        rewards = gold.clone()
        outcome = {"correct": gold.clone()}
    if overlong is not None:
        from .rewards import overlong_penalty

        pen = overlong_penalty(lengths, max_len=overlong[0], cache_len=overlong[1]).to(rewards.dtype)
        rewards = rewards + pen
        info["reward/overlong_penalty_mean"] = float(pen.mean())
    return Scored(rewards=rewards, outcome=outcome, gold_correct=gold, info=info)


def _call_reward(reward_fn, texts: list[str], answers: list[str]) -> torch.Tensor:
    name = getattr(reward_fn, "__name__", repr(reward_fn))
    try:
        values = reward_fn(texts, answers)
    except Exception as exc:  # name the function and, when we can find it, the sample
        for i, (t, a) in enumerate(zip(texts, answers)):
            try:
                reward_fn([t], [a])
            except Exception:
                raise RewardError(
                    f"reward function `{name}` raised on sample {i} (answer {a!r}, response {t[:80]!r}): {exc!r}"
                ) from exc
        raise RewardError(f"reward function `{name}` raised: {exc!r}") from exc
    r = torch.as_tensor([float("nan") if v is None else float(v) for v in values], dtype=torch.float32)
    if r.shape[0] != len(texts):
        raise RewardError(f"reward function `{name}` returned {r.shape[0]} values for {len(texts)} responses")
    bad = ~torch.isfinite(r)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise NonFiniteError(
            f"reward function `{name}` returned {values[i]!r} for sample {i} (response {texts[i][:80]!r}); "
            "rewards must be finite numbers (None means 'not applicable' only for combined rewards)"
        )
    return r


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
