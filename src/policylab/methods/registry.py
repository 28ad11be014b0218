"""The method registry: a plain dict from name to `Recipe`.

A recipe names its stages (advantage, objective, correction, KL, filter, reward shaping,
aggregation) with their parameters, declares the batch fields it needs, and carries a
`Card`: the paper, who samples, who learns, the reference, status and what the kernel
does not establish. A new method is one function of math plus one entry here, never a
subclass.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import PolicylabError


class UnknownMethodError(PolicylabError, KeyError):
    """No method of that name; the message lists close matches."""

    def __str__(self):  # KeyError would quote the message
        return self.args[0]


@dataclass(frozen=True)
class Card:
    title: str  # paper title
    arxiv: str  # arXiv id ("" if none)
    family: str  # advantage | objective | correction | reward | test-time | ...
    samples: str  # which policy produced the tokens (behavior)
    learns: str  # which policy receives gradient
    reference: str  # the KL anchor, or "none"
    summary: str  # one line: what the method changes
    status: str  # "kernel verified" / "trained end to end on <model>, <task>" / ...
    not_established: str  # what the kernel and our runs do not show
    unconfirmed: tuple[str, ...] = ()  # parameters/forms not verified against the paper
    confirmed: str = ""  # what we checked against the paper, and how
    critic: str = "none"


@dataclass(frozen=True)
class KLSpec:
    """A KL term toward the reference. `placement` is "reward" (detached per-token penalty
    folded into the reward before advantages, computed from the sampler's logp_old) or
    "loss" (differentiable estimator added to the per-token loss). Never both."""

    estimator: str  # k1 | k2 | k3
    coef: float
    placement: str  # reward | loss

    def __post_init__(self):
        if self.placement not in ("reward", "loss"):
            raise ValueError(f"KL placement must be 'reward' or 'loss', got {self.placement!r}")
        if self.estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"KL estimator must be k1, k2 or k3, got {self.estimator!r}")
        if self.coef < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {self.coef}")


@dataclass(frozen=True)
class Recipe:
    name: str
    card: Card
    advantage: str  # key of methods.stages.ADVANTAGES
    objective: str  # key of methods.stages.OBJECTIVES
    aggregation: str  # aggregate mode
    params: Mapping[str, Any] = field(default_factory=dict)  # stage parameters (paper defaults)
    kl: KLSpec | None = None
    correction: str | None = None  # key of methods.stages.CORRECTIONS
    filter: str | None = None  # "dynamic_sampling"
    shaping: tuple[str, ...] = ()  # "overlong"
    reward_source: str = "verifier"  # verifier | majority_vote (TTRL: no gold)
    needs: tuple[str, ...] = ()  # RolloutBatch fields the stages read (KL-derived ones are added by `required_fields`)
    critic: bool = False
    min_group_size: int = 1
    single_use: bool = False  # each batch may be used for exactly one update
    greedy_baseline: bool = False  # ReMax: decode greedily too
    runnable: bool = True  # False for literature-only cards

    def with_params(self, overrides: Mapping[str, Any]) -> "Recipe":
        """A copy with some stage parameters replaced; unknown names are refused."""
        import dataclasses

        unknown = set(overrides) - set(self.params) - {"kl_coef", "kl_estimator", "kl_placement", "entropy_coef"}
        if unknown:
            name = sorted(unknown)[0]
            near = difflib.get_close_matches(name, list(self.params), n=3)
            hint = f" Did you mean: {', '.join(near)}?" if near else f" Parameters of {self.name}: {', '.join(sorted(self.params)) or '(none)'}."
            raise PolicylabError(f"method `{self.name}` has no parameter `{name}`.{hint}")
        params = {**self.params, **{k: v for k, v in overrides.items() if k in self.params}}
        kl = self.kl
        if any(k in overrides for k in ("kl_coef", "kl_estimator", "kl_placement")):
            base = kl or KLSpec("k3", 0.0, "loss")
            kl = KLSpec(
                overrides.get("kl_estimator", base.estimator),
                float(overrides.get("kl_coef", base.coef)),
                overrides.get("kl_placement", base.placement),
            )
            if kl.coef == 0:
                kl = None
        if "entropy_coef" in overrides:
            params["entropy_coef"] = float(overrides["entropy_coef"])
        return dataclasses.replace(self, params=params, kl=kl)

    @property
    def required_fields(self) -> tuple[str, ...]:
        """Batch fields the recipe reads: its declared needs, plus logp_ref (and logp_old,
        the sampler-side log-probs KL-in-reward is computed from) when a KL term is on."""
        extra = ()
        if self.kl is not None:
            extra = ("logp_ref",) + (("logp_old",) if self.kl.placement == "reward" else ())
        return tuple(dict.fromkeys(self.needs + extra))


REGISTRY: dict[str, Recipe] = {}


def register(recipe: Recipe) -> Recipe:
    if recipe.name in REGISTRY:
        raise ValueError(f"method {recipe.name!r} is already registered")
    REGISTRY[recipe.name] = recipe
    return recipe


def get(name: str) -> Recipe:
    """The recipe of `name`; an unknown name raises with close matches."""
    try:
        return REGISTRY[name]
    except KeyError:
        near = difflib.get_close_matches(name, list(REGISTRY), n=3, cutoff=0.4)
        hint = f" Did you mean: {', '.join(near)}?" if near else ""
        raise UnknownMethodError(f"unknown method {name!r}.{hint} `policylab methods` lists them all.") from None


def names() -> list[str]:
    return sorted(REGISTRY)
