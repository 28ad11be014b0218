"""The method registry: a plain dict from name to `Method`.

A new method is a `Method` built from stage functions (and, when it needs new math, a
kernel with its tests) plus one `register` call; never a subclass, never a branch in the
trainer.
"""

from __future__ import annotations

import difflib

from policylab.errors import PolicylabError
from policylab.methods.spec import Card, Method


class UnknownMethodError(PolicylabError, KeyError):
    """No method of that name; the message lists close matches."""

    def __str__(self):  # KeyError would quote the message
        return self.args[0]


class LiteratureOnlyError(PolicylabError, NotImplementedError):
    """The name is a literature-only card: nothing of it runs; the message quotes the card."""


REGISTRY: dict[str, Method] = {}
# literature-only entries: a card and nothing else (no parameters, stages or kernels);
# every execution path refuses them (`refuse_literature`)
LITERATURE: dict[str, Card] = {}


def register(method: Method) -> Method:
    if not isinstance(method, Method):
        raise TypeError(f"register() takes a Method, got {type(method).__name__}")
    if method.name in REGISTRY:
        raise ValueError(f"method {method.name!r} is already registered")
    REGISTRY[method.name] = method
    return method


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


def get(name: str) -> Method:
    """The method called `name` (its paper defaults); an unknown name raises with close matches,
    a literature-only name raises LiteratureOnlyError quoting its card."""
    if not isinstance(name, str) or not name:
        raise UnknownMethodError(f"a method name must be a non-empty string, got {name!r}. "
                                 "`policylab methods` lists them all.")
    refuse_literature(name)
    try:
        return REGISTRY[name]
    except KeyError:
        near = difflib.get_close_matches(name, list(REGISTRY), n=3, cutoff=0.4)
        hint = f" Did you mean: {', '.join(near)}?" if near else ""
        raise UnknownMethodError(f"unknown method {name!r}.{hint} `policylab methods` lists them all.") from None


def names() -> list[str]:
    return sorted(REGISTRY)
