"""LlamaForCausalLM's forward for a decode loop, computed layer by layer from the model's
own modules: prefill, one decode step, output head, over a preallocated key/value cache.
Used by `engines.fast.FastEngine`; see its module docstring for what it must match
(RMSNorm with fp32 statistics, rotary embedding from the model's `inv_freq` and
attention scaling, grouped-query attention, SiLU-gated MLP, final norm, output head).
Other architectures are refused at construction (`UnsupportedModel`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["LlamaDecoder", "UnsupportedModel"]


class UnsupportedModel(ValueError):
    """FastEngine cannot run this model (architecture or setting it does not implement)."""


_SUPPORTED = ("llama",)
_HEAD_BLOCK = 2048  # output-head rows per matmul (see LlamaDecoder.logits)


class LlamaDecoder:
    """LlamaForCausalLM's forward, split into prefill / one decode step / output head,
    over a preallocated cache tensor [2, layers, rows, kv_heads, S, head_dim]
    (keys then values; one index_select on dim 2 compacts every layer's rows)."""

    def __init__(self, model: torch.nn.Module, copy: bool, quant: tuple[int, int] | None = None):
        """copy: keep a bf16 copy of the weights and compute in bf16; quant = (bits, group):
        keep a weight-quantized copy (`engines.quant.fake_quantize`: linears, embedding and
        output head; norms as they are) and compute in the model's dtype on it."""
        cfg = getattr(model, "config", None)
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        mtype = getattr(cfg, "model_type", None)
        if mtype not in _SUPPORTED or decoder is None or head is None or not hasattr(decoder, "layers"):
            raise UnsupportedModel(
                f"FastEngine runs {', '.join(_SUPPORTED)} decoders; this model is "
                f"{type(model).__name__} (model_type {mtype!r}). Use HFEngine (rollout.engine=hf)."
            )
        rope = cfg.rope_parameters if hasattr(cfg, "rope_parameters") else {}
        if (rope or {}).get("rope_type", "default") == "dynamic":
            raise UnsupportedModel("FastEngine does not implement dynamic RoPE scaling; use HFEngine")
        if quant is not None:
            copy = True
        self.model, self.decoder, self.head, self.copy, self.quant = model, decoder, head, copy, quant
        self.layers = list(decoder.layers)
        a0 = self.layers[0].self_attn
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = a0.head_dim
        self.scale = a0.scaling
        self.inv_freq = decoder.rotary_emb.inv_freq
        self.rope_scale = float(decoder.rotary_emb.attention_scaling)
        self._w: dict | None = None
        if copy:
            for layer in self.layers:
                for lin in _linears(layer):
                    if type(lin) is not torch.nn.Linear:
                        raise UnsupportedModel(
                            f"FastEngine with a {'quantized' if quant else 'bf16'} weight copy needs plain "
                            f"torch.nn.Linear projections, found {type(lin).__module__}.{type(lin).__name__} "
                            "(e.g. LoRA): use the model's own weights"
                        )
            if quant is not None:
                from policylab.engines.quant import fake_quantize

                bits, group = quant
                widths = {lin.weight.shape[1] for layer in self.layers for lin in _linears(layer)}
                widths |= {decoder.embed_tokens.weight.shape[1], head.weight.shape[1]}
                bad = sorted(w for w in widths if group and w % group)
                if bad:
                    raise UnsupportedModel(f"quantization group {group} does not divide the input width(s) {bad} "
                                           "of this model; choose a group that does (or 0: one scale per row)")
                self._fake_quantize = lambda w: fake_quantize(w, bits, group)

    # ---- weights ---------------------------------------------------------------------
    def refresh(self) -> None:
        """bf16 copy: rebuilt from the current weights at the start of every decode call
        (~0.1 s for 135M parameters here, against seconds of decoding). Not cached on the
        tensors' version counters: fused optimizers (torch.optim.AdamW(fused=True))
        update parameters without bumping them, and a stale copy would sample from old
        weights while `logp_behavior` claimed the current version."""
        if not self.copy:
            return
        if self.quant is not None:  # integer-grid weights, norms and biases as they are
            mat, vec = (lambda t: self._fake_quantize(t.detach())), (lambda t: t.detach())
        else:
            bf = torch.bfloat16
            mat = vec = (lambda t: t.detach().to(bf))
        embed = mat(self.decoder.embed_tokens.weight)
        tied = self.head.weight is self.decoder.embed_tokens.weight
        w = {"embed": embed, "head": embed if tied else mat(self.head.weight),
             "norm": vec(self.decoder.norm.weight), "layers": []}
        for layer in self.layers:
            w["layers"].append({name: (mat(lin.weight), None if lin.bias is None else vec(lin.bias))
                                for name, lin in zip(_NAMES, _linears(layer))}
                               | {"ln1": vec(layer.input_layernorm.weight),
                                  "ln2": vec(layer.post_attention_layernorm.weight)})
        self._w = w

    def release(self) -> None:
        """Drop the weight copy (the next `refresh` rebuilds it): between decode calls the
        trainer needs that memory (270 MB of bf16 weights for 135M parameters), and a
        copy kept after the weights change would be stale anyway."""
        self._w = None

    def _lin(self, i: int, layer, name: str, x: torch.Tensor) -> torch.Tensor:
        if not self.copy:
            return getattr(layer.self_attn if name in ("q", "k", "v", "o") else layer.mlp, _ATTR[name])(x)
        w, b = self._w["layers"][i][name]
        return F.linear(x, w, b)

    def _norm(self, module, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """LlamaRMSNorm: fp32 statistics, weight times the normalized input in x's dtype."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
        return (module.weight if weight is None else weight) * h.to(x.dtype)

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.copy and self.quant is None else self.decoder.embed_tokens.weight.dtype

    # ---- cache and rotary ---------------------------------------------------------------
    def new_cache(self, B: int, S: int, device) -> torch.Tensor:
        """Uninitialized: every column a query reads has been written before (prompt columns,
        padding included, by the prefill; column P+t by step t)."""
        return torch.empty((2, len(self.layers), B, self.n_kv, S, self.head_dim), dtype=self.compute_dtype,
                           device=device)

    def compact(self, cache: torch.Tensor, keep: torch.Tensor, filled: int) -> torch.Tensor:
        """The cache holding only the rows `keep` (ascending), compacted in place: row
        keep[j] moves to row j of the same buffer (keep[j] >= j, and each layer's rows are
        gathered before they are written), only the `filled` written columns are moved, and
        the result is a view of the first len(keep) rows. No new cache is allocated (the
        buffer stays the one `new_cache` made, one contiguous block per layer and row), so
        compacting costs a copy of the live rows, not a fresh allocation of the whole cache
        next to the old one."""
        n = keep.numel()
        if n == cache.shape[2]:
            return cache
        for layer in range(cache.shape[1]):  # one layer at a time: the gathered temporary is 1/layers of the cache
            cache[:, layer, :n, :, :filled] = cache[:, layer, keep, :, :filled]
        return cache[:, :, :n]

    def _rope(self, pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [..., head_dim] for integer positions `pos` (LlamaRotaryEmbedding)."""
        freqs = pos[..., None].float() * self.inv_freq.to(device=pos.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.rope_scale).to(dtype), (emb.sin() * self.rope_scale).to(dtype)

    # ---- forward pieces -----------------------------------------------------------------
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.copy:
            return F.embedding(ids, self._w["embed"])
        return self.decoder.embed_tokens(ids)

    def _layer(self, i, layer, x, cos, sin, cache, cols: slice, key_ok):
        """One decoder layer on x [R, Q, H]: writes its keys/values into cache columns
        `cols`, attends over columns [0, cols.stop) where key_ok [R, Q, S'] is True."""
        w = self._w["layers"][i] if self.copy else None
        R, Q, _ = x.shape
        nh, nkv, D = self.n_heads, self.n_kv, self.head_dim
        h = self._norm(layer.input_layernorm, x, None if w is None else w["ln1"])
        q = self._lin(i, layer, "q", h).view(R, Q, nh, D).transpose(1, 2)
        k = self._lin(i, layer, "k", h).view(R, Q, nkv, D).transpose(1, 2)
        v = self._lin(i, layer, "v", h).view(R, Q, nkv, D).transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        cache[0, i, :, :, cols] = k
        cache[1, i, :, :, cols] = v
        keys, vals = cache[0, i, :, :, : cols.stop], cache[1, i, :, :, : cols.stop]
        if Q == 1:
            o = self._decode_attention(q, keys, vals, key_ok)
        else:  # grouped-query attention: query head h reads kv head h // (nh / nkv), as repeat_kv
            o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=key_ok[:, None], scale=self.scale,
                                               enable_gqa=nh != nkv)  # [R, nh, Q, D]
        x = x + self._lin(i, layer, "o", o.transpose(1, 2).reshape(R, Q, nh * D))
        h = self._norm(layer.post_attention_layernorm, x, None if w is None else w["ln2"])
        return x + self._lin(i, layer, "down", F.silu(self._lin(i, layer, "gate", h)) * self._lin(i, layer, "up", h))

    def _decode_attention(self, q, keys, vals, key_ok) -> torch.Tensor:
        """Attention of one new query per row, q [R, nh, 1, D] over keys/vals [R, nkv, S, D]
        where key_ok [R, 1, S]. Scores, softmax and the weighted sum in fp32 (fp64 for an
        fp64 decoder) whatever the cache dtype; the query heads that share a kv head are
        stacked as the rows of one product (head h reads kv head h // (nh / nkv), as
        repeat_kv). The same function as `scaled_dot_product_attention`, whose torch 2.13
        CPU kernel is slow at this shape in bf16: 1.0-1.5 ms per call against 0.22-0.33 ms
        here at R = 32, S = 60-100 (30 calls per decode step), and the fp32 scores put the
        result closer to an fp64 reference than that kernel's (tests/engines/test_fast.py)."""
        R, nh, _, D = q.shape
        nkv = keys.shape[1]
        acc = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 for an fp64 decoder
        qg = q.reshape(R, nkv, nh // nkv, D).to(acc)
        scores = torch.matmul(qg, keys.to(acc).transpose(-1, -2)) * self.scale  # [R, nkv, nh/nkv, S]
        scores = scores.masked_fill(~key_ok[:, None], float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), vals.to(acc))
        return out.to(q.dtype).reshape(R, nh, 1, D)

    def _final(self, x: torch.Tensor) -> torch.Tensor:
        w = self._w["norm"] if self.copy else None
        return self._norm(self.decoder.norm, x, w)

    def prefill(self, ids, pmask, cache, G: int) -> torch.Tensor:
        """Run the N distinct prompts [N, P]; copy their keys/values to the G rows of each
        prompt; return the final hidden state at the last prompt position [N, H]."""
        N, P = ids.shape
        pos = (pmask.long().cumsum(-1) - 1).masked_fill(~pmask, 1)
        cos, sin = self._rope(pos, self.compute_dtype)
        causal = torch.ones((P, P), dtype=torch.bool, device=ids.device).tril()
        # a padding query sees only itself: finite garbage (never read), no all-masked row
        key_ok = (causal & pmask[:, None, :]) | torch.eye(P, dtype=torch.bool, device=ids.device)
        small = cache.new_zeros((2, len(self.layers), N, self.n_kv, P, self.head_dim))
        x = self._embed(ids)
        for i, layer in enumerate(self.layers):
            x = self._layer(i, layer, x, cos, sin, small, slice(0, P), key_ok)
        cache[:, :, :, :, :P] = small.repeat_interleave(G, dim=2)
        return self._final(x[:, -1])

    def step(self, tok, pos, col: int, cache, key_ok) -> torch.Tensor:
        """One decode step for the cache rows: tok [R], positions [R], cache column `col`,
        key_ok [R, col+1]. Returns the final hidden state [R, H]."""
        cos, sin = self._rope(pos[:, None], self.compute_dtype)
        x = self._embed(tok[:, None])
        ok = key_ok[:, None, :]
        for i, layer in enumerate(self.layers):
            x = self._layer(i, layer, x, cos, sin, cache, slice(col, col + 1), ok)
        return self._final(x[:, 0])

    def logits(self, hidden: torch.Tensor, keep_fp64: bool = False) -> torch.Tensor:
        """[R, V] fp32 (`keep_fp64`: fp64 logits of an fp64 decoder are not rounded to fp32).
        The vocabulary is split into blocks of `_HEAD_BLOCK` rows of the output matrix:
        each logit is the same dot product (bit-identical to one call), but a block's
        weights stay in cache (1.4x faster at R = 32 on the reference CPU)."""
        cast = (lambda z: z) if keep_fp64 and hidden.dtype == torch.float64 else (lambda z: z.float())
        if self.copy:
            w, bias = self._w["head"], None
        elif type(self.head) is torch.nn.Linear:
            w, bias = self.head.weight, self.head.bias
        else:
            return cast(self.head(hidden))  # a wrapped head (e.g. LoRA): call it as it is
        n = w.shape[0]
        parts = [F.linear(hidden, w[i : i + _HEAD_BLOCK], None if bias is None else bias[i : i + _HEAD_BLOCK])
                 for i in range(0, n, _HEAD_BLOCK)]
        return cast(torch.cat(parts, dim=-1))


_NAMES = ("q", "k", "v", "o", "gate", "up", "down")
_ATTR = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
         "down": "down_proj"}


def _linears(layer) -> list:
    a, m = layer.self_attn, layer.mlp
    return [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)
