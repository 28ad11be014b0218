"""Method registry: `methods.get(name)`, `methods.names()`, and the specs' cards.

A method is a `Method` (policylab.methods.spec): a card, typed parameters with the
paper's defaults, and the stage functions of its step. `get(name)` returns it with its
defaults; `get(name).with_params({...}, run)` validates and resolves parameters.
"""

from . import graded as _graded  # noqa: F401  (registers the interval and multi-dimensional methods)
from . import offpolicy as _offpolicy  # noqa: F401  (registers the off-policy methods)
from . import onpolicy as _onpolicy  # noqa: F401  (registers the on-policy methods)
from . import testtime as _testtime  # noqa: F401  (registers the test-time adaptation methods)
from .evidence import apply as _apply_evidence
from .registry import REGISTRY, UnknownMethodError, get, names, register
from .spec import Card, LossInputs, Method, Param, ParamError, Params, RunShape, Stage, Weighting

_apply_evidence()

__all__ = ["REGISTRY", "Card", "LossInputs", "Method", "Param", "ParamError", "Params", "RunShape", "Stage",
           "UnknownMethodError", "Weighting", "get", "names", "register"]
