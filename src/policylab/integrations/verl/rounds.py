"""The round extension in verl (`policylab.integrations.rounds`): methods with a round
stage, a batch-level field or external rows, run by verl's own trainer with two changes a
`RayPPOTrainer` subclass makes:

1. in the driver, after the old-logprob, reference and critic passes, `compute_advantage`
   below replaces verl's `compute_advantage`: it turns the DataProto into a policylab
   batch (responses, masks, uid groups, the scalar reward Σ token_level_scores,
   ``old_log_probs`` as logp_old and as logp_current (verl recomputes them at the weights
   the round starts from, as policylab's trainer reuses logp_old when it was computed at
   these weights), ``ref_log_prob``, ``rollout_log_probs`` as logp_behavior, ``values``,
   ``reward_baselines`` as greedy_rewards, plus every ``policylab.*`` column the rows
   carry: external rows' provenance and behavior log-probs, reward-stage outputs), runs
   the method's round and advantage stages, and writes ``advantages``, ``returns`` and
   the loss's columns into the batch;
2. the actor's loss function is `loss_fn` (``actor_rollout_wg.set_loss_fn(partial(loss_fn,
   config=actor_config))``): verl's own `ppo_loss` (its KL and entropy terms, metrics),
   with the micro-batch's columns handed to the policylab policy loss.

verl splits the columns into mini- and micro-batches with its other tensors, so each
micro-batch's loss sees its own rows' fields.
"""

from __future__ import annotations

import contextvars
from typing import Any

import torch

from policylab.errors import PolicylabError
from policylab.integrations import hosting, rounds
from policylab.integrations.verl.advantages import uid_groups
from policylab.integrations.verl.engine import ENGINE
from policylab.batch import RolloutBatch
from policylab.methods.spec import RunShape

_MICRO: contextvars.ContextVar = contextvars.ContextVar("policylab_verl_micro_batch", default=None)
_STATE: dict[str, Any] = {}  # per-run state objects of the extension's methods, by method name


def micro_batch():
    """(data, model_output) of the micro-batch `loss_fn` is computing, or None."""
    return _MICRO.get()


def loss_fn(config, model_output, data, dp_group=None):
    """verl's `ppo_loss`, with the micro-batch visible to policylab's policy loss."""
    from verl.workers.utils.losses import ppo_loss

    token = _MICRO.set((data, model_output))
    try:
        return ppo_loss(config, model_output, data, dp_group)
    finally:
        _MICRO.reset(token)


def keep_entropy(old_log_prob):
    """verl's old-logprob pass output (`RayPPOTrainer._compute_old_log_prob`'s DataProto)
    with its full-vocabulary entropy ``entropys`` kept as the column
    ``policylab.extras.worker_entropy``, which the round extension serves to a round stage
    asking for the entropy at the round's start (STARE). verl's trainer pops ``entropys``
    after logging it; this copy goes through the union into the batch. Returns it."""
    if "entropys" not in old_log_prob.batch.keys():
        raise PolicylabError("verl's old-logprob output has no `entropys` (its _compute_old_log_prob computes them "
                             "with calculate_entropy=True)")
    old_log_prob.batch[rounds.PREFIX + "extras." + rounds.ENTROPY] = old_log_prob.batch["entropys"].clone()
    return old_log_prob


def _columns_in(data) -> dict:
    cols = {k: v for k, v in data.batch.items() if k.startswith(rounds.PREFIX)}
    for k, v in data.non_tensor_batch.items():
        if k.startswith(rounds.PREFIX):
            cols[k] = torch.as_tensor(v.astype("float64") if v.dtype == object else v)
    return cols


def batch_of(data, *, batch_id: str = "verl", step: int = 0) -> RolloutBatch:
    """The policylab batch of a verl DataProto (see the module doc)."""
    b = data.batch
    prompts, responses = b["prompts"], b["responses"]
    mask = b["response_mask"].bool()
    B = mask.shape[0]
    scores = b["token_level_scores"] if "token_level_scores" in b.keys() else b["token_level_rewards"]
    if "token_level_rewards" in b.keys() and not torch.equal(b["token_level_rewards"], scores):
        raise PolicylabError("verl's KL in the reward (algorithm.use_kl_in_reward=True) changed token_level_rewards; "
                             "the round extension computes the advantages from the scores and does not combine it: "
                             "set algorithm.use_kl_in_reward=False (a KL in the loss is verl's use_kl_loss)")
    rewards = torch.where(mask, scores, torch.zeros((), dtype=scores.dtype)).sum(-1)
    old = b["old_log_probs"] if "old_log_probs" in b.keys() else None
    get = lambda k: b[k] if k in b.keys() else None  # noqa: E731
    greedy = get("reward_baselines")
    batch = RolloutBatch(
        tokens=torch.cat([prompts, responses], 1), attention_mask=b["attention_mask"].bool(), loss_mask=mask,
        prompt_width=prompts.shape[1], group=uid_groups(data.non_tensor_batch.get("uid"), B, mask.device),
        policy_version=torch.full((B,), int(step), dtype=torch.long), batch_id=batch_id, engine="verl",
        logp_old=old, logp_current=old, logp_ref=get("ref_log_prob"), logp_behavior=get("rollout_log_probs"),
        values=get("values"), rewards=rewards,
        greedy_rewards=None if greedy is None else greedy.reshape(B, -1).sum(-1),
        # verl's old pass runs at the weights that sampled this step's batch
        extras={"logp_old_version": torch.full((B,), int(step), dtype=torch.long)} if old is not None else {})
    return rounds.with_columns(batch.validate(), _columns_in(data))


def compute_advantage(data, method: str, params: dict | None = None, *, rollout_n: int | None = None,
                      epochs: int = 1, step: int = 0, state: dict | None = None):
    """verl's `compute_advantage` for a round-extension method: round and advantage
    stages on the whole batch, the loss's columns written into `data` (see the module
    doc). `step` is the trainer's step (verl's `global_steps`): the batch's policy version
    and its id (Online IcePop's single-use ledger refuses a batch id seen before).
    Returns `data`."""
    p = hosting.plan(method, ENGINE, params)
    if not p.hostable:
        raise PolicylabError(p.refusal())
    m = p.method
    if rollout_n is not None:
        m = hosting.with_run(m, RunShape(group_size=rollout_n, epochs=epochs))
    state = state if state is not None else _STATE.setdefault(m.name, m.state_objects(0))
    batch = batch_of(data, batch_id=f"verl-step{step}", step=step)
    batch, A, metrics = rounds.run_round(m, batch, state, RunShape(group_size=rollout_n or 1, epochs=epochs),
                                         policy_version=step, engine="verl")
    mask = batch.loss_mask
    adv = A.adv.unsqueeze(-1).expand(mask.shape) if A.adv.dim() == 1 else A.adv
    adv = torch.where(mask, adv, torch.zeros((), dtype=adv.dtype))
    # the dtype of verl's log-probs (its own estimators return that of token_level_rewards)
    dtype = data.batch["old_log_probs"].dtype if "old_log_probs" in data.batch.keys() else adv.dtype
    data.batch["advantages"] = adv.to(dtype)
    ret = getattr(A, "returns", None)
    data.batch["returns"] = (ret if ret is not None and ret.dim() == 2 else adv).to(data.batch["advantages"].dtype)
    for k, v in rounds.to_columns(m, batch).items():
        data.batch[k] = v
    data.meta_info.setdefault("metrics", {}).update({f"policylab/{k}": float(v) for k, v in metrics.items()
                                                     if isinstance(v, (int, float))})
    return data


__all__ = ["batch_of", "compute_advantage", "keep_entropy", "loss_fn", "micro_batch"]
