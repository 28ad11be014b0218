"""Registered methods whose reward is richer than one scalar per reply: an interval
(Range-GRPO) or a vector of dimensions (GPRL). Each adds a reward stage that produces
what its advantage reads; the trainer runs them like any other method."""

from __future__ import annotations

from policylab.errors import PolicylabError
from policylab.kernels.rewards.graded import DIMENSIONS, INTERVAL_JUDGES, parse_dimensions
from policylab.methods.params import clip, group_std, max_new_tokens, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import Card, Param, positive
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses, rewards
from policylab.methods.stages.advantages import dimension_weights

_ROLES = dict(
    samples="rollout engine at the current weights (G samples per prompt); π_old = trainer recompute at those weights",
    learns="π_θ (the only differentiable policy)",
)


def _dimensions(v: str) -> str | None:
    try:
        parse_dimensions(v)
    except PolicylabError as exc:
        return str(exc)
    return None


def _weights_match(run, p) -> None:
    dimension_weights(p.dimension_weights, len(parse_dimensions(p.dimensions)))  # raises on a mismatch


register(policy_gradient_method(
    "range_grpo",
    Card(
        title="Range-GRPO: Policy Optimization via Pairwise Relations among Reward Intervals", arxiv="",
        family="advantage", **_ROLES, reference="none",
        summary="advantages from determinate pairwise relations between reward intervals (l_i > u_j); "
                "overlapping intervals compare as 0; point intervals give Dr. GRPO",
        not_established="interval calibration (the built-in judge is a rule on numeric distance, not a calibrated "
                        "LLM judge); that sparser supervision helps",
        unconfirmed=("title, id", "magnitude of a determinate pair (the gap between facing endpoints)"),
        confirmed="the point limit: intervals [r, r] give exactly r − mean_g r (tested)",
    ),
    rewards_=(rewards.VERIFIER, rewards.INTERVAL_JUDGE),
    advantage=adv.RANGE_GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_sum_norm",
    params=clip(0.2, 0.2) + (
        Param("interval_judge", str, "numeric_interval", "the judge giving each reply a [low, high] reward "
              "(rewards.graded)", choices=tuple(INTERVAL_JUDGES)),
        Param("L_norm", float, None, "the constant normalizer of the summed token loss (None: rollout.max_new_tokens)",
              optional=True, check=positive, resolve=max_new_tokens)),
    kl_placements=("loss",), min_group_size=2,
))

register(policy_gradient_method(
    "gprl",
    Card(
        title="General Preference Reinforcement Learning (GPRL)", arxiv="2605.18721",
        family="advantage", **_ROLES, reference="none",
        summary="each reward dimension standardized within its group on its own scale, then a weighted sum",
        not_established="context-dependent weights w(x) (constant per dimension here); rule-based dimensions are not "
                        "preference models",
        unconfirmed=("title", "how w(x) is obtained (an input here)"),
        confirmed="per-dimension group normalization before the weighted sum (summing first is a different "
                  "estimator: tested)",
    ),
    rewards_=(rewards.VERIFIER, rewards.REWARD_DIMENSIONS),
    advantage=adv.GPRL, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std(std="population") + (
        Param("dimensions", str, "correct,closeness,terse", "reward dimensions, comma-separated, among "
              + ", ".join(DIMENSIONS), check=_dimensions),
        Param("dimension_weights", str, "1,1,1", "weight w_d of each dimension, comma-separated, in order")),
    kl_placements=("loss",), checks=(_weights_match,), min_group_size=2,
))
