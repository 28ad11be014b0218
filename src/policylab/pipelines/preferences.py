"""A procedural preference set whose ground truth is known, for the RLHF pipeline.

For an arithmetic prompt ("What is 7 × 8? Reply with only the number.") the true
preference over replies is a score computed from the reply itself:

    true_score(y) = 2·[the last number of y is the answer] + [y is only a number]

so a correct terse reply (3) beats a correct verbose one (2), which beats a wrong terse
one (1), which beats a wrong verbose one or a reply without a number (0). Ranked
comparisons: for each prompt, K = 4 candidates with four different true scores (the
answer; "The answer is <answer>."; a wrong number; "I think it is <wrong>."), ranked by the
true score, giving the C(4, 2) = 6 ordered pairs the reward model is trained on. Because
the ground truth is a function, a reward model's held-out pair accuracy and a policy's
true-preference win rate are measured, not estimated from labels.

Held-out prompts come from the task's held-out split, train prompts from its train
stream (the split is the task's own, `tasks.arithmetic`).
"""

from __future__ import annotations

import hashlib
import re

from ..rewards.verifiers import exact_numeric_reward
from ..tasks.example import Example

_ONLY_NUMBER = re.compile(r"\s*[-+\u2212]?\d+(?:\.\d+)?\s*\.?\s*")


def is_terse(text: str) -> bool:
    """The reply is a single number (an optional final period allowed)."""
    return bool(_ONLY_NUMBER.fullmatch(text))


def true_score(example: Example, text: str) -> float:
    """The known preference score of a reply (see the module docstring)."""
    correct = exact_numeric_reward([text], [example.answer])[0]
    return 2.0 * correct + (1.0 if is_terse(text) else 0.0)


def _wrong(example: Example) -> str:
    h = int.from_bytes(hashlib.blake2b(example.prompt.encode(), digest_size=4).digest(), "little")
    d = (h % 3) + 1
    r = int(example.answer)
    return str(r + d if h & 8 or r - d < 0 else r - d)


def candidates(example: Example) -> list[str]:
    """K = 4 replies with true scores 3, 2, 1, 0 (in that order)."""
    r, w = example.answer, _wrong(example)
    return [r, f"The answer is {r}.", w, f"I think it is {w}."]


def ranked(example: Example) -> tuple[list[str], list[float]]:
    """(candidates, their true scores): the ranking every comparison of the prompt follows."""
    c = candidates(example)
    return c, [true_score(example, t) for t in c]
