"""Method registry: `methods.get(name)`, `methods.names()`, and the specs' cards.

A method is a `Method` (policylab.methods.spec): a card, typed parameters with the
paper's defaults, and the stage functions of its step. `get(name)` returns it with its
defaults; `get(name).with_params({...}, run)` validates and resolves parameters.
"""

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



def _register_families() -> None:
    """Import every module of `policylab.methods.families`: each registers its methods."""
    import importlib
    import pkgutil

    from policylab.methods import families

    for info in sorted(pkgutil.iter_modules(families.__path__), key=lambda i: i.name):
        importlib.import_module(f"{families.__name__}.{info.name}")


_register_families()
_apply_evidence()


__all__ = ["LITERATURE", "REGISTRY", "Card", "LiteratureOnlyError", "LossInputs", "Method", "Param", "ParamError",
           "Params", "RunShape", "Stage", "UnknownMethodError", "Weighting", "card", "get",
           "literature_names", "names", "refuse_literature", "register"]
