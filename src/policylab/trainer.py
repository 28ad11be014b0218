"""The trainer: a thin loop over pure stages.

    prompts -> engine samples (behavior log-probs recorded) -> rewards -> filters (refill)
    -> old / reference log-probs and values, only when the recipe needs them
    -> advantages -> K passes x minibatches of optimizer steps (normalizer once per step)
    -> the engine shares the policy's weights (sync is free for the HF engine) -> log

Every sample carries the policy version that produced it; the version advances with
every optimizer step.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from . import memory, methods, runtime
from .batch import RolloutBatch
from .checkpoint import latest_checkpoint, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .config import ConfigError, RunConfig
from .errors import PolicylabError
from .logprobs import model_logprobs
from .prefix import shared_prefix_or_none
from .methods import stages
from .rollout import attach, keep_groups, merge, sampling_from, score
from .trainer_support import (
    _autocast,
    _adamw,
    _build_engine,
    _lr_lambda,
    _mean_dicts,
    _rollout_metrics,
    _seed_everything,
    _wrap_lora,
    load_run_config,  # noqa: F401  (re-exported: run.py and cli.py import it from here)
    save_config,  # noqa: F401
)
from .update import optimizer_step


class Trainer:
    """Build everything a run needs from a `RunConfig`, then `run()`."""

    def __init__(self, cfg: RunConfig, *, console=None):
        from .models import load_policy
        from .taskrun import build_task, extra_rewards

        self.cfg = cfg
        self.console = console
        self.run_dir = Path(cfg.run_dir)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if cfg.keep_freed_memory:
            runtime.keep_freed_memory()
        _seed_everything(cfg.seed)
        self.recipe = methods.get(cfg.method).with_params(cfg.method_params)
        if not self.recipe.runnable:
            raise PolicylabError(f"method `{cfg.method}` is a literature-only card and cannot be trained")
        if cfg.rollout.group_size < self.recipe.min_group_size:
            raise ConfigError(
                f"method `{cfg.method}` needs rollout.group_size >= {self.recipe.min_group_size}, got {cfg.rollout.group_size}"
            )
        dtype = torch.float64 if cfg.train.dtype == "fp64" else torch.float32
        self.model, self.tokenizer = load_policy(cfg.model, dtype=dtype)
        self.model.train()
        self.model.config.use_cache = True
        self.ref_model = None
        if "logp_ref" in self.recipe.required_fields:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        if cfg.train.lora_rank > 0:
            self.model = _wrap_lora(self.model, cfg.train)
        self.critic = self.critic_opt = None
        if self.recipe.critic:
            from .critic import ValueModel

            self.critic = ValueModel(self.model)
            self.critic_opt = _adamw(self.critic.parameters(), lr=cfg.train.critic_lr)
        self.engine = _build_engine(self.model, self.tokenizer, cfg.rollout)
        self.task = build_task(cfg.task, seed=cfg.seed)
        self.extra_rewards = extra_rewards(cfg.task.extra_rewards)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = _adamw(params, lr=cfg.train.lr, betas=tuple(cfg.train.betas), weight_decay=cfg.train.weight_decay)
        self.total_opt_steps = cfg.train.steps * cfg.train.epochs * cfg.train.minibatches
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(cfg.train, self.total_opt_steps))
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed + 17)
        self.sis_gen = torch.Generator().manual_seed(cfg.seed + 29)  # SIS acceptance draws
        self.controllers: dict = {}
        if self.recipe.single_use:
            if cfg.train.epochs != 1 or cfg.train.minibatches != 1:
                raise ConfigError(
                    f"method `{cfg.method}` uses every batch for exactly one update: set train.epochs=1 and "
                    "train.minibatches=1 (gradient accumulation over micro-batches is fine)"
                )
            from .corrections import BatchLedger

            self.controllers["ledger"] = BatchLedger()
        if self.recipe.params.get("scale") == "ema":
            from .advantages import EmaScale

            self.controllers["ema_scale"] = EmaScale(decay=float(self.recipe.params.get("ema_decay", 0.99)))
        self.step = 0
        self.policy_version = 0
        self.prompt_counter = 0
        self.stale_queue: list[RolloutBatch] = []
        self.run_state: dict = {}  # run-level bookkeeping carried in checkpoints (policylab.run: train_seconds)
        self.L_norm = self.recipe.params.get("L_norm") or cfg.rollout.max_new_tokens

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

    # ------------------------------------------------------------------ rollout
    def _sample(self, n_prompts: int, tag: str) -> RolloutBatch:
        r = self.cfg.rollout
        examples = self.task.next_train(n_prompts)
        prompts = [self.encode(e.prompt) for e in examples]
        memory.check_sampling(self, prompts)  # refuse a step whose estimated memory does not fit
        groups = list(range(self.prompt_counter, self.prompt_counter + n_prompts))
        self.prompt_counter += n_prompts
        batch = self.engine.generate(
            prompts, group_size=r.group_size, sampling=sampling_from(r), max_new_tokens=r.max_new_tokens,
            policy_version=self.policy_version, batch_id=tag, group_ids=groups,
            record_topk=int(self.recipe.params.get("sis_topk", 0)),
        )
        texts = self.engine.decode_responses(batch)
        answers = [e.answer for e in examples for _ in range(r.group_size)]
        overlong = None
        if "overlong" in self.recipe.shaping:
            mx = self.recipe.params.get("overlong_max") or r.max_new_tokens
            cache = self.recipe.params.get("overlong_cache") or max(1, mx // 4)
            overlong = (int(mx), int(cache))
        scored = score(self.recipe, texts, answers, batch.group, batch.response_lengths, self.task.reward_fn,
                       extra=self.extra_rewards, prompts=[e.prompt for e in examples for _ in range(r.group_size)],
                       overlong=overlong)
        greedy = None
        if self.recipe.greedy_baseline:
            g_ids = self.engine.greedy(prompts, max_new_tokens=r.max_new_tokens)
            g_texts = self.tokenizer.batch_decode(g_ids, skip_special_tokens=True)
            g = torch.as_tensor(self.task.reward_fn(g_texts, [e.answer for e in examples]), dtype=torch.float32)
            greedy = g.repeat_interleave(r.group_size)
        self._last_info = scored.info
        batch = attach(batch, scored, greedy)
        if self.recipe.advantage == "grpo_process":  # rule-based steps: lines of the response
            from .rewards.process import line_steps

            steps = line_steps(self.tokenizer, batch.response_tokens, batch.loss_mask, answers, self.task.reward_fn)
            batch = batch.replace(extras={**batch.extras, **steps})
        return batch

    def collect(self) -> tuple[RolloutBatch, dict]:
        """Sample until the batch has `prompts_per_step` eligible groups (or the refill
        budget is spent: then a smaller batch trains and that is logged)."""
        r = self.cfg.rollout
        need, parts, info, rounds, sampled = r.prompts_per_step, [], {}, 0, 0
        n_seen_groups = n_kept_groups = 0
        while need > 0 and rounds <= r.max_refill_rounds:
            b = self._sample(need, f"v{self.policy_version}-s{self.step}-r{rounds}")
            sampled += b.size
            info.update(self._last_info)
            keep, _ = keep_groups(self.recipe, b)
            n_seen_groups += int(torch.unique(b.group).numel())
            kept = b.select(keep)
            kept_groups = torch.unique(kept.group)
            n_kept_groups += int(kept_groups.numel())
            if kept_groups.numel() > need:  # more than needed: keep whole groups, in order
                kept = kept.select(torch.isin(kept.group, kept_groups[:need]))
                info["filter/surplus_groups_dropped"] = info.get("filter/surplus_groups_dropped", 0) + int(kept_groups.numel() - need)
            if kept.size:
                parts.append(kept)
            need -= min(need, int(kept_groups.numel()))
            rounds += 1
        info["filter/filtered_fraction"] = 1.0 - n_kept_groups / max(n_seen_groups, 1)
        info["filter/refill_rounds"] = rounds - 1
        info["filter/missing_groups"] = need  # > 0: the refill budget ran out, a smaller batch trains
        info["rollout/sampled_sequences"] = sampled
        if not parts:
            return None, info
        batch = merge(parts, f"v{self.policy_version}-s{self.step}")
        return batch, info

    # ------------------------------------------------------------ per-role passes
    def _needs_old_pass(self) -> bool:
        t = self.cfg.train
        return (
            t.epochs > 1 or t.minibatches > 1 or self.recipe.correction is not None
            or "logp_old" in self.recipe.required_fields or self.cfg.rollout.staleness > 0
            # a behavior engine that differs from training: π_old must come from the trainer
            or self.cfg.rollout.engine_dtype != "fp32"
        )

    @torch.no_grad()
    def _role_logprobs(self, model, batch: RolloutBatch) -> torch.Tensor:
        out = []
        mbs = self.cfg.train.micro_batch_size
        prefix = None
        if self.cfg.train.shared_prefix:
            with _autocast(self.cfg.train.dtype):
                prefix = shared_prefix_or_none(model, batch.tokens, batch.attention_mask, batch.prompt_width)
        for idx in torch.arange(batch.size).split(mbs):
            mb = batch.select(idx)
            with _autocast(self.cfg.train.dtype):
                if prefix is not None:
                    lp = prefix.logprobs(model, idx, mb.tokens, mb.attention_mask, sampling=mb.sampling)
                else:
                    lp = model_logprobs(model, mb.tokens, mb.attention_mask, mb.prompt_width, sampling=mb.sampling)
            out.append(torch.where(mb.loss_mask, lp.float() if lp.dtype != torch.float64 else lp, torch.zeros((), dtype=lp.dtype)))
        return torch.cat(out)

    def prepare(self, batch: RolloutBatch) -> RolloutBatch:
        changes = {}
        if self._needs_old_pass():
            changes["logp_old"] = self._role_logprobs(self.model, batch)
        if self.ref_model is not None:
            changes["logp_ref"] = self._role_logprobs(self.ref_model, batch)
        if self.critic is not None:
            changes["values"] = self.critic.values(batch)
        return batch.replace(**changes).validate() if changes else batch

    # -------------------------------------------------------------------- step
    def train_step(self) -> dict:
        cfg, t0 = self.cfg, time.perf_counter()
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
        metrics.update(_rollout_metrics(batch, t_gen))
        t1 = time.perf_counter()
        # role passes at the sampling weights: logp_old here is π_old exactly, even when the
        # batch is trained on k versions later (async mode keeps it: the snapshot route)
        batch = self.prepare(batch)
        if cfg.rollout.staleness > 0:
            batch = self._stale(batch, metrics)
            if batch is None:
                self.step += 1
                return metrics
        if self.recipe.objective == "sis":
            batch = self._sis_accept(batch, metrics)
        if self.recipe.single_use:
            self.controllers["ledger"].consume(batch.batch_id, batch.policy_version, self.policy_version)
        scratch = dict(self.controllers)  # stages may add e.g. critic returns; controllers persist
        adv, ainfo = stages.compute_advantages(self.recipe, batch, scratch)
        metrics.update({f"adv/{k}": v for k, v in ainfo.items() if isinstance(v, (int, float)) or torch.is_tensor(v) and v.dim() == 0})
        if batch.logp_ref is not None:
            d = batch.logp_ref - (batch.logp_old if batch.logp_old is not None else batch.logp_behavior)
            k3 = torch.exp(d) - d - 1
            metrics["kl/ref_k3"] = float(k3[batch.loss_mask].mean()) if batch.loss_mask.any() else 0.0
        if batch.logp_old is not None and batch.logp_behavior is not None:
            dd = (batch.logp_old - batch.logp_behavior)[batch.loss_mask]
            metrics["mismatch/old_vs_behavior_abs_dlogp_mean"] = float(dd.abs().mean()) if dd.numel() else 0.0
            metrics["mismatch/old_vs_behavior_abs_dlogp_max"] = float(dd.abs().max()) if dd.numel() else 0.0
        step_metrics = []
        old_same = not self._needs_old_pass()
        # value pretraining (VAPO): the first `value_pretrain_steps` steps train the critic
        # only, on batches from the fixed initial policy; no policy update, no version change
        pretraining = self.critic is not None and self.step < cfg.train.value_pretrain_steps
        metrics["value/pretraining"] = float(pretraining)
        for _ in range(0 if pretraining else cfg.train.epochs):
            perm = torch.randperm(batch.size, generator=self.shuffle_gen)
            for idx in perm.tensor_split(cfg.train.minibatches):
                m = optimizer_step(
                    self.model, self.optimizer, self.scheduler, self.recipe, batch.select(idx), adv[idx],
                    micro_batch_size=cfg.train.micro_batch_size, dtype=cfg.train.dtype,
                    grad_clip=cfg.train.grad_clip, old_from_same_forward=old_same, L_norm=self.L_norm,
                    skip_nonfinite=cfg.train.skip_nonfinite, shared_prefix=cfg.train.shared_prefix,
                )
                step_metrics.append(m)
                if not m.get("skipped_nonfinite") and not m.get("skipped_no_signal"):
                    self.policy_version += 1
        if self.critic is not None:
            from .critic import value_step

            if "returns" not in scratch:
                raise PolicylabError(f"{self.recipe.name}: the advantage stage produced no critic returns")
            vm = value_step(self.critic, self.critic_opt, batch, scratch["returns"],
                            clip_eps=self.recipe.params.get("value_clip"), micro_batch_size=cfg.train.micro_batch_size,
                            grad_clip=cfg.train.grad_clip)
            metrics.update(vm)
        if step_metrics:
            metrics.update(_mean_dicts(step_metrics))
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        metrics["policy_version"] = self.policy_version
        metrics["time/train_s"] = time.perf_counter() - t1
        metrics["time/step_s"] = time.perf_counter() - t0
        metrics.update({f"sys/{k}_mb": v for k, v in runtime.memory_mb().items()})
        self.step += 1
        return metrics

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

    @torch.no_grad()
    def _sis_accept(self, batch: RolloutBatch, metrics: dict) -> RolloutBatch:
        """Draw SIS acceptance once for this round, against the current weights."""
        from .corrections import sis
        from .logprobs import model_logprobs_at

        ids = batch.extras["behavior_topk_ids"]
        cur_topk, cur_tok = [], []
        for idx in torch.arange(batch.size).split(self.cfg.train.micro_batch_size):
            mb = batch.select(idx)
            cur_topk.append(model_logprobs_at(self.model, mb.tokens, mb.attention_mask, mb.prompt_width,
                                              mb.extras["behavior_topk_ids"], sampling=mb.sampling))
        cur_tok = self._role_logprobs(self.model, batch)
        accepted, m = sis(cur_tok, ids, batch.extras["behavior_topk_logp"], torch.cat(cur_topk), batch.response_tokens,
                          batch.logp_behavior, batch.loss_mask, generator=self.sis_gen)
        metrics.update({f"correction/{k}": float(v) for k, v in m.items()})
        return batch.replace(extras={**batch.extras, "sis_accepted": accepted})

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
            "sis_gen": self.sis_gen.get_state(),
            "task": self.task.state_dict(),
            "controllers": {k: v.state_dict() for k, v in self.controllers.items() if hasattr(v, "state_dict")},
            "stale_queue": self.stale_queue,
            "run": self.run_state,
        }

    def load_state(self, st: dict) -> None:
        self.step, self.policy_version, self.prompt_counter = st["step"], st["policy_version"], st["prompt_counter"]
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        if self.critic_opt is not None and st.get("critic_optimizer"):
            self.critic_opt.load_state_dict(st["critic_optimizer"])
        set_rng_state(st["rng"])
        self.shuffle_gen.set_state(st["shuffle_gen"])
        self.sis_gen.set_state(st["sis_gen"])
        self.task.load_state_dict(st["task"])
        for k, v in st.get("controllers", {}).items():
            self.controllers[k].load_state_dict(v)
        self.stale_queue = st.get("stale_queue", [])
        self.run_state = dict(st.get("run", {}))

    def models(self) -> dict:
        out = {"model": self.model}
        if self.critic is not None:
            out["critic"] = self.critic
        return out

    def save(self) -> Path:
        return save_checkpoint(self.run_dir, self.step, self.models(), self.state(), keep=self.cfg.log.keep_checkpoints)

    def restore(self) -> bool:
        path = latest_checkpoint(self.run_dir)
        if path is None:
            return False
        self.load_state(load_checkpoint(path, self.models()))
        return True

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, label: str) -> dict:
        from .evaluate import evaluate

        e = self.cfg.eval
        examples = self.task.heldout(e.n)
        prompts = [self.encode(x.prompt) for x in examples]
        self.model.eval()
        res = evaluate(self.engine, prompts, [x.answer for x in examples], self.task.reward_fn,
                       samples=e.samples, k=tuple(e.k), temperature=e.temperature,
                       max_new_tokens=e.max_new_tokens, batch_size=e.batch_size, seed=self.cfg.seed + 999)
        self.model.train()
        res["label"] = label
        return res


