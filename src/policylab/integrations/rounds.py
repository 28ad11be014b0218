"""The round extension: a method's update-round stages run on an engine's whole batch,
and the fields its loss reads carried to the engine's micro-batch loss as columns.

An engine calls a loss per micro-batch and has no hook in between; policylab runs, once
per update round over the whole batch, the round stages (GMC's group-capped weights,
SIS's acceptance draws, ERPO's reference drift, the exact-old check, ...) and then the
advantage stage. The extension is the same for every engine:

1. at the point where the engine holds the whole batch with its log-prob passes done (TRL:
   after scoring a generation batch; verl: in the driver, in place of its
   `compute_advantage`), the engine's tensors become a `RolloutBatch` (`hosted_batch`);
   external rows (demonstrations, gold, hints, peers, external rollouts) arrive already
   appended, with their provenance (`source`, `producer`) and behavior log-probs on
   `behavior_mask`;
2. `run_round` runs the method's round stages and advantage stage on it, exactly as
   `policylab.trainer.loop.Trainer.round_inputs` does (same stages, same `apply_changes`
   checks, the method's per-run state objects);
3. `to_columns` turns every per-row / per-token field of the resulting batch into engine
   columns (``policylab.<field>`` tensors whose first dimension is the row): the engine
   splits them into micro-batches with its own tensors (TRL's dict slicing, verl's
   TensorDict mini/micro-batching), so each micro-batch carries its own rows' fields;
4. in the loss hook, `loss_batch` rebuilds the micro-batch's `RolloutBatch` from its
   columns, and `methods.loss.loss_terms` composes the loss from it: nothing is
   re-implemented.

Normalizers of a method's extra loss terms (VAPO's NLL, TTPO's self-distillation) are
taken over the whole batch here (``policylab.norm.<term>``): exact when the round is one
optimizer step (one mini-batch), which the engine adapters check.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from policylab.batch import RolloutBatch
from policylab.batch.rollout import SOURCE_KINDS
from policylab.errors import PolicylabError
from policylab.kernels import aggregate as agg
from policylab.methods.context import StageContext
from policylab.methods.loss import term_masks
from policylab.methods.spec import LossInputs, Method, RunShape
from policylab.trainer.rollout import apply_changes

PREFIX = "policylab."
ROW = PREFIX + "row"
NORM = PREFIX + "norm."
_PRODUCER_WIDTH = 96  # bytes of a producer identity carried per row
_TENSOR_FIELDS = ("group", "policy_version", "logp_behavior", "behavior_mask", "logp_current", "values", "rewards",
                  "token_rewards", "reward_vectors", "reward_intervals", "greedy_rewards")


ENTROPY = "worker_entropy"  # extras key (column policylab.extras.worker_entropy): the engine's old-pass entropy


class PassWorker:
    """The worker calls a round stage may make inside an engine, served from what the
    engine's own passes computed (columns of its batch), never from a model: the
    full-vocabulary entropy at the round's start (`vocab_stats`; verl's old-logprob pass
    computes it, kept as ``policylab.extras.worker_entropy``). Anything else is refused."""

    def __init__(self, engine: str):
        self.engine = engine

    def vocab_stats(self, batch: RolloutBatch, *, kl_to_reference: bool = False) -> dict[str, torch.Tensor]:
        if kl_to_reference:
            raise PolicylabError(f"a full-vocabulary KL to the reference was asked for; {self.engine}'s passes "
                                 "compute the full-vocabulary entropy only")
        ent = batch.extras.get(ENTROPY)
        if ent is None:
            raise PolicylabError(f"this method reads the full-vocabulary entropy at the round's start, and "
                                 f"{self.engine}'s batch has no column {PREFIX}extras.{ENTROPY} (the old-logprob "
                                 "pass's entropy, kept: see policylab.integrations.verl.rounds.keep_entropy)")
        if tuple(ent.shape) != tuple(batch.loss_mask.shape):
            raise PolicylabError(f"{PREFIX}extras.{ENTROPY} has shape {tuple(ent.shape)}, the responses "
                                 f"{tuple(batch.loss_mask.shape)}")
        return {"entropy": torch.where(batch.loss_mask, ent, torch.zeros((), dtype=ent.dtype))}


def context(method: Method, stage, state: Mapping[str, Any], run: RunShape, batch: RolloutBatch,
            policy_version: int = 0, engine: str = "the engine") -> StageContext:
    """The context a round or advantage stage sees inside an engine: the method's
    parameters and per-run state; as worker only `PassWorker` (the engine's own passes),
    seen through the stage's declared needs (a stage that needs more is refused by the
    hosting plan)."""
    ctx = StageContext(p=method.view(stage), state=dict(state), run=run, policy_version=policy_version,
                       sampling=batch.sampling, rollout=None, worker=PassWorker(engine), score=None, next_train=None,
                       encode=None, new_groups=None, decode=None, task_reward=None, batch_tag=batch.batch_id)
    return ctx.for_stage(method, stage)


def run_round(method: Method, batch: RolloutBatch, state: Mapping[str, Any], run: RunShape,
              policy_version: int = 0, engine: str = "the engine"):
    """The method's round stages, then its advantage stage, on the whole batch (as
    `Trainer.round_inputs`). Returns (batch with the stages' fields, Advantages, metrics)."""
    metrics: dict = {}
    if "logp_current" in method.roles and batch.logp_current is None:
        raise PolicylabError(f"method `{method.name}` reads logp_current (the learner at the start of the round); "
                             "the engine's batch has none")
    for stage in method.active("round"):
        changes, info = stage.fn(batch, context(method, stage, state, run, batch, policy_version, engine))
        batch = apply_changes(batch, changes, stage)
        metrics.update(info)
    with torch.no_grad():
        A = method.advantage.fn(batch, context(method, method.advantage, state, run, batch, policy_version, engine))
    return batch, A, metrics


def norms(method: Method, batch: RolloutBatch) -> dict[str, float]:
    """Each loss term's normalizer over the whole batch (one optimizer step), as
    `backends.update.plan_step` computes them."""
    return {name: (agg.normalizer(mask, mode, L_norm=L) if bool(mask.any()) else 0.0)
            for name, (mask, mode, L) in term_masks(method, batch).items()}


def _producer_bytes(names) -> torch.Tensor:
    out = torch.zeros((len(names), _PRODUCER_WIDTH), dtype=torch.uint8)
    for i, n in enumerate(names):
        b = n.encode()
        if len(b) > _PRODUCER_WIDTH:
            raise PolicylabError(f"producer identity {n!r} is longer than {_PRODUCER_WIDTH} bytes")
        out[i, : len(b)] = torch.tensor(list(b), dtype=torch.uint8)
    return out


def _producer_names(t: torch.Tensor) -> tuple[str, ...]:
    return tuple(bytes(int(x) for x in row if int(x) != 0).decode() for row in t.cpu())


def to_columns(method: Method, batch: RolloutBatch, *, with_norms: bool = True) -> dict[str, torch.Tensor]:
    """Every per-row / per-token field of `batch` the loss may read, as engine columns
    (first dimension = row), plus the row index, the provenance and the whole-batch
    normalizers of the method's loss terms."""
    B = batch.size
    cols: dict[str, torch.Tensor] = {ROW: torch.arange(B)}
    for f in _TENSOR_FIELDS:
        v = getattr(batch, f)
        if v is not None:
            cols[PREFIX + f] = v
    if batch.source:
        cols[PREFIX + "source"] = torch.tensor([SOURCE_KINDS.index(s) for s in batch.source])
    if batch.producer:
        cols[PREFIX + "producer"] = _producer_bytes(batch.producer)
    for kind in ("outcome", "extras"):
        for k, v in getattr(batch, kind).items():
            if torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == B:
                cols[f"{PREFIX}{kind}.{k}"] = v
            elif torch.is_tensor(v) and v.dim() == 0:  # a batch-level scalar: one copy per row
                cols[f"{PREFIX}{kind}0.{k}"] = v.expand(B).clone()
    for name, n in (norms(method, batch) if with_norms else {}).items():
        cols[NORM + name] = torch.full((B,), float(n), dtype=torch.float64)
    cols[PREFIX + "rows_total"] = torch.full((B,), B, dtype=torch.long)
    return cols


def decode(cols: Mapping[str, Any], dev=None):
    """(tensor fields, outcome, extras, source, producer) from policylab columns."""
    fields: dict[str, Any] = {}
    for f in _TENSOR_FIELDS:
        if PREFIX + f in cols:
            fields[f] = torch.as_tensor(cols[PREFIX + f]).to(dev)
    if "behavior_mask" in fields:
        fields["behavior_mask"] = fields["behavior_mask"].bool()
    outcome, extras = {}, {}
    for k, v in cols.items():
        for kind, out in (("outcome", outcome), ("extras", extras)):
            if k.startswith(f"{PREFIX}{kind}."):
                out[k[len(f"{PREFIX}{kind}."):]] = torch.as_tensor(v).to(dev)
            elif k.startswith(f"{PREFIX}{kind}0."):
                out[k[len(f"{PREFIX}{kind}0."):]] = torch.as_tensor(v)[0].to(dev)
    source = tuple(SOURCE_KINDS[int(i)] for i in cols[PREFIX + "source"]) if PREFIX + "source" in cols else ()
    producer = _producer_names(torch.as_tensor(cols[PREFIX + "producer"])) if PREFIX + "producer" in cols else ()
    return fields, outcome, extras, source, producer


def with_columns(batch: RolloutBatch, cols: Mapping[str, Any]) -> RolloutBatch:
    """`batch` (the engine's whole batch) with the fields its policylab columns carry
    (external rows' provenance and behavior log-probs, reward-stage outputs)."""
    fields, outcome, extras, source, producer = decode(cols, batch.tokens.device)
    return dataclasses.replace(batch, **fields, source=source or batch.source, producer=producer or batch.producer,
                               outcome={**batch.outcome, **outcome}, extras={**batch.extras, **extras}).validate()


def loss_batch(cols: Mapping[str, torch.Tensor], mask: torch.Tensor, *, logp_old: torch.Tensor | None = None,
               logp_ref: torch.Tensor | None = None, batch_id: str = "engine") -> RolloutBatch:
    """A micro-batch's `RolloutBatch` rebuilt from its columns (and the roles the engine's
    loss hook passes), response-aligned like `methods.loss.tensor_inputs`."""
    if ROW not in cols:
        raise PolicylabError("the micro-batch carries no policylab columns (policylab.row): the round extension did "
                             "not run on this batch")
    B, T = mask.shape
    dev = mask.device
    fields, outcome, extras, source, producer = decode(cols, dev)
    if "group" not in fields:
        fields["group"] = torch.arange(B, device=dev)
    if "policy_version" not in fields:
        fields["policy_version"] = torch.zeros(B, dtype=torch.long, device=dev)
    return RolloutBatch(tokens=torch.zeros((B, T + 1), dtype=torch.long, device=dev),
                        attention_mask=torch.cat([torch.ones((B, 1), dtype=torch.bool, device=dev), mask], 1),
                        loss_mask=mask, prompt_width=1, batch_id=batch_id, source=source, producer=producer,
                        logp_old=None if logp_old is None else logp_old.detach(), logp_ref=logp_ref,
                        outcome=outcome, extras=extras, **fields).validate()


def loss_inputs(mb: RolloutBatch, logp: torch.Tensor, adv: torch.Tensor, entropy: torch.Tensor | None = None) -> LossInputs:
    """`LossInputs` of a rebuilt micro-batch, as `backends.update.accumulate` builds them."""
    return LossInputs(logp=logp, logp_old=logp.detach() if mb.logp_old is None else mb.logp_old,
                      logp_behavior=mb.logp_behavior, logp_ref=mb.logp_ref, adv=adv, mask=mb.loss_mask,
                      entropy=entropy, batch=mb)


def term_norms(cols: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """The whole-batch normalizers `to_columns` carried (the same value on every row)."""
    return {k[len(NORM):]: float(v.reshape(-1)[0]) for k, v in cols.items() if k.startswith(NORM) and v.numel()}


def columns_of(mapping: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The policylab columns among an engine's micro-batch fields."""
    return {k: v for k, v in mapping.items() if isinstance(k, str) and k.startswith(PREFIX)}


__all__ = ["PREFIX", "ROW", "NORM", "ENTROPY", "PassWorker", "context", "run_round", "norms", "to_columns", "loss_batch", "loss_inputs", "decode", "with_columns",
           "term_norms", "columns_of"]
