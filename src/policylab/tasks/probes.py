"""Answer-independent probes for Probe-ERPO: questions about intermediate quantities.

A probe is asked to the model itself (greedy decode) and never contains or asks for the
final answer. Its consistency rule says which final answer the probe's own answer
implies; a candidate is consistent with the probe when its answer equals that implied
value. Nothing here reads a gold answer: the rules are arithmetic identities between the
re-asked sub-quantity and the final quantity, written from the prompt's operands.

`arithmetic_subquantity` (the built-in generator, for "What is a op b? ..." prompts of
`policylab.tasks.arithmetic`): two probes re-ask the operation with one operand moved by
one (down, or up when it is 0):

    a op b'  with b' = b − 1 (b + 1 if b = 0)      a' op b  with a' = a − 1 (a + 1 if a = 0)
    implied final answer, from the probe's answer q:
      +  :  q + (b − b')            q + (a − a')
      −  :  q − (b − b')            q + (a − a')
      ×  :  q + a·(b − b')          q + (a − a')·b

A prompt the generator cannot parse gets no probes (None): its group cannot be scored and
is left out of the update (the eligibility filter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from policylab.errors import PolicylabError

_ARITH = re.compile(r"What is (\d+) ([+\-×*]) (\d+)\?")


@dataclass(frozen=True)
class Probe:
    """One probe: the question asked, and the final answer a probe answer q implies."""

    question: str
    implied: Callable[[int], int]


def _moved(x: int) -> int:
    return x - 1 if x > 0 else x + 1


def arithmetic_subquantity(prompt: str) -> list[Probe] | None:
    """The two sub-quantity probes of an arithmetic prompt, or None if it does not parse.
    The probe keeps the prompt's wording (the instruction after the question mark)."""
    m = _ARITH.search(prompt)
    if m is None:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    head, tail = prompt[: m.start()], prompt[m.end():]
    a2, b2 = _moved(a), _moved(b)

    def ask(x: int, y: int) -> str:
        return f"{head}What is {x} {op} {y}?{tail}"

    if op == "+":
        rules = ((ask(a, b2), lambda q, d=b - b2: q + d), (ask(a2, b), lambda q, d=a - a2: q + d))
    elif op == "-":
        rules = ((ask(a, b2), lambda q, d=b - b2: q - d), (ask(a2, b), lambda q, d=a - a2: q + d))
    else:  # × or *
        rules = ((ask(a, b2), lambda q, d=a * (b - b2): q + d), (ask(a2, b), lambda q, d=(a - a2) * b: q + d))
    return [Probe(question, implied) for question, implied in rules]


PROBE_GENERATORS: dict[str, Callable[[str], "list[Probe] | None"]] = {
    "arithmetic_subquantity": arithmetic_subquantity,
}


def _as_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return int(value) if value.is_integer() else None


def probe_consistency(candidate: str | None, probe_answers: Sequence[str | None],
                      probes: Sequence[Probe]) -> list[bool]:
    """Per probe: is the candidate's answer the final answer the probe's answer implies?

    An unparseable candidate or probe answer (None, or not an integer) is inconsistent
    (library decision: no evidence of agreement). No gold argument."""
    if len(probe_answers) != len(probes):
        raise PolicylabError(f"{len(probe_answers)} probe answers for {len(probes)} probes")
    y = _as_int(candidate)
    out = []
    for ans, probe in zip(probe_answers, probes):
        q = _as_int(ans)
        out.append(y is not None and q is not None and probe.implied(q) == y)
    return out
