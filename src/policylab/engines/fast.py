"""Rollout engine with its own decode loop: the HFEngine contract, less time per token.

`FastEngine` has exactly the interface and the semantics of `policylab.engines.hf.HFEngine`
(same `generate` / `greedy` / `decode_responses`, same RolloutBatch layout, masks through
the first eos with pad == eos allowed, same extras, same seed handling). What differs is
how the forward runs:

* one prefill per distinct prompt (not per sample): the G copies of a prompt share its
  key/value cache rows, which are copied G times;
* a preallocated key/value cache `[2, layers, rows, kv_heads, P + T, head_dim]` written
  in place (HF's dynamic cache grows by concatenation and rebuilds a 4-D mask every step);
* rows that have emitted their eos leave the batch: once a `compact_min` fraction of the
  cache rows is done, the cache is compacted and later steps run only on the live rows;
* the output head runs in vocabulary blocks (same dot products, better cache reuse), and
  no per-step score tensors are kept: the log-prob of the drawn token (and the top-K
  envelope when asked) is taken at once, so memory is O(B x V) instead of O(T x B x V).

The model's train/eval mode does not matter (the loop has no dropout) and is left as it
is; `model.generation_config` is never read.

The decoder is computed here, layer by layer, from the model's own modules (q/k/v/o and
MLP projections are called as modules, so weight sharing with the trainer is free and
wrapped linears such as LoRA work). It follows LlamaForCausalLM exactly: RMSNorm with fp32
statistics, rotary embedding from the model's `inv_freq` and attention scaling, grouped
query attention, SiLU-gated MLP, final norm, output head. Other architectures are refused
at construction (use HFEngine for them).

Sampling, in fp32, is HF's distribution: z = logits / temperature, then the top-k / top-p
kept set (`policylab.logprobs.kept_set`, the transform `model_logprobs` scores with), then
a draw from softmax(z); `logp_behavior = log_softmax(z)[token]`, recorded as sampled.
Two ways to draw (`sampler`):

* "cdf" (default): one uniform per running row, inverse CDF of softmax(z) (fp64 cumulative
  sum; a token outside the kept set can never be drawn). Same distribution as HF, other
  random numbers: the tokens differ from HFEngine's for the same seed.
* "hf": torch.multinomial's own rule, token = argmax(p / E) with E ~ Exp(1) drawn for ALL B
  rows every step (finished rows included, as HF's loop does). This consumes the RNG
  exactly as HFEngine does, so the same seed gives the same tokens wherever the two
  forwards round their probabilities alike (tested on a tiny model); drawing B x V
  exponentials costs ~30 ms per step at B = 32 on the reference CPU.

`dtype=torch.bfloat16` keeps a bf16 copy of the weights (rebuilt from the current weights
at the start of every `generate` / `greedy` call) and runs the decoder in
bf16: a DIFFERENT behavior engine ("fast-bf16"), whose log-probs differ from the fp32
trainer's (measured in benchmarks/results/utilization.md); the corrections exist for it.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..batch import RolloutBatch, SamplingSettings
from ..logprobs import kept_set
from .hf import HFEngine, _sampling_rng

__all__ = ["FastEngine", "UnsupportedModel"]


class UnsupportedModel(ValueError):
    """FastEngine cannot run this model (architecture or setting it does not implement)."""


_SUPPORTED = ("llama",)
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}
_HEAD_BLOCK = 2048  # output-head rows per matmul (see _Decoder.logits)


class FastEngine(HFEngine):
    """Sample with a manual decode loop; return validated `RolloutBatch`es.

    model        a LlamaForCausalLM (possibly PEFT-wrapped in fp32), shared with the trainer
    tokenizer    gives `pad_token_id` and the eos id(s), as for HFEngine
    engine_name  recorded in `RolloutBatch.engine`; default "fast-fp32" / "fast-bf16"
    dtype        None: the model's own dtype (fp32, or fp64), the trainer's numerics ("fast-fp32");
                 torch.bfloat16: a bf16 copy of the weights, a different engine ("fast-bf16")
    eos_token_id id or ids that end a response; default the tokenizer's eos
    sampler      "cdf" (default): one uniform per running row, inverse CDF of softmax(z);
                 "hf": torch.multinomial's draw over all B rows, the same tokens as HFEngine
                 for the same seed (costs B x V exponential draws per step: ~30 ms at B=32)
    compact_min  compact the cache once at least this fraction of its rows is finished
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        engine_name: str | None = None,
        dtype: torch.dtype | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        sampler: str = "cdf",
        compact_min: float = 0.125,
    ):
        own = next(model.parameters()).dtype
        if dtype not in (None, own, torch.bfloat16):
            raise ValueError(
                f"`dtype` must be None (the model's own dtype, {own}) or torch.bfloat16 (a bf16 weight "
                f"copy), got {dtype}"
            )
        copy = dtype == torch.bfloat16 and own != torch.bfloat16
        if sampler not in ("cdf", "hf"):
            raise ValueError(f"`sampler` must be 'cdf' or 'hf', got {sampler!r}")
        if not 0.0 < compact_min <= 1.0:
            raise ValueError(f"`compact_min` must be in (0, 1], got {compact_min}")
        name = engine_name or "fast-" + _DTYPE_NAMES.get(torch.bfloat16 if copy else own, str(own))
        super().__init__(model, tokenizer, engine_name=name, eos_token_id=eos_token_id)
        self.dtype = torch.bfloat16 if copy else own
        self.sampler = sampler
        self.compact_min = compact_min
        self._net = _Decoder(model, copy)  # refuses unsupported architectures now

    # ------------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[list[int]],
        *,
        group_size: int,
        sampling: SamplingSettings,
        max_new_tokens: int,
        policy_version: int,
        batch_id: str,
        seed: int | torch.Generator | None = None,
        group_ids: list[int] | None = None,
        record_topk: int = 0,
    ) -> RolloutBatch:
        """Same contract as `HFEngine.generate` (see there): B = len(prompts) * group_size
        rows, prompt i's copies in rows i*G ... i*G+G-1, tokens [B, P+T], loss_mask and
        logp_behavior [B, T], extras truncated / prompt_lengths / prompt_index / seed (and
        behavior_topk_ids / behavior_topk_logp [B, T, K] with `record_topk`; 0 id and 0.0
        at positions after a row's eos, which no loss reads)."""
        group_ids = self._check_request(prompts, sampling, group_size, max_new_tokens, group_ids)
        ids, pmask = self._left_pad(prompts)
        G = group_size
        with _sampling_rng(seed, self._device) as used_seed:
            out = self._decode(ids, pmask, G, max_new_tokens, sampling, record_topk)
        response, logp, topk = out
        P, B = ids.shape[1], response.shape[0]
        loss_mask, truncated = self._response_mask(response)
        logp = torch.where(loss_mask, logp, torch.zeros_like(logp))
        prompt_mask = pmask.repeat_interleave(G, 0)
        dev = response.device
        batch = RolloutBatch(
            tokens=torch.cat([ids.repeat_interleave(G, 0), response], dim=1),
            attention_mask=torch.cat([prompt_mask, loss_mask], dim=1),
            loss_mask=loss_mask,
            prompt_width=P,
            group=torch.tensor(group_ids, dtype=torch.long, device=dev).repeat_interleave(G),
            policy_version=torch.full((B,), int(policy_version), dtype=torch.long, device=dev),
            batch_id=batch_id,
            source=("native",) * B,
            engine=self.engine_name,
            sampling=sampling,
            logp_behavior=logp,
            extras={
                "truncated": truncated,
                "prompt_lengths": prompt_mask.sum(1),
                "prompt_index": torch.arange(len(prompts), device=dev).repeat_interleave(G),
                "seed": used_seed,
                **topk,
            },
        )
        return batch.validate()

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy (argmax of the raw logits) response of each prompt, through the first
        eos, as HFEngine.greedy; consumes no randomness."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        ids, pmask = self._left_pad(prompts)
        response, _, _ = self._decode(ids, pmask, 1, max_new_tokens, None, 0)
        mask, _ = self._response_mask(response)
        return [row[m].tolist() for row, m in zip(response, mask)]

    # ------------------------------------------------------------------------------
    def _draw(self, z: torch.Tensor, rows: torch.Tensor, live: torch.Tensor, B: int) -> torch.Tensor:
        """Tokens [R] for the cache rows from the processed scores z [R, V]."""
        if self.sampler == "cdf":
            return _draw_cdf(z, live)
        # torch.multinomial(p, 1) is argmax(p / E), E ~ Exp(1) drawn row-major for every
        # row of the batch: draw the full [B, V] as HF's loop does, use the cache rows
        E = torch.empty((B, z.shape[1]), dtype=torch.float32, device=z.device).exponential_()
        return (torch.softmax(z, -1) / E[rows]).argmax(-1)

    @torch.no_grad()
    def _decode(self, ids, pmask, G, max_new_tokens, sampling, record_topk):
        """The decode loop. Returns (response [B, T] long, logp [B, T] fp32, topk extras).

        `sampling=None` is greedy. Positions after a row's eos hold the pad id."""
        net = self._net
        net.refresh()
        N, P = ids.shape
        B, S = N * G, P + max_new_tokens
        dev = ids.device
        plen = pmask.sum(1).repeat_interleave(G)  # [B] real prompt tokens
        cache = net.new_cache(B, S, dev)
        hidden = net.prefill(ids, pmask, cache, G)  # [N, H] last prompt position
        logits = net.logits(hidden).repeat_interleave(G, 0)  # [B, V]
        resp = torch.full((B, max_new_tokens), self.pad_token_id, dtype=torch.long, device=dev)
        logp = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=dev)
        K = int(record_topk)
        top_ids = torch.zeros((B, max_new_tokens, K), dtype=torch.long, device=dev) if K else None
        top_lp = torch.zeros((B, max_new_tokens, K), dtype=torch.float32, device=dev) if K else None
        eos = torch.tensor(self.eos_token_ids, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        rows = torch.arange(B, device=dev)  # original row of each cache row
        key_ok = torch.zeros((B, S), dtype=torch.bool, device=dev)  # cache columns a row may attend to
        key_ok[:, :P] = pmask.repeat_interleave(G, 0)
        T = 0
        for t in range(max_new_tokens):
            live = ~done[rows]  # cache rows still generating
            z = logits.float()
            if sampling is None:
                tok = z.argmax(-1)
            else:
                if sampling.temperature != 1.0:
                    z = z / sampling.temperature
                if sampling.top_k > 0 or sampling.top_p < 1.0:
                    z = z.masked_fill(~kept_set(z, top_k=sampling.top_k, top_p=sampling.top_p), float("-inf"))
                tok = self._draw(z, rows, live, B)
                lsm = torch.log_softmax(z, -1)
                r = rows[live]
                logp[r, t] = lsm[live].gather(1, tok[live, None]).squeeze(1)
                if K:
                    tv = lsm[live].topk(K, dim=-1)
                    top_ids[r, t], top_lp[r, t] = tv.indices, tv.values
            r = rows[live]
            resp[r, t] = tok[live]
            done[r] = torch.isin(tok[live], eos)
            T = t + 1
            if bool(done.all()) or T == max_new_tokens:
                break
            finished = int((~live).sum()) + int(done[r].sum())
            col = P + t
            if finished and finished >= self.compact_min * rows.numel():
                keep = (~done[rows]).nonzero().squeeze(1)
                cache = net.compact(cache, keep, col)
                rows, tok = rows[keep], tok[keep]
            key_ok[rows, col] = True
            hidden = net.step(tok, plen[rows] + t, col, cache, key_ok[rows, : col + 1])
            logits = net.logits(hidden)
        topk = {"behavior_topk_ids": top_ids[:, :T], "behavior_topk_logp": top_lp[:, :T]} if K else {}
        return resp[:, :T], logp[:, :T], topk


def _draw_cdf(z: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from softmax(z) for the live rows (one uniform each, from the
    current torch RNG); finished rows get token 0 (never read). The cumulative sum is
    taken in fp64, so u * total < total and the first index whose cumulative mass exceeds
    it always has p > 0: a token outside the kept set (p = 0) can never be drawn."""
    tok = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    n = int(live.sum())
    if n == 0:
        return tok
    cdf = torch.softmax(z[live], -1).double().cumsum_(-1)
    u = torch.rand(n, 1, dtype=torch.float64, device=z.device) * cdf[:, -1:]
    tok[live] = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=z.shape[1] - 1)
    return tok


class _Decoder:
    """LlamaForCausalLM's forward, split into prefill / one decode step / output head,
    over a preallocated cache tensor [2, layers, rows, kv_heads, S, head_dim]
    (keys then values; one index_select on dim 2 compacts every layer's rows)."""

    def __init__(self, model: torch.nn.Module, copy: bool):
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
        self.model, self.decoder, self.head, self.copy = model, decoder, head, copy
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
                            f"FastEngine(dtype=bf16) needs plain torch.nn.Linear projections, found "
                            f"{type(lin).__module__}.{type(lin).__name__} (e.g. LoRA): use the model's own dtype"
                        )

    # ---- weights ---------------------------------------------------------------------
    def refresh(self) -> None:
        """bf16 copy: rebuilt from the current weights at the start of every decode call
        (~0.1 s for 135M parameters here, against seconds of decoding). Not cached on the
        tensors' version counters: fused optimizers (torch.optim.AdamW(fused=True))
        update parameters without bumping them, and a stale copy would sample from old
        weights while `logp_behavior` claimed the current version."""
        if not self.copy:
            return
        bf = torch.bfloat16
        w = {"embed": self.decoder.embed_tokens.weight.to(bf), "head": self.head.weight.to(bf),
             "norm": self.decoder.norm.weight.to(bf), "layers": []}
        for layer in self.layers:
            w["layers"].append({name: (lin.weight.to(bf), None if lin.bias is None else lin.bias.to(bf))
                                for name, lin in zip(_NAMES, _linears(layer))}
                               | {"ln1": layer.input_layernorm.weight.to(bf),
                                  "ln2": layer.post_attention_layernorm.weight.to(bf)})
        self._w = w

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
        return torch.bfloat16 if self.copy else self.decoder.embed_tokens.weight.dtype

    # ---- cache and rotary ---------------------------------------------------------------
    def new_cache(self, B: int, S: int, device) -> torch.Tensor:
        """Uninitialized: every column a query reads has been written before (prompt columns,
        padding included, by the prefill; column P+t by step t)."""
        return torch.empty((2, len(self.layers), B, self.n_kv, S, self.head_dim), dtype=self.compute_dtype,
                           device=device)

    def compact(self, cache: torch.Tensor, keep: torch.Tensor, filled: int) -> torch.Tensor:
        """A cache holding only the rows `keep`; only the `filled` written columns are copied."""
        new = torch.empty(cache.shape[:2] + (keep.numel(),) + cache.shape[3:], dtype=cache.dtype, device=cache.device)
        new[..., :filled, :] = cache[:, :, keep, :, :filled]
        return new

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
        # grouped-query attention: query head h reads kv head h // (nh / nkv), as repeat_kv
        o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=key_ok[:, None], scale=self.scale,
                                           enable_gqa=nh != nkv)  # [R, nh, Q, D]
        x = x + self._lin(i, layer, "o", o.transpose(1, 2).reshape(R, Q, nh * D))
        h = self._norm(layer.post_attention_layernorm, x, None if w is None else w["ln2"])
        return x + self._lin(i, layer, "down", F.silu(self._lin(i, layer, "gate", h)) * self._lin(i, layer, "up", h))

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

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, V] fp32. The vocabulary is split into blocks of `_HEAD_BLOCK` rows of the
        output matrix: each logit is the same dot product (bit-identical to one call), but
        a block's weights stay in cache (1.4x faster at R = 32 on the reference CPU)."""
        if self.copy:
            w, bias = self._w["head"], None
        elif type(self.head) is torch.nn.Linear:
            w, bias = self.head.weight, self.head.bias
        else:
            return self.head(hidden).float()  # a wrapped head (e.g. LoRA): call it as it is
        n = w.shape[0]
        parts = [F.linear(hidden, w[i : i + _HEAD_BLOCK], None if bias is None else bias[i : i + _HEAD_BLOCK])
                 for i in range(0, n, _HEAD_BLOCK)]
        return torch.cat(parts, dim=-1).float()


_NAMES = ("q", "k", "v", "o", "gate", "up", "down")
_ATTR = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
         "down": "down_proj"}


def _linears(layer) -> list:
    a, m = layer.self_attn, layer.mlp
    return [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)
