"""Method registry: `methods.get(name)`, `methods.names()`, and the specs' cards.

A method is a `Method` (policylab.methods.spec): a card, typed parameters with the
paper's defaults, and the stage functions of its step. `get(name)` returns it with its
defaults; `get(name).with_params({...}, run)` validates and resolves parameters.
"""

from policylab.methods.families import geometry as _geometry  # noqa: F401  (registers the gradient-geometry methods)
from policylab.methods.families import graded as _graded  # noqa: F401  (registers the interval and multi-dimensional methods)
from policylab.methods.families import sequence_objectives as _objectives_more  # noqa: F401  (conspo, zcpo, stare, reco, erpo, tlm_dre, rlid)
from policylab.methods.families import literature as _literature  # noqa: F401  (registers the literature-only cards)
from policylab.methods.families import mixed_policy as _mixed  # noqa: F401  (registers the mixed-policy methods)
from policylab.methods.families import off_policy as _offpolicy  # noqa: F401  (registers the off-policy methods)
from policylab.methods.families import policy_gradient as _onpolicy  # noqa: F401  (registers the on-policy methods)
from policylab.methods.families import pipelines as _pipelines  # noqa: F401  (registers ppo_rlhf and fusion)
from policylab.methods.families import rich_rewards as _rewards_more  # noqa: F401  (registers rlcr, mad_rl, rlcpr, code_opt, rfpo)
from policylab.methods.families import test_time as _testtime  # noqa: F401  (registers the test-time adaptation methods)
from policylab.methods.evidence import apply as _apply_evidence
from policylab.methods.registry import (
    LITERATURE,
    REGISTRY,
    LiteratureOnlyError,
    UnknownMethodError,
    card,
    get,
    literature_names,
    names,
    refuse_literature,
    register,
)
from policylab.methods.spec import Card, LossInputs, Method, Param, ParamError, Params, RunShape, Stage, Weighting

_apply_evidence()


__all__ = ["LITERATURE", "REGISTRY", "Card", "LiteratureOnlyError", "LossInputs", "Method", "Param", "ParamError",
           "Params", "RunShape", "Stage", "UnknownMethodError", "Weighting", "card", "get",
           "literature_names", "names", "refuse_literature", "register"]
