"""policylab rewards inside another engine's reward hook: a method's own reward stages
(RLCR's calibration reward, ...) on top of a policylab verifier, as a verl
`custom_reward_function` and as a TRL reward function.

The reward stages run exactly as in policylab's trainer (`Method.rewards`, each with its
typed parameters through `ParamView`), on the decoded replies and gold answers; what an
engine's reward hook cannot give a stage (the model, for a scoring forward; token-level
data) makes that stage raise a PolicylabError naming it. verl calls its
`compute_score` once per response, so only stages that score each reply on its own run
there (`row_local`); TRL passes the whole batch, with groups of `num_generations`.

verl:

    reward.custom_reward_function.path=pkg://policylab.integrations.rewards
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.method=rlcr        (default: the verifier alone)
    +reward.custom_reward_function.reward_kwargs.verifier=exact_numeric

verl's batch reward manager sees the whole batch, so group-coupled stages (TTRL's vote) run:

    reward.reward_manager.name=batch
    reward.custom_reward_function.name=compute_score_batch
    +reward.custom_reward_function.reward_kwargs.rollout_n=<actor_rollout_ref.rollout.n>

TRL: ``reward_funcs=[trl_reward_func("rlcr")]`` (the dataset's ``answer`` column is the gold).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import torch

from policylab.batch import RolloutBatch
from policylab.errors import PolicylabError
from policylab.kernels import rewards as rw
from policylab.kernels.rewards.calibration import confidence_answer_reward
from policylab.methods import get
from policylab.methods.context import Sampled, StageContext
from policylab.methods.spec import RunShape
from policylab.methods.stages import rewards as reward_stages

VERIFIERS: dict[str, Callable] = {"exact_numeric": rw.exact_numeric_reward, "math_verify": rw.math_verify_reward,
                                  "confidence_answer": confidence_answer_reward}
# reward stages that score each reply from its own text and gold alone (verl's per-response hook)
ROW_LOCAL = frozenset({"verifier", "rlcr_confidence"})


class _Example:
    def __init__(self, prompt: str, answer: Any):
        self.prompt, self.answer, self.meta = prompt, answer, {}


def verifier(name: str) -> Callable:
    if name not in VERIFIERS:
        raise PolicylabError(f"unknown policylab verifier {name!r}; known: {', '.join(VERIFIERS)}")
    return VERIFIERS[name]


def score_replies(method: str | None, texts: Sequence[str], answers: Sequence[Any], *, verifier_name: str = "exact_numeric",
                  group: Sequence[int] | None = None, prompts: Sequence[str] | None = None,
                  params: dict | None = None, row_local: bool = False) -> list[float]:
    """The rewards policylab's trainer gives `texts` under `method`'s reward stages (None:
    the verifier alone), the task verifier being `verifier_name`."""
    fn = verifier(verifier_name)
    if method is None:
        return [float(v) for v in fn(list(texts), list(answers))]
    m = get(method).with_params(dict(params or {}))
    stages = list(m.rewards)
    if not stages:
        raise PolicylabError(f"method `{m.name}` has no reward stage of its own: use method=None (the verifier)")
    if row_local:
        bad = [s.name for s in stages if s.name not in ROW_LOCAL]
        if bad:
            raise PolicylabError(f"method `{m.name}`'s reward stage(s) {', '.join(bad)} score a reply against its "
                                 "group or the model, and verl's compute_score sees one reply at a time: use a batch "
                                 "reward manager or policylab's trainer")
    B = len(texts)
    g = torch.tensor(list(group) if group is not None else list(range(B)), dtype=torch.long)
    batch = RolloutBatch(tokens=torch.zeros(B, 2, dtype=torch.long), attention_mask=torch.ones(B, 2, dtype=torch.bool),
                         loss_mask=torch.ones(B, 1, dtype=torch.bool), prompt_width=1, group=g,
                         policy_version=torch.zeros(B, dtype=torch.long), batch_id="reward-hook")
    examples = [_Example(prompts[i] if prompts else "", answers[i]) for i in range(B)]
    order = list(dict.fromkeys(g.tolist()))
    first = {k: g.tolist().index(k) for k in order}
    s = Sampled(batch, list(texts), examples, [[] for _ in order], [examples[first[k]] for k in order])
    rewards = None
    for stage in stages:
        ctx = StageContext(p=m.view(stage), state={}, run=RunShape(group_size=max(1, B // max(1, len(order)))),
                           policy_version=0, sampling=None, rollout=None, worker=None,
                           score=reward_stages.scorer(fn), next_train=None, encode=None, new_groups=None,
                           decode=None, task_reward=lambda t, a: fn(list(t), list(a)))
        try:
            out = stage.fn(s, ctx)
        except (AttributeError, TypeError) as exc:
            raise PolicylabError(f"method `{m.name}` reward stage `{stage.name}` needs more than the replies and gold "
                                 f"answers ({type(exc).__name__}: {exc})") from exc
        changes = out[0] if isinstance(out, tuple) else out
        if "rewards" in changes:
            rewards = changes["rewards"]
        update = {k: changes[k] for k in ("rewards",) if k in changes}
        if "outcome" in changes:
            update["outcome"] = {**s.batch.outcome, **changes["outcome"]}
        if update:
            s = Sampled(dataclasses.replace(s.batch, **update), s.texts, s.examples, s.prompt_ids, s.group_examples)
    if rewards is None:
        raise PolicylabError(f"method `{m.name}`'s reward stages wrote no reward")
    return [float(v) for v in rewards]


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, *,
                  method: str | None = None, verifier: str = "exact_numeric", **_engine: Any) -> float:
    """verl's `custom_reward_function` signature (one response): `method`'s reward of
    `solution_str` against `ground_truth` (reward_kwargs give `method` and `verifier`)."""
    return score_replies(method, [solution_str], [ground_truth], verifier_name=verifier, row_local=True)[0]


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, *, method: str | None = None,
                        verifier: str = "exact_numeric", rollout_n: int | None = None, **_engine: Any) -> list[float]:
    """verl's batch reward manager signature (``reward.reward_manager.name=batch``): the
    whole batch at once, so group-coupled reward stages (TTRL's majority vote, MaD-RL's
    distribution match, RLCPR's length gate) run. Groups are `rollout_n` consecutive
    responses (verl repeats each prompt's responses next to each other); reward_kwargs
    give `method`, `verifier` and `rollout_n` (= actor_rollout_ref.rollout.n)."""
    n = len(solution_strs)
    if method is not None and rollout_n is None:
        raise PolicylabError("policylab batch reward: set +reward.custom_reward_function.reward_kwargs.rollout_n="
                             "<actor_rollout_ref.rollout.n> (the group of each response)")
    G = int(rollout_n or 1)
    if G < 1 or n % G:
        raise PolicylabError(f"policylab batch reward: {n} responses do not split into groups of rollout_n={G}")
    return score_replies(method, list(solution_strs), list(ground_truths), verifier_name=verifier,
                         group=[i // G for i in range(n)])


def trl_reward_func(method: str | None = None, *, verifier: str = "exact_numeric", answer_column: str = "answer",
                    num_generations: int | None = None, params: dict | None = None):
    """A TRL reward function giving `method`'s rewards; groups are `num_generations`
    consecutive completions (TRL's layout), every completion its own group when None."""

    def reward(prompts, completions, **columns):
        if answer_column not in columns:
            raise PolicylabError(f"policylab reward: the dataset has no `{answer_column}` column (the gold answers)")
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        G = num_generations or 1
        return score_replies(method, texts, columns[answer_column], verifier_name=verifier,
                             group=[i // G for i in range(len(texts))], params=params,
                             prompts=[p if isinstance(p, str) else str(p) for p in prompts])

    reward.__name__ = f"policylab_{method or verifier}"
    return reward


__all__ = ["VERIFIERS", "compute_score", "compute_score_batch", "score_replies", "trl_reward_func", "verifier"]
