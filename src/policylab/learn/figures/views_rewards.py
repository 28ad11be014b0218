"""Views of reward and filter stages: reward against its inputs (length, votes, the
number in a reply), and which groups a filter keeps."""

from __future__ import annotations

from collections import Counter

import torch

from policylab.kernels.filters import dynamic_sampling_keep
from policylab.methods.spec import Method
from policylab.kernels.rewards.verifiers import exact_numeric_reward
from policylab.kernels.rewards.graded import parse_dimensions
from policylab.learn.figures.model import Mark, Panel, Series, T, view
from policylab.learn.figures.common import F64, bare_batch, reward_stage, stage_context, stage_named

REWARD = T("reward", "奖励")


@view("overlong_penalty")
def overlong_penalty(method: Method, *, beyond: int = 8) -> list[Panel]:
    """DAPO's soft overlong punishment added to a reply's reward, against its length: the
    method's reward stage `overlong` on rows of every length 1..L_max + `beyond`
    (L_max, L_cache from the method's parameters, resolved against the run's budget)."""
    stage = stage_named(method, "reward", "overlong")
    from policylab.methods.context import Sampled
    from policylab.methods.stages.rewards import overlong_cache

    L_max = int(method.p.overlong_max)
    lengths = list(range(1, L_max + int(beyond) + 1))
    mask = torch.zeros((len(lengths), max(lengths)), dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    batch = bare_batch(len(lengths), max(lengths), mask=mask, rewards=[0.0] * len(lengths))
    changes, _ = stage.fn(Sampled(batch, [""] * len(lengths), [None] * len(lengths), [], []),
                          stage_context(method, stage))
    cache = overlong_cache(method.p)
    return [Panel(T(f"L_max = {L_max}, L_cache = {cache}"), T("response length |y| (tokens)", "回答长度 |y|（词元数）"),
                  T("added to the reward", "加到奖励上的值"),
                  [Series(T("overlong penalty", "超长惩罚"), lengths, changes["rewards"].tolist())],
                  marks=[Mark("x", L_max - cache, T("L_max − L_cache")), Mark("x", L_max, T("L_max"))],
                  source="reward stage overlong (rewards.overlong_penalty)")]


@view("dynamic_sampling")
def dynamic_sampling(method: Method, *, group_size: int = 8) -> list[Panel]:
    """Which groups the filter keeps, against the number of correct replies in a group of
    `group_size` (the method's filter stage on `outcome["correct"]`)."""
    stage = stage_named(method, "filter", "dynamic_sampling")
    G = int(group_size)
    ks, kept = list(range(G + 1)), []
    for k in ks:
        batch = bare_batch(G, 1, rewards=[0.0] * G).replace(
            outcome={"correct": torch.tensor([1.0] * k + [0.0] * (G - k), dtype=F64)})
        keep, _ = stage.fn(batch, stage_context(method, stage))
        kept.append(float(keep.all()))
    return [Panel(T(f"group of {G}", f"每组 {G} 个"), T("correct replies in the group", "组内正确回答数"),
                  T("group kept (1) or dropped (0)", "保留 (1) 或丢弃 (0)"),
                  [Series(T("kept", "保留"), ks, kept, kind="bar")], categories=[str(k) for k in ks],
                  source=f"filter stage dynamic_sampling ({dynamic_sampling_keep.__module__}.dynamic_sampling_keep)")]


def _reply(template: str, answer) -> str:
    return template.format(x=answer) if answer is not None else "I am not sure."


@view("majority_vote")
def majority_vote(method: Method, *, answers=("12", "12", "7", "12", None, "7", "12", "3"),
                  template: str = "... so the answer is {x}.") -> list[Panel]:
    """TTRL on one unlabeled group: votes per extracted answer, and the reward each reply
    gets from the method's reward stage (1 when its answer is the majority's)."""
    texts = [_reply(template, a) for a in answers]
    changes = reward_stage(method, "majority_vote", texts, ["0"] * len(texts),
                           task_reward=exact_numeric_reward)
    rewards = changes["rewards"].tolist()
    counts = Counter("none" if a is None else a for a in answers)
    cats = list(counts)
    labels = ["none" if a is None else a for a in answers]
    xl = T("extracted answer", "提取的答案")
    return [
        Panel(T("votes", "票数"), xl, T("replies with this answer", "给出该答案的回答数"),
              [Series(T("votes", "票数"), list(range(len(cats))), [counts[c] for c in cats], kind="bar")],
              categories=cats, source="reward stage majority_vote (rewards.ttrl_rewards)"),
        Panel(T("reward of each reply", "每个回答的奖励"), T("reply (its answer)", "回答（其答案）"), REWARD,
              [Series(REWARD, list(range(len(texts))), rewards, kind="bar")],
              categories=[f"{i + 1}: {c}" for i, c in enumerate(labels)],
              source="reward stage majority_vote (rewards.ttrl_rewards)"),
    ]


@view("interval_judge")
def interval_judge(method: Method, *, gold: int = 10, spread: int = 8,
                   template: str = "... so the answer is {x}.") -> list[Panel]:
    """The judge's reward interval [low, high] against the number a reply ends with (the
    method's reward stage `interval_judge`, gold answer `gold`)."""
    xs = list(range(gold - spread, gold + spread + 1))
    iv = reward_stage(method, "interval_judge", [_reply(template, x) for x in xs], [str(gold)] * len(xs))["reward_intervals"]
    return [Panel(T(f"gold answer {gold}", f"标准答案 {gold}"), T("number the reply ends with", "回答最后给出的数"), REWARD,
                  [Series(T("interval high", "区间上界"), xs, iv[:, 1].tolist(), markers=True),
                   Series(T("interval low", "区间下界"), xs, iv[:, 0].tolist(), markers=True)],
                  marks=[Mark("x", gold, T("gold", "标准答案"))],
                  source=f"reward stage interval_judge ({method.p.interval_judge})")]


@view("reward_dimensions")
def reward_dimensions(method: Method, *, gold: int = 10, spread: int = 8, template: str = "{x}") -> list[Panel]:
    """Each reward dimension against the number a reply ends with (the method's reward
    stage `reward_dimensions`, its `dimensions` parameter)."""
    xs = list(range(gold - spread, gold + spread + 1))
    v = reward_stage(method, "reward_dimensions", [_reply(template, x) for x in xs], [str(gold)] * len(xs))["reward_vectors"]
    names = parse_dimensions(method.p.dimensions)
    return [Panel(T(f"gold answer {gold}, replies like {template.format(x='x')!r}", f"标准答案 {gold}，回答形如 "
                    f"{template.format(x='x')!r}"), T("number the reply ends with", "回答最后给出的数"), REWARD,
                  [Series(T(n), xs, v[:, d].tolist(), markers=True) for d, n in enumerate(names)],
                  marks=[Mark("x", gold, T("gold", "标准答案"))], source="reward stage reward_dimensions")]
