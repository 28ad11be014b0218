"""Per-token log-probabilities and entropy, consistent with the sampler.

This is the ONE code path that turns logits into log-probs: the rollout engine check,
`logp_old`, `logp_ref` and the learner's `logp` all go through `token_logprobs`, so a
ratio between two roles never compares two different transforms.

The transform is the one HF `generate(do_sample=True)` applies before it samples
(transformers' TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, in that
order, with `min_tokens_to_keep=1`):

    z      = logits / temperature                          (in fp32, or fp64 for fp64 input)
    top-k  : keep every v with z_v >= (k-th largest z)     (ties at the k-th value are all kept)
    top-p  : sort z ascending, c = cumsum(softmax(z_sorted)); drop the entries with
             c <= 1 - top_p, but always keep the largest one; computed on the top-k
             survivors (dropped entries are -inf and weigh 0)
    logp_v = z_v - logsumexp_{u kept} z_u                  (-inf for v outside the kept set)

`top_k=0` and `top_p=1.0` switch the truncations off (plain log-softmax of z).

A menu restriction (`SamplingSettings.allowed_ids`, a tuple of token ids; () = off) sets
z_v = -inf for every v outside the menu right after the temperature, so the distribution
is softmax over the menu only (`restrict_to`). The engines apply the same restriction
before they draw, so the log-probs of a restricted batch are those of the distribution
that sampled it (docs/conventions.md rule 9). It is not combined with top-k / top-p
(`SamplingSettings` refuses that).

Entropy (`with_entropy=True`) is the entropy of that same sampling distribution,
H = -sum_{v kept} p_v log p_v, in nats; `with_entropy="detached"` returns the same values
without a graph (a metric only: cheaper, and no gradient can reach it).

Memory: the flattened B*T positions (not the vocabulary) are processed `chunk_size` rows at a time; when a
gradient is needed each chunk is recomputed in the backward pass
(torch.utils.checkpoint), so only one chunk's [chunk, V] intermediates are alive at a
time. Without `chunk_size` everything is one chunk (no recomputation). Within a chunk the
log-prob of the target keeps one [chunk, V] tensor for the backward, whose backward
writes the gradient into its own input buffer (`logprob_rows.TargetLogProb`), and every other
[chunk, V] intermediate is freed as soon as it is spent.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from policylab.kernels.checks import check_mask
from policylab.batch import SamplingSettings
from policylab.errors import NonFiniteError, ShapeError
from policylab.models.logprob_rows import chunked, kept_set, restrict_to, validate_settings

__all__ = ["token_logprobs", "model_logprobs", "kept_set", "restrict_to"]


def _menu(allowed_ids) -> str:
    return f", allowed_ids={tuple(allowed_ids)}" if allowed_ids else ""


def _finish(
    logp: torch.Tensor,
    ent: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None,
    with_entropy: bool | str,
    settings: str,
):
    """Reshape, refuse -inf/NaN at counted positions, put 0 at uncounted ones."""
    shape = targets.shape
    logp = logp.reshape(shape)
    counted = torch.ones_like(targets, dtype=torch.bool) if mask is None else mask
    bad = ~torch.isfinite(logp) & counted
    if bool(bad.any()):
        idx = tuple(bad.nonzero()[0].tolist())
        value = logp[idx].item()
        tok = int(targets[idx])
        if value == float("-inf"):
            raise NonFiniteError(
                f"target token {tok} at position {list(idx)} is outside the sampler's kept set "
                f"under {settings} (its log-prob is -inf), so it cannot have been sampled with "
                f"these settings ({int(bad.sum())} such position(s)). Check that the batch's "
                "SamplingSettings are the ones the engine used; an engine with other numerics "
                "(bf16, another kernel) can put a boundary token on the other side of the cut."
            )
        raise NonFiniteError(
            f"log-prob is {value} at position {list(idx)} ({int(bad.sum())} non-finite "
            "position(s)): the logits contain NaN or inf"
        )
    if mask is not None:
        logp = torch.where(mask, logp, torch.zeros_like(logp))
    if not with_entropy:
        return logp
    ent = ent.reshape(shape)
    if mask is not None:
        ent = torch.where(mask, ent, torch.zeros_like(ent))
    return logp, ent


# ----------------------------------------------------------------------------------------
# public
# ----------------------------------------------------------------------------------------
def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool | str = False,
    mask: torch.Tensor | None = None,
    allowed_ids: tuple[int, ...] = (),
):
    """Log-prob of each target under the sampler's distribution, `[B, T]`.

    logits  [B, T, V]  entry (b, t) is the distribution of targets[b, t]
    targets [B, T]     long token ids
    mask    [B, T]     optional bool, True = the position counts. Only counted positions
                       are checked (see Raises); uncounted ones return exactly 0 for logp
                       and entropy (padding, not a log-prob). Without a mask every
                       position counts.

    Returns `logp [B, T]`, or `(logp [B, T], entropy [B, T])` with `with_entropy`.
    fp32 math for fp16/bf16/fp32 input (fp64 stays fp64); the output has that dtype.
    Differentiable w.r.t. `logits` (the kept set itself is a discrete choice and carries
    no gradient). `allowed_ids`: the sampler's menu restriction (() = none). Transform and
    memory behavior: see the module docstring.

    Raises ValueError for temperature <= 0, bad top_k / top_p / chunk_size;
    ShapeError for mismatched shapes or ids outside [0, V); NonFiniteError if a counted
    target is outside the kept set (log-prob -inf: it cannot have been sampled under
    these settings) or the logits are NaN/inf there.
    """
    validate_settings(temperature, top_k, top_p, chunk_size)
    if logits.dim() != 3 or not logits.is_floating_point():
        raise ShapeError(f"`logits` must be a float [B, T, V] tensor, got {logits.dtype} {tuple(logits.shape)}")
    if targets.shape != logits.shape[:2] or targets.dtype != torch.long:
        raise ShapeError(
            f"`targets` must be long [B, T] = {tuple(logits.shape[:2])}, got {targets.dtype} {tuple(targets.shape)}"
        )
    if mask is not None:
        check_mask(mask, "mask")
        if mask.shape != targets.shape:
            raise ShapeError(f"`mask` has shape {tuple(mask.shape)} but `targets` has {tuple(targets.shape)}")
    V = logits.shape[-1]
    if targets.numel() and bool(((targets < 0) | (targets >= V)).any()):
        raise ShapeError(f"`targets` has ids outside [0, {V})")
    flat = logits.reshape(-1, V)
    lp, ent = chunked(
        lambda rows: rows, flat, targets.reshape(-1), flat.shape[0], chunk_size,
        temperature, top_k, top_p, with_entropy, tuple(allowed_ids),
    )
    settings = f"temperature={temperature}, top_k={top_k}, top_p={top_p}" + _menu(allowed_ids)
    return _finish(lp, ent, targets, mask, with_entropy, settings)


def model_logprobs(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_width: int,
    *,
    sampling: SamplingSettings,
    chunk_size: int | None = None,
    with_entropy: bool | str = False,
    response_only_logits: bool = True,
    mask: torch.Tensor | None = None,
):
    """Log-probs of the response tokens under a causal LM, `[B, T]`, T = L - prompt_width.

    tokens          [B, L] long, left-padded prompt (prompt_width columns) then response
    attention_mask  [B, L] bool, True = real token (a RolloutBatch's own masks fit as is)

    One forward with position ids counted over real tokens (cumsum of the mask - 1, so
    left padding does not shift positions, as in HF generate). Hidden states at
    positions prompt_width-1 ... L-2 predict tokens prompt_width ... L-1; with
    `response_only_logits` only those go through the output head (split with
    `get_decoder()`/`base_model` and `get_output_embeddings()`), in `chunk_size`
    chunks, so [B, L, V] logits are never built. Gemma-style
    `config.final_logit_softcapping` is applied; a model that changes its logits after
    the head in any other way needs `response_only_logits=False` (full forward, logits
    sliced to the response positions). Under bf16 autocast the split path runs the
    decoder in bf16 and the head and log-softmax in fp32 (`logprobs_from_hidden`); the
    full-forward path takes the logits as the model computes them under autocast.

    The log-probs then come from `token_logprobs` under `sampling` with `mask`
    ([B, T] bool, default `attention_mask[:, prompt_width:]`): response padding (after
    EOS) gives exactly 0, and a counted token outside the sampler's kept set raises
    (pass a narrower mask, e.g. the loss mask, to score only some tokens).
    Returns logp [B, T] (or (logp, entropy)); differentiable w.r.t. the model.
    """
    if tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ShapeError(f"`tokens` must be long [B, L], got {tokens.dtype} {tuple(tokens.shape)}")
    check_mask(attention_mask, "attention_mask")
    if attention_mask.shape != tokens.shape:
        raise ShapeError(f"`attention_mask` {tuple(attention_mask.shape)} != `tokens` {tuple(tokens.shape)}")
    L = tokens.shape[1]
    if not 1 <= prompt_width < L:
        raise ShapeError(f"`prompt_width` must be in [1, {L}) for L = {L}, got {prompt_width}")
    s = sampling
    validate_settings(s.temperature, s.top_k, s.top_p, chunk_size)
    targets = tokens[:, prompt_width:]
    if mask is None:
        mask = attention_mask[:, prompt_width:]
    check_mask(mask, "mask")
    if mask.shape != targets.shape:
        raise ShapeError(f"`mask` must be [B, T] = {tuple(targets.shape)}, got {tuple(mask.shape)}")
    # the last position predicts nothing we score: feed L-1 tokens
    inp, am = tokens[:, :-1], attention_mask[:, :-1]
    position_ids = (am.long().cumsum(-1) - 1).masked_fill(~am, 0)
    if response_only_logits:
        decoder, head, softcap = split_head(model)
        out = decoder(input_ids=inp, attention_mask=am.long(), position_ids=position_ids, use_cache=False)
        hidden = out.last_hidden_state[:, prompt_width - 1 :]
        return logprobs_from_hidden(hidden, head, softcap, targets, mask, sampling=s, chunk_size=chunk_size,
                                    with_entropy=with_entropy)
    logits = model(input_ids=inp, attention_mask=am.long(), position_ids=position_ids, use_cache=False).logits
    return token_logprobs(
        logits[:, prompt_width - 1 :], targets, temperature=s.temperature, top_k=s.top_k,
        top_p=s.top_p, chunk_size=chunk_size, with_entropy=with_entropy, mask=mask, allowed_ids=s.allowed_ids,
    )


def logprobs_from_hidden(hidden: torch.Tensor, head, softcap: float | None, targets: torch.Tensor,
                         mask: torch.Tensor, *, sampling: SamplingSettings, chunk_size: int | None = None,
                         with_entropy: bool | str = False):
    """The response tail of `model_logprobs`: final hidden states [B, T, H] at the positions
    that predict `targets` [B, T] -> the output head (with the softcap, if any), in
    `chunk_size` chunks -> log-probs under `sampling`, 0 outside `mask` (and entropy).
    Shared with the shared-prefix path (`policylab.models.prefix`). Under autocast (bf16
    training) the head and everything after it run in fp32 (autocast off there)."""
    s = sampling

    def row_logits(h: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(h.device.type):
            # bf16 training (`train.dtype: bf16`): the decoder body ran in bf16; the output
            # head, the softcap and the log-softmax run in fp32 on the fp32 master weights,
            # so every log-prob a ratio is formed from has fp32 logits
            with torch.autocast(h.device.type, enabled=False):
                z = _head(head, h.float())
        else:
            z = _head(head, h)
        return z if softcap is None else torch.tanh(z / softcap) * softcap

    flat = hidden.reshape(-1, hidden.shape[-1])
    lp, ent = chunked(
        row_logits, flat, targets.reshape(-1), flat.shape[0], chunk_size,
        s.temperature, s.top_k, s.top_p, with_entropy, s.allowed_ids,
    )
    settings = f"temperature={s.temperature}, top_k={s.top_k}, top_p={s.top_p}" + _menu(s.allowed_ids)
    return _finish(lp, ent, targets, mask, with_entropy, settings)


class _PlainGrad(torch.autograd.Function):
    """The identity on a weight, whose backward hands on its gradient as a tensor that is
    not a view (same storage, no copy)."""

    @staticmethod
    def forward(ctx, w: torch.Tensor) -> torch.Tensor:
        return w.view_as(w)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        return g.detach()


def _head(head, h: torch.Tensor) -> torch.Tensor:
    """The output head on hidden states h. For a plain linear head whose weight is also the
    input embedding (SmolLM2, Llama 3.2, Gemma), the head's weight gradient is computed
    first in the backward and waits at the weight for the embedding's, which comes last.
    It arrives as a view (the transpose of the matrix product's [H, V] output), and
    autograd adds a second gradient in place only into a tensor that is not a view: it
    allocates a third [V, H] buffer for the sum instead (108 MB for SmolLM2-135M in fp32),
    at the end of the backward, where the step's memory peaks. `_PlainGrad` hands the
    same storage on as a plain tensor, so the embedding's gradient is added into it: the
    same two tensors summed in the same order, one [V, H] buffer fewer. An untied head's
    gradient goes to its weight alone, where a plain tensor changes nothing (no copy is
    made either way), so every plain linear head takes the same path."""
    if type(head) is torch.nn.Linear and head.weight.requires_grad and torch.is_grad_enabled():
        return F.linear(h, _PlainGrad.apply(head.weight), head.bias)
    return head(h)


def split_head(model: torch.nn.Module):
    """(decoder returning last_hidden_state, output head, softcap or None) of a causal LM."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or decoder is model:
        base = getattr(model, "base_model", None)
        decoder = base if base is not model else None
    if head is None or decoder is None:
        raise ValueError(
            f"cannot split {type(model).__name__} into a decoder and an output head "
            "(no get_decoder()/base_model or get_output_embeddings()); pass "
            "response_only_logits=False to use the full forward instead"
        )
    config = getattr(model, "config", None)
    softcap = getattr(config, "final_logit_softcapping", None) if config is not None else None
    return decoder, head, softcap
