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

How a shipped method is recognised: the registry records which module called `register`
for each method (`registry.origin`); the shipped ones are those registered by the modules
of `policylab.methods.families`.
"""

from __future__ import annotations


from policylab import methods

FAMILIES = "policylab.methods.families"

NO_LESSON = {"en": "no lesson yet", "zh": "尚无讲解"}
NO_LESSON_NOTE = {
    "en": "No lesson yet: this method was registered outside policylab, so it has no questions and no figure; "
          "its card and formulas are read from its spec.",
    "zh": "尚无讲解：该方法是在 policylab 之外注册的，因此没有问题和图；其方法卡片和公式读自它的规格。",
}


def shipped_names() -> frozenset[str]:
    """The methods the modules of `policylab.methods.families` register (module doc)."""
    return frozenset(n for n in methods.names() if methods.registry.origin(n).startswith(FAMILIES + "."))


def is_shipped(name: str) -> bool:
    """Whether the registered method `name` is one the project ships."""
    return methods.get(name).name in shipped_names()
