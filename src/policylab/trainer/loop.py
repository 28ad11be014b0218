"""The trainer: a thin loop over the stages of whatever method it is given.

    source -> reward stages -> filters (refill)               rollout.collect
    -> role passes at the sampling weights (π_old, reference, values)
    -> [staleness queue] -> role passes at the current weights (logp_current)
    -> round stages -> advantage stage
    -> K passes x minibatches of optimizer steps (objective x corrections + addends, terms;
       normalizer once per step; gradient stages before the step)
    -> critic step (methods with a critic) -> after stages -> sync the rollout backend -> log

It never names a method or a method's parameter: what a method needs it declares on its
spec (`policylab.methods.spec.Method`). Every sample carries the policy version that
produced it; the version advances with every optimizer step.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from policylab import methods
from policylab.backends import require_capabilities
from policylab.backends.build import build_local
from policylab.methods.fast_mode import pair_correction
from policylab.backends.update import StepHooks
from policylab.batch import RolloutBatch
from policylab.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from policylab.trainer.config import RunConfig
from policylab.errors import PolicylabError
from policylab.methods.context import StageContext
from policylab.methods.diagnostics import reduce_steps, role_diagnostics, rollout_metrics
from policylab.methods.spec import RunShape
from policylab.methods.stages.rewards import scorer
from policylab.trainer import memory, runtime
from policylab.trainer.rollout import apply_changes, collect, sampling_from
from policylab.trainer.support import load_run_config, rng_state, save_config, seed_everything, set_rng_state  # noqa: F401


def _local_backends(method, controllers, trainer):
    """The in-process backends; every sampling request first checks that the step's
    estimated memory fits (policylab.trainer.memory)."""
    cfg = trainer.cfg
    return build_local(method, model_name=cfg.model, train=cfg.train, rollout=cfg.rollout, shape=trainer.shape,
                       controllers=controllers, before_generate=lambda prompts: memory.check_sampling(trainer, prompts))


def run_shape(cfg: RunConfig) -> RunShape:
    r, t = cfg.rollout, cfg.train
    return RunShape(prompts_per_step=r.prompts_per_step, group_size=r.group_size, max_new_tokens=r.max_new_tokens,
                    temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, epochs=t.epochs,
                    minibatches=t.minibatches, staleness=r.staleness, engine_differs=r.engine_dtype != "fp32")


class Trainer:
    """Build everything a run needs from a `RunConfig`, then `run()`."""

    def __init__(self, cfg: RunConfig, *, console=None, backends=None):
        """`backends`: a callable (method, controllers, trainer) -> LocalBackends-like
        bundle; default: the in-process backends of `policylab.backends.build`."""
        from policylab.tasks.source import build_task, extra_rewards
        from policylab.trainer.config import check_model_value

        check_model_value("model", cfg.model)  # before anything is loaded
        self.cfg = cfg
        self.console = console
        self.run_dir = Path(cfg.run_dir)
        runtime.configure_threads(cfg.threads)  # cfg.threads, else POLICYLAB_THREADS, else the available cores
        if cfg.keep_freed_memory:
            runtime.keep_freed_memory()
        runtime.reset_peak_memory()  # sys/peak_rss_mb: this run's peak, not the process's so far
        seed_everything(cfg.seed)
        self.shape = run_shape(cfg)
        # the fast mode (rollout.engine=fast-bf16) pairs the method with an engine-mismatch correction
        self.method = pair_correction(methods.get(cfg.method), cfg.rollout.engine).with_params(cfg.method_params,
                                                                                               self.shape)
        self.device = torch.device(cfg.train.device)
        self.controllers = self.method.state_objects(cfg.seed)
        self.backends = (backends or _local_backends)(self.method, self.controllers, self)
        require_capabilities(self.method, self.backends.capabilities, "these backends")
        self.model, self.tokenizer, self.engine = self.backends.model, self.backends.tokenizer, self.backends.engine
        self.rollout, self.worker = self.backends.rollout, self.backends.worker
        self.optimizer, self.scheduler = self.backends.learner.optimizer, self.backends.learner.scheduler
        self.critic, self.critic_opt = self.backends.critic, self.backends.critic_optimizer
        self.ref_model = self.backends.ref_model
        self.task = build_task(cfg.task, seed=cfg.seed)
        self.extra_rewards = extra_rewards(cfg.task.extra_rewards)
        self.total_opt_steps = cfg.train.steps * cfg.train.epochs * cfg.train.minibatches
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed + 17)
        self.step = 0
        self.policy_version = 0
        self.prompt_counter = 0
        self.stale_queue: list[RolloutBatch] = []
        self.run_state: dict = {}  # run-level bookkeeping carried in checkpoints (policylab.trainer.run: train_seconds)

    # ------------------------------------------------------------------ prompts
    def encode(self, prompt: str) -> list[int]:
        msgs = []
        if self.cfg.task.system_prompt:
            msgs.append({"role": "system", "content": self.cfg.task.system_prompt})
        msgs.append({"role": "user", "content": prompt})
        ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = list(ids)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit and len(ids) + self.cfg.rollout.max_new_tokens > limit:
            raise PolicylabError(
                f"prompt of {len(ids)} tokens + max_new_tokens {self.cfg.rollout.max_new_tokens} exceeds the "
                f"model's context of {limit} tokens; shorten the prompt or lower rollout.max_new_tokens"
            )
        return ids

    def _new_groups(self, n: int) -> list[int]:
        groups = list(range(self.prompt_counter, self.prompt_counter + n))
        self.prompt_counter += n
        return groups

    def score(self, texts: list[str], examples: list):
        """The reward protocol of this run (`methods.stages.rewards.scorer`): the task's
        verifier (read at call time) plus the configured shaping functions."""
        return scorer(self.task.reward_fn, self.extra_rewards)(texts, examples)

    def context(self, tag: str = "") -> StageContext:
        """The trainer's services for this step, as stages see them."""
        return StageContext(
            p=None, state=self.controllers, run=self.shape, policy_version=self.policy_version,
            sampling=sampling_from(self.cfg.rollout), rollout=self.rollout, worker=self.worker, score=self.score,
            next_train=self.task.next_train, encode=self.encode, new_groups=self._new_groups,
            decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            task_reward=self.task.reward_fn, batch_tag=tag, step=self.step, tokenizer=self.tokenizer,
        )

    # ------------------------------------------------------------------ rollout
    def collect(self) -> tuple[RolloutBatch | None, dict]:
        """Sample until the batch has `prompts_per_step` groups that pass the method's
        filters (or the refill budget is spent: then a smaller batch trains, logged)."""
        r = self.cfg.rollout
        tag = f"v{self.policy_version}-s{self.step}"
        return collect(self.method, self.context(tag), prompts_per_step=r.prompts_per_step,
                       max_refill_rounds=r.max_refill_rounds, tag=tag)

    # ------------------------------------------------------------ role passes
    def needs_old_pass(self) -> bool:
        """π_old must be recomputed unless this is a single on-policy update whose
        engine has the trainer's numerics (then it is sg(logp) of the training forward)."""
        return "logp_old" in self.method.roles or not self.shape.single_update or not self.rollout.same_numerics_as_trainer

    def prepare(self, batch: RolloutBatch) -> RolloutBatch:
        """Role passes at the sampling weights, right after sampling: π_old (exact, even
        when the batch trains k versions later: the snapshot route), the reference, the
        critic's values."""
        changes = {}
        roles = self.method.roles
        if self.needs_old_pass():
            changes["logp_old"] = self.worker.role_logprobs("logp_old", batch)
            changes["extras"] = {**batch.extras, "logp_old_version": torch.full((batch.size,), self.policy_version)}
        if "logp_ref" in roles:
            changes["logp_ref"] = self.worker.role_logprobs("logp_ref", batch)
        if "values" in roles:
            changes["values"] = self.worker.values(batch)
        return batch.replace(**changes).validate() if changes else batch

    def current_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        """The learner at the start of this update round (detached), for methods that read
        `logp_current`; π_old is reused when it was computed at these very weights."""
        if "logp_current" not in self.method.roles:
            return batch
        same = (batch.logp_old is not None and "logp_old_version" in batch.extras
                and bool((batch.extras["logp_old_version"] == self.policy_version).all()))
        lp = batch.logp_old if same else self.worker.role_logprobs("logp_current", batch)
        return batch.replace(logp_current=lp)

    def round_inputs(self, batch: RolloutBatch):
        """What an update round trains on, from a batch whose sampling-time roles are in:
        the learner at the round's start (when the method reads it), the round stages'
        fields, the advantages. Returns (batch, Advantages, metrics)."""
        method = self.method
        batch = self.current_logprobs(batch)
        ctx = self.context(batch.batch_id)
        metrics: dict = {}
        for stage in method.active("round"):
            changes, sinfo = stage.fn(batch, ctx.for_stage(method, stage))
            batch = apply_changes(batch, changes, stage)
            metrics.update(sinfo)
        A = method.advantage.fn(batch, ctx.for_stage(method, method.advantage))
        metrics.update({f"adv/{k}": float(v) for k, v in A.info.items()
                        if isinstance(v, (int, float)) or torch.is_tensor(v) and v.dim() == 0})
        metrics.update(role_diagnostics(batch))
        return batch, A, metrics

    # -------------------------------------------------------------------- step
    def train_step(self) -> dict:
        cfg, method, t0 = self.cfg, self.method, time.perf_counter()
        self.model.eval()
        batch, info = self.collect()
        t_gen = time.perf_counter() - t0
        self.model.train()
        metrics = dict(info)
        metrics["time/generate_s"] = t_gen
        if batch is None:
            metrics["skipped_no_signal"] = 1.0
            self.step += 1
            return metrics
        metrics.update(rollout_metrics(batch, t_gen))
        t1 = time.perf_counter()
        batch = self.prepare(batch)
        if cfg.rollout.staleness > 0:
            batch = self._stale(batch, metrics)
            if batch is None:
                self.step += 1
                return metrics
        batch, A, rinfo = self.round_inputs(batch)
        adv = A.adv.detach()
        metrics.update(rinfo)
        ctx = self.context(batch.batch_id)
        pretraining = self._pretraining()
        metrics["value/pretraining"] = float(pretraining)
        step_metrics = []
        old_same = not self.needs_old_pass()
        hooks = StepHooks(grad=self._hooks(ctx, "grad"), post=self._hooks(ctx, "poststep"))
        for _ in range(0 if pretraining else cfg.train.epochs):
            for idx in self._minibatches(batch):
                m = self.worker.optimizer_step(method, batch.select(idx), adv[idx], old_from_same_forward=old_same,
                                               hooks=hooks)
                step_metrics.append(m)
                if not m.get("skipped_nonfinite") and not m.get("skipped_no_signal"):
                    self.policy_version += 1
                    self.rollout.sync_weights(self.policy_version)
        if self.critic is not None:
            if A.returns is None:
                raise PolicylabError(f"{method.name}: the advantage stage produced no critic returns")
            metrics.update(self.worker.value_step(batch, A.returns, clip_eps=method.p[method.critic.clip_param]))
        for stage in method.active("after"):
            metrics.update(stage.fn(batch, self.context(batch.batch_id).for_stage(method, stage)))
        if step_metrics:
            metrics.update(reduce_steps(step_metrics))
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        metrics["policy_version"] = self.policy_version
        metrics["time/train_s"] = time.perf_counter() - t1
        metrics["time/step_s"] = time.perf_counter() - t0
        metrics.update({f"sys/{k}_mb": v for k, v in runtime.memory_mb().items()})
        self.step += 1
        return metrics

    def _pretraining(self) -> bool:
        """Critic-only steps (a critic with a pretraining phase, e.g. VAPO's): no policy
        update, no version change, batches from the fixed initial policy."""
        c = self.method.critic
        return c is not None and c.pretrain_param is not None and self.step < int(self.method.p[c.pretrain_param])

    def _minibatches(self, batch: RolloutBatch) -> list[torch.Tensor]:
        """A random split of the rows into train.minibatches parts (whole groups when the
        objective couples the rows of a group)."""
        n = self.cfg.train.minibatches
        if self.method.objective.row_coupling != "group":
            return list(torch.randperm(batch.size, generator=self.shuffle_gen).tensor_split(n))
        uniq = torch.unique(batch.group)
        order = uniq[torch.randperm(uniq.numel(), generator=self.shuffle_gen)]
        return [torch.isin(batch.group, part).nonzero().squeeze(-1) for part in order.tensor_split(n)]

    def _hooks(self, ctx: StageContext, kind: str):
        """The method's `grad` or `poststep` stages as one callable on the model (None if none)."""
        stages = self.method.active(kind)
        if not stages:
            return None

        def run(model) -> dict:
            out = {}
            for stage in stages:
                out.update(stage.fn(model, ctx.for_stage(self.method, stage)))
            return out

        return run

    def _stale(self, batch: RolloutBatch, metrics: dict) -> RolloutBatch | None:
        """Async mode: train on the batch sampled `staleness` steps ago."""
        self.stale_queue.append(batch)
        if len(self.stale_queue) <= self.cfg.rollout.staleness:
            metrics["staleness/warming_up"] = 1.0
            return None
        old = self.stale_queue.pop(0)
        lag = (self.policy_version - old.policy_version.float()).float()
        metrics["staleness/versions_behind_mean"] = float(lag.mean())
        metrics["staleness/versions_behind_max"] = float(lag.max())
        return old

    # ------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        return {
            "step": self.step,
            "policy_version": self.policy_version,
            "prompt_counter": self.prompt_counter,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "critic_optimizer": self.critic_opt.state_dict() if self.critic_opt else None,
            "rng": rng_state(),
            "shuffle_gen": self.shuffle_gen.get_state(),
            "task": self.task.state_dict(),
            "controllers": {k: v.state_dict() for k, v in self.controllers.items()},
            "stale_queue": self.stale_queue,
            "run": self.run_state,
        }

    def load_state(self, st: dict) -> None:
        self.step, self.policy_version, self.prompt_counter = st["step"], st["policy_version"], st["prompt_counter"]
        self.rollout.sync_weights(self.policy_version)
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        if self.critic_opt is not None and st.get("critic_optimizer"):
            self.critic_opt.load_state_dict(st["critic_optimizer"])
        set_rng_state(st["rng"])
        self.shuffle_gen.set_state(st["shuffle_gen"])
        self.task.load_state_dict(st["task"])
        saved = st.get("controllers", {})
        missing = sorted(set(self.controllers) - set(saved))
        if missing:
            raise PolicylabError(f"the checkpoint has no state for {missing} of method {self.method.name}")
        for k, obj in self.controllers.items():
            obj.load_state_dict(saved[k])
        self.stale_queue = st.get("stale_queue", [])
        self.run_state = dict(st.get("run", {}))

    def models(self) -> dict:
        return self.backends.modules()

    def save(self) -> Path:
        from policylab.trainer.resume import identity_config

        return save_checkpoint(self.run_dir, self.step, self.models(), self.state(), keep=self.cfg.log.keep_checkpoints,
                               config=identity_config(self.cfg))

    def restore(self) -> bool:
        path = latest_checkpoint(self.run_dir)
        if path is None:
            return False
        self.load_state(load_checkpoint(path, self.models()))
        return True

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, label: str) -> dict:
        from policylab.eval.evaluate import evaluate

        e = self.cfg.eval
        examples = self.task.heldout(e.n)
        prompts = [self.encode(x.prompt) for x in examples]
        self.model.eval()
        res = evaluate(self.engine, prompts, [x.answer for x in examples], self.task.reward_fn,
                       samples=e.samples, k=tuple(e.k), temperature=e.temperature,
                       max_new_tokens=e.max_new_tokens, batch_size=e.batch_size, seed=self.cfg.seed + 999,
                       prompt_texts=[x.prompt for x in examples],
                       task_metrics=getattr(self.task, "heldout_metrics", None))
        self.model.train()
        res["label"] = label
        return res
