"""The step extension's hooks in TRL's GRPOTrainer (`policylab.integrations.trl`).

Methods that change the learner outside the loss (gradient, post-step and learner model
stages: CORD, GCPO, ISO) run through the *step extension*
(`policylab.integrations.steps`), at the points of transformers' training loop where
policylab's trainer runs them (`policylab.backends.update.apply_step`):

- learner model stages: on TRL's model at the end of the trainer's construction (after
  TRL loaded it and applied ``peft_config``), before transformers creates the optimizer
  (it does so in ``train()``); a user optimizer passed through ``optimizers=`` is refused
  for them (it would hold the parameters the stage replaced);
- gradient stages: in ``_clip_grad_norm``, which transformers' Trainer calls once per
  optimizer step, after the last backward of the accumulation window and before it clips
  and steps: the stage rewrites the accumulated gradient, then transformers clips it
  (``max_grad_norm``) and steps, as policylab clips after its gradient stages. With
  ``max_grad_norm=0`` (no clipping) transformers calls ``_get_grad_norm`` there instead,
  which runs them;
- post-step stages: in an ``on_optimizer_step`` callback (right after
  ``optimizer.step()``, before the learning-rate scheduler steps; not when the step was
  skipped).

`StepHooks` is a base of `PolicylabGRPOTrainer` placed before GRPOTrainer, so its
``_clip_grad_norm`` / ``_get_grad_norm`` run first and then call transformers' own. It
reads what the trainer's constructor set: ``policylab_method``, ``_policylab_state``,
``_policylab_steps`` (None until `_policylab_step_extension` arms it) and
``_policylab_grad_done``.
"""

from __future__ import annotations

import torch

from policylab.errors import PolicylabError
from policylab.methods.spec import RunShape
from policylab.integrations import hosting

__all__ = ["StepHooks", "check_step_args"]


class StepHooks:
    """Learner model stages at construction, gradient stages before transformers clips,
    post-step stages after each optimizer step (see the module doc)."""

    def _policylab_step_extension(self, cfg, train_examples) -> None:
        """The learner model stages on TRL's model (before transformers creates the
        optimizer), and the gradient / post-step hooks armed (see the module doc)."""
        from transformers import TrainerCallback

        from policylab.integrations.steps import StepExtension

        m = self.policylab_method
        acc = self.accelerator
        if acc.num_processes > 1 or self.is_deepspeed_enabled or self.is_fsdp_enabled:
            raise PolicylabError(f"policylab method `{m.name}` changes the learner outside its loss: "
                                 "PolicylabGRPOTrainer runs its step extension in one process, without DeepSpeed or "
                                 "FSDP (their optimizer step and sharded gradients are outside the hooks)")
        if self.optimizer is not None and any(s.kind == "model" for s in hosting.learner_stages(m)):
            raise PolicylabError(f"policylab method `{m.name}` re-parameterizes the model before the optimizer is "
                                 "made; an optimizer passed through optimizers=(...) holds the parameters it replaces: "
                                 "leave it to transformers (optim=..., learning_rate=...)")
        ext = StepExtension(m, "TRL", tokenizer=self._tokenizer,
                            run=RunShape(group_size=cfg.num_generations, epochs=cfg.num_iterations,
                                         max_new_tokens=cfg.max_completion_length),
                            state=self._policylab_state, train_examples=train_examples,
                            model_fn=lambda: self.accelerator.unwrap_model(self.model))
        model = ext.setup(self.model)
        if model is not self.model:
            raise PolicylabError(f"policylab method `{m.name}`: a model stage returned a new model object; "
                                 "PolicylabGRPOTrainer needs the stages to change TRL's model in place")
        self._policylab_steps = ext
        trainer = self

        class _PostStep(TrainerCallback):
            """policylab's post-step stages after each optimizer step."""

            def on_optimizer_step(self, args, state, control, **kwargs):
                trainer._policylab_post_step()

        self.add_callback(_PostStep())

    def _policylab_grad_stages(self, model) -> None:
        """The gradient stages, once per optimizer step, on the accumulated gradient."""
        ext = self._policylab_steps
        if ext is None or self._policylab_grad_done:
            return
        self._policylab_grad_done = True
        self._policylab_log(ext.grad(self.accelerator.unwrap_model(model), int(self.state.global_step)))

    def _policylab_post_step(self) -> None:
        ext = self._policylab_steps
        if ext is None:
            return
        self._policylab_grad_done = False
        if self.accelerator.optimizer_step_was_skipped:
            return
        self._policylab_log(ext.post(self.accelerator.unwrap_model(self.model), int(self.state.global_step)))

    def _policylab_log(self, metrics: dict) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) or torch.is_tensor(v) and v.numel() == 1:
                self._metrics["train"][f"policylab/{k}"].append(float(v))

    def _clip_grad_norm(self, model):
        # transformers calls this after the last backward of the optimizer step and before
        # it clips and steps: policylab's gradient stages run first, on the accumulated gradient
        self._policylab_grad_stages(model)
        return super()._clip_grad_norm(model)

    def _get_grad_norm(self, model, grad_norm=None):
        # without clipping (max_grad_norm=0) transformers computes the norm here instead, at the
        # same point of the step: the gradient stages run (once) before it
        self._policylab_grad_stages(model)
        return super()._get_grad_norm(model, grad_norm=grad_norm)


def check_step_args(m, plan, cfg, train_examples, engine: hosting.Engine) -> None:
    """Refuse settings the step extension cannot honour, before TRL builds anything
    (`engine`: TRL's hosting description, whose requirement texts the errors quote)."""
    draws = [s.name for s in hosting.learner_stages(m) if "train_examples" in s.requires]
    if train_examples is not None and not draws:
        raise PolicylabError(f"train_examples is read only by methods whose stages draw training examples "
                             f"themselves (e.g. cord's retention set); `{m.name}` has none")
    if not plan.step:
        return
    model_stages = [s.name for s in hosting.learner_stages(m) if s.kind == "model"]
    if model_stages and getattr(cfg, "use_vllm", False):
        raise PolicylabError(f"policylab method `{m.name}` re-parameterizes TRL's model ({', '.join(model_stages)}), "
                             "and TRL's vLLM weight sync sends the model's parameters by name: generate with TRL's "
                             "own model (use_vllm=False)")
    if draws and train_examples is None:
        raise PolicylabError(f"policylab method `{m.name}` draws training examples itself ({', '.join(draws)}): "
                             f"{engine.step_requires['train_examples']}")
