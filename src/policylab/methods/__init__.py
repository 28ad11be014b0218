"""Method registry: `methods.get(name)`, `methods.names()`, and the recipes' cards."""

from . import recipes as _recipes  # noqa: F401  (registers every method)
from . import recipes_offpolicy as _recipes_offpolicy  # noqa: F401
from .evidence import apply as _apply_evidence
from .registry import REGISTRY, Card, KLSpec, Recipe, UnknownMethodError, get, names

_apply_evidence()

__all__ = ["REGISTRY", "Card", "KLSpec", "Recipe", "UnknownMethodError", "get", "names"]
