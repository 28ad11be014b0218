"""Per-run state of the mixed-policy methods and pipelines.

`FrozenModel`: a second model of the run (a peer, an external sampler, a domain teacher,
a reward model's backbone), rebuilt from where it comes from, never stored in a
checkpoint: its checkpointed state is its spec and a fingerprint of its weights, and a
resume whose rebuilt model has another fingerprint is refused. Built by a `model` stage
of the method (`build`), which sees the policy before its optimizer exists.

    spec ""        a frozen copy of the run's initial policy (the model the run starts
                   from; on a resume, rebuilt from the same starting weights)
    spec PATH      a save_pretrained model directory, or a checkpoint directory of a
                   policylab run (run_dir/checkpoints/step_N: the run's config names the
                   base model, the checkpoint's model.safetensors holds the weights)

`SuccessEma`: an exponential moving average of the native success rate (GRIN's injection
schedule), checkpointed.
"""

from __future__ import annotations

import copy

import torch

from policylab.errors import PolicylabError
from policylab.models.loading import load_model_or_checkpoint, weights_fingerprint


class FrozenModel:
    """A frozen second model (see the module docstring). `role` names it in messages."""

    def __init__(self, spec: str, role: str):
        self.spec, self.role = str(spec or ""), role
        self.model = self.tokenizer = self.engine = None
        self.name = ""
        self.fingerprint = ""

    def build(self, policy: torch.nn.Module, tokenizer) -> None:
        if self.model is not None:
            return
        if not self.spec:
            base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
            self.model, self.tokenizer, self.name = copy.deepcopy(base), tokenizer, "initial"
        else:
            self.model, self.tokenizer, self.name = load_model_or_checkpoint(self.spec, dtype=next(policy.parameters()).dtype)
        self.model.eval().requires_grad_(False)
        self.model.to(next(policy.parameters()).device)
        self.fingerprint = weights_fingerprint(self.model)
        from policylab.engines.fast import FastEngine, UnsupportedModel
        from policylab.engines.hf import HFEngine

        try:
            self.engine = FastEngine(self.model, self.tokenizer, engine_name=f"{self.role}-fast")
        except UnsupportedModel:
            self.engine = HFEngine(self.model, self.tokenizer, engine_name=f"{self.role}-hf")

    def require(self) -> "FrozenModel":
        if self.model is None:
            raise PolicylabError(f"the {self.role} model is not built (its method's model stage builds it)")
        return self

    def encode(self, prompt: str, system_prompt: str = "") -> list[int]:
        """The prompt through this model's own chat template."""
        msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
               [{"role": "user", "content": prompt}]
        ids = self.require().tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    @torch.no_grad()
    def logprobs(self, batch) -> torch.Tensor:
        """[B, T] this model's log-probs of `batch`'s response tokens (its sampling transform)."""
        from policylab.models.logprobs import model_logprobs

        lp = model_logprobs(self.require().model, batch.tokens, batch.attention_mask, batch.prompt_width,
                            sampling=batch.sampling)
        return torch.where(batch.loss_mask, lp.float(), torch.zeros(()))

    def state_dict(self) -> dict:
        return {"spec": self.spec, "name": self.name, "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        if state.get("spec") != self.spec:
            raise PolicylabError(f"the checkpoint's {self.role} model was {state.get('spec')!r}, this run names "
                                 f"{self.spec!r}")
        if self.model is not None and state.get("fingerprint") != self.fingerprint:
            raise PolicylabError(f"the {self.role} model rebuilt from {self.spec or 'the initial policy'!r} has other "
                                 "weights than the one the checkpointed run used")


class SuccessEma:
    """EMA of the native success rate, m <- d·m + (1 − d)·rate, starting at `start`."""

    def __init__(self, decay: float, start: float = 0.0):
        self.decay, self.value, self.updates = float(decay), float(start), 0

    def update(self, rate: float) -> float:
        self.value = self.decay * self.value + (1.0 - self.decay) * float(rate)
        self.updates += 1
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.updates = float(state["value"]), int(state["updates"])


class Teachers:
    """Domain teachers of multi-teacher on-policy distillation, one `FrozenModel` per
    domain, from a spec "arithmetic=PATH,sequence=PATH" ("" or a missing domain: a frozen
    copy of the run's initial policy, shared). Checkpointed as the specs and fingerprints."""

    def __init__(self, spec: str):
        self.spec = str(spec or "")
        self.paths: dict[str, str] = {}
        for part in filter(None, (x.strip() for x in self.spec.split(","))):
            name, sep, path = part.partition("=")
            if not sep or not name.strip() or not path.strip():
                raise PolicylabError(f"teachers entry {part!r} must look like domain=PATH")
            self.paths[name.strip()] = path.strip()
        self.models: dict[str, FrozenModel] = {}

    def build(self, policy: torch.nn.Module, tokenizer) -> None:
        from policylab.tasks.mixture import DOMAINS

        unknown = set(self.paths) - set(DOMAINS)
        if unknown:
            raise PolicylabError(f"teachers name unknown domains {sorted(unknown)}; domains are {', '.join(DOMAINS)}")
        by_spec: dict[str, FrozenModel] = {}
        for d in DOMAINS:
            spec = self.paths.get(d, "")
            if spec not in by_spec:
                by_spec[spec] = FrozenModel(spec, f"teacher-{d}")
                by_spec[spec].build(policy, tokenizer)
            self.models[d] = by_spec[spec]

    def for_domain(self, domain: str) -> FrozenModel:
        if domain not in self.models:
            raise PolicylabError(f"no teacher for domain {domain!r} (the model stage builds them)")
        return self.models[domain]

    def state_dict(self) -> dict:
        return {"spec": self.spec, "teachers": {d: m.state_dict() for d, m in self.models.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state.get("spec") != self.spec:
            raise PolicylabError(f"the checkpoint's teachers were {state.get('spec')!r}, this run names {self.spec!r}")
        for d, m in self.models.items():
            m.load_state_dict(state["teachers"][d])
