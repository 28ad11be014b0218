"""The row kernel of the log-prob path: sampler settings checked, the sampler's kept set
and menu restriction, logits [N, V] -> (target log-prob [N], entropy [N]) in chunks of
rows, with the memory-lean target log-prob and detached entropy.

The transform, the entropy and the memory rules are stated once, in
`policylab.models.logprobs` (the public entry points: `token_logprobs`,
`model_logprobs`); this module is what they run.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from policylab.errors import ShapeError
from policylab.models.bf16_backward import active_region

__all__ = ["validate_settings", "kept_set", "restrict_to", "compute_dtype", "row_logprobs", "chunked"]


def validate_settings(temperature: float, top_k: int, top_p: float, chunk_size: int | None) -> None:
    if not temperature > 0:
        raise ValueError(
            f"`temperature` must be > 0, got {temperature} (greedy decoding is not a "
            "distribution: there is no log-prob to compute)"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"`top_k` must be an int >= 0 (0 = off), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"`top_p` must be in (0, 1], got {top_p}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"`chunk_size` must be a positive int or None, got {chunk_size!r}")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.no_grad()
def kept_set(z: torch.Tensor, *, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Bool `[..., V]`: True = the sampler may emit this token.

    `z` are temperature-scaled logits. Same rule and same operations as transformers'
    TopKLogitsWarper then TopPLogitsWarper with min_tokens_to_keep=1 (see the module
    docstring), so equal inputs give the identical set, ties included."""
    V = z.shape[-1]
    keep = torch.ones_like(z, dtype=torch.bool)
    if top_k > 0:
        kth = torch.topk(z, min(top_k, V), dim=-1).values[..., -1:]
        keep = z >= kth
    if top_p < 1.0:
        zk = z.masked_fill(~keep, float("-inf"))
        sorted_z, order = torch.sort(zk, dim=-1, descending=False)
        cum = sorted_z.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= (1 - top_p)
        drop_sorted[..., -1:] = False  # the most likely token always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        keep = keep & ~drop
    return keep


def restrict_to(z: torch.Tensor, allowed_ids: tuple[int, ...]) -> torch.Tensor:
    """`z` [..., V] with -inf outside `allowed_ids` (a menu of token ids); `z` itself when
    `allowed_ids` is empty (no restriction). Raises ShapeError for an id outside [0, V)."""
    if not allowed_ids:
        return z
    V = z.shape[-1]
    if max(allowed_ids) >= V or min(allowed_ids) < 0:
        raise ShapeError(f"allowed_ids {allowed_ids} has ids outside the vocabulary [0, {V})")
    keep = torch.zeros(V, dtype=torch.bool, device=z.device)
    keep[list(allowed_ids)] = True
    return z.masked_fill(~keep, float("-inf"))


def row_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_k: int, top_p: float, with_entropy: bool | str,
    allowed_ids: tuple[int, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, V] -> (logp [N], entropy [N] or an empty tensor).

    Memory: [N, V] intermediates are released as soon as they are spent (the logits and the
    scaled logits once the log-softmax exists; a temperature of 1 divides nothing), and a
    detached entropy is computed `ENTROPY_BLOCK` elements at a time, so the peak beside
    the log-softmax the backward keeps is about one more [N, V] tensor, not five."""
    z = logits.to(compute_dtype(logits.dtype))
    del logits  # this frame held the caller's temporary: the head's output is freed with z
    if temperature != 1.0:  # x / 1.0 == x exactly, value and gradient
        z = z / temperature
    z = restrict_to(z, allowed_ids)
    if top_k > 0 or top_p < 1.0:
        z = z.masked_fill(~kept_set(z, top_k=top_k, top_p=top_p), float("-inf"))
    if with_entropy is True:  # the entropy's gradient is wanted: autograd's own graph
        logp_all = torch.log_softmax(z, dim=-1)
        del z  # the log-softmax's backward reads its output only
        return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy(logp_all)
    return TargetLogProb.apply(z, targets, with_entropy == "detached")


class TargetLogProb(torch.autograd.Function):
    """log_softmax(z)[n, t_n], the same values and bit-identical gradients as autograd's graph
    of `log_softmax(z).gather(-1, t)`, with one [N, V] tensor fewer in the backward.

    That graph's backward builds gather's dense [N, V] gradient, then log_softmax's [N, V]
    input gradient while both it and the kept log-softmax are alive: three [N, V] tensors
    at once (210 MB for 360 positions of a 49,152-token vocabulary in fp32). Here the
    same backward kernel (`torch._log_softmax_backward_data`: g - exp(log_softmax) * sum(g)
    per row) writes its result into the dense gradient it reads, element by element after
    the row's sum, so two are alive (on the CPU, where tests/models/test_logprob_memory.py
    checks it bit for bit; other devices get a fresh output tensor). The kept log-softmax
    is not modified (a second backward with `retain_graph=True` is valid); the backward is
    not itself differentiable (no double backward). With `detached_entropy` each row's
    entropy is returned as well (no gradient reaches it)."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, targets: torch.Tensor, detached_entropy: bool):
        logp_all = torch.log_softmax(z, dim=-1)
        idx = targets.unsqueeze(-1)
        logp = logp_all.gather(-1, idx).squeeze(-1)
        ent = entropy_in_blocks(logp_all) if detached_entropy else logp.new_empty(0)
        ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(logp_all, idx)
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor, _g_entropy):
        logp_all, idx = ctx.saved_tensors
        grad = torch.zeros_like(logp_all).scatter_(-1, idx, g.unsqueeze(-1).to(logp_all.dtype))  # gather's gradient
        if grad.device.type == "cpu":  # the CPU kernel reads a row's gradient before it writes it (tested)
            torch._log_softmax_backward_data(grad, logp_all, -1, logp_all.dtype, out=grad)
            return grad, None, None
        return torch._log_softmax_backward_data(grad, logp_all, -1, logp_all.dtype), None, None


ENTROPY_BLOCK = 1 << 21  # elements per block of a detached entropy (8 MB in fp32)


def entropy_in_blocks(logp_all: torch.Tensor) -> torch.Tensor:
    """`entropy` of [N, V] log-probs without gradient, a block of rows at a time: the
    temporaries (exp, the -inf-free copy, their product) are [rows, V] instead of [N, V].
    Each row's value is the same sum as `entropy`'s, up to the order in which a
    reduction kernel adds it."""
    N, V = logp_all.shape
    rows = max(1, ENTROPY_BLOCK // max(V, 1))
    if N <= rows:
        return entropy(logp_all)
    out = logp_all.new_empty(N)
    for start in range(0, N, rows):
        out[start : start + rows] = entropy(logp_all[start : start + rows])
    return out


def entropy(logp_all: torch.Tensor) -> torch.Tensor:
    """-Σ p log p over the last dim. Dropped tokens have p = 0 and logp = -inf: the -inf is
    replaced by 0 BEFORE the product (nan_to_num, whose gradient there is 0), so neither
    the value nor the gradient (0 * -inf) can become NaN."""
    return -(logp_all.exp() * logp_all.nan_to_num(neginf=0.0)).sum(-1)


def chunked(
    row_logits: Callable[[slice], torch.Tensor],
    source: torch.Tensor,
    targets: torch.Tensor,
    n: int,
    chunk_size: int | None,
    temperature: float,
    top_k: int,
    top_p: float,
    with_entropy: bool | str,
    allowed_ids: tuple[int, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply `row_logprobs` to chunks of N flattened positions.

    `row_logits(src_chunk)` maps a chunk of `source` rows to logits [n_chunk, V]
    (identity for token_logprobs, the lm_head for model_logprobs), so the chunk's
    logits are built, used and freed inside the (checkpointed) chunk."""

    def run(src: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return row_logprobs(row_logits(src), tgt, temperature, top_k, top_p, with_entropy, allowed_ids)

    step = n if chunk_size is None else chunk_size
    recompute = chunk_size is not None and torch.is_grad_enabled()
    out_logp, out_ent = [], []
    for start in range(0, n, max(step, 1)):
        src, tgt = source[start : start + step], targets[start : start + step]
        if recompute:
            lp, ent = checkpoint(run, src, tgt, use_reentrant=False, context_fn=recompute_context)
        else:
            lp, ent = run(src, tgt)
        out_logp.append(lp)
        out_ent.append(ent)
    if not out_logp:  # n == 0
        empty = source.new_empty(0, dtype=compute_dtype(source.dtype))
        return empty, empty
    return torch.cat(out_logp), torch.cat(out_ent)


def recompute_context():
    """(forward, recomputation) contexts of a checkpointed chunk: the recomputation runs in
    the `train.dtype: bf16-backward` region the forward ran in, if any
    (`policylab.models.bf16_backward.active_region`), so it saves the same tensors."""
    region = active_region()
    return contextlib.nullcontext(), (contextlib.nullcontext() if region is None else region)
