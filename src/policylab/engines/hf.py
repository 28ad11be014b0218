"""Rollout engine on HF `generate`: samples groups of responses and records, for every
sampled token, the log-prob of the distribution it was actually drawn from.

`logp_behavior[b, t] = log_softmax(scores_t)[token]`, where `scores_t` are the processed
scores `generate` sampled from (temperature, then top-k, then top-p; transformers'
warpers). `policylab.models.logprobs.model_logprobs` applies the same transform to a fresh
forward, so on the same weights and numerics the two agree to float rounding; any
difference measures the engine mismatch (the behavior role μ vs. the training policy).

Rules of this engine (the trainer relies on them):

* The sampler is exactly `sampling` (a SamplingSettings): `model.generation_config` is
  ignored. During each call it is swapped for a default `GenerationConfig()` and
  restored, so settings saved with a model (repetition_penalty, top_k=50, min_p, bad
  words, ...) can never reshape the distribution behind `logp_behavior`'s back.
* Masks never compare token ids to the pad id (SmolLM2 has pad == eos): a response is
  its tokens up to and including the FIRST eos; the rest is padding.
* Randomness: `seed=int` samples under `torch.random.fork_rng` seeded with it (the
  global RNG is left untouched); `seed=torch.Generator` draws that int from the
  generator (so a generator kept in the trainer's state gives a reproducible stream);
  `seed=None` uses and advances the global torch RNG.
* The model is put in eval mode during the call and restored afterwards.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch
from transformers import GenerationConfig

from policylab.batch import RolloutBatch, SamplingSettings
from policylab.errors import ShapeError

__all__ = ["HFEngine"]

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


class HFEngine:
    """Sample with `model.generate`; return validated `RolloutBatch`es.

    model          a causal LM (`generate`, `get_output_embeddings`)
    tokenizer      gives `pad_token_id` (required: see `_pad_id`) and the eos id(s)
    engine_name    recorded in `RolloutBatch.engine`; default "hf-fp32", or
                   "hf-bf16" / "hf-fp16" when `autocast_dtype` is set
    autocast_dtype run `generate` under torch.autocast with this dtype (a different
                   behavior engine than the fp32 trainer forward)
    eos_token_id   id or ids that end a response; default the tokenizer's eos
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        engine_name: str | None = None,
        autocast_dtype: torch.dtype | None = None,
        eos_token_id: int | Sequence[int] | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.autocast_dtype = autocast_dtype
        if engine_name is None:
            engine_name = "hf-" + (_DTYPE_NAMES.get(autocast_dtype, str(autocast_dtype)) if autocast_dtype else "fp32")
        self.engine_name = engine_name
        self.pad_token_id = _pad_id(tokenizer)
        eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        if eos is None:
            raise ValueError(
                "no eos token: the tokenizer has no eos_token_id; pass eos_token_id=... to "
                "HFEngine (responses end at the first eos)"
            )
        self.eos_token_ids = [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]

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
        """Sample `group_size` responses per prompt: B = len(prompts) * group_size rows,
        prompt i's copies in rows i*G ... i*G+G-1, group id `group_ids[i]` (default i).

        prompts are token ids after the chat template (no padding). Returns a validated
        RolloutBatch: tokens [B, P+T] (P = longest prompt, left padding; T = generated
        steps), attention_mask, loss_mask [B, T] (True through the first eos),
        logp_behavior [B, T] (0.0 where loss_mask is False), group, policy_version,
        batch_id, engine, sampling, source "native", and extras:
          "truncated"      [B] bool  no eos within max_new_tokens
          "prompt_lengths" [B] long  real prompt tokens of each row
          "prompt_index"   [B] long  index of the row's prompt in `prompts`
          "seed"           int | None  the seed sampling ran under (see module docstring)
        """
        group_ids = self._check_request(prompts, sampling, group_size, max_new_tokens, group_ids)
        input_ids, prompt_mask = self._left_pad(prompts)
        G = group_size
        input_ids, prompt_mask = input_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0)
        config = GenerationConfig(
            do_sample=True, num_beams=1, temperature=float(sampling.temperature),
            top_k=int(sampling.top_k), top_p=float(sampling.top_p), max_new_tokens=max_new_tokens,
            pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_ids,
            output_scores=True, return_dict_in_generate=True,
            **self._menu_restriction(sampling),
        )
        with sampling_rng(seed, self._device) as used_seed:
            out = self._run(input_ids, prompt_mask, config)
        P = input_ids.shape[1]
        response = out.sequences[:, P:]
        T = response.shape[1]
        if len(out.scores) != T:
            raise RuntimeError(f"generate returned {len(out.scores)} score steps for {T} new tokens")
        loss_mask, truncated = self._response_mask(response)
        logp = torch.stack(
            [torch.log_softmax(s.float(), -1).gather(1, response[:, t : t + 1]).squeeze(1)
             for t, s in enumerate(out.scores)], dim=1,
        )
        logp = torch.where(loss_mask, logp, torch.zeros_like(logp))
        topk = {}
        if record_topk > 0:  # the behavior's top-K envelope per position (SIS), same transform
            lp_all = [torch.log_softmax(s.float(), -1).topk(record_topk, dim=-1) for s in out.scores]
            topk = {
                "behavior_topk_ids": torch.stack([t.indices for t in lp_all], dim=1),  # [B, T, K]
                "behavior_topk_logp": torch.stack([t.values for t in lp_all], dim=1),  # [B, T, K]
            }
        B = response.shape[0]
        batch = RolloutBatch(
            tokens=out.sequences.long(),
            attention_mask=torch.cat([prompt_mask, loss_mask], dim=1),
            loss_mask=loss_mask,
            prompt_width=P,
            group=torch.tensor(group_ids, dtype=torch.long, device=response.device).repeat_interleave(G),
            policy_version=torch.full((B,), int(policy_version), dtype=torch.long, device=response.device),
            batch_id=batch_id,
            source=("native",) * B,
            engine=self.engine_name,
            sampling=sampling,
            logp_behavior=logp,
            extras={
                "truncated": truncated,
                "prompt_lengths": prompt_mask.sum(1),
                "prompt_index": torch.arange(len(prompts), device=response.device).repeat_interleave(G),
                "seed": used_seed,
                **topk,
            },
        )
        return batch.validate()

    def _menu_restriction(self, sampling: SamplingSettings) -> dict:
        """generate() settings for `sampling.allowed_ids`: every other id is suppressed (its
        score is -inf before the draw, and in the recorded scores), the same distribution as
        `policylab.models.logprobs.restrict_to` gives the trainer."""
        if not sampling.allowed_ids:
            return {}
        V = self.model.get_output_embeddings().weight.shape[0]
        allowed = set(sampling.allowed_ids)
        if max(allowed) >= V:
            raise ShapeError(f"allowed_ids {sampling.allowed_ids} has ids outside the vocabulary [0, {V})")
        return {"suppress_tokens": [v for v in range(V) if v not in allowed]}

    @staticmethod
    def _check_request(prompts, sampling, group_size: int, max_new_tokens: int, group_ids) -> list[int]:
        """Validate a `generate` request; return the group ids (default: prompt indices)."""
        if not isinstance(sampling, SamplingSettings):
            raise TypeError(f"`sampling` must be a SamplingSettings, got {type(sampling).__name__}")
        if group_size < 1 or max_new_tokens < 1:
            raise ValueError(f"group_size and max_new_tokens must be >= 1, got {group_size}, {max_new_tokens}")
        if group_ids is None:
            group_ids = list(range(len(prompts)))
        if len(group_ids) != len(prompts):
            raise ShapeError(f"`group_ids` has {len(group_ids)} entries for {len(prompts)} prompts")
        return group_ids

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy (argmax) response of each prompt, for ReMax's baseline: token ids up to
        and including the first eos (no padding), one list per prompt. Uses the same
        autocast as `generate`; consumes no randomness."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        input_ids, prompt_mask = self._left_pad(prompts)
        config = GenerationConfig(
            do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
            pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_ids,
            return_dict_in_generate=True,
        )
        out = self._run(input_ids, prompt_mask, config)
        response = out.sequences[:, input_ids.shape[1] :]
        mask, _ = self._response_mask(response)
        return [row[m].tolist() for row, m in zip(response, mask)]

    def decode_responses(self, batch: RolloutBatch) -> list[str]:
        """Text of each response (tokens where loss_mask is True), special tokens skipped."""
        rows = batch.response_tokens
        return [
            self.tokenizer.decode(row[m].tolist(), skip_special_tokens=True)
            for row, m in zip(rows, batch.loss_mask)
        ]

    # ------------------------------------------------------------------------------
    @property
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """prompts -> (input_ids [N, P] long, mask [N, P] bool), padding on the left."""
        if not prompts:
            raise ValueError("`prompts` is empty")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty (a prompt needs at least one token)")
            if any((not isinstance(t, int)) or t < 0 for t in p):
                raise ValueError(f"prompt {i} must be a list of non-negative int token ids")
        P = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), P), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), P), dtype=torch.bool)
        for i, p in enumerate(prompts):
            ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, P - len(p) :] = True
        return ids.to(self._device), mask.to(self._device)

    def _response_mask(self, response: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss_mask [B, T]: True through the first eos, truncated [B]: no eos at all)."""
        T = response.shape[1]
        eos = torch.tensor(self.eos_token_ids, device=response.device)
        is_eos = torch.isin(response, eos)
        has_eos = is_eos.any(1)
        first = is_eos.int().argmax(1)  # 0 when there is no eos; replaced below
        length = torch.where(has_eos, first + 1, torch.full_like(first, T))
        loss_mask = torch.arange(T, device=response.device)[None, :] < length[:, None]
        return loss_mask, ~has_eos

    def _run(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor, config: GenerationConfig):
        model = self.model
        was_training = model.training
        saved_config = getattr(model, "generation_config", None)
        autocast = (
            torch.autocast(device_type=input_ids.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None else contextlib.nullcontext()
        )
        try:
            model.eval()
            model.generation_config = GenerationConfig()
            with torch.no_grad(), autocast:
                return model.generate(
                    input_ids=input_ids, attention_mask=prompt_mask.long(), generation_config=config
                )
        finally:
            model.generation_config = saved_config
            model.train(was_training)


def _pad_id(tokenizer) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        raise ValueError(
            "the tokenizer has no pad token, which left padding needs. Set one before "
            "building the engine, e.g. `tokenizer.pad_token = tokenizer.eos_token` (safe: "
            "policylab never derives masks from pad ids), or load the model with "
            "policylab.models.loading.load_policy, which does this for you"
        )
    return int(pad)


@contextlib.contextmanager
def sampling_rng(seed: int | torch.Generator | None, device: torch.device):
    """Yield the int seed sampling runs under (None: the global RNG, not forked)."""
    if seed is None:
        yield None
        return
    if isinstance(seed, torch.Generator):
        seed = int(torch.randint(0, 2**62, (1,), generator=seed).item())
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        yield int(seed)
