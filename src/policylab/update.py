"""One optimizer step over a minibatch, with gradient accumulation over micro-batches.

The loss normalizer of every term is computed once, over the minibatch's final mask,
before any micro-batch runs; each micro-batch then contributes sum(loss)/N_global, so
the accumulated gradient does not depend on how the minibatch is split (tested in fp64).
A step whose loss or gradient is non-finite is skipped (no optimizer or scheduler
update) and reported, never applied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from . import aggregate as agg
from ._checks import masked_mean
from .batch import _BT_FIELDS, RolloutBatch
from .logprobs import model_logprobs
from .methods import stages
from .methods.registry import Recipe
from .prefix import shared_prefix_or_none


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
    for name in _BT_FIELDS:
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


def _autocast(dtype: str):
    if dtype == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
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


def optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    recipe: Recipe,
    minibatch: RolloutBatch,
    adv: torch.Tensor,
    *,
    micro_batch_size: int,
    dtype: str,
    grad_clip: float,
    old_from_same_forward: bool,
    L_norm: float | None,
    skip_nonfinite: bool = True,
    chunk_size: int | None = None,
    shared_prefix: bool = False,
    skip_zero_adv: bool = True,
) -> dict[str, float]:
    """Accumulate gradients over micro-batches of `minibatch`, then step once.

    `old_from_same_forward=True` is the single on-policy update: π_old equals π_θ in
    value, so logp_old := sg(logp) of this very forward (ratio exactly 1) instead of a
    separate old-logprob pass. Otherwise `minibatch.logp_old` must be present.

    `shared_prefix=True` computes each distinct prompt of the minibatch once
    (`policylab.prefix.SharedPrefix`) when at least two rows share one; micro-batches then
    carry response tokens only. Same loss and gradient up to float rounding (tested).

    `skip_zero_adv=True` leaves out of the forward the rows whose advantage is 0 on every
    counted token when that cannot change the update (`stages.zero_advantage_rows_inert`:
    e.g. GRPO's all-equal groups without a KL or entropy term in the loss): they add
    exactly 0 to loss and gradient, and still count in the normalizers. The metrics
    (entropy, ratio statistics, clip fractions) then describe the rows that were trained;
    `train/rows_zero_adv_skipped` counts the others. A minibatch with no other row is
    skipped like a no-signal step."""
    if not old_from_same_forward:
        minibatch.require(recipe.name, "logp_old")
    terms = stages.term_masks(recipe, minibatch)
    def _L(mode):  # the Dr. GRPO constant belongs to one mode only
        return L_norm if mode == "seq_mean_token_sum_norm" else None

    norms = {
        name: agg.normalizer(mask, mode, L_norm=_L(mode)) if bool(mask.any()) else 0.0
        for name, (mask, mode) in terms.items()
    }
    if all(n == 0.0 for n in norms.values()):
        # no counted token anywhere: skip the step entirely (a zero-loss step would still
        # move the weights through weight decay and optimizer momentum)
        return {"skipped_no_signal": 1.0, "skipped_nonfinite": 0.0, "tokens": 0.0}
    n_tokens = float(minibatch.loss_mask.sum())  # counted tokens (the skipped rows' included)
    n_skipped = 0
    if skip_zero_adv and stages.zero_advantage_rows_inert(recipe):
        a2 = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(minibatch.loss_mask)
        live = ((a2 != 0) & minibatch.loss_mask).any(-1)
        n_skipped = int(minibatch.size - int(torch.count_nonzero(live)))
        if n_skipped == minibatch.size:
            return {"skipped_no_signal": 1.0, "skipped_nonfinite": 0.0, "tokens": n_tokens,
                    "train/rows_zero_adv_skipped": float(n_skipped)}
        if n_skipped:
            rows = live.nonzero().squeeze(-1)
            minibatch, adv = minibatch.select(rows), adv[rows]
    need_entropy = recipe.params.get("entropy_coef", 0.0) > 0
    acc = MetricAccumulator()
    optimizer.zero_grad(set_to_none=True)
    total = {name: 0.0 for name in terms}
    nonfinite = False
    # micro-batches of similar lengths waste less compute on padding; the summed gradient
    # does not depend on the grouping (each part is divided by the global normalizer)
    lengths = minibatch.attention_mask.sum(-1)
    prefix = None
    if shared_prefix:
        with _autocast(dtype):
            prefix = shared_prefix_or_none(model, minibatch.tokens, minibatch.attention_mask, minibatch.prompt_width)
    if prefix is not None:
        lengths = minibatch.loss_mask.sum(-1)  # micro-batches then carry response tokens only
    for idx in torch.argsort(lengths, descending=True, stable=True).split(micro_batch_size):
        mb, mb_adv = trim(minibatch.select(idx), adv[idx], keep_prompt=prefix is not None)
        with _autocast(dtype):
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
        logp_old = logp.detach() if old_from_same_forward else mb.logp_old
        loss_mats, metrics = stages.loss_terms(
            recipe, logp, logp_old, mb_adv, mb, entropy=entropy if need_entropy else None
        )
        loss = 0.0
        for name, mat in loss_mats.items():
            mask, mode = stages.term_masks(recipe, mb)[name]
            if norms[name] == 0.0:
                continue  # no counted token of this term in the whole minibatch
            part = agg.aggregate(mat, mask, mode, normalizer=norms[name], L_norm=_L(mode))
            total[name] += float(part.detach())
            loss = loss + part
        if not torch.is_tensor(loss):
            continue
        if not torch.isfinite(loss):
            nonfinite = True
            break
        loss.backward()
        w = float(mb.loss_mask.sum())
        m = {k: v for k, v in metrics.items()}
        m["policy/entropy"] = float(masked_mean(entropy, mb.loss_mask))
        if mb.logp_behavior is not None:
            d = (mb.logp_behavior - logp.detach())
            m["mismatch/behavior_vs_current_abs_dlogp"] = float(masked_mean(d.abs(), mb.loss_mask))
        acc.add(m, w)
    if prefix is not None and not nonfinite:
        prefix.backward()  # the prompts' share of the gradient, through the prefix graph once
    grad_norm = _grad_norm(model)
    if not math.isfinite(grad_norm):
        nonfinite = True
    out = acc.result()
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
