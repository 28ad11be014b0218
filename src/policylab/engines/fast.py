"""Rollout engine with its own decode loop: the HFEngine contract, less time per token.

`FastEngine` has exactly the interface and the semantics of `policylab.engines.hf.HFEngine`
(same `generate` / `greedy` / `decode_responses`, same RolloutBatch layout, masks through
the first eos with pad == eos allowed, same extras, same seed handling). What differs is
how the forward runs:

* one prefill per distinct prompt (not per sample): the G copies of a prompt share its
  key/value cache rows, which are copied G times;
* a preallocated key/value cache `[2, layers, rows, kv_heads, P + T, head_dim]` written
  in place (HF's dynamic cache grows by concatenation and rebuilds a 4-D mask every step);
* rows that have emitted their eos leave the batch: from the next step on, the output head
  and the sampling math (transform, draw, log-softmax) run only on the rows still
  generating; once a `compact_min` fraction of the cache rows is done, the cache is
  compacted in place (the live rows move to the front of the one preallocated buffer, no
  second cache is allocated) and the decoder layers run only on the live rows too;
* the output head runs in vocabulary blocks (same dot products, better cache reuse), and
  no per-step score tensors are kept: the log-prob of the drawn token (and the top-K
  envelope when asked) is taken at once, so memory is O(B x V) instead of O(T x B x V).

The model's train/eval mode does not matter (the loop has no dropout) and is left as it
is; `model.generation_config` is never read.

The decoder (`engines.llama_decoder.LlamaDecoder`) is computed layer by layer from the model's own modules (q/k/v/o and
MLP projections are called as modules, so weight sharing with the trainer is free and
wrapped linears such as LoRA work). It follows LlamaForCausalLM exactly: RMSNorm with fp32
statistics, rotary embedding from the model's `inv_freq` and attention scaling, grouped
query attention, SiLU-gated MLP, final norm, output head. Other architectures are refused
at construction (use HFEngine for them).

Sampling, in fp32, is HF's distribution: z = logits / temperature (then -inf outside the
menu of `SamplingSettings.allowed_ids`, when one is set), then the top-k / top-p
kept set (`policylab.models.logprobs.kept_set`, the transform `model_logprobs` scores with), then
a draw from softmax(z); `logp_behavior = log_softmax(z)[token]`, recorded as sampled.
`fp64_scores=True` (an fp64 decoder only: an fp64 model, or its weight-quantized copy)
keeps the logits, this transform, the draw and `logp_behavior` in fp64 instead: the
behavior log-probs then carry no fp32 rounding, so they equal the fp64 trainer's up to
fp64 rounding (a behavior role that is reproducible across CPUs, e.g. for golden tests).
The default rounds the logits to fp32, as HFEngine's `generate` does.

Two ways to draw (`sampler`):

* "cdf" (default): one uniform per running row, inverse CDF of softmax(z) (fp64 cumulative
  sum; a token outside the kept set can never be drawn). Same distribution as HF, other
  random numbers: the tokens differ from HFEngine's for the same seed.
* "hf": torch.multinomial's own rule, token = argmax(p / E) with E ~ Exp(1) drawn for ALL B
  rows every step (finished rows included, as HF's loop does). This consumes the RNG
  exactly as HFEngine does, so the same seed gives the same tokens wherever the two
  forwards round their probabilities alike (tested on a tiny model); drawing B x V
  exponentials costs ~30 ms per step at B = 32 on the reference CPU.

`weights="int8"` / `"int4"` keeps a weight-quantized copy instead (`engines.quant`: symmetric
round-to-nearest with one absmax scale per `quant_group` input weights of each output row;
linears, embedding and output head; norms as they are), rebuilt at the start of every
call like the bf16 copy, and decodes in the model's dtype on it: a behavior engine
("fast-int8-g32", "fast-int4-g32") whose weights really differ from the learner's, used
only to sample. `logp_behavior` is the quantized model's log-prob of the drawn token.

`dtype=torch.bfloat16` makes a bf16 copy of the weights (built from the current weights
at the start of every `generate` / `greedy` call and dropped at its end, so the trainer
has that memory between calls) and runs the decoder in bf16: a DIFFERENT behavior
engine ("fast-bf16"), whose log-probs differ from the fp32 trainer's (measured in
benchmarks/results/utilization.md); the corrections exist for it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from policylab.batch import RolloutBatch, SamplingSettings
from policylab.models.logprobs import kept_set, restrict_to
from policylab.engines.hf import HFEngine, sampling_rng
from policylab.engines.llama_decoder import LlamaDecoder, UnsupportedModel

__all__ = ["FastEngine", "UnsupportedModel"]


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


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
    weights      None: the model's weights; "int8" / "int4": sample from a weight-quantized copy
                 ("fast-int8-g32" ...), see the module doc
    quant_group  input weights per quantization scale (0: one scale per output row)
    fp64_scores  with an fp64 decoder: scores, draw and logp_behavior in fp64, not fp32
                 (see the module doc); refused for any other decoder
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
        weights: str | None = None,
        quant_group: int = 32,
        fp64_scores: bool = False,
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
        quant = None
        if weights is not None:
            from policylab.engines.quant import BITS

            if weights not in BITS:
                raise ValueError(f"`weights` must be None or one of {', '.join(BITS)}, got {weights!r}")
            if copy:
                raise ValueError("`weights` (a quantized copy) and dtype=torch.bfloat16 (a bf16 copy) exclude each other")
            if isinstance(quant_group, bool) or not isinstance(quant_group, int) or quant_group < 0:
                raise ValueError(f"`quant_group` must be an int >= 0 (0 = one scale per row), got {quant_group!r}")
            quant = (BITS[weights], quant_group)
        if quant is not None:
            default = f"fast-{weights}-" + (f"g{quant_group}" if quant_group else "row")
        else:
            default = "fast-" + _DTYPE_NAMES.get(torch.bfloat16 if copy else own, str(own))
        super().__init__(model, tokenizer, engine_name=engine_name or default, eos_token_id=eos_token_id)
        self.dtype = torch.bfloat16 if copy else own
        self.weights, self.quant_group = weights, quant_group
        self.sampler = sampler
        self.compact_min = compact_min
        self._net = LlamaDecoder(model, copy, quant)  # refuses unsupported architectures now
        self.fp64_scores = bool(fp64_scores)
        self._check_fp64_scores()

    def _check_fp64_scores(self) -> None:
        if self.fp64_scores and self._net.compute_dtype != torch.float64:
            raise ValueError(f"`fp64_scores` needs an fp64 decoder (an fp64 model without a bf16 copy); this one "
                             f"computes in {self._net.compute_dtype}")

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
        with sampling_rng(seed, self._device) as used_seed:
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
    def _draw(self, z: torch.Tensor, rows: torch.Tensor, B: int) -> torch.Tensor:
        """Tokens [R] for the rows still generating (original rows `rows`) from their
        processed scores z [R, V]."""
        if self.sampler == "cdf":
            return _draw_cdf(z)
        # torch.multinomial(p, 1) is argmax(p / E), E ~ Exp(1) drawn row-major for every
        # row of the batch: draw the full [B, V] as HF's loop does, use the rows still generating
        E = torch.empty((B, z.shape[1]), dtype=torch.float32, device=z.device).exponential_()
        return (torch.softmax(z, -1) / E[rows]).argmax(-1)

    @torch.no_grad()
    def _decode(self, ids, pmask, G, max_new_tokens, sampling, record_topk):
        """The decode loop. Returns (response [B, T] long, logp [B, T] fp32 (fp64 with
        `fp64_scores`), topk extras).

        `sampling=None` is greedy. Positions after a row's eos hold the pad id."""
        self._check_fp64_scores()  # the attribute may have been set after construction
        self._net.refresh()
        try:
            return self._decode_loop(ids, pmask, G, max_new_tokens, sampling, record_topk)
        finally:
            self._net.release()  # a bf16 / quantized copy is rebuilt by the next call anyway

    def _decode_loop(self, ids, pmask, G, max_new_tokens, sampling, record_topk):
        net = self._net
        fp64 = self.fp64_scores
        N, P = ids.shape
        B, S = N * G, P + max_new_tokens
        dev = ids.device
        plen = pmask.sum(1).repeat_interleave(G)  # [B] real prompt tokens
        cache = net.new_cache(B, S, dev)
        hidden = net.prefill(ids, pmask, cache, G)  # [N, H] last prompt position
        logits = net.logits(hidden, fp64).repeat_interleave(G, 0)  # [B, V], fp32 (fp64 with fp64_scores)
        resp = torch.full((B, max_new_tokens), self.pad_token_id, dtype=torch.long, device=dev)
        logp = torch.zeros((B, max_new_tokens), dtype=logits.dtype, device=dev)
        K = int(record_topk)
        top_ids = torch.zeros((B, max_new_tokens, K), dtype=torch.long, device=dev) if K else None
        top_lp = torch.zeros((B, max_new_tokens, K), dtype=logits.dtype, device=dev) if K else None
        eos = torch.tensor(self.eos_token_ids, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        rows = torch.arange(B, device=dev)  # original row of each cache row
        live = torch.ones(B, dtype=torch.bool, device=dev)  # cache rows still generating: `logits` holds these
        last = torch.full((B,), self.pad_token_id, dtype=torch.long, device=dev)  # each row's latest token
        key_ok = torch.zeros((B, S), dtype=torch.bool, device=dev)  # cache columns a row may attend to
        key_ok[:, :P] = pmask.repeat_interleave(G, 0)
        T = 0
        for t in range(max_new_tokens):
            lrows = rows[live]  # original rows of the logits held (the rows still generating)
            z = logits  # [len(lrows), V] fp32, or fp64 with fp64_scores
            if sampling is None:
                tok = z.argmax(-1)
            else:
                if sampling.temperature != 1.0:
                    z = z / sampling.temperature
                z = restrict_to(z, sampling.allowed_ids)  # a menu restriction (no-op without one)
                if sampling.top_k > 0 or sampling.top_p < 1.0:
                    z = z.masked_fill(~kept_set(z, top_k=sampling.top_k, top_p=sampling.top_p), float("-inf"))
                tok = self._draw(z, lrows, B)
                lsm = torch.log_softmax(z, -1)
                logp[lrows, t] = lsm.gather(1, tok[:, None]).squeeze(1)
                if K:
                    tv = lsm.topk(K, dim=-1)
                    top_ids[lrows, t], top_lp[lrows, t] = tv.indices, tv.values
            resp[lrows, t] = tok
            last[lrows] = tok
            done[lrows] = torch.isin(tok, eos)
            T = t + 1
            if bool(done.all()) or T == max_new_tokens:
                break
            finished = int(done[rows].sum())
            col = P + t
            if finished and finished >= self.compact_min * rows.numel():
                keep = (~done[rows]).nonzero().squeeze(1)
                cache = net.compact(cache, keep, col)
                rows = rows[keep]
            # finished rows still in the cache feed their last token: their outputs are never read
            key_ok[rows, col] = True
            hidden = net.step(last[rows], plen[rows] + t, col, cache, key_ok[rows, : col + 1])
            live = ~done[rows]
            # the output head and the sampling math only for the rows still generating
            logits = net.logits(hidden if bool(live.all()) else hidden[live], fp64)
        topk = {"behavior_topk_ids": top_ids[:, :T], "behavior_topk_logp": top_lp[:, :T]} if K else {}
        return resp[:, :T], logp[:, :T], topk


def _draw_cdf(z: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from softmax(z) for every row (one uniform each, from the current
    torch RNG). The cumulative sum is taken in fp64, so u * total < total and the first
    index whose cumulative mass exceeds it always has p > 0: a token outside the kept set
    (p = 0) can never be drawn."""
    if z.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=z.device)
    cdf = torch.softmax(z, -1).double().cumsum_(-1)
    u = torch.rand(z.shape[0], 1, dtype=torch.float64, device=z.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=z.shape[1] - 1)
