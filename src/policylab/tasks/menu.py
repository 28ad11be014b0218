"""Arithmetic as a menu decision: pick the label of the correct option.

    Which option is 3 + 4?
    A) 9
    B) 7
    C) 6
    D) 12
    Reply with only the letter of the correct option.

The answer is the correct option's label ("B"). Every example carries its menu in
`meta["menu"]` (the labels, in order) and the option values in `meta["options"]`, so a
source can restrict the sampler to the labels (`SamplingSettings.allowed_ids`) and a
policy over single-token labels (RLiD) can be trained on it.

The problem underneath is an `ArithmeticTask` problem, and the train / held-out split is
that task's (a pure function of the problem: disjoint by construction, independent of the
training seed). The options of a problem are a pure function of the problem too: the
correct value, then distractors at distinct nonzero offsets drawn by hashing the problem,
and the correct option's position drawn the same way, so a problem always shows the same
menu (in training and in evaluation).
"""

from __future__ import annotations

import re

from policylab.errors import PolicylabError
from policylab.tasks.arithmetic import ArithmeticTask, hash_ints
from policylab.tasks.example import Example

LABELS = ("A", "B", "C", "D")
_OFFSETS = (-3, -2, -1, 1, 2, 3, 4, 5, -4, 10, -10)


class MenuArithmeticTask:
    """Menu version of `ArithmeticTask` (same arguments, plus `labels`: 2 to 10 distinct
    single uppercase letters)."""

    def __init__(self, ops=("+", "*"), digits: int = 1, *, seed: int = 0, labels=LABELS,
                 heldout_fraction: float = 0.5, split_seed: int = 0):
        labels = tuple(labels)
        if not 2 <= len(labels) <= 10 or len(set(labels)) != len(labels) or \
                not all(len(x) == 1 and x.isupper() for x in labels):
            raise PolicylabError(f"`labels` must be 2 to 10 distinct uppercase letters, got {labels}")
        self.labels = labels
        self.arith = ArithmeticTask(ops, digits, seed=seed, heldout_fraction=heldout_fraction, split_seed=split_seed)

    def _menu(self, ex: Example) -> Example:
        op, a, b = ex.meta["op"], ex.meta["a"], ex.meta["b"]
        value = int(ex.answer)
        h = hash_ints(f"policylab-menu:{op}:{a}:{b}", 2 + len(self.labels))
        offsets = list(_OFFSETS)
        distractors = []
        for j in range(len(self.labels) - 1):
            d = offsets.pop(h[2 + j] % len(offsets))
            distractors.append(value + d)
        pos = h[0] % len(self.labels)
        options = distractors[:pos] + [value] + distractors[pos:]
        shown = ex.prompt.split("?")[0].replace("What is ", "")
        lines = [f"Which option is {shown}?"] + [f"{lab}) {v}" for lab, v in zip(self.labels, options)]
        lines.append("Reply with only the letter of the correct option.")
        meta = {**ex.meta, "menu": list(self.labels), "options": options, "value": value}
        return Example("\n".join(lines), self.labels[pos], meta)

    def train_prompts(self, n: int) -> list[Example]:
        return [self._menu(e) for e in self.arith.train_prompts(n)]

    def heldout(self, n: int, *, repeat: bool = False) -> list[Example]:
        return [self._menu(e) for e in self.arith.heldout(n, repeat=repeat)]

    def heldout_size(self) -> int | None:
        return self.arith.heldout_size()

    def state_dict(self) -> dict:
        return {**self.arith.state_dict(), "labels": list(self.labels)}

    def load_state_dict(self, state: dict) -> None:
        if list(state.get("labels", [])) != list(self.labels):
            raise PolicylabError(f"task state was saved for labels {state.get('labels')}, this task has {self.labels}")
        self.arith.load_state_dict({k: v for k, v in state.items() if k != "labels"})


_ANY = re.compile(r"(?<![A-Za-z])([A-Z])(?![A-Za-z])")
_PRONOUN = re.compile(r"(?<![A-Za-z])I(?=\s+[a-z]|['’])")  # "I think", "I'm": the pronoun, not a label


def chosen_label(reply: str, labels=LABELS) -> str | None:
    """The label a free-text reply picks: the one menu label it names as a standalone
    capital letter ("B", "B) 7", "(B)", "I think B", "**B**"), any number of times; None
    when it names none, or several distinct ones ("A or B", "B, no, C", a copy of the whole
    menu): a hedge over labels is not a choice. "I" followed by a lower-case word or an
    apostrophe is the pronoun, never the label I."""
    if not isinstance(reply, str):
        raise TypeError(f"reply must be a str, got {type(reply).__name__}")
    named = {m for m in _ANY.findall(_PRONOUN.sub(" ", reply)) if m in labels}
    return named.pop() if len(named) == 1 else None


def menu_label_reward(responses: list[str], answers: list[str], **context) -> list[float]:
    """1.0 when the reply picks the gold label (`chosen_label`), else 0.0.

    Contract: exactly one distinct menu label named in the reply (the menu is the
    example's meta["menu"] when `metas` are given, else A-D plus the gold label); a copy of
    the prompt (context `prompts`) is removed first, so echoing the menu names nothing;
    a label plus a hedge naming another label scores 0."""
    from policylab.kernels.rewards.verifiers import strip_echo

    n = len(responses)
    prompts = context.get("prompts") or [None] * n
    metas = context.get("metas") or [None] * n
    out = []
    for r, a, p, m in zip(responses, answers, prompts, metas):
        labels = tuple(m["menu"]) if isinstance(m, dict) and m.get("menu") else tuple(dict.fromkeys(LABELS + (a,)))
        out.append(float(chosen_label(strip_echo(r, p if isinstance(p, str) else None), labels) == a))
    return out
