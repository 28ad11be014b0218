"""Which registered methods another engine can host, computed from their specs.

An engine adapter runs a method's *loss path* (objective × corrections, addends, terms,
through `methods.loss`) inside the engine's loss hook, and its *advantage stage* inside
the engine's advantage hook. Whether that is possible follows from what each stage
declares it reads, never from a list of names:

- the source must be the plain on-policy rollout: the engine samples with its own
  rollout engine and records nothing else (no top-K envelope, no demonstrations);
- no round stage may be active: a round stage runs once per update round over the whole
  batch (group statistics, acceptance draws, provenance checks), and the engines call a
  loss per micro-batch with no hook in between;
- every field an active objective, correction or term reads must be one the engine's
  loss hook supplies;
- addends that the engine computes itself (verl adds its own KL and entropy terms) are
  switched off in the hosted loss and mapped to the engine's settings;
- the advantage stage may read only what the engine's advantage hook supplies (rewards
  and the prompt groups, for both engines).

- no stage may change the learner outside its loss: a gradient stage (rewriting the
  accumulated gradient before the optimizer steps), a post-step stage (changing the
  weights after it) or a model stage that wraps or re-parameterizes the learner (GCPO's
  LoRA frames, ISO's fixed spectra, TASCO's soft prefix) needs a hook inside the engine's
  optimizer step or model construction; model stages that only build a frozen companion
  (a peer, teachers, a reward model) go with the source or reward they serve.

Reward and filter stages are outside any loss: they are listed on the hosting card as
the parts the user's engine configuration (its reward function, its group filter) must
provide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from policylab.errors import PolicylabError
from policylab.methods import REGISTRY, Method, get
from policylab.methods.spec import RunShape, Stage
from policylab.methods.stages import rewards as reward_stages
from policylab.methods.stages import sources

# what each field means, for refusals ("needs X: <what>")
FIELD_MEANING = {
    "logp": "the learner's log-probs",
    "logp_old": "the trainer's log-probs at the sampling weights",
    "logp_behavior": "the log-probs the rollout engine sampled from",
    "logp_ref": "the reference model's log-probs",
    "logp_current": "the learner's log-probs at the start of the update round over the whole batch "
                    "(a forward at the current weights before any minibatch)",
    "entropy": "the learner's per-token entropy",
    "values": "a critic's values",
    "rewards": "one scalar reward per response",
    "group": "the prompt group of each response",
    "greedy_rewards": "the reward of a greedy decode of each prompt",
    "extras.step_rewards": "per-step (process) rewards with their step boundaries",
    "reward_intervals": "a judge's [low, high] reward interval per response",
    "reward_vectors": "a vector of reward dimensions per response",
    "outcome.correct": "the raw verifier outcome of each response",
    "extras.sis_accepted": "SIS acceptance draws (made by a round stage)",
    "extras.gmc_weight": "GMC group-capped weights (made by a round stage)",
    "batch_id": "batch ids (single-use ledger)",
    "policy_version": "the policy version that sampled each response (provenance)",
}


@dataclass(frozen=True)
class Engine:
    """What an engine's hooks supply.

    loss_fields       fields the loss hook can give a policylab loss, per micro-batch
    advantage_fields  fields the advantage hook can give an advantage stage, whole batch
    own_addends       addend stage name -> the engine setting that computes that term
                      (the hosted loss switches the policylab addend off)
    off_params        parameter -> value forced in the hosted loss (the engine's own
                      term replaces it), with the message given when a user sets another
    requires          field -> the setting the user must make for the engine to supply it
                      (without it the adapter refuses the run when it starts)
    provides          field -> how the adapter obtains it itself (no user setting)
    """

    name: str
    loss_fields: frozenset
    advantage_fields: frozenset
    own_addends: Mapping[str, str] = field(default_factory=dict)
    off_params: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    requires: Mapping[str, str] = field(default_factory=dict)
    provides: Mapping[str, str] = field(default_factory=dict)
    # the round extension (`policylab.integrations.rounds`): where it runs (None: none),
    # the fields the engine's whole batch gives it, those it gives only with a setting,
    # the external-row sources it accepts (source stage -> what the user appends), and
    # the loss-hook fields it adds (field -> setting, "" when none is needed)
    round_hook: str | None = None
    batch_fields: frozenset = frozenset()
    batch_requires: Mapping[str, str] = field(default_factory=dict)
    row_sources: Mapping[str, str] = field(default_factory=dict)
    extension_loss_fields: Mapping[str, str] = field(default_factory=dict)
    # sources whose rows the engine's own rollout makes, with per-row columns the user adds
    # (source stage -> how), and worker calls a round stage makes that one of the engine's
    # own passes already computes (capability -> the setting or trainer change that keeps it)
    own_rows: Mapping[str, str] = field(default_factory=dict)
    worker_passes: Mapping[str, str] = field(default_factory=dict)


@dataclass
class HostPlan:
    """The outcome of checking one method against one engine."""

    method: Method  # with the parameters the hosted loss uses
    engine: Engine
    reasons: list[str]  # why it cannot be hosted (empty: hostable)
    requires: list[str]  # settings the user must make (the adapter refuses the run without them)
    needs: list[str]  # what the adapter obtains from the engine by itself
    outside: list[str]  # stages the engine configuration must provide itself
    extension: bool = False  # hosted through the round extension (`policylab.integrations.rounds`)

    @property
    def hostable(self) -> bool:
        return not self.reasons

    @property
    def status(self) -> str:
        """"hostable", "hostable with a requirement" or "refused"."""
        if self.reasons:
            return "refused"
        return "hostable with a requirement" if self.requires else "hostable"

    def refusal(self) -> str:
        return (f"{self.engine.name} cannot host policylab method `{self.method.name}`: " + "; ".join(self.reasons))


def _missing(stage: Stage, available, kind: str, engine: Engine) -> list[str]:
    out = []
    for f in stage.reads:
        if f in available:
            continue
        what = FIELD_MEANING.get(f, f)
        out.append(f"{kind} `{stage.name}` reads `{f}` ({what}), which {engine.name}'s {_hook(kind)} does not supply")
    return out


def _learner_stages(m: Method, engine: Engine) -> list[str]:
    """Why the engine cannot run `m`'s stages that change the learner outside its loss."""
    out = []
    for s in m.active("model"):
        if s.learner:
            out.append(f"model stage `{s.name}` changes the learner itself (wraps, freezes or re-parameterizes its "
                       f"weights); {engine.name} builds and wraps its own actor model, and policylab has no hook to "
                       f"change it before the optimizer is made")
    for s in m.active("grad"):
        out.append(f"gradient stage `{s.name}` rewrites the accumulated gradient before each optimizer step; "
                   f"{engine.name}'s optimizer step has no hook between the last backward and the step")
    for s in m.active("poststep"):
        out.append(f"post-step stage `{s.name}` changes the weights after each optimizer step; "
                   f"{engine.name} has no hook after its optimizer step")
    return out


def _hook(kind: str) -> str:
    return "advantage hook" if kind == "advantage" else "loss hook"


def plan(method: Method | str, engine: Engine, overrides: Mapping[str, Any] | None = None) -> HostPlan:
    """Check `method` (with `overrides` of its parameters, validated by the method) against
    `engine`; the returned plan's method has the engine's forced parameters applied. A
    method the engine's own hooks cannot host is checked against the engine's round
    extension (`extension_plan`); the plan names the hooks' reasons when that fails too."""
    p = _plain_plan(method, engine, overrides)
    if p.hostable or engine.round_hook is None:
        return p
    return extension_plan(p, engine)


def _plain_plan(method: Method | str, engine: Engine, overrides: Mapping[str, Any] | None = None) -> HostPlan:
    if isinstance(method, Method):
        m = method
    elif isinstance(method, str):
        m = get(method)  # an unknown name raises with close matches
    else:
        raise PolicylabError(f"{engine.name}: `method` must be a policylab method name (a string, e.g. 'grpo'; "
                             f"`policylab methods` lists them), got {type(method).__name__} {method!r}")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise PolicylabError(f"{engine.name}: the parameters of method `{m.name}` must be a mapping of parameter "
                             f"name to value (e.g. {{'eps_high': 0.28}}), got {type(overrides).__name__} {overrides!r}")
    overrides = dict(overrides or {})
    bad_keys = [k for k in overrides if not isinstance(k, str)]
    if bad_keys:
        raise PolicylabError(f"{engine.name}: parameter names of method `{m.name}` must be strings, got {bad_keys!r}")
    for name, (forced, why) in engine.off_params.items():
        if name in overrides and overrides[name] != forced and name in {q.name for q in m.params}:
            raise PolicylabError(f"method `{m.name}` parameter `{name}`={overrides[name]!r}: {why}")
    declared = {q.name for q in m.params}
    forced = {k: v for k, (v, _) in engine.off_params.items() if k in declared}
    m = m.with_params({**overrides, **forced})
    reasons: list[str] = []
    requires: list[str] = []
    needs: list[str] = []
    outside: list[str] = []
    if m.source is not sources.ON_POLICY:
        extra = [w for w in m.source.writes if w not in sources.ON_POLICY.writes]
        reasons.append(f"source `{m.source.name}` records {', '.join(extra) or 'more than the sampled tokens'} at "
                       f"sampling; {engine.name} samples with its own rollout engine")
    reasons += _learner_stages(m, engine)
    for s in m.active("round"):
        what = ", ".join(f"`{f}` ({FIELD_MEANING.get(f, f)})" for f in s.reads) or "the whole batch"
        reasons.append(f"round stage `{s.name}` runs once per update round over the whole batch and reads {what}; "
                       f"{engine.name} calls a loss per micro-batch and has no per-round hook")
    for kind in ("objective", "correction", "term"):
        for s in m.active(kind):
            reasons += _missing(s, engine.loss_fields, kind, engine)
    for s in m.active("addend"):
        if s.name in engine.own_addends:
            continue
        reasons += _missing(s, engine.loss_fields, "addend", engine)
    reasons += _missing(m.advantage, engine.advantage_fields, "advantage", engine)
    used = {f for k in ("objective", "correction", "term", "addend") for s in m.active(k) for f in s.reads}
    for f, setting in engine.requires.items():
        if f in used:
            requires.append(setting)
    for f, how in engine.provides.items():
        if f in used:
            needs.append(how)
    for s in (*m.rewards, *m.filters):
        if s is reward_stages.VERIFIER:
            outside.append("rewards: the engine's reward function (policylab's task verifier is not run)")
        else:
            outside.append(f"{s.kind} stage `{s.name}` ({(s.fn.__doc__ or '').strip().splitlines()[0]}) is not "
                           f"run: the engine's reward function or group filter must provide it")
    return HostPlan(m, engine, reasons, requires, needs, outside)


_SERVICE = {"worker.prompt_logprobs": "the learner's log-probs over the prompt tokens",
            "worker.logprobs_at": "the learner's log-probs at token ids other than the sampled ones",
            "worker.vocab_stats": "the full-vocabulary entropy of a forward at the round's start",
            "worker.vocab_kl": "the full-vocabulary KL to the reference at every position (both models' logits at once)"}


def extension_plan(base: HostPlan, engine: Engine) -> HostPlan:
    """`base.method` through the engine's round extension: its round and advantage stages
    run on the whole batch, its loss reads the batch's fields as columns. Every field a
    stage reads must come from the engine's batch (`batch_fields`, or `batch_requires`
    with a setting), the external rows of a source the extension accepts, a reward
    stage's output carried as a column, or an earlier round stage."""
    m = base.method
    reasons: list[str] = []
    requires: list[str] = []
    needs: list[str] = [f"the round extension: {engine.round_hook}"]
    avail = set(engine.batch_fields)
    req_fields: dict[str, str] = dict(engine.batch_requires)
    if m.source is not sources.ON_POLICY:
        if m.source.name in engine.own_rows:
            requires.append(f"the rows of source `{m.source.name}` from {engine.own_rows[m.source.name]}")
            avail |= set(m.source.writes)
        elif m.source.name in engine.row_sources:
            requires.append(f"the rows of source `{m.source.name}` appended to the engine's batch "
                            f"({engine.row_sources[m.source.name]}), each with its provenance (source, producer) "
                            f"and its behavior log-probs on behavior_mask, as policylab columns "
                            f"({', '.join(w for w in m.source.writes if w not in ('tokens', 'loss_mask'))})")
            avail |= set(m.source.writes)
        else:
            reasons.append(f"source `{m.source.name}` makes rows ({', '.join(m.source.writes)}) that "
                           f"{engine.name}'s rollout and the extension's external rows cannot: "
                           f"{(m.source.fn.__doc__ or '').strip().splitlines()[0]}")
    for s in m.rewards:
        for w in s.writes:
            if w not in ("rewards",) and w not in avail:
                req_fields.setdefault(w, f"the reward stage `{s.name}`'s `{w}` per response as the column "
                                         f"policylab.{w} of the engine's batch")
    used_req: list[str] = []

    def need(stage: Stage, kind: str, extra=frozenset()) -> None:
        for f in stage.reads:
            if f in avail or f in extra:
                continue
            if f in req_fields:
                if req_fields[f] not in used_req:
                    used_req.append(req_fields[f])
                continue
            reasons.append(f"{kind} `{stage.name}` reads `{f}` ({FIELD_MEANING.get(f, f)}), which {engine.name}'s "
                           f"batch does not hold")

    reasons += _learner_stages(m, engine)
    for s in m.active("round"):
        for n in s.needs:
            if n in engine.worker_passes:
                if engine.worker_passes[n] not in requires:
                    requires.append(engine.worker_passes[n])
                continue
            reasons.append(f"round stage `{s.name}` needs {_SERVICE.get(n, n)} (policylab's `{n}`), which "
                           f"{engine.name} does not compute")
        need(s, "round stage")
        avail |= set(s.writes)
    need(m.advantage, "advantage")
    loss_extra = frozenset(engine.loss_fields) | frozenset(engine.extension_loss_fields)
    for kind in ("objective", "correction", "term", "addend"):
        for s in m.active(kind):
            if kind == "addend" and s.name in engine.own_addends:
                continue
            need(s, kind, loss_extra)
            for f in s.reads:
                if engine.extension_loss_fields.get(f) and engine.extension_loss_fields[f] not in used_req \
                        and f not in engine.loss_fields:
                    used_req.append(engine.extension_loss_fields[f])
    loss_reads = {f for k in ("objective", "correction", "term", "addend") for s in m.active(k)
                  if not (k == "addend" and s.name in engine.own_addends) for f in s.reads}
    for f in sorted(loss_reads):  # a role the loss reads that the engine supplies only with a setting
        setting = engine.batch_requires.get(f) or engine.requires.get(f)
        if setting and setting not in used_req:
            used_req.append(setting)
    if m.active("term"):
        used_req.append(f"one optimizer step per round (the extra loss terms {', '.join(s.name for s in m.active('term'))} "
                        "are normalized over the whole batch)")
    requires += used_req
    if m.critic is not None:
        needs.append(f"the critic is {engine.name}'s own (its value loss and its training); policylab's critic step "
                     "(value clipping, pretraining) is not run, only the values reach the advantage")
    for st in m.state:
        needs.append(f"per-run state `{st.name}` ({st.doc}) is kept by the extension in memory, not in "
                     f"{engine.name}'s checkpoint: a resumed run starts it afresh")
    return HostPlan(m, engine, reasons, requires, needs, base.outside, True)


def plans(engine: Engine) -> dict[str, HostPlan]:
    """Every registered method's plan at its defaults, by name."""
    return {name: plan(name, engine) for name in sorted(REGISTRY)}


def hostable(engine: Engine) -> list[str]:
    """Every method the engine can host, with or without a setting it requires."""
    return [n for n, p in plans(engine).items() if p.hostable]


def by_status(engine: Engine) -> dict[str, dict[str, HostPlan]]:
    """Every registered method's plan, grouped by `HostPlan.status`."""
    out: dict[str, dict[str, HostPlan]] = {"hostable": {}, "hostable with a requirement": {}, "refused": {}}
    for n, p in plans(engine).items():
        out[p.status][n] = p
    return out


def advantage_stages(engine: Engine) -> dict[str, tuple[Stage, Method]]:
    """Each distinct advantage stage that reads only what the engine's advantage hook
    supplies, with the method whose parameters (and defaults) it takes: the method of the
    stage's own name when there is one, else the first registered method using it."""
    out: dict[str, tuple[Stage, Method]] = {}
    for name in sorted(REGISTRY):
        m = REGISTRY[name]
        s = m.advantage
        if not set(s.reads) <= engine.advantage_fields:
            continue
        if s.name not in out or name == s.name:
            out[s.name] = (s, m)
    return out


def with_run(method: Method, run: RunShape) -> Method:
    """`method` with every value it has now kept and its run-derived parameters (None
    defaults with a resolve rule, e.g. ReCo's group size) taken from `run`; then the
    method's run checks."""
    kept = {q.name: method.p[q.name] for q in method.params if method.p[q.name] is not None}
    return method.with_params(kept, run)


def stage_params(stage: Stage, method: Method, given: Mapping[str, Any] | None, where: str) -> Method:
    """`method` with `given` applied, refusing names the stage does not declare."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(stage.params))
    if unknown:
        raise PolicylabError(f"{where}: advantage `{stage.name}` takes {', '.join(stage.params) or 'no parameters'}; "
                             f"got {', '.join(unknown)}")
    return method.with_params(given)


def replace_state(method: Method, engine: Engine):
    """A `ctx.state` for stages run inside an engine: per-run state is not checkpointed
    there, so reading it is refused with the state's name and purpose."""
    docs = {s.name: s.doc for s in method.state}

    class _NoState(dict):
        def __getitem__(self, key):
            raise PolicylabError(
                f"method `{method.name}` with these parameters reads per-run state `{key}` ({docs.get(key, '')}), "
                f"which {engine.name} would not checkpoint; choose parameters that need no state")

    return _NoState()


__all__ = ["Engine", "HostPlan", "FIELD_MEANING", "plan", "plans", "hostable", "by_status", "advantage_stages", "stage_params",
           "replace_state"]
