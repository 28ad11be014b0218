"""The method registry: a plain dict from name to `Method`.

A new method is a `Method` built from stage functions (and, when it needs new math, a
kernel with its tests) plus one `register` call; never a subclass, never a branch in the
trainer.
"""

from __future__ import annotations

import difflib

from ..errors import PolicylabError
from .spec import Method


class UnknownMethodError(PolicylabError, KeyError):
    """No method of that name; the message lists close matches."""

    def __str__(self):  # KeyError would quote the message
        return self.args[0]


REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    if not isinstance(method, Method):
        raise TypeError(f"register() takes a Method, got {type(method).__name__}")
    if method.name in REGISTRY:
        raise ValueError(f"method {method.name!r} is already registered")
    REGISTRY[method.name] = method
    return method


def get(name: str) -> Method:
    """The method called `name` (its paper defaults); an unknown name raises with close matches."""
    if not isinstance(name, str) or not name:
        raise UnknownMethodError(f"a method name must be a non-empty string, got {name!r}. "
                                 "`policylab methods` lists them all.")
    try:
        return REGISTRY[name]
    except KeyError:
        near = difflib.get_close_matches(name, list(REGISTRY), n=3, cutoff=0.4)
        hint = f" Did you mean: {', '.join(near)}?" if near else ""
        raise UnknownMethodError(f"unknown method {name!r}.{hint} `policylab methods` lists them all.") from None


def names() -> list[str]:
    return sorted(REGISTRY)
