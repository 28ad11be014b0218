"""The method registry: a plain dict from name to `Method`.

A new method is a `Method` built from stage functions (and, when it needs new math, a
kernel with its tests) plus one `register` call; never a subclass, never a branch in the
trainer.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys

from policylab.errors import PolicylabError
from policylab.methods.spec import Card, Method


class UnknownMethodError(PolicylabError, KeyError):
    """No method of that name; the message lists close matches."""

    def __str__(self):  # KeyError would quote the message
        return self.args[0]


class LiteratureOnlyError(PolicylabError, NotImplementedError):
    """The name is a literature-only card: nothing of it runs; the message quotes the card."""


# the status of a card that states none (shipped cards get theirs from `methods.evidence`)
EXTERNAL = "registered outside policylab: nothing of it is measured by this project"

REGISTRY: dict[str, Method] = {}
# name -> the module whose code called `register` (the shipped methods: policylab.methods.families.*)
ORIGIN: dict[str, str] = {}
# literature-only entries: a card and nothing else (no parameters, stages or kernels);
# every execution path refuses them (`refuse_literature`)
LITERATURE: dict[str, Card] = {}


def register(method: Method) -> Method:
    if not isinstance(method, Method):
        raise TypeError(f"register() takes a Method, got {type(method).__name__}")
    if method.name in REGISTRY:
        raise ValueError(f"method {method.name!r} is already registered")
    if not method.card.status:
        method = dataclasses.replace(method, card=dataclasses.replace(method.card, status=EXTERNAL))
    REGISTRY[method.name] = method
    ORIGIN[method.name] = sys._getframe(1).f_globals.get("__name__", "?")
    return method


def origin(name: str) -> str:
    """The module that registered method `name` ("?" when unknown)."""
    return ORIGIN.get(get(name).name, "?")


def register_literature(name: str, card: Card) -> Card:
    """Register a literature-only card under `name` (never runnable, never in `names()`)."""
    if not isinstance(card, Card):
        raise TypeError(f"register_literature() takes a Card, got {type(card).__name__}")
    if name in REGISTRY or name in LITERATURE:
        raise ValueError(f"method {name!r} is already registered")
    LITERATURE[name] = card
    return card


def refuse_literature(name: str) -> None:
    """Raise LiteratureOnlyError quoting the card when `name` is a literature-only entry."""
    if isinstance(name, str) and name in LITERATURE:
        c = LITERATURE[name]
        raise LiteratureOnlyError(
            f"{name!r} is a literature-only card and cannot be run, built or logged. Card: {c.title!r}"
            f"{f' (arXiv {c.arxiv})' if c.arxiv else ''}; status: {c.status}; why: {c.not_established}. "
            f"`policylab methods {name}` prints the whole card.")


def card(name: str) -> Card:
    """The card of a registered method or of a literature-only entry."""
    if isinstance(name, str) and name in LITERATURE:
        return LITERATURE[name]
    return get(name).card


def literature_names() -> list[str]:
    return sorted(LITERATURE)


# installed packages register methods under this entry-point group: `name = "pkg.mod:OBJECT"`
ENTRY_POINT_GROUP = "policylab.methods"
_IMPORT_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


def entry_points() -> dict[str, str]:
    """name -> "pkg.mod:OBJECT" of every method an installed package declares (not loaded)."""
    from importlib.metadata import entry_points as eps

    return {ep.name: ep.value for ep in eps(group=ENTRY_POINT_GROUP)}


def outside_module(name: str) -> str | None:
    """The module that resolving method `name` would import (and so run), when it is not a
    built-in method: "pkg.mod" of an import path "pkg.mod:OBJECT", or the module of an
    installed entry point of that name; None otherwise. Nothing is imported."""
    if not isinstance(name, str) or name in REGISTRY:
        return None
    if ":" in name:
        return name.partition(":")[0]
    target = entry_points().get(name)
    return target.partition(":")[0] if target else None


def _load(path: str, how: str) -> Method:
    """Import `path` ("pkg.mod:OBJECT"), check that it is a Method, register it under its own
    name (unless its module registered it already) and return it."""
    import importlib

    if not _IMPORT_PATH.fullmatch(path):
        raise UnknownMethodError(f"method {path!r} is not an import path of the form package.module:OBJECT")
    mod, _, obj = path.partition(":")
    try:
        method = getattr(importlib.import_module(mod), obj)
    except Exception as exc:  # the module's own code failed too: name it, one line
        raise UnknownMethodError(f"method {path!r} ({how}): cannot import {obj} from {mod}: "
                                 f"{type(exc).__name__}: {exc}") from None
    if not isinstance(method, Method):
        raise UnknownMethodError(f"method {path!r} ({how}) is a {type(method).__name__}, not a policylab Method")
    known = REGISTRY.get(method.name)
    if known is None:
        known = register(method)
        ORIGIN[method.name] = mod
        return known
    if known == method or known == dataclasses.replace(method, card=dataclasses.replace(method.card, status=EXTERNAL)):
        return known  # its module registered it on import
    raise UnknownMethodError(f"method {path!r} ({how}) is named {method.name!r}, which another registered method "
                             "already uses: give it another `name`")


def get(name: str) -> Method:
    """The method called `name` (its paper defaults); an unknown name raises with close matches,
    a literature-only name raises LiteratureOnlyError quoting its card.

    Besides the built-in names, `name` may be an import path "pkg.mod:OBJECT" (a `Method`
    defined anywhere importable) or the name of an installed package's entry point in the
    group "policylab.methods". Both import code from outside policylab: a run config that
    names one is refused from a received run directory unless the user allows imports
    (`policylab.trainer.trust`)."""
    if not isinstance(name, str) or not name:
        raise UnknownMethodError(f"a method name must be a non-empty string, got {name!r}. "
                                 "`policylab methods` lists them all.")
    refuse_literature(name)
    if name in REGISTRY:
        return REGISTRY[name]
    if ":" in name:
        return _load(name, "an import path")
    declared = entry_points()
    if name in declared:
        return _load(declared[name], f"entry point {name!r} of group {ENTRY_POINT_GROUP}")
    near = difflib.get_close_matches(name, list(REGISTRY) + list(declared), n=3, cutoff=0.4)
    hint = f" Did you mean: {', '.join(near)}?" if near else ""
    raise UnknownMethodError(f"unknown method {name!r}.{hint} `policylab methods` lists them all; a method of your "
                             "own is named by its import path, package.module:OBJECT.")


def names() -> list[str]:
    return sorted(REGISTRY)
