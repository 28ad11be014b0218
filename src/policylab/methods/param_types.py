"""Typed method parameters: `Param` (one declared parameter with its type, default,
doc, choices, check and resolve rule), `Params` (a method's resolved values, read-only)
and `ParamView` (what one stage may read: the names it declared, nothing else)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from policylab.errors import PolicylabError


class ParamError(PolicylabError):
    """A method parameter that is unknown, of the wrong type or out of range."""


@dataclass(frozen=True)
class Param:
    """One typed method parameter.

    `type` is bool, int, float or str; `optional` allows None. `choices` restricts a str
    (or any) value. `check(value) -> str | None` returns an error text for a bad value.
    `resolve(run) -> value` gives the value of a None default from the run's shape (e.g.
    the generation budget); its meaning is in `doc`. Non-finite numbers are refused."""

    name: str
    type: type
    default: Any
    doc: str
    choices: tuple | None = None
    optional: bool = False
    check: Callable[[Any], str | None] | None = None
    resolve: Callable[[Any], Any] | None = None  # called with the run's `policylab.methods.stage.RunShape`

    def __post_init__(self):
        if self.type not in (bool, int, float, str):
            raise TypeError(f"parameter {self.name}: type must be bool, int, float or str, got {self.type}")
        if self.default is not None or not self.optional:
            self.validate(self.default, "default")

    def validate(self, value: Any, method: str) -> Any:
        """The value converted to the declared type, or ParamError naming the problem."""
        where = f"method `{method}` parameter `{self.name}`"
        if value is None:
            if self.optional:
                return None
            raise ParamError(f"{where} must be a {self.type.__name__}, got None")
        if self.type is bool:
            if not isinstance(value, bool):
                raise ParamError(f"{where} must be true or false, got {value!r}")
        elif self.type is int:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ParamError(f"{where} must be an integer, got {value!r}")
        elif self.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ParamError(f"{where} must be a number, got {value!r}")
            value = float(value)
            if not math.isfinite(value):
                raise ParamError(f"{where} must be finite, got {value!r}")
        elif not isinstance(value, str):
            raise ParamError(f"{where} must be a string, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ParamError(f"{where} must be one of {', '.join(map(str, self.choices))}; got {value!r}")
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise ParamError(f"{where} {problem}; got {value!r}")
        return value


def positive(v) -> str | None:
    return None if v > 0 else "must be > 0"


def non_negative(v) -> str | None:
    return None if v >= 0 else "must be >= 0"


def at_least_one(v) -> str | None:
    return None if v >= 1 else "must be >= 1"


def unit_interval(v) -> str | None:
    return None if 0 <= v < 1 else "must be in [0, 1)"


class Params(Mapping):
    """A method's resolved parameter values: read-only, by attribute or by key."""

    def __init__(self, method: str, values: Mapping[str, Any]):
        object.__setattr__(self, "_method", method)
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"method `{self._method}` declares no parameter `{name}`") from None

    def __setattr__(self, name, value):
        raise AttributeError("Params are read-only")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Params({self._method}: " + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def view(self, names: tuple[str, ...], stage: str) -> "ParamView":
        return ParamView(self, names, stage)


class ParamView:
    """What one stage may read: the parameters it declared, nothing else."""

    def __init__(self, params: Params, names: tuple[str, ...], stage: str):
        object.__setattr__(self, "_p", params)
        object.__setattr__(self, "_names", frozenset(names))
        object.__setattr__(self, "_stage", stage)

    def __getattr__(self, name: str) -> Any:
        if name not in self._names:
            raise AttributeError(
                f"stage `{self._stage}` reads parameter `{name}` without declaring it "
                f"(declared: {', '.join(sorted(self._names)) or 'none'})")
        return getattr(self._p, name)

    def __setattr__(self, name, value):
        raise AttributeError("Params are read-only")
