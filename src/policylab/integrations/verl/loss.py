"""policylab methods as verl policy losses (``policylab_<method>``), and the actor-config
subclass that carries their parameters.

The loss is the method's objective x corrections composed by `methods.loss.loss_terms`
(nothing is re-implemented here), reduced by `policylab.kernels.aggregate.aggregate` with
the normalizer taken from verl's global batch information (`config.global_batch_info`:
tokens or sequences of the whole mini-batch over every data-parallel rank), so
micro-batch and data-parallel splits give the same update (docs/conventions.md rule 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from policylab.errors import PolicylabError
from policylab.integrations import hosting
from policylab.integrations.verl.engine import ENGINE, PREFIX, RAW_RATIO, VERL_MODES, loss_name, method_of, plain
from policylab.kernels import aggregate as agg
from policylab.methods import REGISTRY
from policylab.methods.loss import loss_terms, tensor_inputs, term_masks
from policylab.methods.spec import RunShape

# ----------------------------------------------------------------------------- parameters

_CACHE: dict[tuple, Any] = {}


def resolve(method: str, params: dict | None = None):
    """The hosted method with `params` validated (and verl's forced parameters), or
    PolicylabError naming the parameter / the missing capability."""
    items = tuple(sorted((params or {}).items()))
    key = (method, items)
    if key not in _CACHE:
        p = hosting.plan(method, ENGINE, dict(params or {}))
        if not p.hostable:
            raise PolicylabError(p.refusal())
        _CACHE[key] = p.method
        _EXTENSION[p.method.name, items] = p.extension
    return _CACHE[key]


_EXTENSION: dict[tuple, bool] = {}


def through_extension(method: str, params: dict | None = None) -> bool:
    """Whether `method` (with `params`) is hosted through the round extension."""
    resolve(method, params)
    return _EXTENSION[method, tuple(sorted((params or {}).items()))]


# ----------------------------------------------------------------------------- the loss


def _behavior(old_log_prob: torch.Tensor, weights: torch.Tensor | None, mask: torch.Tensor, name: str):
    if weights is None:
        raise PolicylabError(f"policylab loss `{loss_name(name)}` reads logp_behavior, which verl passes only as "
                             f"rollout_is_weights, and none were passed: set {RAW_RATIO}")
    w = weights.to(old_log_prob.dtype)
    if w.shape != old_log_prob.shape:
        w = w.expand_as(old_log_prob)
    bad = mask & ~(w > 0)
    if bool(bad.any()):
        raise PolicylabError(
            f"policylab loss `{loss_name(name)}`: rollout_is_weights are 0 (or not finite) on {int(bad.sum())} "
            f"counted tokens, so they are not the raw engine ratio (an IcePop band, rejection or a sequence-level "
            f"weight in verl's rollout_correction?); set {RAW_RATIO}")
    logw = torch.where(mask, w, torch.ones((), dtype=w.dtype)).log()
    return torch.where(mask, (old_log_prob.detach() - logw).clamp(max=0.0), old_log_prob.detach())


def _normalizer(mask: torch.Tensor, mode: str, L_norm: float | None, info: dict, name: str) -> float:
    dp = int(info.get("dp_size") or 1)
    key = "batch_num_tokens" if mode == "token_mean" else "global_batch_size"
    total = info.get(key)
    if total is None:
        if dp > 1:
            raise PolicylabError(f"policylab loss `{loss_name(name)}`: verl gave no global {key} with dp_size {dp} "
                                 "(config.global_batch_info); the normalizer would differ per rank")
        return agg.normalizer(mask, mode, L_norm=L_norm)
    total = float(total)
    if mode == "seq_mean_token_sum_norm":
        total *= L_norm
    if not math.isfinite(total) or total <= 0:
        raise PolicylabError(f"policylab loss `{loss_name(name)}`: global {key} is {total}; skip an empty step")
    return total / dp


def per_sequence(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl hands every loss [bs, T] advantages. When each row holds one value on its
    counted tokens (outcome estimators broadcast it) that value is the per-sequence
    advantage [bs] that sequence-level objectives (LUSPO) require; token-level advantages
    are passed on unchanged."""
    if adv.dim() != 2:
        return adv
    pos = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    first = torch.where(mask, pos, torch.full_like(pos, mask.shape[1])).min(-1).values.clamp(max=mask.shape[1] - 1)
    row = adv.gather(1, first.unsqueeze(-1)).squeeze(-1)
    row = torch.where(mask.any(-1), row, torch.zeros((), dtype=adv.dtype))
    same = torch.where(mask, adv == row.unsqueeze(-1), torch.ones((), dtype=torch.bool)).all()
    return row if bool(same) else adv


def make_loss(name: str):
    """verl's policy-loss signature for policylab method `name` (keyword call of
    `verl.workers.utils.losses.ppo_loss`; extra keywords of other releases are ignored)."""

    def policylab_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                       rollout_is_weights=None, **_unused):
        if config is None:
            raise PolicylabError(f"policylab loss `{loss_name(name)}` needs verl's actor config (config=...)")
        pl = config.policy_loss
        params = plain(getattr(pl, "method_params", None) if not isinstance(pl, dict) else pl.get("method_params"))
        method = resolve(name, params)
        method = _with_run(method, config, name)
        _require_steps(name, method)
        mask = response_mask.bool()
        if through_extension(name, params):
            return _extension_loss(name, method, old_log_prob, log_prob, advantages, mask, config)
        needs_behavior = any("logp_behavior" in s.reads for s in method.active("correction"))
        behavior = _behavior(old_log_prob, rollout_is_weights, mask, name) if needs_behavior else None
        inp = tensor_inputs(log_prob, per_sequence(advantages, mask), mask, logp_old=old_log_prob,
                            logp_behavior=behavior)
        terms, metrics = loss_terms(method, inp)
        aggregation = pl.get("aggregation", "method") if hasattr(pl, "get") else "method"
        mode = method.aggregation if aggregation == "method" else VERL_MODES.get(loss_agg_mode)
        if mode is None:
            raise PolicylabError(f"policylab loss `{loss_name(name)}`: verl's loss_agg_mode {loss_agg_mode!r} has no "
                                 f"policylab equivalent ({', '.join(VERL_MODES)})")
        info = dict(getattr(config, "global_batch_info", None) or {})
        L_norm = None
        if mode == "seq_mean_token_sum_norm":
            L_norm = method.p["L_norm"] if "L_norm" in method.p else None
            L_norm = L_norm if L_norm is not None else info.get("loss_scale_factor")
            if L_norm is None:
                raise PolicylabError(
                    f"policylab loss `{loss_name(name)}` aggregates with a constant L_norm: set "
                    "+actor_rollout_ref.actor.policy_loss.method_params.L_norm=<max response length> or "
                    "actor_rollout_ref.actor.loss_scale_factor")
            L_norm = float(L_norm)
        N = _normalizer(mask, mode, L_norm, info, name)
        loss = agg.aggregate(terms["policy"], mask, mode, normalizer=N)
        out = {f"actor/policylab/{k}": float(v) for k, v in metrics.items()
               if isinstance(v, (int, float)) or (torch.is_tensor(v) and v.numel() == 1)}
        return loss, out

    policylab_loss.__name__ = f"policylab_{name}_loss"
    policylab_loss.__qualname__ = policylab_loss.__name__
    policylab_loss.__policylab__ = name
    return policylab_loss


def _require_steps(name: str, method) -> None:
    """A method whose stages change the learner outside the loss trains only with the step
    extension's engine in this process (`policylab.integrations.verl.steps`): without it
    the loss alone would train the host objective under the method's name."""
    if not hosting.learner_stages(method):
        return
    from policylab.integrations.verl import steps

    if not steps.active(method.name):
        from policylab.integrations.steps import refuse_without

        refuse_without(method, "verl", f"use {steps.WORKER} as the actor worker class "
                                       "(role_worker_mapping[Role.ActorRollout])")


def _extension_loss(name, method, old_log_prob, log_prob, advantages, mask, config):
    """The loss of a round-extension method on one micro-batch: its rows' policylab
    columns (written by `rounds.compute_advantage` in the driver) rebuilt into a batch."""
    from policylab.integrations import rounds
    from policylab.integrations.verl import rounds as vr

    mb = vr.micro_batch()
    if mb is None:
        raise PolicylabError(f"policylab loss `{loss_name(name)}` is hosted through the round extension: the driver "
                             "must call policylab.integrations.verl.rounds.compute_advantage and the actor run "
                             "policylab.integrations.verl.rounds.loss_fn (actor_rollout_wg.set_loss_fn)")
    data, model_output = mb
    cols = {k: data[k] for k in data.keys() if isinstance(k, str) and k.startswith(rounds.PREFIX)}
    entropy = None
    if any("entropy" in s.reads for k in ("objective", "correction", "term") for s in method.active(k)):
        ent = model_output.get("entropy", None) if hasattr(model_output, "get") else None
        if ent is None:
            raise PolicylabError(f"policylab loss `{loss_name(name)}` reads the entropy: set "
                                 "actor_rollout_ref.actor.calculate_entropy=True")
        from verl.workers.utils.padding import no_padding_2_padding

        entropy = no_padding_2_padding(ent, data)
    ref = data["ref_log_prob"] if "ref_log_prob" in data.keys() else None
    batch = rounds.loss_batch(cols, mask, logp_old=old_log_prob, logp_ref=ref, batch_id=f"verl-{name}")
    inp = rounds.loss_inputs(batch, log_prob, per_sequence(advantages, mask), entropy)
    terms, metrics = loss_terms(method, inp)
    info = dict(getattr(config, "global_batch_info", None) or {})
    norms = rounds.term_norms(cols)
    masks = term_masks(method, batch)
    loss = None
    for term, mat in terms.items():
        tmask, mode, L = masks[term]
        if term == "policy":
            N = _normalizer(tmask, mode, L if L is not None else info.get("loss_scale_factor"), info, name)
        else:
            total = int(cols[rounds.PREFIX + "rows_total"].reshape(-1)[0])
            if info.get("global_batch_size") is not None and int(info["global_batch_size"]) != total:
                raise PolicylabError(f"policylab loss `{loss_name(name)}`: term `{term}` is normalized over the "
                                     f"whole round ({total} rows) and this mini-batch has "
                                     f"{info['global_batch_size']}: set ppo_mini_batch_size to the train batch size")
            N = norms[term] / int(info.get("dp_size") or 1)
            if N == 0.0:
                continue
        part = agg.aggregate(mat, tmask, mode, normalizer=N, L_norm=L)
        loss = part if loss is None else loss + part
    out = {f"actor/policylab/{k}": float(v) for k, v in metrics.items()
           if isinstance(v, (int, float)) or (torch.is_tensor(v) and v.numel() == 1)}
    return loss, out


def _with_run(method, config, name: str):
    """`method` with its run-derived parameters (a None default with a resolve rule, e.g.
    ReCo's group size) taken from the actor config's rollout_n and ppo_epochs, then the
    method's run checks; refused, naming the parameter, when the config does not carry
    rollout_n and the method needs it."""
    unresolved = [q.name for q in method.params if q.resolve is not None and method.p[q.name] is None]
    if not unresolved:
        _check_run(method, config)
        return method
    n = config.get("rollout_n", None) if hasattr(config, "get") else None
    if not isinstance(n, int):
        raise PolicylabError(f"policylab loss `{loss_name(name)}`: {', '.join(unresolved)} take their value from the "
                             "rollout group size, which this actor config does not carry (rollout_n): set "
                             f"+actor_rollout_ref.actor.policy_loss.method_params.{unresolved[0]}=<n>")
    return hosting.with_run(method, RunShape(epochs=int(config.get("ppo_epochs", 1) or 1), group_size=n))


def _check_run(method, config) -> None:
    """The method's run checks against what the actor config tells (epochs, group size)."""
    if not method.checks and method.min_group_size <= 1:
        return
    n = config.get("rollout_n", None) if hasattr(config, "get") else None
    run = RunShape(epochs=int(config.get("ppo_epochs", 1) or 1), group_size=int(n) if isinstance(n, int) else 8)
    method.check_run(run)


# ----------------------------------------------------------------------------- the config


def _policy_loss_base():
    from verl.workers.config import PolicyLossConfig

    return PolicyLossConfig


@dataclass
class PolicylabLossConfig(_policy_loss_base()):
    """verl's PolicyLossConfig plus a policylab method's parameters.

    ``loss_mode=policylab_<method>`` names the method; ``method_params`` its typed
    parameters (checked here, when verl builds the actor config); ``aggregation``
    "method" (the method's own mode) or "verl" (``actor.loss_agg_mode``);
    ``train_examples`` the JSON-lines file a step stage draws training examples from
    (CORD's retention set; `policylab.integrations.verl.steps`)."""

    method_params: dict[str, Any] = field(default_factory=dict)
    aggregation: str = "method"
    train_examples: str | None = None  # a JSON-lines file of {"prompt", "answer"}: the step extension's ctx.next_train

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        if self.aggregation not in ("method", "verl"):
            raise PolicylabError(f"policy_loss.aggregation must be 'method' or 'verl', got {self.aggregation!r}")
        name = method_of(self.loss_mode)
        if name is None:
            if self.method_params:
                raise PolicylabError(f"policy_loss.method_params are read only by policylab losses "
                                     f"({PREFIX}<method>); loss_mode is {self.loss_mode!r}")
            return
        if name not in REGISTRY:
            from policylab.methods import get

            get(name)  # raises with close matches
        m = resolve(name, plain(self.method_params))
        if self.train_examples is not None and not any("train_examples" in s.requires
                                                       for s in hosting.learner_stages(m)):
            raise PolicylabError(f"policy_loss.train_examples is read only by methods whose stages draw training "
                                 f"examples themselves (e.g. cord's retention set); `{name}` has none")
