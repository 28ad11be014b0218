"""policylab methods inside TRL's GRPOTrainer (tested against TRL 1.16.0).

    from policylab.integrations.trl import PolicylabGRPOTrainer
    trainer = PolicylabGRPOTrainer(method="cispo", method_params={"eps_high": 0.28},
                                   model=..., reward_funcs=[...], args=GRPOConfig(...), train_dataset=...)

The subclass replaces two things and keeps the rest of TRL (generation, reward
functions, accelerate / DeepSpeed, logging):

- advantages: after TRL has scored a generation batch, the method's advantage stage runs
  on the rewards of the whole batch (every process's completions, gathered, as TRL does;
  groups are TRL's `num_generations` consecutive completions), then each process keeps
  its slice;
- the loss (`_compute_loss`): the method's terms from `methods.loss.loss_terms` on TRL's
  tensors (``per_token_logps`` -> logp, ``old_per_token_logps`` -> logp_old, or sg(logp)
  when TRL skips that pass for a single update, ``ref_per_token_logps`` -> logp_ref,
  ``sampling_per_token_logps`` -> logp_behavior, the entropies TRL computes -> entropy),
  reduced by `policylab.kernels.aggregate.aggregate` with TRL's normalizer for the method's mode:
  a token mean over ``num_items_in_batch`` / processes (scaled to one accumulation
  window, as TRL's dapo/cispo), a sequence mean over the micro-batch's rows divided by
  the accumulation steps (as TRL's grpo/dr_grpo).

Methods that change the learner outside the loss (gradient, post-step and learner model
stages: CORD, GCPO, ISO) run through the *step extension*, whose hooks into transformers'
training loop are `policylab.integrations.trl_steps.StepHooks` (a base of the trainer).

TRL's own ``loss_type``, ``epsilon*`` and ``beta`` are not read by the loss: the method's
parameters are. ``args.beta`` is set to the method's KL coefficient so TRL computes the
reference log-probs exactly when the KL is in the loss. Methods whose needs TRL cannot
supply are refused when the trainer is built, naming the missing role
(`policylab.integrations.hosting`).
"""

from __future__ import annotations

import math

import torch
from trl import GRPOTrainer

from policylab.kernels import aggregate as agg
from policylab.errors import PolicylabError
from policylab.methods.context import StageContext
from policylab.methods.loss import loss_terms, tensor_inputs
from policylab.methods.spec import RunShape
from policylab.integrations import hosting
from policylab.integrations.trl_steps import StepHooks, check_step_args

_BEHAVIOR = ("TRL passes the sampler's log-probs (sampling_per_token_logps) only from vLLM (use_vllm=True) or a "
             "rollout_func that returns logprobs")
ENGINE = hosting.Engine(
    name="TRL",
    loss_fields=frozenset({"logp", "logp_old", "logp_behavior", "logp_ref", "entropy"}),
    advantage_fields=frozenset({"rewards", "group"}),
    requires={"logp_behavior": _BEHAVIOR},
    provides={"logp_ref": "TRL's reference model (the trainer sets args.beta to the method's kl_coef, so TRL computes "
                          "the reference log-probs exactly when the KL is in the loss)"},
    round_hook=("PolicylabGRPOTrainer runs it on each generation batch after TRL has scored it (one process), "
                "and its loss reads the micro-batch's policylab columns"),
    batch_fields=frozenset({"tokens", "loss_mask", "rewards", "group", "logp_old", "logp_current", "policy_version",
                            "batch_id", "logp_ref"}),
    batch_requires={"logp_behavior": _BEHAVIOR},
    row_sources={"demonstrations": "a demonstrator's replies", "gold_injection": "gold answers",
                 "expert_prefix": "expert prefixes continued by the policy", "peer_exchange": "a peer's rollouts",
                 "external": "an external policy's rollouts", "hinted": "replies sampled under hinted prompts"},
    step_hook=("PolicylabGRPOTrainer runs the learner model stages on TRL's model when it is built (after "
               "peft_config, before transformers creates the optimizer), the gradient stages in _clip_grad_norm "
               "(after the last backward of the optimizer step, before transformers clips and steps) and the "
               "post-step stages in an on_optimizer_step callback (after optimizer.step(), before the scheduler); "
               "one process, no vLLM weight sync for a re-parameterized model"),
    step_kinds=frozenset({"model", "grad", "poststep"}),
    step_services={"rollout.greedy": "greedy replies of the learner at its current weights (HF generate on TRL's "
                                     "model), for a stage that decodes"},
    step_requires={"lora_adapter": "a LoRA adapter on TRL's model: peft_config=LoraConfig(r=..., "
                                   "target_modules=\"all-linear\") or a PeftModel as model",
                   "train_examples": "PolicylabGRPOTrainer(train_examples=[{\"prompt\": ..., \"answer\": ...}, ...]) "
                                     "(or the path of a JSON-lines file of them): the training examples the stage "
                                     "draws itself, in order"},
)


def methods() -> list[str]:
    """The policylab methods this trainer accepts (at their defaults), with or without a
    setting they require."""
    return hosting.hostable(ENGINE)


def hosting_card(name: str) -> str:
    """What PolicylabGRPOTrainer needs to run policylab method `name`, or why it cannot."""
    p = hosting.plan(name, ENGINE)
    if not p.hostable:
        return p.refusal()
    m = p.method
    lines = [f"policylab method `{name}` in TRL ({p.status}):",
             f"  PolicylabGRPOTrainer(method={name!r}, method_params={{...}}, args=GRPOConfig(...), ...)",
             f"  aggregation: {m.aggregation}, with TRL's normalizer for that mode"]
    try:
        lines.append(f"  TRL's own equivalent loss settings: {trl_loss_args(name)}")
    except PolicylabError:
        pass
    lines += [f"  requires: {r}" for r in p.requires]
    lines += [f"  needs: {n}" for n in p.needs]
    lines += [f"  outside the loss: {o}" for o in p.outside]
    return "\n".join(lines)


class PolicylabGRPOTrainer(StepHooks, GRPOTrainer):
    """TRL's GRPOTrainer running policylab method `method` with `method_params`."""

    def __init__(self, *args, method: str = "grpo", method_params: dict | None = None, train_examples=None,
                 **kwargs):
        """`train_examples`: what a step stage draws itself (CORD's retention set; see
        `policylab.integrations.steps.examples_from`), refused for other methods."""
        plan = hosting.plan(method, ENGINE, method_params)
        if not plan.hostable:
            raise PolicylabError(plan.refusal())
        m = plan.method
        cfg = kwargs.get("args") if "args" in kwargs else (args[2] if len(args) > 2 else None)
        if cfg is None:
            raise PolicylabError("PolicylabGRPOTrainer needs args=GRPOConfig(...) (the method sets args.beta)")
        _check_args(m, cfg, kwargs.get("rollout_func"))
        if "L_norm" in m.p and m.p["L_norm"] is None:  # Dr. GRPO's documented default: the generation budget
            m = m.with_params({**(method_params or {}), "L_norm": float(cfg.max_completion_length)})
        # run-derived parameters (e.g. ReCo's group size) resolve from the trainer's shape; then the run checks
        m = hosting.with_run(m, RunShape(group_size=cfg.num_generations, epochs=cfg.num_iterations))
        kl = [s for s in m.active("addend") if "logp_ref" in s.reads]
        cfg.beta = float(m.p["kl_coef"]) if kl else 0.0  # TRL computes ref log-probs iff beta != 0
        self._policylab_extension = plan.extension
        if plan.extension and "logp_ref" in m.roles and cfg.beta == 0.0:
            cfg.beta = 1.0  # only so that TRL computes the reference log-probs; the replaced loss never reads beta
        seed = int(getattr(cfg, "seed", 0))
        self._policylab_state = m.state_objects(seed) if plan.extension or plan.step else {}
        self._policylab_extra = {}
        self.policylab_method = m
        self._policylab_rewards = None
        self._policylab_steps = None
        self._policylab_grad_done = False
        check_step_args(m, plan, cfg, train_examples, ENGINE)
        super().__init__(*args, **kwargs)
        if getattr(self, "_entropy_bonus_enabled", False):
            raise PolicylabError("TRL's entropy bonus is not run by PolicylabGRPOTrainer: set "
                                 "method_params.entropy_coef instead")
        if plan.step:
            self._policylab_step_extension(cfg, train_examples)

    # ------------------------------------------------------------------ advantages
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._policylab_rewards = rewards  # [N, F] over every process (TRL gathers them)
        return rewards

    def _generate(self, prompts):
        out = super()._generate(prompts)
        self._policylab_extra = dict(out[5] or {})  # the rollout_func's extra fields (policylab.* columns)
        return out

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        if self._policylab_extension:
            self._policylab_round(out, mode)
        else:
            out["advantages"] = self._policylab_advantages(out["completion_mask"], mode)
        return out

    # ------------------------------------------------------------------ the round extension
    def _policylab_round(self, out: dict, mode: str) -> None:
        """The method's round and advantage stages on the generation batch
        (`policylab.integrations.rounds`), its loss's columns put into `out`."""
        from policylab.batch import RolloutBatch
        from policylab.integrations import rounds

        if self.accelerator.num_processes > 1:
            raise PolicylabError(f"policylab method `{self.policylab_method.name}` runs a round stage over the whole "
                                 "batch: PolicylabGRPOTrainer runs it in one process only")
        m = self.policylab_method
        per_func = self._policylab_rewards
        if per_func is None or torch.isnan(per_func).all(dim=1).any():
            raise PolicylabError("a completion was unscorable (every reward function returned None); policylab "
                                 "advantages do not zero-fill it")
        rewards = (torch.nan_to_num(per_func) * self.reward_weights.to(per_func.device).unsqueeze(0)).sum(dim=1)
        G = self.num_generations if mode == "train" else self.num_generations_eval
        pm, cm = out["prompt_mask"].bool(), out["completion_mask"].bool()
        tokens = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
        mask = cm if "tool_mask" not in out else cm & out["tool_mask"].bool()
        old = out.get("old_per_token_logps")
        current = old
        if current is None and ("logp_current" in m.roles or "logp_old" in {f for s in m.active("round") for f in s.reads}):
            with torch.no_grad():  # the learner at the round's start: a forward at the current weights
                current, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, tokens, torch.cat([pm, cm], 1).long(), cm.shape[1], compute_entropy=False,
                    compute_aux_loss=False)
        B = tokens.shape[0]
        # provenance: every row sampled by the weights of this step, and TRL's old pass (or the
        # forward above) is at those weights
        step = int(self.state.global_step)
        extras = {"logp_old_version": torch.full((B,), step, dtype=torch.long)} if current is not None else {}
        batch = RolloutBatch(tokens=tokens, attention_mask=torch.cat([pm, cm], 1), loss_mask=mask,
                             prompt_width=pm.shape[1], group=torch.arange(B, device=cm.device) // G,
                             policy_version=torch.full((B,), step, dtype=torch.long), batch_id=f"trl-step{step}",
                             engine="trl", logp_old=current, logp_current=current,
                             logp_ref=out.get("ref_per_token_logps"), logp_behavior=out.get("sampling_per_token_logps"),
                             rewards=rewards.float(), extras=extras).validate()
        cols = {k: torch.as_tensor(v) if not isinstance(v, list) else torch.stack([torch.as_tensor(x) for x in v])
                for k, v in self._policylab_extra.items() if k.startswith(rounds.PREFIX)}
        batch = rounds.with_columns(batch, cols)
        batch, A, metrics = rounds.run_round(m, batch, self._policylab_state, RunShape(group_size=G),
                                             policy_version=step)
        out["advantages"] = A.adv
        if old is None and current is not None and "logp_old" in {f for s in m.active("round") for f in s.reads}:
            out["old_per_token_logps"] = current
        out.update(rounds.to_columns(m, batch))
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                self._metrics[mode][f"policylab/{k}"].append(float(v))

    def _policylab_advantages(self, local_mask: torch.Tensor, mode: str) -> torch.Tensor:
        m = self.policylab_method
        per_func = self._policylab_rewards
        if per_func is None:
            raise PolicylabError("no rewards were computed for this generation batch")
        if torch.isnan(per_func).all(dim=1).any():
            raise PolicylabError("a completion was unscorable (every reward function returned None); policylab "
                                 "advantages do not zero-fill it")
        rewards = (torch.nan_to_num(per_func) * self.reward_weights.to(per_func.device).unsqueeze(0)).sum(dim=1)
        G = self.num_generations if mode == "train" else self.num_generations_eval
        acc = self.accelerator
        mask = acc.gather(acc.pad_across_processes(local_mask, dim=1, pad_index=0)).bool()
        group = torch.arange(rewards.shape[0], device=rewards.device) // G
        batch = tensor_inputs(torch.zeros(mask.shape, dtype=rewards.dtype, device=mask.device), rewards, mask,
                              group=group, rewards=rewards.float()).batch
        stage = m.advantage
        ctx = StageContext(p=m.view(stage), state=hosting.replace_state(m, ENGINE), run=RunShape(group_size=G),
                           policy_version=0, sampling=None, rollout=None, worker=None, score=None, next_train=None,
                           encode=None, new_groups=None, decode=None, task_reward=None)
        with torch.no_grad():
            adv = stage.fn(batch, ctx).adv
        n = local_mask.shape[0]
        rows = slice(acc.process_index * n, (acc.process_index + 1) * n)
        adv = adv[rows]
        return adv[:, : local_mask.shape[1]].contiguous() if adv.dim() == 2 else adv

    # ------------------------------------------------------------------ the loss
    def _compute_loss(self, model, inputs):
        m = self.policylab_method
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        mask = mask.bool()
        wants_entropy = any("entropy" in s.reads for k in ("objective", "correction", "addend", "term")
                            for s in m.active(k))
        extra = {k: inputs.get(k) for k in ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
                                            "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids",
                                            "mm_token_type_ids", "image_position_ids")}
        logp, entropy, _aux = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=wants_entropy,
            compute_aux_loss=False, **extra)
        behavior = inputs.get("sampling_per_token_logps")
        if behavior is None and not self._policylab_extension and \
                "logp_behavior" in {f for s in m.active("correction") for f in s.reads}:
            raise PolicylabError(f"method `{m.name}` reads logp_behavior: {_BEHAVIOR}")
        train = self.model.training
        if self._policylab_extension:
            loss, metrics = self._policylab_extension_loss(inputs, logp, entropy if wants_entropy else None, mask,
                                                           train)
        else:
            inp = tensor_inputs(logp, inputs["advantages"], mask, logp_old=inputs.get("old_per_token_logps"),
                                logp_behavior=behavior, logp_ref=inputs.get("ref_per_token_logps"),
                                entropy=entropy if wants_entropy else None)
            terms, metrics = loss_terms(m, inp)
            loss = agg.aggregate(terms["policy"], mask, m.aggregation,
                                 normalizer=self._normalizer(inputs, mask, train))
        mode = "train" if train else "eval"
        for k, v in metrics.items():
            if torch.is_tensor(v) and v.numel() == 1 or isinstance(v, (int, float)):
                self._metrics[mode][f"policylab/{k}"].append(float(v))
        # TRL logs the mean of these values over the logging window; a micro-batch's `loss` is
        # its share of the optimizer step's loss (the shares add up to it), so the share times
        # the accumulation steps makes that mean the step's whole-batch loss, as TRL's own
        # `loss` (the sum of the shares), whatever the accumulation
        ga = self.current_gradient_accumulation_steps if train else 1
        self._metrics[mode]["policylab/loss"].append(float(loss.detach()) * ga)
        return loss

    def _policylab_extension_loss(self, inputs, logp, entropy, mask, train):
        """The loss of a round-extension method: the micro-batch rebuilt from its columns;
        the policy term with TRL's normalizer, every other term with its whole-batch
        normalizer scaled as TRL scales the policy term's."""
        from policylab.integrations import rounds
        from policylab.methods.loss import term_masks

        m = self.policylab_method
        cols = rounds.columns_of(inputs)
        batch = rounds.loss_batch(cols, mask, logp_old=inputs.get("old_per_token_logps"),
                                  logp_ref=inputs.get("ref_per_token_logps"), batch_id="trl")
        inp = rounds.loss_inputs(batch, logp, inputs["advantages"], entropy)
        terms, metrics = loss_terms(m, inp)
        masks = term_masks(m, batch)
        norms = rounds.term_norms(cols)
        N = self._normalizer(inputs, mask, train)
        scale = N / norms["policy"] if norms.get("policy") else 1.0
        loss = None
        for term, mat in terms.items():
            tmask, mode, L = masks[term]
            n = N if term == "policy" else norms[term] * scale
            if n == 0.0:
                continue
            part = agg.aggregate(mat, tmask, mode, normalizer=n, L_norm=L)
            loss = part if loss is None else loss + part
        return loss, metrics

    def _normalizer(self, inputs, mask: torch.Tensor, train: bool) -> float:
        """TRL's normalizer for the method's aggregation mode (see the module doc)."""
        m = self.policylab_method
        ga = self.current_gradient_accumulation_steps if train else 1
        mode = m.aggregation
        if mode == "token_mean":
            n = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if train:
                n = n * ga / self.args.steps_per_generation
            return float(n)
        rows = float(mask.shape[0]) * ga
        if mode == "seq_mean_token_sum_norm":
            rows *= float(m.p["L_norm"])
        if not math.isfinite(rows) or rows <= 0:
            raise PolicylabError(f"normalizer {rows} for mode {mode}")
        return rows


# TRL's own loss settings, and what each is in a policylab method's parameters. TRL's
# clipped losses bound the ratio to [1 − epsilon, 1 + epsilon_high], as policylab's eps_low /
# eps_high do; TRL's CISPO caps the importance weight at epsilon_high itself, where
# policylab's CISPO caps it at 1 + eps_high: policylab eps_high = 0.28 is TRL
# epsilon_high = 1.28. (TRL's GRPOConfig defaults: loss_type "dapo", epsilon 0.2,
# epsilon_high None = epsilon, beta 0.)
_TRL_LOSS = {"grpo": "grpo", "dapo": "dapo", "dr_grpo": "dr_grpo", "cispo": "cispo"}


def trl_loss_args(method, method_params: dict | None = None) -> dict:
    """The GRPOConfig settings under which TRL's own `loss_type` computes policylab method
    `method`'s loss (grpo, dapo, dr_grpo, cispo; TRL's advantages aside); PolicylabError for a
    method TRL has no loss type for."""
    name = method if isinstance(method, str) else method.name
    if name not in _TRL_LOSS:
        raise PolicylabError(f"TRL has no loss_type for policylab method `{name}` (only {', '.join(_TRL_LOSS)}); "
                             "PolicylabGRPOTrainer runs the method's own loss")
    m = hosting.plan(name, ENGINE, method_params).method
    p = m.p
    out = {"loss_type": _TRL_LOSS[name]}
    if name == "cispo":
        out["epsilon_high"] = 1.0 + float(p["eps_high"])  # TRL's cap is the weight itself, policylab's 1 + ε_high
    else:
        out["epsilon"], out["epsilon_high"] = float(p["eps_low"]), float(p["eps_high"])
    kl = any("logp_ref" in s.reads for s in m.active("addend"))
    out["beta"] = float(p["kl_coef"]) if kl else 0.0
    return out


def _trl_defaults() -> dict:
    from trl import GRPOConfig

    fields = GRPOConfig.__dataclass_fields__
    return {k: fields[k].default for k in ("loss_type", "epsilon", "epsilon_high", "beta")}


def _check_loss_settings(m, cfg) -> None:
    """TRL's `loss_type`, `epsilon`, `epsilon_high` and `beta` are not read by the replaced
    loss: a value other than TRL's default is refused unless it is the method's own value
    in TRL's terms (`trl_loss_args`), saying which policylab parameter to set."""
    defaults = _trl_defaults()
    try:
        mapped = trl_loss_args(m.name, {q.name: m.p[q.name] for q in m.params if m.p[q.name] is not None})
    except PolicylabError:
        mapped = {}
    where = {"loss_type": "the method itself", "epsilon": "method_params['eps_low']",
             "epsilon_high": "method_params['eps_high']", "beta": "method_params['kl_coef']"}
    bad = []
    for key, default in defaults.items():
        value = getattr(cfg, key, default)
        if value == default or (key in mapped and value == mapped[key]):
            continue
        hint = ""
        if m.name == "cispo" and key == "epsilon_high" and isinstance(value, (int, float)):
            hint = f" (TRL's CISPO epsilon_high={value} is policylab's cispo eps_high={value - 1:g})"
        bad.append(f"{key}={value!r} -> set {where[key]}{hint}")
    if bad:
        raise PolicylabError(f"PolicylabGRPOTrainer runs policylab method `{m.name}`'s own loss and does not read "
                             f"TRL's loss settings; these differ from the method's: " + "; ".join(bad))


def _check_args(m, cfg, rollout_func) -> None:
    """Refuse TRL settings the replaced loss would silently drop."""
    _check_loss_settings(m, cfg)
    used = {f for k in ("objective", "correction", "addend", "term") for s in m.active(k) for f in s.reads}
    if m.source.name != "on_policy" or m.active("round"):  # the round extension reads what the round stages read
        used |= {f for s in (*m.active("round"), m.advantage) for f in s.reads}
    if "logp_behavior" in used and not getattr(cfg, "use_vllm", False) and rollout_func is None:
        raise PolicylabError(f"TRL cannot host policylab method `{m.name}` here: it reads logp_behavior "
                             f"(the log-probs the rollout engine sampled from), and {_BEHAVIOR}")
    dropped = []
    if getattr(cfg, "use_liger_kernel", False):
        dropped.append("use_liger_kernel=True (TRL then skips _compute_loss)")
    if getattr(cfg, "off_policy_mask_threshold", None) is not None:
        dropped.append("off_policy_mask_threshold")
    if getattr(cfg, "top_entropy_quantile", 1.0) < 1.0:
        dropped.append("top_entropy_quantile < 1")
    if getattr(cfg, "delta", None) is not None:
        dropped.append("delta (two-sided clipping)")
    if getattr(cfg, "use_vllm", False) and getattr(cfg, "vllm_importance_sampling_correction", False):
        dropped.append("vllm_importance_sampling_correction=True (use a policylab correction: tis, icepop, mis ...)")
    kl_in_loss = any("logp_ref" in s.reads for s in m.active("addend"))
    if kl_in_loss and getattr(cfg, "use_bias_correction_kl", False):
        dropped.append(f"use_bias_correction_kl=True (TRL's default; `{m.name}`'s KL term is its own "
                       f"{m.p['kl_estimator']} estimator, set use_bias_correction_kl=False)")
    if getattr(cfg, "multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize":
        dropped.append("multi_objective_aggregation other than sum_then_normalize")
    if dropped:
        raise PolicylabError("PolicylabGRPOTrainer runs policylab's loss and advantages; these TRL settings would be "
                             "ignored, so they are refused: " + ", ".join(dropped))
