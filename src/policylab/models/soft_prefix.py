"""The prefix-injection path of TASCO: a soft prefix of m virtual tokens in front of every
prompt, on a frozen causal LM.

Virtual tokens. The model's vocabulary has V rows; ids V .. V + (K + 1)·m − 1 are virtual:
block 0 (ids V .. V + m − 1) is the prefix P itself, block k >= 1 is P + ξ_k (a seeded
perturbation, for TASCO's stability term). `PrefixEmbedding` replaces the decoder's
`embed_tokens`: real ids look up the frozen embedding, virtual ids read the prefix table.
The prefix P is the only trainable tensor; ξ is a buffer (no gradient, in no optimizer).

Where the prefix enters. `PrefixedLM` wraps the model the trainer sees:

* a prompt that already starts with a virtual block (TASCO's training batches: clean rows
  carry block 0, their perturbed copies block k) goes through unchanged;
* a prompt without one (held-out evaluation, greedy decodes, any other caller) gets
  block 0 inserted right after its left padding, in `generate`, in `forward` and in the
  decoder that `policylab.models.logprobs` and the shared-prompt path call (`get_decoder()`),
  and the outputs are cut back to the caller's layout. A continuation call with a cache
  built on an inserted prefix is recognized by the cache length and shifted to match.

Sampling therefore always goes through the prefix. The FastEngine runs plain Llama
decoders only: the wrapper's decoder exposes no layer list, so `rollout.engine: auto`
falls back to HF `generate` (through `PrefixedLM.generate`), and `rollout.engine: fast`
is refused at construction (tested).
"""

from __future__ import annotations

import torch
from torch import nn

from policylab.errors import PolicylabError


class PrefixEmbedding(nn.Module):
    """Token embedding with a trainable soft prefix and K perturbed copies of it.

    base        the model's frozen nn.Embedding (V rows, shared with a tied output head)
    prefix_init [m, H] initial prefix (copied into the trainable `prefix`)
    n_perturb   K: blocks 1..K read prefix + xi[k − 1]
    """

    def __init__(self, base: nn.Embedding, prefix_init: torch.Tensor, n_perturb: int):
        super().__init__()
        if not isinstance(base, nn.Embedding):
            raise PolicylabError(f"a soft prefix needs a plain nn.Embedding input layer, got {type(base).__name__}")
        if prefix_init.dim() != 2 or prefix_init.shape[1] != base.embedding_dim or prefix_init.shape[0] < 1:
            raise PolicylabError(f"`prefix_init` must be [m, {base.embedding_dim}] with m >= 1, "
                                 f"got {tuple(prefix_init.shape)}")
        self.base = base
        self.vocab = base.num_embeddings
        self.m = prefix_init.shape[0]
        self.n_perturb = int(n_perturb)
        w = base.weight
        self.prefix = nn.Parameter(prefix_init.detach().to(dtype=w.dtype, device=w.device).clone())
        self.register_buffer("xi", torch.zeros(self.n_perturb, self.m, w.shape[1], dtype=w.dtype, device=w.device))

    @property
    def weight(self) -> torch.Tensor:  # the real vocabulary's embedding (tied heads read it)
        return self.base.weight

    @property
    def num_embeddings(self) -> int:
        return self.vocab

    def block(self, k: int) -> list[int]:
        """The m virtual ids of block k (0 = the prefix, k >= 1 = prefix + ξ_k)."""
        if not 0 <= k <= self.n_perturb:
            raise PolicylabError(f"prefix block {k} does not exist (0..{self.n_perturb})")
        start = self.vocab + k * self.m
        return list(range(start, start + self.m))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        top = self.vocab + (self.n_perturb + 1) * self.m
        if ids.numel() and int(ids.max()) >= top:
            raise PolicylabError(f"token id {int(ids.max())} is beyond the virtual prefix ids (< {top})")
        virtual = ids >= self.vocab
        out = self.base(ids.masked_fill(virtual, 0))
        if not bool(virtual.any()):
            return out
        j = (ids - self.vocab).clamp(min=0)
        table = torch.cat([self.prefix.unsqueeze(0), self.prefix.unsqueeze(0) + self.xi], dim=0)  # [K+1, m, H]
        rows = table.reshape(-1, table.shape[-1])[j.clamp(max=table.shape[0] * self.m - 1)]
        return torch.where(virtual.unsqueeze(-1), rows.to(out.dtype), out)

    @torch.no_grad()
    def redraw(self, generator: torch.Generator, sigma: float) -> None:
        """ξ_k ~ N(0, (σ·s)² I), s = the RMS of the real embedding rows (fixed), drawn from
        `generator` (the method's checkpointed generator: same seed, same perturbations)."""
        scale = float(sigma) * float(self.base.weight.detach().double().pow(2).mean().sqrt())
        noise = torch.randn(self.xi.shape, generator=generator, dtype=torch.float64)
        self.xi.copy_((scale * noise).to(self.xi.dtype))


def _has_block(ids: torch.Tensor, mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B] bool: the row's first real token is virtual (the prompt carries a prefix block)."""
    first = mask.long().argmax(-1)
    return ids.gather(1, first.unsqueeze(-1)).squeeze(-1) >= vocab


def insert_block(ids: torch.Tensor, mask: torch.Tensor, block: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L] left-padded ids and bool-able mask -> [B, L + m] with `block` right after each
    row's left padding (the row stays left-padded; its real columns shift by m)."""
    B, L = ids.shape
    m = len(block)
    mask = mask.bool()
    n_pad = L - mask.long().sum(-1)  # rows are left-padded: real tokens fill the tail
    new_ids = torch.zeros((B, L + m), dtype=ids.dtype, device=ids.device)
    new_mask = torch.zeros((B, L + m), dtype=torch.bool, device=ids.device)
    blk = torch.tensor(block, dtype=ids.dtype, device=ids.device)
    for b in range(B):
        p = int(n_pad[b])
        new_ids[b, :p] = ids[b, :p]
        new_ids[b, p:p + m] = blk
        new_ids[b, p + m:] = ids[b, p:]
        new_mask[b, :p] = mask[b, :p]
        new_mask[b, p:p + m] = True
        new_mask[b, p + m:] = mask[b, p:]
    return new_ids, new_mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).masked_fill(~mask.bool(), 0)


class PrefixedDecoder:
    """What `get_decoder()` returns: the inner decoder with block 0 inserted into prompts
    that lack a prefix (see the module docstring). Not an nn.Module: it owns nothing."""

    def __init__(self, lm: "PrefixedLM"):
        self.lm = lm
        self.inner = lm.inner.get_decoder()

    def __call__(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, **kw):
        emb, m = self.lm.embedding, self.lm.embedding.m
        mask = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        if cache is not None and cache.get_seq_length() > 0:
            past = cache.get_seq_length()
            if past == mask.shape[1] - input_ids.shape[1]:
                return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                  cache=cache, **kw)
            if past != mask.shape[1] - input_ids.shape[1] + m:
                raise PolicylabError(f"soft prefix: a cache of {past} positions does not fit an attention mask "
                                     f"of {mask.shape[1]} columns and {input_ids.shape[1]} new tokens")
            n_new = input_ids.shape[1]
            _, new_mask = insert_block(torch.zeros_like(mask[:, :-n_new], dtype=torch.long), mask[:, :-n_new],
                                       [0] * m)
            new_mask = torch.cat([new_mask, mask[:, -n_new:]], dim=1)
            pos = _positions(new_mask)[:, -n_new:]
            return self.inner(input_ids=input_ids, attention_mask=new_mask.long(), position_ids=pos, cache=cache, **kw)
        has = _has_block(input_ids, mask, emb.vocab)
        if bool(has.all()):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              cache=cache, **kw)
        if bool(has.any()):
            raise PolicylabError("soft prefix: some prompts of the batch carry a prefix block and some do not")
        new_ids, new_mask = insert_block(input_ids, mask, emb.block(0))
        out = self.inner(input_ids=new_ids, attention_mask=new_mask.long(), position_ids=_positions(new_mask),
                         cache=cache, **kw)
        out.last_hidden_state = out.last_hidden_state[:, m:]
        return out


class PrefixedLM(nn.Module):
    """A causal LM with a soft prefix in front of every prompt (see the module docstring).
    `inner` is the original model, its `embed_tokens` replaced by `embedding`."""

    def __init__(self, inner: nn.Module, embedding: PrefixEmbedding):
        super().__init__()
        self.inner = inner
        inner.get_decoder().embed_tokens = embedding
        self.config = inner.config

    @property
    def embedding(self) -> PrefixEmbedding:
        return self.inner.get_decoder().embed_tokens

    @property
    def generation_config(self):
        return self.inner.generation_config

    @generation_config.setter
    def generation_config(self, value) -> None:
        self.inner.generation_config = value

    def get_decoder(self) -> PrefixedDecoder:
        return PrefixedDecoder(self)

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def get_input_embeddings(self):
        return self.embedding

    def tie_weights(self, *args, **kwargs) -> None:
        """The output head stays tied: the frozen base embedding keeps its Parameter."""
        head = self.get_output_embeddings()
        if getattr(self.config, "tie_word_embeddings", False) and head.weight is not self.embedding.base.weight:
            head.weight = self.embedding.base.weight

    def _prepared(self, input_ids, attention_mask):
        mask = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        has = _has_block(input_ids, mask, self.embedding.vocab)
        if bool(has.all()):
            return input_ids, mask, 0
        if bool(has.any()):
            raise PolicylabError("soft prefix: some prompts of the batch carry a prefix block and some do not")
        ids, mask = insert_block(input_ids, mask, self.embedding.block(0))
        return ids, mask, self.embedding.m

    def forward(self, input_ids=None, attention_mask=None, **kw):
        """The inner model's forward on the prefixed prompts; logits cut to the caller's columns."""
        kw.pop("position_ids", None)
        ids, mask, m = self._prepared(input_ids, attention_mask)
        out = self.inner(input_ids=ids, attention_mask=mask.long(), position_ids=_positions(mask), **kw)
        if m:
            out.logits = out.logits[:, m:]
        return out

    @torch.no_grad()
    def generate(self, input_ids=None, attention_mask=None, **kw):
        """HF `generate` of the inner model on the prefixed prompts; `sequences` come back in
        the caller's layout (its prompt columns, then the generated tokens)."""
        ids, mask, m = self._prepared(input_ids, attention_mask)
        out = self.inner.generate(input_ids=ids, attention_mask=mask.long(), **kw)
        if not m:
            return out
        if torch.is_tensor(out):  # return_dict_in_generate=False: the sequences alone
            return torch.cat([input_ids, out[:, ids.shape[1]:]], dim=1)
        out.sequences = torch.cat([input_ids, out.sequences[:, ids.shape[1]:]], dim=1)
        return out


def attach_prefix(model: nn.Module, tokenizer, *, init_text: str, n_perturb: int) -> PrefixedLM:
    """Freeze `model` and wrap it with a soft prefix initialized from the embeddings of the
    tokens of `init_text` (m = their number). Returns the wrapper; only its prefix has
    `requires_grad`."""
    if isinstance(model, PrefixedLM):
        raise PolicylabError("the model already carries a soft prefix")
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    base = getattr(decoder, "embed_tokens", None)
    if not isinstance(base, nn.Embedding):
        raise PolicylabError(f"a soft prefix needs a decoder with an nn.Embedding `embed_tokens`; "
                             f"{type(model).__name__} has none (LoRA wrappers are not supported: train.lora_rank=0)")
    ids = tokenizer(init_text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise PolicylabError(f"the prefix initialization text {init_text!r} has no tokens")
    model.requires_grad_(False)
    with torch.no_grad():
        init = base.weight[torch.tensor(ids)].clone()
    return PrefixedLM(model, PrefixEmbedding(base, init, n_perturb))
