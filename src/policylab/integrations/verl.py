"""policylab methods inside verl (tested against verl 0.9.1).

Importing this module registers, in verl's own registries:

- every hostable policylab method (`policylab.integrations.hosting`) as a verl policy
  loss named ``policylab_<method>``: the method's objective × corrections, composed by
  `methods.loss.loss_terms` (nothing is re-implemented here) and reduced by
  `policylab.kernels.aggregate.aggregate` with the normalizer taken from verl's global batch
  information (`config.global_batch_info`: tokens or sequences of the whole mini-batch
  over every data-parallel rank), so micro-batch and data-parallel splits give the same
  update (docs/conventions.md rule 4);
- every policylab advantage stage that works from verl's token-level rewards and uid
  groups as a verl advantage estimator named ``policylab_<stage>``, returning
  (advantages, returns) shaped [bs, T].

verl loads it in the driver and in every Ray worker through the ``verl.plugins`` entry
point of the policylab package (``import verl`` loads every plug-in of that group);
``VERL_USE_EXTERNAL_MODULES=policylab.integrations.verl`` is the fallback (import errors
then raise instead of being logged at DEBUG level). ``policylab integrations`` checks
both ways.

Roles. verl's ``old_log_prob`` is ``logp_old`` (the actor's recompute at the weights
that sampled, before the update), ``log_prob`` is ``logp``. verl never passes the
rollout log-probs to a loss: it passes ``rollout_is_weights``. A policylab correction
that needs ``logp_behavior`` (TIS, IcePop, KPop, MIS, MiniRL) reads it from those
weights, which must then be the raw token engine ratio π_old/μ:

    actor_rollout_ref.rollout.calculate_log_probs=True
    algorithm.rollout_correction.rollout_is=token
    algorithm.rollout_correction.rollout_is_threshold=1e9   (above any ratio verl keeps:
                                                            it clamps log-ratios at ±20)
    algorithm.rollout_correction.rollout_is_batch_normalize=False
    (and no rollout_rs: rejection changes the response mask, i.e. the normalizer)

and ``logp_behavior = old_log_prob − log(rollout_is_weights)`` on counted tokens.

Parameters. ``actor_rollout_ref.actor.policy_loss._target_=policylab.integrations.verl.PolicylabLossConfig``
selects the config subclass below, which adds ``method_params`` (validated by the
method when verl builds its config: unknown names and bad values are refused with
policylab's messages) and ``aggregation`` ("method": the method's own mode, or "verl":
``actor.loss_agg_mode``). verl adds its own KL and entropy terms to the policy loss, so
the hosted loss has ``kl_coef = entropy_coef = 0``; the KL in the loss is
``actor.use_kl_loss=True actor.kl_loss_coef=β actor.kl_loss_type=low_var_kl`` (k3, verl
clamps it to [−10, 10]), the entropy bonus ``actor.entropy_coeff``, the KL in the
reward ``algorithm.use_kl_in_reward=True``. Advantage parameters (e.g. GRPO's ``std``)
go under ``+algorithm.policylab.<name>=<value>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from policylab.kernels import aggregate as agg
from policylab.errors import PolicylabError
from policylab.methods import REGISTRY
from policylab.methods.loss import loss_terms, tensor_inputs
from policylab.methods.spec import RunShape
from policylab.integrations import hosting

PREFIX = "policylab_"
RAW_RATIO = ("actor_rollout_ref.rollout.calculate_log_probs=True algorithm.rollout_correction.rollout_is=token "
             "algorithm.rollout_correction.rollout_is_threshold=1e9 "
             "algorithm.rollout_correction.rollout_is_batch_normalize=False (no rollout_rs)")
_KL = ("verl adds its own KL term: set actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=β "
       "actor_rollout_ref.actor.kl_loss_type=low_var_kl (k3) for KL in the loss, or algorithm.use_kl_in_reward=True "
       "for KL in the reward; the hosted loss has kl_coef 0")
_ENTROPY = "verl adds its own entropy term: set actor_rollout_ref.actor.entropy_coeff=c; the hosted loss has entropy_coef 0"

ENGINE = hosting.Engine(
    name="verl",
    loss_fields=frozenset({"logp", "logp_old", "logp_behavior"}),
    advantage_fields=frozenset({"rewards", "group"}),
    own_addends={"kl_loss": _KL, "entropy_bonus": _ENTROPY},
    off_params={"kl_coef": (0.0, _KL), "entropy_coef": (0.0, _ENTROPY)},
    conditional={"logp_behavior": "the raw engine ratio as rollout_is_weights: " + RAW_RATIO},
)

_VERL_MODES = {"token-mean": "token_mean", "seq-mean-token-mean": "seq_mean_token_mean",
               "seq-mean-token-sum": "seq_mean_token_sum", "seq-mean-token-sum-norm": "seq_mean_token_sum_norm"}
_POLICYLAB_MODES = {v: k for k, v in _VERL_MODES.items()}


def loss_name(method: str) -> str:
    return PREFIX + method


def method_of(loss_mode: str) -> str | None:
    return loss_mode[len(PREFIX):] if isinstance(loss_mode, str) and loss_mode.startswith(PREFIX) else None


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
    return _CACHE[key]


def _plain(value):
    """OmegaConf containers -> plain dict (values as given)."""
    if value is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(value, DictConfig):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - verl always brings omegaconf
        pass
    return dict(value)


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
        method = resolve(name, _plain(getattr(pl, "method_params", None) if not isinstance(pl, dict)
                                      else pl.get("method_params")))
        method = _with_run(method, config, name)
        mask = response_mask.bool()
        needs_behavior = any("logp_behavior" in s.reads for s in method.active("correction"))
        behavior = _behavior(old_log_prob, rollout_is_weights, mask, name) if needs_behavior else None
        inp = tensor_inputs(log_prob, per_sequence(advantages, mask), mask, logp_old=old_log_prob,
                            logp_behavior=behavior)
        terms, metrics = loss_terms(method, inp)
        aggregation = pl.get("aggregation", "method") if hasattr(pl, "get") else "method"
        mode = method.aggregation if aggregation == "method" else _VERL_MODES.get(loss_agg_mode)
        if mode is None:
            raise PolicylabError(f"policylab loss `{loss_name(name)}`: verl's loss_agg_mode {loss_agg_mode!r} has no "
                                 f"policylab equivalent ({', '.join(_VERL_MODES)})")
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
    "method" (the method's own mode) or "verl" (``actor.loss_agg_mode``)."""

    method_params: dict[str, Any] = field(default_factory=dict)
    aggregation: str = "method"

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
        resolve(name, _plain(self.method_params))


# ----------------------------------------------------------------------------- advantages


def _groups(index, B: int, device) -> torch.Tensor:
    if index is None:
        raise PolicylabError("policylab advantage estimators need verl's uid groups (index=...)")
    ids: dict[Any, int] = {}
    return torch.tensor([ids.setdefault(u, len(ids)) for u in list(index)], dtype=torch.long, device=device)


def token_reward_batch(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index):
    """A batch holding verl's token-level rewards the way policylab's advantage stages read
    them: `rewards` = the reward at the last counted token, `extras["kl_penalty"]` = minus
    the rewards before it (verl puts only the KL-in-reward penalty there). Then a scalar
    reward is r − Σ_t penalty = Σ_t token_level_rewards, and a return-to-go is
    Σ_{u ≥ t} token_level_rewards_u, exactly."""
    mask = response_mask.bool()
    B, T = mask.shape
    tlr = torch.where(mask, token_level_rewards, torch.zeros((), dtype=token_level_rewards.dtype))
    pos = torch.arange(T, device=mask.device).expand_as(mask)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).max(-1).values
    if bool((last < 0).any()):
        raise PolicylabError("a response with no counted token reached the advantage estimator")
    at_last = pos == last.unsqueeze(-1)
    r = tlr.gather(1, last.unsqueeze(-1)).squeeze(-1)
    before = torch.where(at_last, torch.zeros((), dtype=tlr.dtype), tlr)
    extras = {"kl_penalty": -before} if bool((before != 0).any()) else {}
    logp = torch.zeros(mask.shape, dtype=tlr.dtype, device=mask.device)
    return tensor_inputs(logp, r, mask, group=_groups(index, B, mask.device), rewards=r, extras=extras).batch


def make_estimator(stage, method):
    """verl's advantage-estimator signature for policylab advantage `stage` (with the
    parameters and defaults of `method`)."""
    from policylab.methods.context import StageContext

    name = PREFIX + stage.name

    def policylab_estimator(token_level_rewards, response_mask, config=None, index=None, **_unused):
        given = {}
        if config is not None and hasattr(config, "get"):
            given = _plain(config.get("policylab", None))
        m = hosting.stage_params(stage, method, given, f"verl advantage estimator `{name}` (+algorithm.policylab.*)")
        batch = token_reward_batch(token_level_rewards, response_mask, index)
        ctx = StageContext(p=m.view(stage), state=hosting.replace_state(m, ENGINE), run=RunShape(),
                           policy_version=0, sampling=None, rollout=None, worker=None, score=None, next_train=None,
                           encode=None, new_groups=None, decode=None, task_reward=None)
        with torch.no_grad():
            adv = stage.fn(batch, ctx).adv
        mask = response_mask.bool()
        adv = adv.unsqueeze(-1).expand(mask.shape) if adv.dim() == 1 else adv
        adv = torch.where(mask, adv, torch.zeros((), dtype=adv.dtype)).to(token_level_rewards.dtype)
        return adv, adv.clone()

    policylab_estimator.__name__ = f"policylab_{stage.name}_estimator"
    policylab_estimator.__policylab__ = stage.name
    return policylab_estimator


# ----------------------------------------------------------------------------- registration


def register() -> dict[str, list[str]]:
    """Fill verl's registries (idempotent); returns the registered names."""
    from verl.trainer.ppo import core_algos

    losses, estimators = [], []
    for name in hosting.hostable(ENGINE):
        key = loss_name(name)
        have = core_algos.POLICY_LOSS_REGISTRY.get(key)
        if have is not None and getattr(have, "__policylab__", None) is None:
            raise PolicylabError(f"verl already has a policy loss named {key!r} that is not policylab's")
        core_algos.POLICY_LOSS_REGISTRY[key] = make_loss(name)
        losses.append(key)
    for stage_name, (stage, method) in hosting.advantage_stages(ENGINE).items():
        key = PREFIX + stage_name
        have = core_algos.ADV_ESTIMATOR_REGISTRY.get(key)
        if have is not None:
            if getattr(have, "__policylab__", None) is None:
                raise PolicylabError(f"verl already has an advantage estimator named {key!r} that is not policylab's")
            del core_algos.ADV_ESTIMATOR_REGISTRY[key]  # a re-import: replace our own
        core_algos.register_adv_est(key)(make_estimator(stage, method))
        estimators.append(key)
    return {"policy_losses": losses, "advantage_estimators": estimators}


def registered() -> dict[str, list[str]]:
    """The policylab names now in verl's registries."""
    from verl.trainer.ppo import core_algos

    return {"policy_losses": sorted(k for k in core_algos.POLICY_LOSS_REGISTRY if k.startswith(PREFIX)),
            "advantage_estimators": sorted(k for k in core_algos.ADV_ESTIMATOR_REGISTRY if k.startswith(PREFIX))}


# ----------------------------------------------------------------------------- hosting cards


def hosting_card(name: str) -> str:
    """What verl needs to run policylab method `name`: the overrides, the settings its
    corrections and regularizers rely on, what stays outside the loss; or why it cannot."""
    p = hosting.plan(name, ENGINE)
    if not p.hostable:
        return p.refusal()
    m = p.method
    adv = m.advantage.name
    lines = [f"policylab method `{name}` in verl:",
             f"  actor_rollout_ref.actor.policy_loss.loss_mode={loss_name(name)}",
             "  actor_rollout_ref.actor.policy_loss._target_=policylab.integrations.verl.PolicylabLossConfig"
             "   (only to set method parameters: +actor_rollout_ref.actor.policy_loss.method_params.NAME=VALUE)",
             f"  algorithm.adv_estimator={PREFIX + adv}   (parameters: +algorithm.policylab.NAME=VALUE)",
             f"  aggregation: {m.aggregation} (policylab's), normalized by verl's global batch information; "
             f"set actor_rollout_ref.actor.loss_agg_mode={_POLICYLAB_MODES[m.aggregation]} so verl's own KL and "
             "entropy terms use the same mode"]
    lines += [f"  needs: {n}" for n in p.needs + _regularizers(name)]
    lines += [f"  outside the loss: {o}" for o in p.outside]
    return "\n".join(lines)


_VERL_KL = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


def _regularizers(name: str) -> list[str]:
    """The method's default KL / entropy terms as verl settings (verl computes them)."""
    from policylab.methods import get

    p = get(name).p
    out = []
    if "kl_coef" in p and p["kl_coef"] > 0:
        est = _VERL_KL[p["kl_estimator"]]
        if p["kl_placement"] == "loss":
            out.append(f"the method's KL in the loss (β={p['kl_coef']}, {p['kl_estimator']}) is verl's: "
                       f"actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef={p['kl_coef']} "
                       f"actor_rollout_ref.actor.kl_loss_type={est}")
        else:
            out.append(f"the method's KL in the reward (β={p['kl_coef']}, {p['kl_estimator']}) is verl's: "
                       f"algorithm.use_kl_in_reward=True algorithm.kl_ctrl.kl_coef={p['kl_coef']} "
                       f"algorithm.kl_penalty={est}")
    if "entropy_coef" in p and p["entropy_coef"] > 0:
        out.append(f"entropy bonus: actor_rollout_ref.actor.entropy_coeff={p['entropy_coef']}")
    return out


# verl imports this module through its entry point (or VERL_USE_EXTERNAL_MODULES)
REGISTERED = register()
