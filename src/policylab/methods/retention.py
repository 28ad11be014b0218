"""A held retention set and its likelihood: the protected objective of `cord`.

The set is built once per run, the first time the protected loss is needed (before the
first optimizer step, so a "base_greedy" set is the base policy's own replies), from
examples of the task's training stream (never the held-out split), and saved in
checkpoints: a resumed run protects the same set.

    gold         prompt + the example's gold answer + eos (a correct worked answer)
    base_greedy  prompt + the base policy's greedy reply (a demonstration of the frozen
                 initial policy: keeping its likelihood is sequence-level self-distillation)

The protected loss is the token-mean negative log-likelihood of the answer tokens under
the model (the chat template's prompt, sampling transform T = 1, no truncation).
"""

from __future__ import annotations

import torch

from policylab.batch import SamplingSettings
from policylab.errors import MissingQuantityError, PolicylabError
from policylab.models.logprobs import model_logprobs

SOURCES = ("gold", "base_greedy")


class RetentionSet:
    """Tokens of the retention set (left-padded prompts, right-padded answers) once built."""

    def __init__(self, size: int, source: str):
        if source not in SOURCES:
            raise PolicylabError(f"retention_source must be one of {', '.join(SOURCES)}, got {source!r}")
        self.size, self.source = int(size), source
        self.tokens: torch.Tensor | None = None  # [N, P + T] long
        self.attention_mask: torch.Tensor | None = None  # [N, P + T] bool
        self.loss_mask: torch.Tensor | None = None  # [N, T] bool, True = an answer token that counts
        self.prompt_width = 0

    @property
    def built(self) -> bool:
        return self.tokens is not None

    # ------------------------------------------------------------------ building
    def build(self, ctx) -> None:
        """Draw `size` training examples and pack them with their answers (see the module doc)."""
        tok = ctx.tokenizer
        if tok is None:
            raise PolicylabError("cord's retention set needs the tokenizer in the stage context")
        examples = ctx.next_train(self.size)
        prompts = [ctx.encode(e.prompt) for e in examples]
        if self.source == "gold":
            empty = [i for i, e in enumerate(examples) if not str(e.answer).strip()]
            if empty:
                raise MissingQuantityError(
                    "cord", "gold answers for its retention set",
                    f"training examples {empty} have no answer text; use a task whose training examples carry "
                    "answers, or method_params.retention_source: base_greedy")
            answers = [tok.encode(str(e.answer).strip(), add_special_tokens=False) + [tok.eos_token_id]
                       for e in examples]
        else:
            if ctx.policy_version != 0:
                raise PolicylabError(
                    f"cord's base_greedy retention set must be built from the base policy (version 0), but the "
                    f"weights are at version {ctx.policy_version} and the checkpoint holds no retention set")
            answers = ctx.rollout.greedy(prompts, max_new_tokens=ctx.run.max_new_tokens)
        self.pack(prompts, answers, pad_id=tok.pad_token_id)

    def pack(self, prompts: list[list[int]], answers: list[list[int]], *, pad_id: int) -> None:
        """Left-pad the prompts to one width P and right-pad the answers to T (>= 1)."""
        if not prompts or len(prompts) != len(answers):
            raise PolicylabError(f"retention set: {len(prompts)} prompts for {len(answers)} answers")
        P = max(len(p) for p in prompts)
        T = max(1, max(len(a) for a in answers))
        N = len(prompts)
        tokens = torch.full((N, P + T), int(pad_id), dtype=torch.long)
        att = torch.zeros((N, P + T), dtype=torch.bool)
        for i, (p, a) in enumerate(zip(prompts, answers)):
            tokens[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
            att[i, P - len(p) : P] = True
            if a:
                tokens[i, P : P + len(a)] = torch.tensor(a, dtype=torch.long)
                att[i, P : P + len(a)] = True
        self.tokens, self.attention_mask, self.loss_mask, self.prompt_width = tokens, att, att[:, P:].clone(), P

    # ------------------------------------------------------------------ the loss
    def nll(self, model: torch.nn.Module) -> torch.Tensor:
        """Token-mean NLL of the answer tokens under `model` (differentiable), one
        forward over the whole set."""
        if not self.built:
            raise MissingQuantityError("cord", "its retention set",
                                       "build it from the task (RetentionSet.build) before asking for its loss")
        n = int(self.loss_mask.sum())
        if n == 0:
            raise MissingQuantityError(
                "cord", "a protected loss with at least one counted token",
                f"every reply of the {self.source} retention set is empty; use retention_source: gold or raise "
                "rollout.max_new_tokens")
        dev = next(model.parameters()).device
        lp = model_logprobs(model, self.tokens.to(dev), self.attention_mask.to(dev), self.prompt_width,
                            sampling=SamplingSettings(), mask=self.loss_mask.to(dev))
        return -(lp * self.loss_mask.to(dev, lp.dtype)).sum() / n

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"size": self.size, "source": self.source, "tokens": self.tokens,
                "attention_mask": self.attention_mask, "loss_mask": self.loss_mask, "prompt_width": self.prompt_width}

    def load_state_dict(self, state: dict) -> None:
        if (state["size"], state["source"]) != (self.size, self.source):
            raise PolicylabError(
                f"the checkpoint's retention set has size {state['size']} and source {state['source']!r}, the run "
                f"asks for {self.size} and {self.source!r}: resume with the run's own method parameters")
        self.tokens, self.attention_mask = state["tokens"], state["attention_mask"]
        self.loss_mask, self.prompt_width = state["loss_mask"], int(state["prompt_width"])
