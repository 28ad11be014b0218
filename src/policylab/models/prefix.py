"""Shared prompt prefix for the training forward: each distinct prompt is computed once.

A GRPO-style batch holds G responses to each prompt. The plain training forward
(`policylab.models.logprobs.model_logprobs`) runs every row in full, so each prompt goes through
the network G times with identical results. `SharedPrefix` runs the distinct prompt
blocks once (keys/values of every layer and the last prompt hidden state), then each
micro-batch runs only its response tokens, attending to its rows' copies of the prompt's
keys/values.

Gradient. The prompt keys/values are detached into leaf tensors that every micro-batch
reads; each micro-batch's backward accumulates the gradient w.r.t. those leaves, and
`backward()` (after the last micro-batch) sends the accumulated gradient through the
prefix graph once. By linearity of the backward, the weights receive exactly the sum
the full forward of every row would give: the same update up to float rounding
(tests: fp64 agreement with `model_logprobs` for values and gradients, and the trainer's
micro-batch-split invariance with the prefix on).

Cost. With 4 prompts x 8 samples, 45 prompt tokens and ~30 response tokens per row, the
prompt is ~60% of the fed tokens: the forward/backward work drops by about half
(benchmarks/results/prefix_share.md). Memory: the prefix graph of the minibatch's
distinct prompts stays alive until `backward()`; for long prompts and large minibatches
turn it off (`train.shared_prefix: false`).

Requirements: a decoder (`get_decoder()`) that accepts `cache=` / `position_ids=` and
returns `.cache` with per-layer `.keys` / `.values` (transformers >= 5 decoder-only
models; LlamaForCausalLM and PEFT-wrapped Llama tested). Anything else raises
`PolicylabError` naming the option to turn off.
"""

from __future__ import annotations

import torch

from policylab.errors import PolicylabError
from policylab.models.logprob_rows import validate_settings
from policylab.models.logprobs import logprobs_from_hidden, split_head

__all__ = ["SharedPrefix", "distinct_prompts", "shared_prefix_or_none"]


def distinct_prompts(tokens: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int):
    """(unique prompt blocks [U, 2P] = tokens then mask columns, row -> block index [B]).
    Two rows share a block only if their left-padded prompt columns are identical in
    tokens AND mask, so the shared keys/values are exactly each row's own."""
    P = prompt_width
    block = torch.cat([tokens[:, :P], attention_mask[:, :P].long()], dim=1)
    return torch.unique(block, dim=0, return_inverse=True)


class SharedPrefix:
    """One prefix forward per distinct prompt of a minibatch; see the module docstring.

    tokens, attention_mask  [B, P + T] of the whole minibatch (left-padded prompt block)
    prompt_width            P

    Use: `sp = SharedPrefix(model, ...)`, then for each micro-batch
    `sp.logprobs(model, rows, tokens[rows, :P + T'], mask[rows, :P + T'], sampling=...)`
    and its backward, then `sp.backward()` once. Without grad (`torch.no_grad()`),
    `backward()` is a no-op."""

    def __init__(self, model: torch.nn.Module, tokens: torch.Tensor, attention_mask: torch.Tensor,
                 prompt_width: int, *, distinct: tuple[torch.Tensor, torch.Tensor] | None = None):
        P = prompt_width
        if not 1 <= P < tokens.shape[1]:
            raise PolicylabError(f"`prompt_width` must be in [1, {tokens.shape[1]}), got {P}")
        # `distinct`: distinct_prompts(...) of these very tensors, when the caller has it
        uniq, self.inv = distinct if distinct is not None else distinct_prompts(tokens, attention_mask, P)
        self.n_rows, self.n_distinct, self.P = tokens.shape[0], uniq.shape[0], P
        kv, h_last = _prefix(model, uniq, P)
        self._outs = kv + [h_last]
        self._leaves = [t.detach().requires_grad_(t.requires_grad) for t in self._outs]

    def logprobs(self, model, rows: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor, *,
                 sampling, with_entropy: bool | str = False, mask: torch.Tensor | None = None,
                 chunk_size: int | None = None):
        """`model_logprobs` of micro-batch `rows` (indices into the minibatch): tokens and
        attention_mask [R, P + T'] keep all P prompt columns; trailing columns that are
        padding for every row may be cut. Returns logp [R, T'] (or (logp, entropy))."""
        if tokens.shape[1] <= self.P:
            raise PolicylabError(f"micro-batch tokens have {tokens.shape[1]} columns, need > prompt width {self.P}")
        inv = self.inv[rows]
        kv, h = self._leaves[:-1], self._leaves[-1]
        return _suffix_logprobs(model, [_rows_of(t, inv) for t in kv], _rows_of(h, inv), tokens, attention_mask, self.P,
                                sampling=sampling, with_entropy=with_entropy, mask=mask, chunk_size=chunk_size)

    def backward(self) -> None:
        """Send the gradient accumulated on the prompt keys/values through the prefix
        graph (once, after the last micro-batch's backward)."""
        pairs = [(o, leaf.grad) for o, leaf in zip(self._outs, self._leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self._outs, self._leaves = [], []  # free the prefix graph


def shared_prefix_or_none(model: torch.nn.Module, tokens: torch.Tensor, attention_mask: torch.Tensor,
                          prompt_width: int) -> SharedPrefix | None:
    """A `SharedPrefix` of the batch when at least two rows share a prompt, else None
    (nothing to save: the caller runs the plain full forward)."""
    distinct = distinct_prompts(tokens, attention_mask, prompt_width)
    if distinct[0].shape[0] == tokens.shape[0]:
        return None
    return SharedPrefix(model, tokens, attention_mask, prompt_width, distinct=distinct)


def _rows_of(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` of `t` (repeats allowed), with a deterministic backward. `t[index]`
    would accumulate the repeated rows' gradients with index_put_, whose CPU kernel sums
    in a thread-dependent order: measured here, two identical training runs drifted apart
    (weights 9e-6 apart after 2 steps, then different samples). index_select's backward
    (index_add_) sums in a fixed order."""
    return torch.index_select(t, 0, index)


def _prefix(model, uniq: torch.Tensor, P: int):
    """Forward of the distinct prompt blocks: per-layer keys and values
    [U, kv_heads, P, head_dim] (layer 0 keys, layer 0 values, ...) and the final hidden
    state at the last prompt column [U, H] (it predicts the first response token)."""
    decoder, _, _ = split_head(model)
    u_tok, u_mask = uniq[:, :P], uniq[:, P:].bool()
    u_pos = (u_mask.long().cumsum(-1) - 1).masked_fill(~u_mask, 0)
    try:
        out = decoder(input_ids=u_tok, attention_mask=u_mask.long(), position_ids=u_pos, use_cache=True)
        layers = out.cache.layers
        kv = []
        for layer in layers:
            kv += [layer.keys, layer.values]
    except (AttributeError, TypeError) as exc:
        raise PolicylabError(
            f"shared prompt prefix: {type(model).__name__}'s decoder does not return a per-layer key/value "
            f"cache this code can read ({exc}); set train.shared_prefix: false"
        ) from exc
    return kv, out.last_hidden_state[:, P - 1]


def _suffix_logprobs(model, kv, h_last, tokens, attention_mask, P, *, sampling, chunk_size=None,
                     with_entropy=False, mask=None):
    """Log-probs of the response tokens from the rows' prompt keys/values and last prompt
    hidden state: one forward over response tokens 0 .. T'-2 (the last one predicts
    nothing scored), attending to the cache; positions counted over real tokens, as in
    `model_logprobs`."""
    from transformers import DynamicCache

    s = sampling
    validate_settings(s.temperature, s.top_k, s.top_p, chunk_size)
    L = tokens.shape[1]
    targets = tokens[:, P:]
    if mask is None:
        mask = attention_mask[:, P:]
    decoder, head, softcap = split_head(model)
    hidden = h_last[:, None]  # [R, 1, H]: predicts response token 0
    if L - P > 1:
        am = attention_mask[:, :-1]
        pos = (am.long().cumsum(-1) - 1).masked_fill(~am, 0)
        cache = DynamicCache(config=model.config)
        for i in range(len(kv) // 2):
            cache.update(kv[2 * i], kv[2 * i + 1], i)
        suf = decoder(input_ids=tokens[:, P:-1], attention_mask=am.long(), position_ids=pos[:, P:],
                      cache=cache, use_cache=True)
        hidden = torch.cat([hidden, suf.last_hidden_state], dim=1)
    return logprobs_from_hidden(hidden, head, softcap, targets, mask, sampling=sampling, chunk_size=chunk_size,
                                with_entropy=with_entropy)
