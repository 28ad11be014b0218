"""The step extension in verl (`policylab.integrations.steps`), tested against verl 0.9.1's
FSDP2 engine: methods whose stages change the learner outside the loss (CORD, GCPO, ISO)
run by verl's own actor with one change, its worker class:

    role_worker_mapping[Role.ActorRollout] = ray.remote(policylab.integrations.verl.steps.ActorRolloutRefWorker)

(a `TaskRunner.add_actor_rollout_worker` override; everything else is verl's). The
method is the actor's ``policy_loss.loss_mode=policylab_<method>`` with its
``method_params``; a stage that draws training examples (CORD's retention set) reads
them from ``policy_loss.train_examples`` (a JSON-lines file of {"prompt", "answer"}).

What the subclass changes is the actor's training engine (verl's `FSDPEngine`; the
reference model and the rollout are untouched). Its class gains `StepEngine`, which
overrides three of the engine's own methods:

- ``_build_fsdp_module(module)``: verl calls it with the HF module (after its LoRA
  wrapping), right before FSDP wraps it and the optimizer is built over the wrapped
  parameters: the method's learner model stages run on the module first (ISO's
  fixed-spectrum layers, GCPO's frames and projected factors);
- ``optimizer_step()``: verl calls it once per mini-batch, after the last micro-batch's
  backward; it clips (``actor.optim.clip_grad``), skips a non-finite step and steps. The
  gradient stages run before it, on the accumulated gradient, so verl's clip and its
  non-finite check see the gradient they leave (policylab's order:
  `policylab.backends.update.apply_step`); the post-step stages run after it, when verl
  did step (a finite gradient norm);
- ``get_per_tensor_param()`` (the weights verl sends to its rollout engine): a layer a
  model stage re-parameterized is sent as the plain weight of the HF layer it replaced
  (`exported_state`), so vLLM / SGLang load it by its HF name.

The stages run on a plain (unsharded, un-wrapped) torch module with the actor's structure
(a copy made before FSDP wraps it), whose parameters are, at every call, the FSDP
engine's own tensors (one process: the local shard is the whole tensor, no copy); a
stage's gradient or weight writes go back to the engine's tensors. A stage that runs a
forward (CORD's retention loss) runs it on that module with plain autograd, outside
FSDP's hooks (the copy's own weights are dropped once it is bound: no second copy of the
weights is kept). The extension runs in one process (data-parallel size 1): a sharded actor
would need every stage to run on gathered tensors, which it does not do.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from policylab.errors import PolicylabError
from policylab.integrations import hosting
from policylab.integrations.steps import StepExtension
from policylab.integrations.verl.engine import ENGINE, method_of, plain
from policylab.methods.spec import RunShape

WORKER = "policylab.integrations.verl.steps.ActorRolloutRefWorker"
_ACTIVE: dict[str, int] = {}  # method name -> step engines built in this process


def active(method: str) -> bool:
    """Whether a step engine for `method` was built in this process (the loss refuses to
    train such a method without one)."""
    return _ACTIVE.get(method, 0) > 0


def step_plan(policy_loss) -> hosting.HostPlan | None:
    """The hosting plan of the actor's policylab method when it has learner-changing
    stages (else None)."""
    pl = policy_loss
    mode = pl.get("loss_mode") if hasattr(pl, "get") else getattr(pl, "loss_mode", None)
    name = method_of(mode)
    if name is None:
        return None
    params = plain(pl.get("method_params") if hasattr(pl, "get") else getattr(pl, "method_params", None))
    p = hosting.plan(name, ENGINE, params)
    if not p.hostable:
        raise PolicylabError(p.refusal())
    return p if p.step else None


def _local(t):
    """The tensor an FSDP2 parameter (a DTensor) holds on this rank; a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


class _PlainModel:
    """The plain module the stages run on, bound to the FSDP engine's parameters."""

    def __init__(self, module: torch.nn.Module):
        self.module = copy.deepcopy(module)
        self.pairs: list[tuple[torch.nn.Parameter, Any]] = []

    def bind(self, wrapped: torch.nn.Module) -> None:
        ours = dict(self.module.named_parameters())
        theirs = dict(wrapped.named_parameters())
        if set(ours) != set(theirs):
            missing = sorted(set(ours) ^ set(theirs))[:4]
            raise PolicylabError(f"verl's FSDP module and the step extension's copy name their parameters "
                                 f"differently ({missing}): the step extension supports strategy=fsdp2")
        for name, fp in theirs.items():
            if tuple(_local(fp).shape) != tuple(ours[name].shape):
                raise PolicylabError(f"parameter {name}: this rank holds {tuple(_local(fp).shape)} of "
                                     f"{tuple(ours[name].shape)}; the step extension runs with one process")
        self.pairs = [(ours[n], theirs[n]) for n in ours]
        dev = next(iter(theirs.values())).device if theirs else None
        self.point()
        if dev is not None:
            for mod in self.module.modules():  # buffers (rotary tables, frames) where the weights are
                for k, b in list(mod._buffers.items()):
                    if b is not None and b.device != dev:
                        mod._buffers[k] = b.to(dev)

    def point(self, grads: bool = False) -> None:
        """The copy's parameters (and gradients) become the engine's own tensors."""
        for pp, fp in self.pairs:
            pp.data = _local(fp).detach()
            if grads:
                pp.grad = None if fp.grad is None else _local(fp.grad)

    def write_grads(self) -> None:
        for pp, fp in self.pairs:
            g = pp.grad
            if g is None:
                fp.grad = None
            elif fp.grad is not None and _local(fp.grad).data_ptr() == g.data_ptr():
                pass  # changed in place: already the engine's gradient
            elif fp.grad is not None:
                _local(fp.grad).copy_(g)
            elif hasattr(fp, "to_local"):
                from torch.distributed.tensor import DTensor

                fp.grad = DTensor.from_local(g.detach().clone(), fp.device_mesh, fp.placements)
            else:
                fp.grad = g.detach().clone()
            pp.grad = None

    def write_weights(self) -> None:
        for pp, fp in self.pairs:
            local = _local(fp).detach()
            if local.data_ptr() != pp.data.data_ptr():
                with torch.no_grad():
                    local.copy_(pp.data)


class StepEngine:
    """Mixed in front of verl's FSDP engine class (see the module doc)."""

    _policylab_steps: StepExtension
    _policylab_plain: _PlainModel | None = None
    _policylab_version: int = 0
    _policylab_metrics: dict

    def _build_fsdp_module(self, module):
        ext = self._policylab_steps
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            raise PolicylabError(f"policylab method `{ext.method.name}` changes the learner outside its loss, and "
                                 "verl's step extension runs with one process (the stages would need the gathered "
                                 f"weights of a sharded actor): world size is {torch.distributed.get_world_size()}")
        if getattr(self.engine_config, "strategy", "fsdp2") != "fsdp2":
            raise PolicylabError(f"policylab method `{ext.method.name}`: verl's step extension runs with "
                                 f"actor.strategy=fsdp2, not {self.engine_config.strategy}")
        if getattr(self, "scaler", None) is not None or (self.engine_config.mixed_precision or {}).get(
                "param_dtype") in ("fp16", "float16"):
            raise PolicylabError(f"policylab method `{ext.method.name}`: fp16 parameters (a grad scaler) are not "
                                 "supported by the step extension")
        module = ext.setup(module)  # before FSDP wraps it and the optimizer is built
        self._policylab_plain = _PlainModel(module)
        wrapped = super()._build_fsdp_module(module)
        self._policylab_plain.bind(wrapped)
        self._policylab_metrics = {}
        _ACTIVE[ext.method.name] = _ACTIVE.get(ext.method.name, 0) + 1
        return wrapped

    def optimizer_step(self):
        ext, plain_model = self._policylab_steps, self._policylab_plain
        metrics: dict = {}
        if "grad" in ext.kinds():
            plain_model.point(grads=True)
            metrics.update(ext.grad(plain_model.module, self._policylab_version))
            plain_model.write_grads()
        grad_norm = super().optimizer_step()  # verl: clip, skip a non-finite step, step
        if math.isfinite(grad_norm):
            if "poststep" in ext.kinds():
                plain_model.point()
                metrics.update(ext.post(plain_model.module, self._policylab_version))
                plain_model.write_weights()
            self._policylab_version += 1
        for k, v in metrics.items():
            if isinstance(v, (int, float)) or torch.is_tensor(v) and v.numel() == 1:
                self._policylab_metrics.setdefault(f"actor/policylab/{k}", []).append(float(v))
        return grad_norm

    def train_batch(self, data, loss_function):
        out = super().train_batch(data, loss_function)
        metrics, self._policylab_metrics = self._policylab_metrics, {}
        if out is not None and self.is_mp_src_rank_with_outputs():
            out["metrics"].update(metrics)
        return out

    def load_checkpoint(self, *args, **kwargs):
        out = super().load_checkpoint(*args, **kwargs)
        steps = [int(s["step"]) for s in self.optimizer.state.values() if "step" in s] if self.optimizer else []
        self._policylab_version = max(steps) if steps else max(self._policylab_version, 1)
        return out

    def get_per_tensor_param(self, *args, **kwargs):
        params, peft = super().get_per_tensor_param(*args, **kwargs)
        replaced = self._exported()
        if not replaced:
            return params, peft
        prefixes = tuple(f"{n}." for n in replaced)

        def stream():
            for name, t in params:
                if not name.startswith(prefixes):
                    yield name, t
            for prefix, state in replaced.items():
                for k, v in state.items():
                    yield f"{prefix}.{k}", v

        return stream(), peft

    def get_per_tensor_param_shard(self, *args, **kwargs):
        if self._exported():
            raise PolicylabError(f"policylab method `{self._policylab_steps.method.name}` re-parameterizes layers "
                                 "of the actor; verl's delta_sharded weight sync sends them unconverted: use the "
                                 "default checkpoint_engine backend")
        return super().get_per_tensor_param_shard(*args, **kwargs)

    def _exported(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each re-parameterized layer's plain HF state, by its module name (at the current
        weights)."""
        plain_model = self._policylab_plain
        if plain_model is None:
            return {}
        layers = [(n, m) for n, m in plain_model.module.named_modules() if hasattr(m, "exported_state")]
        if not layers:
            return {}
        plain_model.point()
        out = {}
        for n, m in layers:
            with torch.no_grad():
                out[_hf_name(n)] = {k: v.detach().clone() for k, v in m.exported_state().items()}
        return out


def _hf_name(name: str) -> str:
    """A module name of the actor as verl's weight sync names it (no PEFT prefix)."""
    for prefix in ("base_model.model.",):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


_CLASSES: dict[type, type] = {}


def with_steps(engine, ext: StepExtension):
    """`engine` (a verl FSDP engine, not yet initialized) with the step extension of `ext`."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    if not isinstance(engine, FSDPEngine):
        raise PolicylabError(f"policylab method `{ext.method.name}`: verl's step extension runs on its FSDP engine "
                             f"(actor.strategy=fsdp2), not {type(engine).__name__}")
    base = type(engine)
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Policylab{base.__name__}", (StepEngine, base), {"__module__": __name__})
    engine.__class__ = _CLASSES[base]
    engine._policylab_steps = ext
    engine._policylab_metrics = {}
    return engine


def _worker_classes():
    from verl.workers.engine_workers import ActorRolloutRefWorker as VerlWorker
    from verl.workers.engine_workers import TrainingWorker

    class StepTrainingWorker(TrainingWorker):
        """verl's TrainingWorker whose engine carries the step extension (set by the
        actor worker below before the engine is initialized)."""

        policylab_extension: StepExtension | None = None

        def __init__(self, config):
            super().__init__(config)
            if self.policylab_extension is not None:
                with_steps(self.engine, self.policylab_extension)

    class ActorRolloutRefWorker(VerlWorker):
        """verl's ActorRolloutRefWorker whose actor engine runs the step extension of the
        actor's policylab method (see the module doc); a method without learner-changing
        stages runs exactly as under verl's own worker."""

        def init_model(self):
            plan = step_plan(self.config.actor.policy_loss) if "actor" in self.role else None
            if plan is not None:
                pl = self.config.actor.policy_loss
                examples = pl.get("train_examples", None) if hasattr(pl, "get") else getattr(pl, "train_examples", None)
                m = plan.method
                n = self.config.rollout.get("n", 1) if hasattr(self.config.rollout, "get") else 1
                run = RunShape(group_size=int(n), epochs=int(self.config.actor.get("ppo_epochs", 1)),
                               max_new_tokens=int(self.config.rollout.get("response_length", 32)))
                m = hosting.with_run(m, run)
                tok = self._policylab_tokenizer()
                ext = StepExtension(m, "verl", tokenizer=tok, run=run, seed=int(self.config.actor.get("seed", 0) or 0),
                                    train_examples=examples)
                draws = [s.name for s in hosting.learner_stages(m) if "train_examples" in s.requires]
                if draws and ext.examples is None:
                    raise PolicylabError(f"policylab method `{m.name}` draws training examples itself "
                                         f"({', '.join(draws)}): {ENGINE.step_requires['train_examples']}")
                worker_cls = type("PolicylabTrainingWorker", (StepTrainingWorker,), {"policylab_extension": ext})
                self.actor_worker_cls = worker_cls
            return super().init_model()

        def _policylab_tokenizer(self):
            from verl.utils import hf_tokenizer

            path = self.config.model.get("tokenizer_path", None) or self.config.model.path
            return hf_tokenizer(path, trust_remote_code=bool(self.config.model.get("trust_remote_code", False)))

        @property
        def policylab_steps(self) -> StepExtension | None:
            """The actor engine's step extension (None for a method without one)."""
            eng = getattr(getattr(self, "actor", None), "engine", None)
            return getattr(eng, "_policylab_steps", None)

    return StepTrainingWorker, ActorRolloutRefWorker


def __getattr__(name: str):
    # the worker classes subclass verl's: built when first asked for (importing this module
    # needs no verl, e.g. for `policylab integrations`)
    if name in ("ActorRolloutRefWorker", "StepTrainingWorker"):
        step_cls, actor_cls = _worker_classes()
        globals().update(StepTrainingWorker=step_cls, ActorRolloutRefWorker=actor_cls)
        return globals()[name]
    raise AttributeError(name)


__all__ = ["WORKER", "StepEngine", "active", "step_plan", "with_steps"]
