"""The step extension: a method's stages that change the learner outside its loss, run
inside an engine's own model construction and optimizer step, at the points where
policylab's trainer runs them.

policylab's trainer (`policylab.backends.build._policy`, `policylab.backends.update.apply_step`)
does, per run and per optimizer step:

    build the policy (and its LoRA adapter)
    -> model stages                       (before any optimizer exists)
    -> the optimizer
    per step: forward/backward over the micro-batches
    -> gradient stages                    (on the accumulated gradient of the whole step)
    -> gradient norm, clipping, optimizer.step()
    -> post-step stages                   (on the weights just stepped)
    -> the learning-rate schedule

The step extension puts the same calls in the same places of an engine's own loop (TRL:
`policylab.integrations.trl.PolicylabGRPOTrainer`; verl:
`policylab.integrations.verl.steps`). What an engine adapter supplies is the model to
run them on and when; this module supplies the rest, so both engines run the stages with
the same functions as the trainer (`apply_model_stages`, `stage_hook`):

- the method's per-run state objects (`Method.state_objects`: CORD's retention set),
  kept here for the whole run, as the trainer keeps its `controllers`; the learner's own
  state (GCPO's principal frames, ISO's frozen spectra) lives on the model, where the
  model stages put it;
- the stage context: the method's parameters, the run's shape, the policy version (the
  optimizer steps taken), the tokenizer, the prompt encoder (the chat template), a greedy
  decoder on the learner (`rollout.greedy`: HF generate at the current weights), and the
  training examples a stage draws itself (`ctx.next_train`) from `train_examples`, the
  user's list (the engines sample their own prompts; policylab's task stream is not
  there).

Only the stages that change the learner run here (`hosting.learner_stages`): model
stages that build a frozen companion (a peer, teachers, a reward model) go with the
source or reward they serve, which the engine's configuration provides.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

import torch

from policylab.backends.build import apply_model_stages
from policylab.backends.update import stage_hook
from policylab.batch import SamplingSettings
from policylab.errors import PolicylabError
from policylab.integrations import hosting
from policylab.methods.context import SetupContext, StageContext
from policylab.methods.spec import Method, RunShape
from policylab.tasks.example import Example


def examples_from(value, engine: str) -> list[Example] | None:
    """`train_examples` as policylab `Example`s: a list of `Example`, of {"prompt",
    "answer"} mappings or of (prompt, answer) pairs, or the path of a JSON-lines file of
    such mappings; None stays None."""
    if value is None:
        return None
    if isinstance(value, (str, Path)):
        path = Path(value)
        if not path.is_file():
            raise PolicylabError(f"{engine}: train_examples {str(value)!r} is not a file (a JSON-lines file of "
                                 "{\"prompt\": ..., \"answer\": ...} objects)")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    elif isinstance(value, Iterable):
        rows = list(value)
    else:
        raise PolicylabError(f"{engine}: train_examples must be a list of examples or a JSON-lines path, got "
                             f"{type(value).__name__}")
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, Example):
            out.append(row)
        elif isinstance(row, dict) and "prompt" in row:
            out.append(Example(str(row["prompt"]), str(row.get("answer", "")), dict(row.get("meta", {}))))
        elif isinstance(row, (tuple, list)) and len(row) == 2:
            out.append(Example(str(row[0]), str(row[1])))
        else:
            raise PolicylabError(f"{engine}: train_examples[{i}] is {row!r}; give an Example, a mapping with "
                                 "\"prompt\" (and \"answer\") or a (prompt, answer) pair")
    if not out:
        raise PolicylabError(f"{engine}: train_examples is empty")
    return out


class _Greedy:
    """`rollout.greedy` for a step stage: argmax decoding by the learner at its current
    weights (`policylab.engines.hf.HFEngine.greedy`, HF generate), on the model the
    engine adapter hands over."""

    def __init__(self, model_fn: Callable[[], torch.nn.Module], tokenizer):
        self.model_fn, self.tokenizer = model_fn, tokenizer

    def greedy(self, prompts, *, max_new_tokens: int):
        from policylab.engines.hf import HFEngine

        return HFEngine(self.model_fn(), self.tokenizer).greedy(prompts, max_new_tokens)


class StepExtension:
    """One run's learner-changing stages of `method`, for an engine adapter to call.

    method          the hosted method (its parameters as the hosting plan resolved them)
    engine          the engine's name (for messages)
    tokenizer       the learner's tokenizer
    run             the run's shape (group size, epochs, max_new_tokens for greedy replies)
    state           the method's per-run state objects (default: fresh ones for `seed`);
                    pass the round extension's when the method has both
    train_examples  what `ctx.next_train` draws from (see `examples_from`), in order
    model_fn        () -> a plain torch module at the learner's current weights, for the
                    greedy decoder (default: the model the stage is run on)
    """

    def __init__(self, method: Method, engine: str, *, tokenizer=None, run: RunShape = RunShape(), seed: int = 0,
                 state: dict | None = None, train_examples=None,
                 model_fn: Callable[[], torch.nn.Module] | None = None, system_prompt: str | None = None):
        self.method, self.engine, self.tokenizer, self.run = method, engine, tokenizer, run
        self.state = state if state is not None else method.state_objects(seed)
        self.examples = examples_from(train_examples, engine)
        self._drawn = 0
        self._model_fn = model_fn
        self._model: torch.nn.Module | None = None
        self.system_prompt = system_prompt
        self.stages = hosting.learner_stages(method)

    @property
    def active(self) -> bool:
        return bool(self.stages)

    def kinds(self) -> set[str]:
        return {s.kind for s in self.stages}

    # ------------------------------------------------------------------ model stages
    def setup(self, model: torch.nn.Module) -> torch.nn.Module:
        """The method's learner model stages on the engine's model (before its optimizer
        exists), as `policylab.backends.build._policy` runs them."""
        setup = SetupContext(p=None, run=self.run, state=self.state, tokenizer=self.tokenizer)
        return apply_model_stages(self.method, model, setup, learner_only=True)

    # ------------------------------------------------------------------ the step
    def grad(self, model: torch.nn.Module, policy_version: int) -> dict:
        """The gradient stages on `model`'s accumulated `.grad` (after the last backward of
        the step, before the gradient norm and clipping); their metrics."""
        return self._run("grad", model, policy_version)

    def post(self, model: torch.nn.Module, policy_version: int) -> dict:
        """The post-step stages on `model` (right after optimizer.step()); their metrics."""
        return self._run("poststep", model, policy_version)

    def _run(self, kind: str, model: torch.nn.Module, policy_version: int) -> dict:
        hook = stage_hook(self.method, kind, self.context(policy_version))
        if hook is None:
            return {}
        self._model = model
        try:
            return hook(model)
        finally:
            self._model = None

    # ------------------------------------------------------------------ the context
    def context(self, policy_version: int) -> StageContext:
        """What a step stage sees (see the module doc); services it does not declare are
        refused by the context (`StageContext.for_stage`)."""
        tok = self.tokenizer

        def decode(ids):
            return tok.decode(ids, skip_special_tokens=True)

        return StageContext(p=None, state=self.state, run=self.run, policy_version=int(policy_version),
                            sampling=SamplingSettings(), rollout=_Greedy(self._greedy_model, tok), worker=None,
                            score=None, next_train=self.next_train, encode=self.encode, new_groups=None,
                            decode=decode, task_reward=None, batch_tag=f"{self.engine}-v{policy_version}",
                            step=int(policy_version), tokenizer=tok)

    def _greedy_model(self) -> torch.nn.Module:
        model = self._model_fn() if self._model_fn is not None else self._model
        if model is None:
            raise PolicylabError(f"{self.engine}: a greedy decode was asked for outside a step stage")
        return model

    def next_train(self, n: int) -> list[Example]:
        """The next `n` training examples of `train_examples`, in order."""
        if self.examples is None:
            raise PolicylabError(
                f"policylab method `{self.method.name}` draws training examples itself ("
                f"{', '.join(s.name for s in self.stages if 'train_examples' in s.requires) or 'a step stage'}), and "
                f"{self.engine} was given none: pass train_examples (a list of {{\"prompt\", \"answer\"}} or a "
                "JSON-lines file of them)")
        if self._drawn + n > len(self.examples):
            raise PolicylabError(f"policylab method `{self.method.name}` asked for {n} training examples and "
                                 f"train_examples has {len(self.examples) - self._drawn} left of "
                                 f"{len(self.examples)}: give at least {self._drawn + n}")
        out = self.examples[self._drawn:self._drawn + n]
        self._drawn += n
        return out

    def encode(self, prompt: str) -> list[int]:
        """A prompt's token ids under the tokenizer's chat template (as the trainer encodes
        its prompts: an optional system message, the user's message, the generation
        prompt)."""
        if self.tokenizer is None:
            raise PolicylabError(f"{self.engine}: a step stage encodes a prompt and the step extension has no "
                                 "tokenizer")
        msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [
            {"role": "user", "content": prompt}]
        ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)


def refuse_without(method: Method, engine: str, where: str) -> None:
    """Refuse a method whose learner-changing stages no step extension runs here (`where`
    says what the user must use instead): an engine running only its loss would train it
    as its host objective under its name."""
    stages = hosting.learner_stages(method)
    if stages:
        names = ", ".join(f"{s.kind} stage `{s.name}`" for s in stages)
        raise PolicylabError(f"policylab method `{method.name}` changes the learner outside its loss ({names}); "
                             f"{engine} runs those stages only through the step extension: {where}")


__all__ = ["StepExtension", "examples_from", "refuse_without"]
