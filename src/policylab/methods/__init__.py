"""Method registry: `methods.get(name)`, `methods.names()`, and the specs' cards.

A method is a `Method` (policylab.methods.spec): a card, typed parameters with the
paper's defaults, and the stage functions of its step. `get(name)` returns it with its
defaults; `get(name).with_params({...}, run)` validates and resolves parameters.
"""

from . import geometry as _geometry  # noqa: F401  (registers the gradient-geometry methods)
from . import graded as _graded  # noqa: F401  (registers the interval and multi-dimensional methods)
from . import objectives_more as _objectives_more  # noqa: F401  (conspo, zcpo, stare, reco, erpo, tlm_dre, rlid)
from . import literature as _literature  # noqa: F401  (registers the literature-only cards)
from . import mixed as _mixed  # noqa: F401  (registers the mixed-policy methods)
from . import offpolicy as _offpolicy  # noqa: F401  (registers the off-policy methods)
from . import onpolicy as _onpolicy  # noqa: F401  (registers the on-policy methods)
from . import pipelines as _pipelines  # noqa: F401  (registers ppo_rlhf and fusion)
from . import rewards_more as _rewards_more  # noqa: F401  (registers rlcr, mad_rl, rlcpr, code_opt, rfpo)
from . import testtime as _testtime  # noqa: F401  (registers the test-time adaptation methods)
from .evidence import apply as _apply_evidence
from .registry import (
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
from .spec import Card, LossInputs, Method, Param, ParamError, Params, RunShape, Stage, Weighting

_apply_evidence()


def exercise_settings(name: str, *, model: str, workdir, budget: str = "test") -> dict:
    """The config sections under which method `name` does anything at all: its spec's
    `exercise`, plus what must be made first for this model (e.g. RFPO's critic, trained
    into `workdir` with the "test" or "real" budget). Used by the generic tests and
    benchmarks/methods_real.py."""
    out = {k: dict(v) for k, v in get(name).exercise.items()}
    prepare = _rewards_more.PREPARE.get(name)
    if prepare is not None:
        for k, v in prepare(model, workdir, budget).items():
            out[k] = {**out.get(k, {}), **v}
    return out

__all__ = ["LITERATURE", "REGISTRY", "Card", "LiteratureOnlyError", "LossInputs", "Method", "Param", "ParamError",
           "Params", "RunShape", "Stage", "UnknownMethodError", "Weighting", "card", "exercise_settings", "get",
           "literature_names", "names", "refuse_literature", "register"]
