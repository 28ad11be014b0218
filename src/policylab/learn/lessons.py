"""Which methods the project ships, and what the learning layer says about the others.

A method's lesson is its bank file (`learn/bank/<name>.yaml`: four questions in both
languages with live examples) and its figure (`learn/figures/defs/<name>.yaml`). Every
method the project ships has one, and the checks of it stay strict: the site build, the
whole-bank build and `tests/learn/test_shipped_lessons.py` fail naming the file to
write. A method registered anywhere else (a user's own module, a test) may have none:
`policylab explain` prints its card and formulas and says there is no lesson yet, the
site lists it with "no lesson yet" on a page of its card and formulas, and no figure is
drawn for it.

    shipped_names() -> frozenset   the methods registered by the modules of policylab.methods.families
    is_shipped(name) -> bool
    NO_LESSON / NO_LESSON_NOTE     the texts, in both languages

How a shipped method is recognised: the registry keeps no record of who registered a
method, and a user's method can copy a shipped one's stages and card, so neither its
stages nor its card tell. `shipped_names` runs the code of each module of
`policylab.methods.families` again with a stand-in `register` that only records the
name it is given (the registry is not touched), which is exactly "the methods those
modules register", whatever else is registered later.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import pkgutil
import sys
from pathlib import Path

from policylab import methods
from policylab.errors import PolicylabError

FAMILIES = "policylab.methods.families"
REGISTRY_MODULE = "policylab.methods.registry"

NO_LESSON = {"en": "no lesson yet", "zh": "尚无讲解"}
NO_LESSON_NOTE = {
    "en": "No lesson yet: this method was registered outside policylab, so it has no questions and no figure; "
          "its card and formulas are read from its spec.",
    "zh": "尚无讲解：该方法是在 policylab 之外注册的，因此没有问题和图；其方法卡片和公式读自它的规格。",
}


class _Recorder:
    """Stands in for `policylab.methods.registry` while a family module's code runs again:
    `register` records the method's name, `register_literature` records nothing (a
    literature card is not a method); every other name is the real module's."""

    def __init__(self, real):
        self.real, self.names = real, []

    def register(self, method):
        self.names.append(method.name)
        return method

    def register_literature(self, name, card):
        return card

    def __getattr__(self, attr):
        return getattr(self.real, attr)


def _registered_by(module_name: str) -> list[str]:
    """The names the family module `module_name` registers, by running its code again."""
    module = importlib.import_module(module_name)
    recorder = _Recorder(sys.modules[REGISTRY_MODULE])
    real_import = builtins.__import__

    def importer(name, globals=None, locals=None, fromlist=(), level=0):
        if name == REGISTRY_MODULE and fromlist and level == 0:
            return recorder
        return real_import(name, globals, locals, fromlist, level)

    namespace = {"__name__": module_name, "__file__": module.__file__, "__package__": FAMILIES,
                 "__builtins__": {**vars(builtins), "__import__": importer}}
    path = Path(module.__file__)
    try:
        exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
    except Exception as exc:  # noqa: BLE001 - any failure means the census cannot be trusted
        raise PolicylabError(f"cannot list the methods {module_name} registers: {type(exc).__name__}: {exc}") from exc
    return recorder.names


@functools.cache
def shipped_names() -> frozenset[str]:
    """The methods the modules of `policylab.methods.families` register (module doc)."""
    families = importlib.import_module(FAMILIES)
    names: set[str] = set()
    for info in pkgutil.iter_modules(families.__path__):
        names.update(_registered_by(f"{FAMILIES}.{info.name}"))
    return frozenset(names)


def is_shipped(name: str) -> bool:
    """Whether the registered method `name` is one the project ships."""
    return methods.get(name).name in shipped_names()
