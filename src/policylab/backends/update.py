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
from typing import Callable

import torch

from policylab.kernels import aggregate as agg
from policylab.kernels.checks import masked_mean
from policylab.batch import BT_FIELDS, RolloutBatch
from policylab.models.logprobs import model_logprobs
from policylab.methods.loss import loss_terms, term_masks
from policylab.methods.spec import LossInputs, Method
from policylab.models.prefix import shared_prefix_or_none


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
    """bf16 autocast on the training device, or nothing (fp32 / fp64)."""
    if dtype == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class MetricAccumulator:
    """Combines micro-batch metrics: keys ending in /min or /max reduce by min/max,
    counts (_count, /n, /n_tokens, log_ratio_clamped) add up, everything else is a
    token-weighted mean."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, metrics: dict, weight: float) -> None:
        for k, v in metrics.items():
            v = float(v)
            if k.endswith("/min"):
                self.sums[k] = min(self.sums.get(k, math.inf), v)
            elif k.endswith("/max"):
                self.sums[k] = max(self.sums.get(k, -math.inf), v)
            elif k.endswith(("_count", "/n", "/n_tokens", "log_ratio_clamped")):
                self.sums[k] = self.sums.get(k, 0.0) + v
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v * weight
                self.weights[k] = self.weights.get(k, 0.0) + weight

    def result(self) -> dict[str, float]:
        out = {}
        for k, v in self.sums.items():
            w = self.weights.get(k)
            out[k] = v / w if w else v
        return out


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


def optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    method: Method,
    minibatch: RolloutBatch,
    adv: torch.Tensor,
    *,
    micro_batch_size: int,
    dtype: str,
    grad_clip: float,
    old_from_same_forward: bool,
    skip_nonfinite: bool = True,
    chunk_size: int | None = None,
    shared_prefix: bool = False,
    skip_zero_adv: bool = True,
    device: torch.device | str = "cpu",
    grad_transforms: Callable[[torch.nn.Module], dict] | None = None,
    post_step: Callable[[torch.nn.Module], dict] | None = None,
) -> dict[str, float]:
    """Accumulate gradients over micro-batches of `minibatch`, then step once.

    `old_from_same_forward=True` is the single on-policy update: π_old equals π_θ in
    value, so logp_old := sg(logp) of this very forward (ratio exactly 1) instead of a
    separate old-logprob pass. Otherwise `minibatch.logp_old` must be present.

    `shared_prefix=True` computes each distinct prompt of the minibatch once
    (`policylab.models.prefix.SharedPrefix`) when at least two rows share one; micro-batches then
    carry response tokens only. Same loss and gradient up to float rounding (tested).

    `skip_zero_adv=True` leaves out of the forward the rows whose advantage is 0 on every
    counted token when that cannot change the update (`Method.zero_adv_rows_inert`: e.g.
    GRPO's all-equal groups without a KL or entropy term in the loss): they add exactly 0
    to loss and gradient, and still count in the normalizers. The metrics (entropy, ratio
    statistics, clip fractions) then describe the rows that were trained;
    `train/rows_zero_adv_skipped` counts the others. A minibatch with no other row is
    skipped like a no-signal step.

    `grad_transforms(model) -> metrics` runs once after the last micro-batch's backward
    and before clipping and the optimizer step (the method's gradient-level stages);
    `post_step(model) -> metrics` right after the optimizer step (e.g. re-projecting
    constrained weights)."""
    if not old_from_same_forward:
        minibatch.require(method.name, "logp_old")
    norms = {
        name: agg.normalizer(mask, mode, L_norm=L) if bool(mask.any()) else 0.0
        for name, (mask, mode, L) in term_masks(method, minibatch).items()
    }
    if all(n == 0.0 for n in norms.values()):
        # no counted token anywhere: skip the step entirely (a zero-loss step would still
        # move the weights through weight decay and optimizer momentum)
        return {"skipped_no_signal": 1.0, "skipped_nonfinite": 0.0, "tokens": 0.0}
    n_tokens = float(minibatch.loss_mask.sum())  # counted tokens (the skipped rows' included)
    n_skipped = 0
    if skip_zero_adv and method.zero_adv_rows_inert:
        a2 = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(minibatch.loss_mask)
        live = ((a2 != 0) & minibatch.loss_mask).any(-1)
        n_skipped = int(minibatch.size - int(torch.count_nonzero(live)))
        if n_skipped == minibatch.size:
            return {"skipped_no_signal": 1.0, "skipped_nonfinite": 0.0, "tokens": n_tokens,
                    "train/rows_zero_adv_skipped": float(n_skipped)}
        if n_skipped:
            rows = live.nonzero().squeeze(-1)
            minibatch, adv = minibatch.select(rows), adv[rows]
    need_entropy = method.needs_entropy_grad
    acc = MetricAccumulator()
    optimizer.zero_grad(set_to_none=True)
    total = {name: 0.0 for name in norms}
    nonfinite = False
    lengths = minibatch.attention_mask.sum(-1)
    prefix = None
    if shared_prefix:
        with autocast(dtype, device):
            prefix = shared_prefix_or_none(model, minibatch.tokens, minibatch.attention_mask, minibatch.prompt_width)
    if prefix is not None:
        lengths = minibatch.loss_mask.sum(-1)  # micro-batches then carry response tokens only
    for idx in micro_batches(minibatch, micro_batch_size, lengths, method.objective.row_coupling == "group"):
        mb, mb_adv = trim(minibatch.select(idx), adv[idx], keep_prompt=prefix is not None)
        with autocast(dtype, device):
            if prefix is not None:
                logp, entropy = prefix.logprobs(
                    model, idx, mb.tokens, mb.attention_mask,
                    sampling=mb.sampling, chunk_size=chunk_size, with_entropy=True if need_entropy else "detached",
                )
            else:
                logp, entropy = model_logprobs(
                    model, mb.tokens, mb.attention_mask, mb.prompt_width,
                    sampling=mb.sampling, chunk_size=chunk_size, with_entropy=True if need_entropy else "detached",
                )
        inp = LossInputs(logp=logp, logp_old=logp.detach() if old_from_same_forward else mb.logp_old,
                         logp_behavior=mb.logp_behavior, logp_ref=mb.logp_ref, adv=mb_adv, mask=mb.loss_mask,
                         entropy=entropy, batch=mb)
        mats, metrics = loss_terms(method, inp)
        masks = term_masks(method, mb)
        loss = 0.0
        for name, mat in mats.items():
            mask, mode, L = masks[name]
            if norms[name] == 0.0:
                continue  # no counted token of this term in the whole minibatch
            part = agg.aggregate(mat, mask, mode, normalizer=norms[name], L_norm=L)
            total[name] += float(part.detach())
            loss = loss + part
        if not torch.is_tensor(loss):
            continue
        if not torch.isfinite(loss):
            nonfinite = True
            break
        loss.backward()
        w = float(mb.loss_mask.sum())
        m = dict(metrics)
        m["policy/entropy"] = float(masked_mean(entropy, mb.loss_mask))
        if mb.logp_behavior is not None:
            d = (mb.logp_behavior - logp.detach())
            m["mismatch/behavior_vs_current_abs_dlogp"] = float(masked_mean(d.abs(), mb.loss_mask))
        acc.add(m, w)
    if prefix is not None and not nonfinite:
        prefix.backward()  # the prompts' share of the gradient, through the prefix graph once
    out = acc.result()
    if not nonfinite and grad_transforms is not None:
        out.update(grad_transforms(model))
    grad_norm = _grad_norm(model)
    if not math.isfinite(grad_norm):
        nonfinite = True
    out.update({f"loss/{k}": v for k, v in total.items()})
    out["grad_norm"] = grad_norm
    out["tokens"] = n_tokens
    out["train/rows_zero_adv_skipped"] = float(n_skipped)
    if nonfinite and skip_nonfinite:
        optimizer.zero_grad(set_to_none=True)
        out["skipped_nonfinite"] = 1.0
        return out
    if nonfinite:
        raise FloatingPointError("non-finite loss or gradient (train.skip_nonfinite is false)")
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    if post_step is not None:
        out.update(post_step(model))
    if scheduler is not None:
        scheduler.step()
    out["skipped_nonfinite"] = 0.0
    return out


def _grad_norm(model: torch.nn.Module) -> float:
    sq = 0.0
    for p in model.parameters():
        if p.grad is not None:
            sq += float(p.grad.detach().float().pow(2).sum())
    return math.sqrt(sq)
