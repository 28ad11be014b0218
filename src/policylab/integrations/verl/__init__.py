"""policylab methods inside verl (tested against verl 0.9.1).

Importing this package registers, in verl's own registries:

- every method verl can host (`policylab.integrations.hosting`) as a verl policy loss
  named ``policylab_<method>`` (`policylab.integrations.verl.loss`);
- every policylab advantage stage that a hosted method uses and that works from verl's
  token-level rewards and uid groups as a verl advantage estimator named
  ``policylab_<stage>`` (`policylab.integrations.verl.advantages`).

`policylab.integrations.verl.rewards` holds policylab's rewards as verl reward functions
(``custom_reward_function.path/name``).

verl loads this package in the driver and in every Ray worker through the
``verl.plugins`` entry point of the policylab package (``import verl`` loads every plug-in
of that group); ``VERL_USE_EXTERNAL_MODULES=policylab.integrations.verl`` is the fallback
(import errors then raise instead of being logged at DEBUG level). ``policylab
integrations`` checks both ways.

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
selects the config subclass, which adds ``method_params`` (validated by the method when
verl builds its config: unknown names and bad values are refused with policylab's
messages) and ``aggregation`` ("method": the method's own mode, or "verl":
``actor.loss_agg_mode``). verl adds its own KL and entropy terms to the policy loss, so
the hosted loss has ``kl_coef = entropy_coef = 0``; the KL in the loss is
``actor.use_kl_loss=True actor.kl_loss_coef=β actor.kl_loss_type=low_var_kl`` (k3, verl
clamps it to [−10, 10]), the entropy bonus ``actor.entropy_coeff``, the KL in the
reward ``algorithm.use_kl_in_reward=True``. Advantage parameters (e.g. GRPO's ``std``)
go under ``+algorithm.policylab.<name>=<value>``.
"""

from __future__ import annotations

from policylab.errors import PolicylabError
from policylab.integrations.verl.advantages import make_estimator, token_reward_batch
from policylab.integrations.verl.engine import (ENGINE, PREFIX, RAW_RATIO, estimators, hosting_card, loss_name,
                                                losses, method_of)
from policylab.integrations.verl.loss import PolicylabLossConfig, make_loss, per_sequence, resolve


def register() -> dict[str, list[str]]:
    """Fill verl's registries (idempotent); returns the registered names."""
    from verl.trainer.ppo import core_algos

    out_losses, out_estimators = [], []
    for name in losses():
        key = loss_name(name)
        have = core_algos.POLICY_LOSS_REGISTRY.get(key)
        if have is not None and getattr(have, "__policylab__", None) is None:
            raise PolicylabError(f"verl already has a policy loss named {key!r} that is not policylab's")
        core_algos.POLICY_LOSS_REGISTRY[key] = make_loss(name)
        out_losses.append(key)
    for stage_name, (stage, method) in estimators().items():
        key = PREFIX + stage_name
        have = core_algos.ADV_ESTIMATOR_REGISTRY.get(key)
        if have is not None:
            if getattr(have, "__policylab__", None) is None:
                raise PolicylabError(f"verl already has an advantage estimator named {key!r} that is not policylab's")
            del core_algos.ADV_ESTIMATOR_REGISTRY[key]  # a re-import: replace our own
        core_algos.register_adv_est(key)(make_estimator(stage, method))
        out_estimators.append(key)
    return {"policy_losses": out_losses, "advantage_estimators": out_estimators}


def registered() -> dict[str, list[str]]:
    """The policylab names now in verl's registries."""
    from verl.trainer.ppo import core_algos

    return {"policy_losses": sorted(k for k in core_algos.POLICY_LOSS_REGISTRY if k.startswith(PREFIX)),
            "advantage_estimators": sorted(k for k in core_algos.ADV_ESTIMATOR_REGISTRY if k.startswith(PREFIX))}


# verl imports this package through its entry point (or VERL_USE_EXTERNAL_MODULES)
REGISTERED = register()

__all__ = ["ENGINE", "PREFIX", "RAW_RATIO", "REGISTERED", "PolicylabLossConfig", "estimators", "hosting_card",
           "loss_name", "losses", "make_estimator", "make_loss", "method_of", "per_sequence", "register",
           "registered", "resolve", "token_reward_batch"]
