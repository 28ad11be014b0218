"""One optimizer step over a minibatch, with gradient accumulation over micro-batches.

The loss normalizer of every term is computed once, over the minibatch's final mask,
before any micro-batch runs; each micro-batch then contributes sum(loss)/N_global, so
the accumulated gradient does not depend on how the minibatch is split (tested in fp64).
The loss itself comes from the method (`methods.loss.loss_terms`); this module only
runs forwards, accumulates, applies the method's gradient transforms and steps.
A step whose loss or gradient is non-finite is skipped (no optimizer or scheduler
update) and reported, never applied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import torch

from policylab.batch import BT_FIELDS, RolloutBatch
from policylab.kernels import aggregate as agg
from policylab.kernels.checks import masked_mean
from policylab.methods.diagnostics import MetricReducer
from policylab.methods.loss import loss_terms, term_masks
from policylab.methods.spec import LossInputs, Method
from policylab.models.logprobs import model_logprobs
from policylab.models.prefix import shared_prefix_or_none


@dataclass(frozen=True)
class UpdateSettings:
    """How a policy worker runs an optimizer step (the `train:` section's update fields).

    micro_batch_size  sequences per forward/backward (gradient accumulation inside a step)
    dtype             fp32 | fp64 | bf16 (autocast of the forward) | bf16-backward (fp32 forward, bf16
                      products in the linear layers' backward); fp32 master weights
    device            torch device of the forward (autocast follows it)
    grad_clip         max global gradient norm (0: off)
    skip_nonfinite    a non-finite loss or gradient skips the step (logged) instead of raising
    shared_prefix     each distinct prompt of a minibatch is computed once (same gradient)
    skip_zero_adv     rows that cannot change the update are left out of the forward
    chunk_size        vocabulary chunk of the log-softmax (None: the default)
    """

    micro_batch_size: int = 8
    dtype: str = "fp32"
    device: str = "cpu"
    grad_clip: float = 1.0
    skip_nonfinite: bool = True
    shared_prefix: bool = False
    skip_zero_adv: bool = True
    chunk_size: int | None = None


@dataclass
class Learner:
    """What a step changes and how: the policy, its optimizer, its schedule (None: none) and
    the update settings."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object = None
    settings: UpdateSettings = UpdateSettings()


@dataclass(frozen=True)
class StepHooks:
    """The method's gradient-level stages for one step: `grad(model) -> metrics` after the
    last backward and before clipping; `post(model) -> metrics` right after the step."""

    grad: Callable[[torch.nn.Module], dict] | None = None
    post: Callable[[torch.nn.Module], dict] | None = None


def stage_hook(method: Method, kind: str, ctx) -> Callable[[torch.nn.Module], dict] | None:
    """The method's active `grad` or `poststep` stages as one callable on the model (None
    if there are none): each stage in declaration order, with its own view of `ctx` (a
    `StageContext`), metrics merged. The trainer and the engines' step extension
    (`policylab.integrations.steps`) both build their hooks here."""
    stages = method.active(kind)
    if not stages:
        return None

    def run(model) -> dict:
        out = {}
        for stage in stages:
            out.update(stage.fn(model, ctx.for_stage(method, stage)))
        return out

    return run


def step_hooks(method: Method, ctx) -> StepHooks:
    """`StepHooks` of the method's gradient and post-step stages under `ctx`."""
    return StepHooks(grad=stage_hook(method, "grad", ctx), post=stage_hook(method, "poststep", ctx))


def trim(mb: RolloutBatch, adv: torch.Tensor, *, keep_prompt: bool = False) -> tuple[RolloutBatch, torch.Tensor]:
    """Drop columns that are padding for every sequence of `mb`: leading prompt columns
    (unless `keep_prompt`: a shared prefix covers all of them) and trailing response
    columns. Values at the kept positions are unchanged."""
    att = mb.attention_mask
    P = mb.prompt_width
    real_cols = att[:, :P].any(0).nonzero()
    first = int(real_cols[0]) if real_cols.numel() else P - 1
    first = 0 if keep_prompt else min(first, P - 1)  # keep >= 1 prompt column (it predicts response token 0)
    valid_t = mb.loss_mask.any(0).nonzero()
    T_keep = int(valid_t[-1]) + 1 if valid_t.numel() else 1
    changes = {
        "tokens": mb.tokens[:, first : P + T_keep],
        "attention_mask": att[:, first : P + T_keep],
        "loss_mask": mb.loss_mask[:, :T_keep],
        "prompt_width": P - first,
    }
    for name in BT_FIELDS:
        t = getattr(mb, name)
        if t is not None:
            changes[name] = t[:, :T_keep]
    T_full = mb.loss_mask.shape[1]
    changes["extras"] = {
        k: (v[:, :T_keep] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == T_full else v)
        for k, v in mb.extras.items()
    }
    adv = adv[:, :T_keep] if adv.dim() == 2 else adv
    return dataclasses.replace(mb, **changes), adv


def autocast(dtype: str, device: torch.device | str = "cpu"):
    """The precision region of `train.dtype` on the training device: bf16 autocast
    ("bf16"), fp32 forwards with bf16 backward products ("bf16-backward",
    `policylab.models.bf16_backward`), or nothing (fp32 / fp64)."""
    if dtype == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    if dtype == "bf16-backward":
        from policylab.models.bf16_backward import Bf16Backward

        return Bf16Backward()
    return contextlib.nullcontext()


def micro_batches(minibatch: RolloutBatch, micro_batch_size: int, lengths: torch.Tensor,
                  by_group: bool) -> list[torch.Tensor]:
    """Row indices of each micro-batch: rows sorted by length (longest first) and cut into
    `micro_batch_size` rows (similar lengths waste less compute on padding); with
    `by_group` whole groups are kept together (a group larger than the micro-batch size is
    one micro-batch). The summed gradient does not depend on the grouping."""
    order = torch.argsort(lengths, descending=True, stable=True)
    if not by_group:
        return list(order.split(micro_batch_size))
    groups: dict[int, list[int]] = {}
    for i in order.tolist():
        groups.setdefault(int(minibatch.group[i]), []).append(i)
    out, cur = [], []
    for rows in groups.values():
        if cur and len(cur) + len(rows) > micro_batch_size:
            out.append(torch.tensor(cur))
            cur = []
        cur = cur + rows
    if cur:
        out.append(torch.tensor(cur))
    return out


@dataclass
class StepPlan:
    """What one optimizer step trains on, decided before any forward: the rows (those that
    cannot change the update left out), each loss term's normalizer over the whole
    minibatch's final mask, and the micro-batches. `skipped` holds the step's metrics when
    it has nothing to train."""

    minibatch: RolloutBatch
    adv: torch.Tensor
    norms: dict[str, float]
    n_tokens: float
    n_skipped_rows: int = 0
    skipped: dict | None = None


def plan_step(method: Method, minibatch: RolloutBatch, adv: torch.Tensor, *, skip_zero_adv: bool) -> StepPlan:
    """Normalizers once per optimizer step (so the micro-batch split never changes the
    gradient) and the rows to train. A minibatch with no counted token, or whose every row
    is inert (advantage 0 on every token of a method where such rows add exactly 0), is a
    skipped step: a zero-loss step would still move the weights through weight decay and
    the optimizer's momentum."""
    norms = {name: agg.normalizer(mask, mode, L_norm=L) if bool(mask.any()) else 0.0
             for name, (mask, mode, L) in term_masks(method, minibatch).items()}
    if all(n == 0.0 for n in norms.values()):
        return StepPlan(minibatch, adv, norms, 0.0,
                        skipped={"skipped_no_signal": 1.0, "skipped_nonfinite": 0.0, "tokens": 0.0})
    n_tokens = float(minibatch.loss_mask.sum())  # counted tokens, the left-out rows' included
    if not (skip_zero_adv and method.zero_adv_rows_inert):
        return StepPlan(minibatch, adv, norms, n_tokens)
    a2 = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(minibatch.loss_mask)
    live = ((a2 != 0) & minibatch.loss_mask).any(-1)
    n_skipped = int(minibatch.size - int(torch.count_nonzero(live)))
    if n_skipped == minibatch.size:
        return StepPlan(minibatch, adv, norms, n_tokens, n_skipped, skipped={
            "skipped_no_signal": 1.0, "skipped_nonfinite": 0.0, "tokens": n_tokens,
            "train/rows_zero_adv_skipped": float(n_skipped)})
    if n_skipped:
        rows = live.nonzero().squeeze(-1)
        minibatch, adv = minibatch.select(rows), adv[rows]
    return StepPlan(minibatch, adv, norms, n_tokens, n_skipped)


def _forward(model, mb: RolloutBatch, idx: torch.Tensor, prefix, settings: UpdateSettings, need_entropy: bool):
    """The learner's log-probs and entropy of one micro-batch (the one training forward)."""
    with_entropy = True if need_entropy else "detached"
    with autocast(settings.dtype, settings.device):
        if prefix is not None:
            return prefix.logprobs(model, idx, mb.tokens, mb.attention_mask, sampling=mb.sampling,
                                   chunk_size=settings.chunk_size, with_entropy=with_entropy)
        return model_logprobs(model, mb.tokens, mb.attention_mask, mb.prompt_width, sampling=mb.sampling,
                              chunk_size=settings.chunk_size, with_entropy=with_entropy)


def step_inputs(mb: RolloutBatch, logp: torch.Tensor, adv: torch.Tensor, entropy: torch.Tensor | None, *,
                old_from_same_forward: bool) -> LossInputs:
    """The loss stages' inputs of one micro-batch from its training forward `logp`.

    `old_from_same_forward` (a single on-policy update: this forward runs at the sampling
    weights): π_old := sg(logp), both as `LossInputs.logp_old` (the objective's ratio,
    exactly 1) and on the batch the corrections read (`batch.logp_old`), so an engine
    ratio is k = π_old/μ = exp(sg(logp) − logp_behavior) whichever engine sampled μ.
    Otherwise π_old is the batch's recomputed `logp_old` (the old pass)."""
    if old_from_same_forward:
        mb = dataclasses.replace(mb, logp_old=logp.detach())
    return LossInputs(logp=logp, logp_old=mb.logp_old, logp_behavior=mb.logp_behavior, logp_ref=mb.logp_ref,
                      adv=adv, mask=mb.loss_mask, entropy=entropy, batch=mb)


def _micro_batch_loss(method: Method, mb: RolloutBatch, inp: LossInputs, norms: dict, totals: dict):
    """The micro-batch's share of the step's loss: each term aggregated over its own mask
    with the step's normalizer (None when no term has a counted token here)."""
    mats, metrics = loss_terms(method, inp)
    masks = term_masks(method, mb)
    loss = None
    for name, mat in mats.items():
        mask, mode, L = masks[name]
        if norms[name] == 0.0:
            continue  # no counted token of this term in the whole minibatch
        part = agg.aggregate(mat, mask, mode, normalizer=norms[name], L_norm=L)
        totals[name] += float(part.detach())
        loss = part if loss is None else loss + part
    return loss, metrics


def accumulate(model, method: Method, plan: StepPlan, settings: UpdateSettings, *, old_from_same_forward: bool):
    """Forward and backward over the plan's micro-batches, gradients accumulated.
    Returns (per-term loss totals, reduced metrics, whether a loss was non-finite)."""
    # bf16: one autocast region around the whole accumulation, so the prompt prefix and
    # every micro-batch share autocast's bf16 casts of the weights (made once, freed at the
    # end of the step) instead of each forward keeping its own copy alive until its backward
    with autocast(settings.dtype, settings.device):
        return _accumulate(model, method, plan, settings, old_from_same_forward=old_from_same_forward)


def _backward(loss_or_prefix, settings: UpdateSettings) -> None:
    """A backward inside `accumulate`'s autocast region, with autocast off (nested, so the
    region's cast cache stays): the backward runs as it would outside the region."""
    with torch.autocast(torch.device(settings.device).type, enabled=False):
        loss_or_prefix.backward()


def _accumulate(model, method: Method, plan: StepPlan, settings: UpdateSettings, *, old_from_same_forward: bool):
    minibatch, adv = plan.minibatch, plan.adv
    lengths = minibatch.attention_mask.sum(-1)
    need_entropy = method.needs_entropy_grad
    reducer = MetricReducer()
    totals = {name: 0.0 for name in plan.norms}
    prefix = None
    if settings.shared_prefix:
        prefix = shared_prefix_or_none(model, minibatch.tokens, minibatch.attention_mask, minibatch.prompt_width)
    if prefix is not None:
        lengths = minibatch.loss_mask.sum(-1)  # micro-batches then carry response tokens only
    by_group = method.objective.row_coupling == "group"
    # the engine mismatch |π_old − μ| is logged from this forward when no old pass ran (the
    # round-time diagnostics then had no π_old): in a single on-policy update this forward
    # runs at the sampling weights, so it is π_old in value, whether or not a stage reads it
    old_mismatch = old_from_same_forward and minibatch.logp_old is None and minibatch.logp_behavior is not None
    mismatch_max = 0.0
    for idx in micro_batches(minibatch, settings.micro_batch_size, lengths, by_group):
        mb, mb_adv = trim(minibatch.select(idx), adv[idx], keep_prompt=prefix is not None)
        logp, entropy = _forward(model, mb, idx, prefix, settings, need_entropy)
        inp = step_inputs(mb, logp, mb_adv, entropy, old_from_same_forward=old_from_same_forward)
        mb = inp.batch
        loss, metrics = _micro_batch_loss(method, mb, inp, plan.norms, totals)
        if loss is None:
            continue
        if not torch.isfinite(loss):
            return totals, reducer.result(), True
        _backward(loss, settings)
        m = dict(metrics)
        m["policy/entropy"] = float(masked_mean(entropy, mb.loss_mask))
        if mb.logp_behavior is not None:
            gap = (mb.logp_behavior - logp.detach()).abs()
            m["mismatch/behavior_vs_current_abs_dlogp"] = float(masked_mean(gap, mb.loss_mask))
            if old_mismatch:
                m["mismatch/old_vs_behavior_abs_dlogp_mean"] = m["mismatch/behavior_vs_current_abs_dlogp"]
                if bool(mb.loss_mask.any()):
                    mismatch_max = max(mismatch_max, float(gap[mb.loss_mask].max()))
        reducer.add(m, weight=float(mb.loss_mask.sum()))
    if prefix is not None:
        _backward(prefix, settings)  # the prompts' share of the gradient, through the prefix graph once
    out = reducer.result()
    if old_mismatch and "mismatch/old_vs_behavior_abs_dlogp_mean" in out:
        out["mismatch/old_vs_behavior_abs_dlogp_max"] = mismatch_max
    return totals, out, False


def apply_step(learner: Learner, hooks: StepHooks, out: dict, nonfinite: bool) -> dict:
    """Gradient stages, the non-finite guard, clipping, the optimizer and schedule steps;
    the gradients are freed after the step (read them in a gradient stage)."""
    settings = learner.settings
    if not nonfinite and hooks.grad is not None:
        out.update(hooks.grad(learner.model))
    grad_norm = _grad_norm(learner.model)
    nonfinite = nonfinite or not math.isfinite(grad_norm)
    out["grad_norm"] = grad_norm
    if nonfinite and settings.skip_nonfinite:
        learner.optimizer.zero_grad(set_to_none=True)
        out["skipped_nonfinite"] = 1.0
        return out
    if nonfinite:
        raise FloatingPointError("non-finite loss or gradient (train.skip_nonfinite is false)")
    if settings.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(learner.model.parameters(), settings.grad_clip)
    learner.optimizer.step()
    if hooks.post is not None:
        out.update(hooks.post(learner.model))
    if learner.scheduler is not None:
        learner.scheduler.step()
    # the gradients are spent: free them now, not at the next step's start, so they do not
    # sit beside the sampler's cache and weight copy (540 MB for 135M fp32 parameters)
    learner.optimizer.zero_grad(set_to_none=True)
    out["skipped_nonfinite"] = 0.0
    return out


def optimizer_step(learner: Learner, method: Method, minibatch: RolloutBatch, adv: torch.Tensor, *,
                   old_from_same_forward: bool, hooks: StepHooks = StepHooks()) -> dict:
    """One optimizer step over `minibatch`: plan, accumulate over micro-batches, apply.

    `old_from_same_forward=True` is the single on-policy update: π_old equals π_θ in
    value, so logp_old := sg(logp) of this very forward (ratio exactly 1) instead of a
    separate old-logprob pass, for the objective and for every correction (an engine
    ratio π_old/μ is then exp(sg(logp) − logp_behavior), whichever engine sampled μ);
    otherwise `minibatch.logp_old` must be present.
    `learner.settings.shared_prefix` computes each distinct prompt once when two rows share one
    (`policylab.models.prefix.SharedPrefix`; same loss and gradient up to float rounding).
    With `learner.settings.skip_zero_adv`, rows whose advantage is 0 on every counted token are
    left out of the forward when that cannot change the update
    (`Method.zero_adv_rows_inert`); they still count in the normalizers, and the metrics
    (entropy, ratio statistics, clip fractions) then describe the trained rows."""
    if not old_from_same_forward:
        minibatch.require(method.name, "logp_old")
    plan = plan_step(method, minibatch, adv, skip_zero_adv=learner.settings.skip_zero_adv)
    if plan.skipped is not None:
        return plan.skipped
    learner.optimizer.zero_grad(set_to_none=True)
    totals, out, nonfinite = accumulate(learner.model, method, plan, learner.settings,
                                        old_from_same_forward=old_from_same_forward)
    out.update({f"loss/{k}": v for k, v in totals.items()})
    out["tokens"] = plan.n_tokens
    out["train/rows_zero_adv_skipped"] = float(plan.n_skipped_rows)
    return apply_step(learner, hooks, out, nonfinite)


def _grad_norm(model: torch.nn.Module) -> float:
    sq = 0.0
    for p in model.parameters():
        if p.grad is not None:
            sq += float(p.grad.detach().float().pow(2).sum())
    return math.sqrt(sq)
