"""A stage: one step of a method, the function the trainer calls at that point of the
step, with what it reads, writes, takes as parameters and needs from the backends; the
`Weighting` a correction returns; and the run shape a method may check or resolve
defaults from. (`policylab.methods.spec` lists the stage kinds and re-exports these names.)"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from policylab.methods.param_types import Params

STAGE_KINDS = ("model", "source", "reward", "filter", "round", "advantage", "objective", "correction", "addend",
               "term", "grad", "poststep", "after")
ROLE_FIELDS = ("logp_old", "logp_ref", "values", "logp_current")
# the stage kinds that run inside the optimizer step, on the training forward's LossInputs
LOSS_KINDS = ("objective", "correction", "addend", "term")
# optional backend calls a stage may declare in `Stage.needs` (every backend has the core ones:
# rollout generate/decode/sync_weights, worker role_logprobs/values)
CAPABILITIES = {
    "rollout.greedy": "greedy decoding of prompts (e.g. ReMax's baseline, probes, retention answers)",
    "worker.logprobs_at": "the current policy's log-probs of given candidate ids at every response position",
    "worker.vocab_stats": "full-vocabulary entropy at every response position",
    "worker.vocab_kl": "full-vocabulary KL to the reference at every response position (vocab_stats(kl_to_reference=True))",
    "worker.prompt_logprobs": "a role's log-probs of the prompt tokens",
    "worker.continuation_logprobs": "the policy's log-probability of a continuation after each reply",
}
# conditions a stage that changes the learner outside its loss (model, grad, poststep) may
# declare in `Stage.requires`: policylab's own trainer meets them from its run config and
# task; an engine hosting the method through its step extension must be told how
# (`policylab.integrations.hosting.Engine.step_requires`)
REQUIREMENTS = {
    "lora_adapter": "a LoRA adapter on the learner (policylab's train.lora_rank > 0): the stage constrains the "
                    "adapter's factors",
    "train_examples": "training examples (prompt and gold answer) that the stage draws itself through ctx.next_train "
                      "(beyond the prompts the rollout samples)",
}




# ----------------------------------------------------------------------------- run shape


@dataclass(frozen=True)
class Weighting:
    """What a correction returns: a detached weight ([B] or [B, T]) multiplying the host
    loss, and/or a replacement for the ratio's denominator `logp_old` (SIS: sg(logp) on
    accepted tokens), plus detached metrics."""

    weight: torch.Tensor | None = None
    logp_old: torch.Tensor | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunShape:
    """The parts of a run's configuration that a method may check or resolve defaults
    from (never the config object itself)."""

    prompts_per_step: int = 4
    group_size: int = 8
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    epochs: int = 1
    minibatches: int = 1
    staleness: int = 0
    engine_differs: bool = False  # the rollout engine's numerics are not the trainer's (e.g. bf16)

    @property
    def single_update(self) -> bool:
        """Each batch gets exactly one optimizer step, at the weights that sampled it."""
        return self.epochs == 1 and self.minibatches == 1 and self.staleness == 0


# ----------------------------------------------------------------------------- stages


@dataclass(frozen=True)
class Stage:
    """One step of a method.

    fn        the function the trainer calls; its signature depends on `kind` (see the
              module doc and `policylab.methods.stages`)
    kernels   the pure policylab kernels it calls (cards and `explain` show their
              equations and source locations)
    params    the parameter names it reads (checked against the method's `Param`s)
    reads     batch fields / roles it reads; a role listed here makes the trainer run
              that role's pass
    writes    batch fields it writes (checked when the stage returns)
    active    params -> bool: whether the stage runs for these parameters (default: always)
    inert_at_zero_adv  objectives: a row with A = 0 on every counted token adds exactly 0
              to loss and gradient (lets the trainer leave such rows out of the forward)
    row_coupling  objectives: "none" (rows independent) or "group" (the loss of a row
              depends on the other rows of its group: micro-batches keep groups whole)
    term_mask, term_aggregation  terms: (batch, params) -> the [B, T] mask the term is
              aggregated over, and its aggregation mode (normalizer computed once per
              optimizer step over that mask)
    needs     optional backend calls the stage makes (names from CAPABILITIES); the
              stage's context exposes only these beyond the core calls
    learner   model stages: True when the stage changes the learner itself (wraps,
              freezes or re-parameterizes its weights), False when it builds a frozen
              companion another stage uses (a peer, teachers, a reward model); an engine
              hosting the method must then run it on its own actor model
    requires  model, grad and poststep stages: conditions on the run (names from
              REQUIREMENTS) the stage needs met, e.g. a LoRA adapter on the learner
    """

    kind: str
    fn: Callable
    name: str = ""
    kernels: tuple[Callable, ...] = ()
    params: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    active: Callable[[Params], bool] | None = None
    inert_at_zero_adv: bool = False
    row_coupling: str = "none"
    term_mask: Callable | None = None
    term_aggregation: str | None = None
    needs: tuple[str, ...] = ()
    learner: bool = False
    requires: tuple[str, ...] = ()

    def __post_init__(self):
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"stage kind must be one of {STAGE_KINDS}, got {self.kind!r}")
        if self.row_coupling not in ("none", "group"):
            raise ValueError(f"row_coupling must be 'none' or 'group', got {self.row_coupling!r}")
        if self.learner and self.kind != "model":
            raise ValueError(f"learner=True is for model stages; stage {self.name or self.fn.__name__!r} is a "
                             f"{self.kind} stage (grad and poststep stages change the learner by their kind)")
        if self.requires and self.kind not in ("model", "grad", "poststep"):
            raise ValueError(f"requires is for model, grad and poststep stages; stage "
                             f"{self.name or self.fn.__name__!r} is a {self.kind} stage")
        bad = [r for r in self.requires if r not in REQUIREMENTS]
        if bad:
            raise ValueError(f"stage {self.name or self.fn.__name__!r}: unknown requirements {bad}; known: "
                             f"{sorted(REQUIREMENTS)}")
        if not self.name:
            object.__setattr__(self, "name", getattr(self.fn, "__name__", "stage").lstrip("_"))
        unknown = [c for c in self.needs if c not in CAPABILITIES]
        if unknown:
            raise ValueError(f"stage {self.name}: unknown capabilities {unknown}; known: {sorted(CAPABILITIES)}")
        if self.kind == "term" and (self.term_mask is None or self.term_aggregation is None):
            raise ValueError(f"term stage {self.name}: needs term_mask and term_aggregation")

    def is_active(self, params: Params) -> bool:
        return self.active is None or bool(self.active(params))

    def where(self) -> list[tuple[str, str, int]]:
        """(qualified name, file relative to the package root, line) of the stage function
        and of each kernel (a bound stage's function is its kernel: listed once)."""
        fns = self.kernels if getattr(self.fn, "binds", None) is not None else (self.fn, *self.kernels)
        return [source_location(f) for f in fns]


def _path(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def bind(kind: str, kernel: Callable, inputs: tuple[str, ...], params: Mapping[str, str] | None = None, *,
         weighting: bool = False, **stage) -> Stage:
    """A stage that calls `kernel` directly: its positional arguments are the `inputs`
    (paths on the stage's LossInputs, e.g. "logp" or "batch.logp_behavior"; a "batch.X"
    input is required of the batch, so a missing role is refused naming the stage), its
    keyword arguments the method parameters `params` maps them from ({kernel kwarg:
    method parameter}). With `weighting` the kernel returns (weights, metrics) and the
    stage a `Weighting`. Instead of a pass-through function per kernel, the binding is the
    declaration; `fn.binds` records it for the cards."""
    params = dict(params or {})
    name = stage.pop("name", kernel.__name__)
    needed = tuple(i.partition(".")[2] for i in inputs if i.startswith("batch."))

    def fn(inp, p):
        if needed:
            inp.batch.require(name, *needed)
        out = kernel(*(_path(inp, i) for i in inputs), **{k: getattr(p, v) for k, v in params.items()})
        if weighting:
            w, metrics = out
            return Weighting(weight=w, metrics=metrics)
        return out

    fn.__name__ = fn.__qualname__ = name
    fn.binds = (kernel, inputs, params)
    reads = stage.pop("reads", tuple(i.removeprefix("batch.") for i in inputs if i not in ("adv", "mask")))
    return Stage(kind, fn, name=name, kernels=(kernel,), params=tuple(params.values()), reads=reads, **stage)


PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # holds `policylab/`


def source_location(fn: Callable) -> tuple[str, str, int]:
    fn = inspect.unwrap(fn)
    try:
        src = Path(inspect.getsourcefile(fn)).resolve()
        path = src.relative_to(PACKAGE_ROOT).as_posix() if src.is_relative_to(PACKAGE_ROOT) else str(src)
        line = inspect.getsourcelines(fn)[1]
    except (TypeError, OSError):
        path, line = "?", 0
    return f"{fn.__module__}.{fn.__qualname__}", path, line
