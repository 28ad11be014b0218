"""The in-process implementation of the backend seam: a rollout backend over policylab's
engines (FastEngine, HF generate) and a policy worker over one model, its optimizer and
(when the method needs them) a frozen reference and a critic.

The local rollout engine shares the policy's parameters, so `sync_weights` has nothing
to copy; it records the version, and `generate` refuses a request for any other version
(a trainer that forgot to sync after an update fails loudly instead of mislabelling the
samples' provenance). A bf16 engine keeps its own weight copy, rebuilt from the current
weights at every call.
"""

from __future__ import annotations

import dataclasses

import torch

from policylab.batch import RolloutBatch, SamplingSettings
from policylab.errors import PolicylabError
from policylab.models.logprobs import model_logprobs
from policylab.models.vocab import model_logprobs_at
from policylab.models.prefix import shared_prefix_or_none
from policylab.backends.update import Learner, StepHooks, UpdateSettings, autocast, optimizer_step


class LocalRollout:
    """RolloutBackend over a policylab engine (`engines.fast.FastEngine` or `engines.hf.HFEngine`)."""

    def __init__(self, engine, *, same_numerics_as_trainer: bool, before_generate=None):
        self.engine = engine
        self.before_generate = before_generate  # (prompts) -> None: may refuse a request (e.g. a memory check)
        self.engine_name = engine.engine_name
        self.tokenizer = engine.tokenizer
        self.same_numerics_as_trainer = same_numerics_as_trainer
        self.version = 0

    capabilities = frozenset({"rollout.greedy"})

    def generate(self, prompts, *, group_size: int, sampling: SamplingSettings, max_new_tokens: int,
                 policy_version: int, batch_id: str, group_ids=None, record_topk: int = 0) -> RolloutBatch:
        if int(policy_version) != self.version:
            raise PolicylabError(
                f"the rollout backend holds weights version {self.version}, but version {policy_version} was "
                "requested: call sync_weights(version) after every update")
        if self.before_generate is not None:
            self.before_generate(prompts)
        return self.engine.generate(prompts, group_size=group_size, sampling=sampling, max_new_tokens=max_new_tokens,
                                    policy_version=policy_version, batch_id=batch_id, group_ids=group_ids,
                                    record_topk=record_topk)

    def greedy(self, prompts, *, max_new_tokens: int):
        return self.engine.greedy(prompts, max_new_tokens)

    def decode(self, batch: RolloutBatch) -> list[str]:
        return self.engine.decode_responses(batch)

    def sync_weights(self, version: int) -> None:
        self.version = int(version)


class LocalWorker:
    """PolicyWorker over one policy model in this process.

    learner                   the policy, its optimizer, its schedule and how updates run
                              (`backends.update.Learner`, its `UpdateSettings`: micro-batch
                              size, dtype, device, clipping, shared prefix)
    ref_model                 frozen reference for `logp_ref` (None: none loaded)
    critic, critic_optimizer  value model for methods with a critic (None otherwise)
    """

    capabilities = frozenset({"worker.logprobs_at", "worker.vocab_stats", "worker.vocab_kl", "worker.prompt_logprobs",
                              "worker.continuation_logprobs"})

    def __init__(self, learner: Learner, *, ref_model=None, critic=None, critic_optimizer=None):
        self.learner = learner
        self.ref_model, self.critic, self.critic_optimizer = ref_model, critic, critic_optimizer

    @property
    def model(self):
        return self.learner.model

    @property
    def settings(self) -> UpdateSettings:
        return self.learner.settings

    @property
    def micro_batch_size(self) -> int:
        return self.settings.micro_batch_size

    @micro_batch_size.setter
    def micro_batch_size(self, n: int) -> None:
        """Another micro-batch split of the same updates (the invariance tests switch it)."""
        self.learner.settings = dataclasses.replace(self.learner.settings, micro_batch_size=int(n))

    @property
    def dtype(self) -> str:
        return self.settings.dtype

    @property
    def device(self):
        return self.settings.device

    # ------------------------------------------------------------------ role passes
    @torch.no_grad()
    def role_logprobs(self, role: str, batch: RolloutBatch) -> torch.Tensor:
        """[B, T] log-probs of `role` (logp_old / logp_current: the policy at its current
        weights; logp_ref: the frozen reference), under the batch's sampling transform, 0
        where the loss mask is False."""
        if role in ("logp_old", "logp_current"):
            model = self.model
        elif role == "logp_ref":
            if self.ref_model is None:
                raise PolicylabError("logp_ref was asked for, but no reference model is loaded")
            model = self.ref_model
        else:
            raise PolicylabError(f"unknown role {role!r}: the worker computes logp_old, logp_current and logp_ref")
        out = []
        prefix = None
        if self.settings.shared_prefix:
            with autocast(self.dtype, self.device):
                prefix = shared_prefix_or_none(model, batch.tokens, batch.attention_mask, batch.prompt_width)
        for idx in torch.arange(batch.size).split(self.micro_batch_size):
            mb = batch.select(idx)
            with autocast(self.dtype, self.device):
                if prefix is not None:
                    lp = prefix.logprobs(model, idx, mb.tokens, mb.attention_mask, sampling=mb.sampling)
                else:
                    lp = model_logprobs(model, mb.tokens, mb.attention_mask, mb.prompt_width, sampling=mb.sampling)
            lp = lp.float() if lp.dtype != torch.float64 else lp
            out.append(torch.where(mb.loss_mask, lp, torch.zeros((), dtype=lp.dtype)))
        return torch.cat(out)

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        if self.critic is None:
            raise PolicylabError("values were asked for, but the method has no critic")
        return self.critic.values(batch)

    @torch.no_grad()
    def logprobs_at(self, batch: RolloutBatch, ids: torch.Tensor) -> torch.Tensor:
        """[B, T, K] current-policy log-probs of the candidate ids at every response position."""
        out = []
        for idx in torch.arange(batch.size).split(self.micro_batch_size):
            mb = batch.select(idx)
            out.append(model_logprobs_at(self.model, mb.tokens, mb.attention_mask, mb.prompt_width, ids[idx],
                                         sampling=mb.sampling))
        return torch.cat(out)

    @torch.no_grad()
    def vocab_stats(self, batch: RolloutBatch, *, kl_to_reference: bool = False, position_chunk: int | None = None,
                    vocab_chunk: int | None = None) -> dict[str, torch.Tensor]:
        """Full-vocabulary statistics of the policy at its current weights at every counted
        response position, under the batch's sampling transform (temperature, menu):
        {"entropy": [B, T]} and, with `kl_to_reference`, {"kl": [B, T]} = KL(π_θ‖π_ref) of
        the next-token distributions (exact, not a sampled-token estimate). Chunked over
        positions and vocabulary (`policylab.models.vocab.head_stats`): [B, T, V] is never built.
        0 where the loss mask is False."""
        from policylab.models.vocab import DEFAULT_POSITION_CHUNK, DEFAULT_VOCAB_CHUNK, head_stats, response_hidden

        if kl_to_reference and self.ref_model is None:
            raise PolicylabError("a full-vocabulary KL to the reference was asked for, but no reference model is "
                                 "loaded (a stage must read logp_ref for the trainer to load one)")
        chunks = dict(position_chunk=position_chunk or DEFAULT_POSITION_CHUNK,
                      vocab_chunk=vocab_chunk or DEFAULT_VOCAB_CHUNK)
        parts: dict[str, list] = {}
        for idx in torch.arange(batch.size).split(self.micro_batch_size):
            mb = batch.select(idx)
            with autocast(self.dtype, self.device):
                h, head, cap = response_hidden(self.model, mb.tokens, mb.attention_mask, mb.prompt_width)
                ref = {}
                if kl_to_reference:
                    hr, head_r, cap_r = response_hidden(self.ref_model, mb.tokens, mb.attention_mask, mb.prompt_width)
                    ref = dict(ref_hidden=hr, ref_head=head_r, ref_softcap=cap_r)
            out = head_stats(h, head, mb.loss_mask, sampling=mb.sampling, softcap=cap, **ref, **chunks)
            for k, v in out.items():
                parts.setdefault(k, []).append(v)
        return {k: torch.cat(v) for k, v in parts.items()}

    @torch.no_grad()
    def prompt_logprobs(self, role: str, batch: RolloutBatch) -> torch.Tensor:
        """[B, P] log-prob of every prompt token given the prompt tokens before it, under
        `role` (logp_ref: the frozen reference; logp_current: the policy now), plain
        softmax (temperature 1: the likelihood of the text, not a sampling distribution).
        0 at padding and at each row's first real token (nothing predicts it)."""
        from policylab.models.logprobs import model_logprobs

        model = self._role_model(role)
        P = batch.prompt_width
        if P < 2:
            raise PolicylabError(f"prompt log-probs need a prompt of at least 2 columns, got {P}")
        out = []
        for idx in torch.arange(batch.size).split(self.micro_batch_size):
            mb = batch.select(idx)
            tok, att = mb.tokens[:, :P], mb.attention_mask[:, :P]
            scored = att[:, 1:] & att[:, :-1]  # a real token whose predecessor is real
            with autocast(self.dtype, self.device):
                lp = model_logprobs(model, tok, att, 1, sampling=SamplingSettings(), mask=scored)
            lp = lp.float() if lp.dtype != torch.float64 else lp
            out.append(torch.cat([torch.zeros_like(lp[:, :1]), torch.where(scored, lp, torch.zeros_like(lp))], 1))
        return torch.cat(out)

    def _role_model(self, role: str):
        if role in ("logp_old", "logp_current"):
            return self.model
        if role == "logp_ref":
            if self.ref_model is None:
                raise PolicylabError("logp_ref was asked for, but no reference model is loaded")
            return self.ref_model
        raise PolicylabError(f"unknown role {role!r}: the worker computes logp_old, logp_current and logp_ref")

    def continuation_logprobs(self, batch: RolloutBatch, continuations: list[list[int]], scored: list[int], *,
                              strip_token: int | None = None) -> torch.Tensor:
        """[B] summed log-probability, under the current policy (raw distribution:
        temperature 1, no top-p/k), of the last `scored[i]` tokens of `continuations[i]`
        appended after row i's prompt and counted response tokens (its loss-mask tokens,
        minus a trailing `strip_token`, e.g. EOS, when given). The other appended tokens
        are context. One scoring forward, in micro-batches; no gradient.

        Used to read what the model believes after its own reply, e.g. the probability of a
        reference answer after each response (an answer posterior)."""
        if len(continuations) != batch.size or len(scored) != batch.size:
            raise PolicylabError(f"continuation_logprobs: {len(continuations)} continuations and {len(scored)} "
                                 f"scored counts for {batch.size} rows")
        rows = []
        for i in range(batch.size):
            prompt = batch.tokens[i, : batch.prompt_width][batch.attention_mask[i, : batch.prompt_width]]
            resp = batch.tokens[i, batch.prompt_width:][batch.loss_mask[i]]
            if strip_token is not None and resp.numel() and int(resp[-1]) == int(strip_token):
                resp = resp[:-1]
            k = int(scored[i])
            if not 1 <= k <= len(continuations[i]):
                raise PolicylabError(f"continuation_logprobs: row {i} scores {k} of {len(continuations[i])} tokens")
            rows.append((torch.cat([prompt, resp, torch.as_tensor(continuations[i][:-k], dtype=torch.long)]),
                         torch.as_tensor(continuations[i][-k:], dtype=torch.long)))
        P = max(int(c.numel()) for c, _ in rows)
        T = max(int(t.numel()) for _, t in rows)
        pad = 0
        tokens = torch.full((batch.size, P + T), pad, dtype=torch.long)
        am = torch.zeros((batch.size, P + T), dtype=torch.bool)
        mask = torch.zeros((batch.size, T), dtype=torch.bool)
        for i, (ctx, tgt) in enumerate(rows):
            tokens[i, P - ctx.numel(): P] = ctx
            am[i, P - ctx.numel(): P] = True
            tokens[i, P: P + tgt.numel()] = tgt
            am[i, P: P + tgt.numel()] = True
            mask[i, : tgt.numel()] = True
        device = next(self.model.parameters()).device
        out = []
        for idx in torch.arange(batch.size).split(self.micro_batch_size):
            with autocast(self.dtype, self.device):
                lp = model_logprobs(self.model, tokens[idx].to(device), am[idx].to(device), P,
                                    sampling=SamplingSettings(), mask=mask[idx].to(device))
            out.append(torch.where(mask[idx].to(lp.device), lp.float(), torch.zeros((), dtype=torch.float32)).sum(-1))
        return torch.cat(out).cpu()

    # ------------------------------------------------------------------ updates
    def optimizer_step(self, method, minibatch: RolloutBatch, adv: torch.Tensor, *, old_from_same_forward: bool,
                       hooks: StepHooks = StepHooks()) -> dict:
        return optimizer_step(self.learner, method, minibatch, adv, old_from_same_forward=old_from_same_forward,
                              hooks=hooks)

    def value_step(self, batch: RolloutBatch, returns: torch.Tensor, *, clip_eps: float | None) -> dict:
        from policylab.models.critic import value_step

        return value_step(self.critic, self.critic_optimizer, batch, returns, clip_eps=clip_eps,
                          micro_batch_size=self.micro_batch_size, grad_clip=self.settings.grad_clip)
