"""A method is a typed spec that owns its stages.

A `Method` references its stage functions directly (no string dispatch), declares the
typed parameters it takes (with the paper's defaults), and says, stage by stage, which
batch fields and roles each stage reads and writes. The trainer loops over the stages of
whatever method it was given; it never names a method or a method's parameter.

The step, in stage order (the kinds a `Stage` can be):

    model       once, when the run is built: a transform of the policy model before its
                optimizer is made (a reparametrization, adapters, a trainable prefix)
    source      where sequences come from (the on-policy rollout engine; demonstrations ...)
    reward      scores and shaping: rewards [B], raw outcomes, per-step rewards, baselines
    filter      which groups train (dynamic sampling on the raw outcome, eligibility)
    (roles)     the role passes the stages below read: logp_old, logp_ref, values,
                logp_current (the learner at the start of the update round, detached)
    round       once per update round, after the role passes: per-token penalties folded
                into rewards, acceptance draws, single-use checks, frozen per-round weights
    advantage   advantages [B] or [B, T] (and critic returns), detached
    objective   the per-token loss of the learner's log-probs
    correction  detached weights composed with any host objective (or a replaced
                ratio denominator, e.g. SIS's accepted tokens)
    addend      terms added to the policy loss matrix (KL in the loss, entropy bonus)
    term        separately aggregated loss terms (VAPO's positive-example NLL)
    grad        gradient transforms between backward and the optimizer step
    poststep    right after every optimizer step (re-projecting constrained weights)
    after       once per round after the updates (e.g. marking a batch consumed)

Per-run state a stage needs across steps (an EMA scale, the single-use ledger, a seeded
generator) is declared as `StateSpec`s: the trainer builds it, hands it to the stages
and checkpoints it. A stage reads only the parameters it declares: it receives a
`ParamView` that refuses any other name.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch


from policylab.methods.param_types import (  # noqa: E402,F401  (re-exported: methods declare parameters through spec)
    Param, ParamError, Params, ParamView, non_negative, positive, unit_interval)
from policylab.methods.stage import (  # noqa: F401  (re-exported: the spec's public names)
    CAPABILITIES, LOSS_KINDS, PACKAGE_ROOT, REQUIREMENTS, ROLE_FIELDS, STAGE_KINDS, RunShape, Stage, Weighting,
    source_location)


@dataclass(frozen=True)
class StateSpec:
    """Per-run state of a method: `factory(params, seed)` builds an object with
    `state_dict()` / `load_state_dict(d)`; the trainer checkpoints it under `name`."""

    name: str
    factory: Callable[[Params, int], Any]
    params: tuple[str, ...] = ()
    doc: str = ""


@dataclass(frozen=True)
class CriticSpec:
    """A value model trained next to the policy. `clip_param` names the parameter with
    the value-clip range (None = unclipped), `pretrain_param` the number of critic-only
    steps that come before any policy update (None = no pretraining)."""

    clip_param: str
    pretrain_param: str | None = None


# ----------------------------------------------------------------------------- loss contract


@dataclass(frozen=True)
class LossInputs:
    """Everything a per-token loss may read, for one micro-batch.

    logp          [B, T] learner log-probs (differentiable)
    logp_old      [B, T] π_old: the batch's recomputed old log-probs, or sg(logp) for a
                  single on-policy update (value equal; ratio exactly 1)
    logp_behavior [B, T] what sampled the tokens (rollout engine), or None
    logp_ref      [B, T] the KL anchor, or None
    adv           [B] or [B, T] detached advantages
    mask          [B, T] bool, True = counts
    entropy       [B, T] learner entropy (differentiable when a stage reads "entropy"), or None
    batch         the micro-batch itself, for group ids, rewards, outcomes and typed extras
    """

    logp: torch.Tensor
    logp_old: torch.Tensor
    logp_behavior: torch.Tensor | None
    logp_ref: torch.Tensor | None
    adv: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor | None
    batch: Any

    def replace(self, **changes) -> "LossInputs":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Advantages:
    """What an advantage stage returns: advantages [B] or [B, T] (detached), critic
    returns [B, T] for methods with a critic, and detached diagnostics."""

    adv: torch.Tensor
    returns: torch.Tensor | None = None
    info: Mapping[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- the card


@dataclass(frozen=True)
class Card:
    title: str  # paper title
    arxiv: str  # arXiv id ("" if none)
    family: str  # advantage | objective | correction | reward | test-time | ...
    samples: str  # which policy produced the tokens (behavior)
    learns: str  # which policy receives gradient
    reference: str  # the KL anchor, or "none"
    summary: str  # one line: what the method changes
    not_established: str  # what the kernel and our runs do not show
    unconfirmed: tuple[str, ...] = ()  # parameters/forms not verified against the paper
    confirmed: str = ""  # what was checked against the paper
    critic: str = "none"
    # what has been measured beyond the kernel tests; for the shipped methods this comes from
    # one place, `policylab.methods.evidence` (a registration does not set it)
    status: str = ""


# ----------------------------------------------------------------------------- the method


@dataclass(frozen=True)
class Method:
    """A registered method: card, typed parameters and the stages that make its step."""

    name: str
    card: Card
    params: tuple[Param, ...]
    source: Stage
    advantage: Stage
    objective: Stage
    aggregation: str
    model: tuple[Stage, ...] = ()
    rewards: tuple[Stage, ...] = ()
    filters: tuple[Stage, ...] = ()
    round: tuple[Stage, ...] = ()
    corrections: tuple[Stage, ...] = ()
    addends: tuple[Stage, ...] = ()
    terms: tuple[Stage, ...] = ()
    grad: tuple[Stage, ...] = ()
    poststep: tuple[Stage, ...] = ()
    after: tuple[Stage, ...] = ()
    state: tuple[StateSpec, ...] = ()
    critic: CriticSpec | None = None
    checks: tuple[Callable[["RunShape", Params], None], ...] = ()
    min_group_size: int = 1
    # run settings (config sections) under which the method does anything at all, e.g.
    # {"rollout": {"engine_dtype": "bf16"}} for an engine-mismatch correction (with one
    # engine its weights are exactly 1): the tests and benchmarks run it that way
    exercise: Mapping[str, Any] = field(default_factory=dict)
    # lines the method adds to a run's start-up summary: params -> (label, text), e.g. the KL
    # to the reference "k3 x 0.04 in the loss" (the trainer prints them, never reads the params)
    header: tuple[Callable[[Params], tuple[str, str]], ...] = ()
    # sections the method adds to a run's report: (key, (run shape, rollout steps) -> dict),
    # e.g. a test-time method's "adaptation" budgets
    report_sections: tuple[tuple[str, Callable[["RunShape", int], dict]], ...] = ()
    values: Params | None = None  # resolved parameter values (set by `with_params`)

    def __post_init__(self):
        names = [p.name for p in self.params]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"method {self.name}: parameters declared twice: {sorted(dup)}")
        declared = set(names)
        for s in self.stages():
            unknown = set(s.params) - declared
            if unknown:
                raise ValueError(f"method {self.name}: stage `{s.name}` reads undeclared parameters {sorted(unknown)}")
        for st in self.state:
            unknown = set(st.params) - declared
            if unknown:
                raise ValueError(f"method {self.name}: state `{st.name}` reads undeclared parameters {sorted(unknown)}")
        if self.critic is not None:
            for n in (self.critic.clip_param, self.critic.pretrain_param):
                if n is not None and n not in declared:
                    raise ValueError(f"method {self.name}: critic names undeclared parameter {n!r}")
        expected = {"model": self.model, "source": [self.source], "advantage": [self.advantage],
                    "objective": [self.objective], "reward": self.rewards, "filter": self.filters,
                    "round": self.round, "correction": self.corrections, "addend": self.addends,
                    "term": self.terms, "grad": self.grad, "poststep": self.poststep, "after": self.after}
        for kind, stages in expected.items():
            for s in stages:
                if s.kind != kind:
                    raise ValueError(f"method {self.name}: stage `{s.name}` of kind {s.kind!r} listed as {kind}")
        from policylab.kernels.aggregate import MODES

        if self.aggregation not in MODES:
            raise ValueError(f"method {self.name}: aggregation {self.aggregation!r} is not one of {MODES}")
        if self.aggregation == "seq_mean_token_sum_norm" and "L_norm" not in declared:
            raise ValueError(f"method {self.name}: aggregation {self.aggregation} needs a declared `L_norm` parameter")

    # ------------------------------------------------------------------ stages
    def stages(self) -> list[Stage]:
        """Every stage, in pipeline order."""
        return [*self.model, self.source, *self.rewards, *self.filters, *self.round, self.advantage,
                self.objective, *self.corrections, *self.addends, *self.terms, *self.grad, *self.poststep,
                *self.after]

    def active(self, kind: str) -> list[Stage]:
        """The stages of `kind` that run with this method's resolved parameters."""
        p = self.p
        return [s for s in self.stages() if s.kind == kind and s.is_active(p)]

    @property
    def p(self) -> Params:
        """The resolved parameter values (the paper's defaults unless configured)."""
        if self.values is not None:
            return self.values
        return Params(self.name, {q.name: q.default for q in self.params})

    def view(self, stage: Stage) -> ParamView:
        return self.p.view(stage.params, f"{self.name}.{stage.name}")

    @property
    def required_fields(self) -> tuple[str, ...]:
        """Batch fields and roles the active stages read, in pipeline order (the learner's
        own `logp` and `entropy` come from the training forward and are not listed)."""
        out: dict[str, None] = {}
        for s in self.stages():
            if s.is_active(self.p):
                out.update(dict.fromkeys(f for f in s.reads if f not in ("logp", "entropy")))
        return tuple(out)

    @property
    def roles(self) -> tuple[str, ...]:
        """The role passes this method itself needs. The objective's π_old is not one of
        them: for a single on-policy update it is sg(logp) of the training forward (same
        value, ratio exactly 1); the trainer runs the old pass whenever that does not hold
        (several updates, staleness). A correction's π_old (the engine ratio π_old/μ) is
        listed, but in a single on-policy update it too is read from the training forward
        (`old_readers_before_update` says when a pass is needed anyway)."""
        out: dict[str, None] = {}
        for s in self.stages():
            if s.is_active(self.p):
                reads = [f for f in s.reads if not (s.kind == "objective" and f == "logp_old")]
                out.update(dict.fromkeys(f for f in reads if f in ROLE_FIELDS))
        return tuple(out)

    @property
    def old_readers_before_update(self) -> tuple[str, ...]:
        """Names of the active stages outside the loss (round, after, ...) that read
        logp_old: they need π_old before (or apart from) the training forward, so the
        trainer runs the old pass even for a single on-policy update. The loss stages
        (objective, corrections, addends, terms) are not listed: inside the optimizer step
        of a single on-policy update π_old is sg(logp) of that step's own forward."""
        return tuple(s.name for s in self.stages()
                     if s.is_active(self.p) and s.kind not in LOSS_KINDS and "logp_old" in s.reads)

    @property
    def needs_entropy_grad(self) -> bool:
        return any("entropy" in s.reads for s in self.stages()
                   if s.kind in ("objective", "correction", "addend", "term") and s.is_active(self.p))

    @property
    def zero_adv_rows_inert(self) -> bool:
        """Rows whose advantage is 0 on every counted token can be left out of the
        training forward without changing the update: the objective is A-proportional and
        row-local, every correction only weights it, and no addend or extra term is active
        (a KL or entropy term has a gradient on every row)."""
        return (self.objective.inert_at_zero_adv and self.objective.row_coupling == "none"
                and not self.active("addend") and not self.active("term"))

    # ------------------------------------------------------------------ parameters
    def param(self, name: str) -> Param:
        for q in self.params:
            if q.name == name:
                return q
        raise ParamError(self._unknown(name))

    def _unknown(self, name: str) -> str:
        valid = [q.name for q in self.params]
        near = difflib.get_close_matches(name, valid, n=3)
        hint = f" Did you mean: {', '.join(near)}?" if near else ""
        return (f"method `{self.name}` has no parameter `{name}`.{hint} "
                f"Parameters of {self.name}: {', '.join(valid) or '(none)'}.")

    def with_params(self, overrides: Mapping[str, Any] | None = None, run: RunShape | None = None) -> "Method":
        """A copy with the parameters validated and resolved: `overrides` replace the
        defaults (unknown names and wrong types are refused, naming the valid ones);
        None defaults with a `resolve` rule take their value from `run` (the run's
        shape); then the method's checks run against `run`."""
        overrides = dict(overrides or {})
        for name in overrides:
            if not isinstance(name, str) or name not in {q.name for q in self.params}:
                raise ParamError(self._unknown(str(name)))
        values = {}
        for q in self.params:
            v = q.validate(overrides[q.name], self.name) if q.name in overrides else q.default
            if v is None and q.resolve is not None and run is not None:
                v = q.validate(q.resolve(run), self.name)
            values[q.name] = v
        p = Params(self.name, values)
        out = dataclasses.replace(self, values=p)
        if run is not None:
            out.check_run(run)
        return out

    def check_run(self, run: RunShape) -> None:
        """Refuse a run configuration the method cannot be trained with."""
        if run.group_size < self.min_group_size:
            raise ParamError(
                f"method `{self.name}` needs rollout.group_size >= {self.min_group_size}, got {run.group_size}")
        for check in self.checks:
            check(run, self.p)

    def state_objects(self, seed: int) -> dict[str, Any]:
        """Fresh per-run state objects, by name."""
        return {st.name: st.factory(self.p.view(st.params, f"{self.name}.{st.name}"), seed) for st in self.state}


def describe_params(method: Method) -> list[str]:
    """One line per parameter: name = value (type; doc)."""
    out = []
    for q in method.params:
        v = method.p[q.name]
        kind = q.type.__name__ + (" or None" if q.optional else "")
        extra = f"; one of {', '.join(map(str, q.choices))}" if q.choices else ""
        out.append(f"{q.name} = {v!r}  ({kind}{extra}) {q.doc}")
    return out
