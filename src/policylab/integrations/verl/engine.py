"""What verl's hooks supply to a policylab method, and the names policylab registers
there. Imports nothing from verl: `policylab integrations` reads it in any interpreter."""

from __future__ import annotations

from typing import Any

from policylab.integrations import hosting

PREFIX = "policylab_"
RAW_RATIO = ("actor_rollout_ref.rollout.calculate_log_probs=True algorithm.rollout_correction.rollout_is=token "
             "algorithm.rollout_correction.rollout_is_threshold=1e9 "
             "algorithm.rollout_correction.rollout_is_batch_normalize=False (no rollout_rs)")
KL = ("verl adds its own KL term: set actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=β "
      "actor_rollout_ref.actor.kl_loss_type=low_var_kl (k3) for KL in the loss, or algorithm.use_kl_in_reward=True "
      "for KL in the reward; the hosted loss has kl_coef 0")
ENTROPY = "verl adds its own entropy term: set actor_rollout_ref.actor.entropy_coeff=c; the hosted loss has entropy_coef 0"

ENGINE = hosting.Engine(
    name="verl",
    loss_fields=frozenset({"logp", "logp_old", "logp_behavior"}),
    advantage_fields=frozenset({"rewards", "group"}),
    own_addends={"kl_loss": KL, "entropy_bonus": ENTROPY},
    off_params={"kl_coef": (0.0, KL), "entropy_coef": (0.0, ENTROPY)},
    requires={"logp_behavior": "the raw engine ratio as rollout_is_weights: " + RAW_RATIO},
    round_hook=("policylab.integrations.verl.rounds: the driver calls its compute_advantage in place of verl's "
                "(after the old-logprob, reference and critic passes) and the actor runs its loss_fn "
                "(actor_rollout_wg.set_loss_fn), which hands each micro-batch's policylab columns to the loss"),
    batch_fields=frozenset({"tokens", "loss_mask", "rewards", "group", "logp_old", "logp_current", "policy_version",
                            "batch_id"}),
    batch_requires={
        "logp_behavior": "actor_rollout_ref.rollout.calculate_log_probs=True (verl keeps the rollout's log-probs as "
                         "rollout_log_probs)",
        "logp_ref": "verl's reference worker (actor_rollout_ref.actor.use_kl_loss=True or "
                    "algorithm.use_kl_in_reward=True make verl compute ref_log_prob)",
        "values": "verl's critic (critic.enable=True): its values feed policylab's advantage",
        "greedy_rewards": "algorithm.adv_estimator=remax in verl's rollout step: verl decodes each prompt greedily "
                          "and scores it (reward_baselines), the extension reads that as greedy_rewards",
    },
    row_sources={"demonstrations": "a demonstrator's replies", "gold_injection": "gold answers",
                 "expert_prefix": "expert prefixes continued by the policy", "peer_exchange": "a peer's rollouts",
                 "external": "an external policy's rollouts", "hinted": "replies sampled under hinted prompts"},
    own_rows={"multi_turn": "verl's multi-turn rollout (actor_rollout_ref.rollout.multi_turn.enable=True: each "
                            "response holds the policy's turns with the other side's messages between them, "
                            "response_mask 0 on those), with each response token's turn index (0, 1, ...; -1 off "
                            "the policy's turns) as the column policylab.extras.turn_ids [B, T]"},
    worker_passes={"worker.vocab_stats": "verl's old-logprob pass keeps its full-vocabulary entropy (at the weights "
                                         "the round starts from, under the rollout temperature): the trainer subclass's "
                                         "_compute_old_log_prob returns policylab.integrations.verl.rounds."
                                         "keep_entropy(old_log_prob) (verl's own drops `entropys` before the union)"},
    extension_loss_fields={"entropy": "actor_rollout_ref.actor.calculate_entropy=True (verl passes its entropy to "
                                      "the loss)"},
)

VERL_MODES = {"token-mean": "token_mean", "seq-mean-token-mean": "seq_mean_token_mean",
              "seq-mean-token-sum": "seq_mean_token_sum", "seq-mean-token-sum-norm": "seq_mean_token_sum_norm"}
POLICYLAB_MODES = {v: k for k, v in VERL_MODES.items()}
VERL_KL = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


def loss_name(method: str) -> str:
    return PREFIX + method


def method_of(loss_mode: str) -> str | None:
    return loss_mode[len(PREFIX):] if isinstance(loss_mode, str) and loss_mode.startswith(PREFIX) else None


def plain(value) -> dict:
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


def losses() -> list[str]:
    """The methods registered as verl policy losses: every method verl can host, with or
    without a setting it requires."""
    return [n for n, p in hosting.plans(ENGINE).items() if p.hostable]


def estimators() -> dict[str, Any]:
    """The advantage stages registered as verl estimators: those a hosted method uses."""
    used = {p.method.advantage.name for p in hosting.plans(ENGINE).values() if p.hostable}
    return {k: v for k, v in hosting.advantage_stages(ENGINE).items() if k in used}


def regularizers(name: str) -> list[str]:
    """The method's default KL / entropy terms as verl settings (verl computes them)."""
    from policylab.methods import get

    p = get(name).p
    out = []
    if "kl_coef" in p and p["kl_coef"] > 0:
        est = VERL_KL[p["kl_estimator"]]
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


def hosting_card(name: str) -> str:
    """What verl needs to run policylab method `name`: the overrides, the settings its
    corrections and regularizers rely on, what stays outside the loss; or why it cannot."""
    p = hosting.plan(name, ENGINE)
    if not p.hostable:
        return p.refusal()
    m = p.method
    adv = m.advantage.name
    if p.extension:
        lines = [f"policylab method `{name}` in verl ({p.status}, through the round extension):",
                 f"  actor_rollout_ref.actor.policy_loss.loss_mode={loss_name(name)}",
                 "  actor_rollout_ref.actor.policy_loss._target_=policylab.integrations.verl.PolicylabLossConfig",
                 f"  the driver: policylab.integrations.verl.rounds.compute_advantage(batch, {name!r}, method_params, "
                 "rollout_n=n) in place of verl's compute_advantage (the method's round stages and advantage "
                 f"`{adv}`)",
                 "  the actor: actor_rollout_wg.set_loss_fn(partial(policylab.integrations.verl.rounds.loss_fn, "
                 "config=actor_config))",
                 "  algorithm.use_kl_in_reward=False (the extension reads the scores); KL in the loss: verl's "
                 "use_kl_loss"]
        lines += [f"  requires: {r}" for r in p.requires]
        lines += [f"  needs: {n}" for n in p.needs]
        lines += [f"  outside the loss: {o}" for o in p.outside]
        return "\n".join(lines)
    lines = [f"policylab method `{name}` in verl ({p.status}):",
             f"  actor_rollout_ref.actor.policy_loss.loss_mode={loss_name(name)}",
             "  actor_rollout_ref.actor.policy_loss._target_=policylab.integrations.verl.PolicylabLossConfig"
             "   (only to set method parameters: +actor_rollout_ref.actor.policy_loss.method_params.NAME=VALUE)",
             f"  algorithm.adv_estimator={PREFIX + adv}   (parameters: +algorithm.policylab.NAME=VALUE)",
             f"  aggregation: {m.aggregation} (policylab's), normalized by verl's global batch information; "
             f"set actor_rollout_ref.actor.loss_agg_mode={POLICYLAB_MODES[m.aggregation]} so verl's own KL and "
             "entropy terms use the same mode"]
    lines += [f"  requires: {n}" for n in p.requires]
    lines += [f"  needs: {n}" for n in p.needs + regularizers(name)]
    lines += [f"  outside the loss: {o}" for o in p.outside]
    return "\n".join(lines)
