"""What a stage receives besides its tensors: `Sampled` (a source's output) and the
`StageContext` the trainer builds for every step.

Math stages read only tensors from the batch and scalars from `ctx.p`; stages that need
the outside world (a source generating text, a reward function, a greedy decode, a
forward pass at the current weights) reach it through the context's backends, never
through a model, optimizer or config object of their own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from policylab.batch import RolloutBatch, SamplingSettings
from policylab.errors import PolicylabError
from policylab.methods.spec import ParamView, RunShape

# what every stage may use of the backends; anything else it must declare in `Stage.needs`
ROLLOUT_CORE = frozenset({"generate", "decode", "engine_name", "same_numerics_as_trainer", "tokenizer"})
WORKER_CORE = frozenset({"role_logprobs", "values"})


class UndeclaredCapability(PolicylabError, AttributeError):
    """A stage called an optional backend call it did not declare in `Stage.needs`."""


class BackendView:
    """A backend as one stage sees it: the core calls plus the capabilities the stage
    declared (`kind.name` in `Stage.needs`); anything else raises, naming the stage."""

    def __init__(self, backend, kind: str, core: frozenset, needs: tuple[str, ...], stage: str):
        self._backend, self._kind, self._stage = backend, kind, stage
        self._allowed = core | {n.partition(".")[2] for n in needs if n.startswith(kind + ".")}

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._allowed:
            raise UndeclaredCapability(f"stage `{self._stage}` uses {self._kind}.{name} without declaring it: add "
                                       f"needs=(\"{self._kind}.{name}\",) to the Stage (policylab.methods.spec.CAPABILITIES)")
        return getattr(self._backend, name)


@dataclass
class Sampled:
    """Sequences a source produced, with what the reward stages need to score them.

    batch          the RolloutBatch (tokens, masks, behavior log-probs, provenance)
    texts          [B] decoded responses
    examples       [B] the task example of each row (prompt, answer, meta)
    prompt_ids     per distinct prompt (group order): its token ids after the chat template
    group_examples per distinct prompt: its example
    """

    batch: RolloutBatch
    texts: list[str]
    examples: list
    prompt_ids: list[list[int]]
    group_examples: list

    def select(self, keep: torch.Tensor) -> "Sampled":
        """The rows where `keep` ([B] bool) is True, whole groups expected."""
        idx = keep.nonzero().squeeze(-1).tolist()
        kept_groups = []
        gids = self.batch.group.tolist()
        order = list(dict.fromkeys(gids))
        for j, g in enumerate(order):
            if any(gids[i] == g for i in idx):
                kept_groups.append(j)
        return Sampled(self.batch.select(keep), [self.texts[i] for i in idx], [self.examples[i] for i in idx],
                       [self.prompt_ids[j] for j in kept_groups], [self.group_examples[j] for j in kept_groups])


@dataclass
class StageContext:
    """The trainer's services for one step, as one stage sees them.

    p              the parameters the stage declared (a ParamView: nothing else readable)
    state          the method's per-run state objects, by `StateSpec.name`
    run            the run's shape (group size, budget, passes, staleness)
    step           the rollout step being run (0-based; schedules read it)
    policy_version the version of the current weights
    sampling       the sampler's settings (log-probs are computed under the same transform)
    rollout        the rollout backend (generate, greedy, decode, sync_weights)
    worker         the policy worker (role log-probs, log-probs at given ids, updates)
    score          (texts, examples) -> (reward [B], per-function rewards, raw verifier
                   outcome [B]): the task verifier (weight 1) plus the configured shaping
                   functions; raises on a verifier that cannot score a response
    next_train     n -> n training examples (advances the data stream)
    encode         prompt text -> token ids (chat template, context-length check)
    new_groups     n -> n fresh group ids
    decode         token ids -> text (special tokens skipped)
    task_reward    the task's verifier alone, (texts, answers) -> list[float]
    batch_tag      the id prefix for batches sampled this step
    """

    p: ParamView | None
    state: dict[str, Any]
    run: RunShape
    policy_version: int
    sampling: SamplingSettings
    rollout: Any
    worker: Any
    score: Callable
    next_train: Callable[[int], list]
    encode: Callable[[str], list[int]]
    new_groups: Callable[[int], list[int]]
    decode: Callable[[list[int]], str]
    task_reward: Callable
    batch_tag: str = ""
    step: int = 0
    tokenizer: Any = None

    def for_stage(self, method, stage) -> "StageContext":
        rollout, worker = self.rollout, self.worker
        if rollout is not None:
            rollout = BackendView(_unwrapped(rollout), "rollout", ROLLOUT_CORE, stage.needs, stage.name)
        if worker is not None:
            worker = BackendView(_unwrapped(worker), "worker", WORKER_CORE, stage.needs, stage.name)
        return dataclasses.replace(self, p=method.view(stage), rollout=rollout, worker=worker)


def _unwrapped(backend):
    return backend._backend if isinstance(backend, BackendView) else backend


@dataclass
class SetupContext:
    """What a `model` stage sees when the run is built: its parameters, the run's shape,
    the method's state objects and the tokenizer."""

    p: ParamView | None
    run: RunShape
    state: dict[str, Any]
    tokenizer: Any

    def for_stage(self, method, stage) -> "SetupContext":
        return dataclasses.replace(self, p=method.view(stage))
