"""Parameter groups and stage sets shared by many methods, and `policy_gradient_method`,
the builder every policy-gradient method of the registry goes through.

A default here is a paper's default or a documented library decision; the card of each
method says which of its values were checked against its paper.
"""

from __future__ import annotations

from policylab.errors import PolicylabError
from policylab.methods.spec import (
    Card,
    Method,
    Param,
    RunShape,
    non_negative,
    positive,
    unit_interval,
)
from policylab.methods.stages import losses, rewards, rounds, sources


def _dual(v) -> str | None:
    return None if v > 1 else "must be > 1 (a lower bound -c·A on the loss of negative-advantage tokens)"


def clip(eps_low: float | None = 0.2, eps_high: float = 0.2, *, low_optional: bool = False, dual: bool = True,
         doc: str = "") -> tuple[Param, ...]:
    """ε_low / ε_high of a clipped ratio (and PPO's optional dual-clip constant)."""
    out = [
        Param("eps_low", float, eps_low, "lower clip: ratios below 1 − eps_low are clipped" +
              (" (None: no lower bound)" if low_optional else "") + doc, optional=low_optional, check=unit_interval),
        Param("eps_high", float, eps_high, "upper clip: ratios above 1 + eps_high are clipped", check=non_negative),
    ]
    if dual:
        out.append(Param("dual_clip", float, None, "dual-clip constant c > 1 bounding the loss of A < 0 tokens "
                         "(None: off)", optional=True, check=_dual))
    return tuple(out)


# the roles of a method sampled by the rollout engine at the current weights (card fields)
ON_POLICY_ROLES = dict(
    samples="rollout engine at the current weights (G samples per prompt); π_old = trainer recompute at those weights",
    learns="π_θ (the only differentiable policy)",
)


def group_std(std: str = "unbiased", eps: float = 1e-6) -> tuple[Param, ...]:
    return (
        Param("std", str, std, "std convention of the group statistic (unbiased: ddof 1; population: ddof 0)",
              choices=("unbiased", "population")),
        Param("eps", float, eps, "added to the group std before dividing", check=non_negative),
    )


def regularizers(kl_coef: float = 0.0, kl_estimator: str = "k3", kl_placement: str = "loss", *,
                 placements: tuple[str, ...] = ("loss", "reward"), entropy_coef: float = 0.0) -> tuple[Param, ...]:
    """KL to the reference (coefficient, estimator, placement) and the entropy bonus.

    Placement "loss": β·k(lp, lp_ref) added to every token's loss, differentiable through
    lp. "reward": β·k(lp_old, lp_ref), detached, subtracted from the rewards before the
    advantages (once). Never both. kl_coef = 0 drops the term and the reference model."""
    return (
        Param("kl_coef", float, kl_coef, "β of the KL term to the reference (0: no KL, no reference model)",
              check=non_negative),
        Param("kl_estimator", str, kl_estimator, "per-token KL estimator (k1 = lp − lp_ref, k2 = ½(lp − lp_ref)², "
              "k3 = exp(lp_ref − lp) − (lp_ref − lp) − 1)", choices=("k1", "k2", "k3")),
        Param("kl_placement", str, kl_placement, "where the KL goes: the loss (differentiable) or the reward "
              "(detached, before advantages)", choices=placements),
        Param("entropy_coef", float, entropy_coef, "coefficient of the entropy bonus (0: off)", check=non_negative),
    )


def kl_header(p) -> tuple[str, str]:
    """The start-up summary's KL line: estimator, β and placement, or "none"."""
    if p["kl_coef"] > 0:
        return "KL", f"{p['kl_estimator']} x {p['kl_coef']} in the {p['kl_placement']}"
    return "KL", "none (kl_coef = 0)"


def group_size_of(run: RunShape) -> int:
    """The run's group size G (a parameter resolved from the run's shape)."""
    return run.group_size


# a response is positive iff the verifier's raw outcome reaches this (ConSPO's positives, tlm-DRE's polarity)
VERDICT_THRESHOLD = Param("verdict_threshold", float, 0.5, "a response is positive iff the verifier's raw outcome is >= "
                          "this (inclusive)")


# the learner of the mixed-policy methods, whatever produced the tokens
DEPLOYMENT_LEARNER = "π_θ on the deployment prompt (the only differentiable policy)"


def fewer_than_group(param: str, what: str):
    """A run check: method parameter `param` (rows per group of another producer) is in [1, G)."""
    def check(run: RunShape, p) -> None:
        k = p[param]
        if not 1 <= k < run.group_size:
            raise PolicylabError(f"{what}: method parameter {param} = {k} must be >= 1 and < rollout.group_size "
                                 f"({run.group_size}); the rest of each group is the learner's own rollouts")
    return check


def max_new_tokens(run: RunShape) -> int:
    return run.max_new_tokens


def on_policy_only(why: str):
    """A check refusing reuse: these methods have no ratio to correct a second update or a
    stale batch with."""
    def check(run: RunShape, p) -> None:
        if not run.single_update:
            raise PolicylabError(
                f"{why}: it needs train.epochs=1, train.minibatches=1 and rollout.staleness=0 (got epochs "
                f"{run.epochs}, minibatches {run.minibatches}, staleness {run.staleness}); gradient accumulation "
                "over micro-batches is fine")
    return check


def policy_gradient_method(name: str, card: Card, *, advantage, objective, aggregation: str, params=(),
                           source=sources.ON_POLICY, rewards_=(rewards.VERIFIER,), filters=(), round_=(),
                           corrections=(), terms=(), kl=(0.0, "k3", "loss"), kl_placements=("loss", "reward"),
                           **kw) -> Method:
    """A method sampled by a source, scored, filtered, with the standard regularizers:
    KL in the reward (a round stage) or in the loss (an addend), and the entropy bonus.
    `kl_placements` lists the placements the method's advantage stage can honour (an
    advantage that does not subtract the reward penalty must not offer "reward")."""
    reg = regularizers(*kl, placements=kl_placements)
    kl_round = (rounds.KL_REWARD_PENALTY,) if "reward" in kl_placements else ()
    return Method(
        name=name, card=card, params=tuple(params) + reg, source=source, rewards=tuple(rewards_),
        filters=tuple(filters), round=kl_round + tuple(round_), advantage=advantage, objective=objective,
        corrections=tuple(corrections), addends=(losses.KL_LOSS, losses.ENTROPY_BONUS), terms=tuple(terms),
        aggregation=aggregation, header=(kl_header,) + tuple(kw.pop("header", ())), **kw)


__all__ = ["DEPLOYMENT_LEARNER", "ON_POLICY_ROLES", "fewer_than_group", "VERDICT_THRESHOLD", "group_size_of", "clip", "group_std", "kl_header", "regularizers", "max_new_tokens", "on_policy_only", "policy_gradient_method",
           "positive", "non_negative", "unit_interval"]
