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

Training comparisons come only from the task's train stream (`candidates` refuses any
other split, as every piece of guidance does); the reward model's held-out pair accuracy
is measured on the same four reply kinds for prompts of the task's held-out split
(`heldout_candidates`), which nothing trains on. The split is the task's own
(`tasks.arithmetic`: by a hash of the problem, disjoint by construction).
"""

from __future__ import annotations

import hashlib
import re

from policylab.errors import PolicylabError
from policylab.kernels.rewards.verifiers import exact_numeric_reward
from policylab.tasks.example import Example
from policylab.tasks.guidance import require_train

_ONLY_NUMBER = re.compile(r"\s*[-+\u2212]?\d+(?:\.\d+)?\s*\.?\s*")


def is_terse(text: str) -> bool:
    """The reply is a single number (an optional final period allowed)."""
    return bool(_ONLY_NUMBER.fullmatch(text))


def has_true_preference(example: Example) -> bool:
    """The example is an arithmetic problem (its operands in meta), for which the known
    preference is defined."""
    return {"op", "a", "b"} <= set(example.meta or {})


def true_score(example: Example, text: str) -> float:
    """The known preference score of a reply (see the module docstring): 3, 2, 1 or 0."""
    if not has_true_preference(example):
        raise PolicylabError(f"the procedural preference is defined for arithmetic problems only; "
                             f"{example.prompt[:50]!r} has no operands in its meta")
    correct = exact_numeric_reward([text], [example.answer])[0]
    return 2.0 * correct + (1.0 if is_terse(text) else 0.0)


def _wrong(example: Example) -> str:
    """A wrong answer 1..3 away from the right one (never negative), fixed per prompt."""
    h = int.from_bytes(hashlib.blake2b(example.prompt.encode(), digest_size=4).digest(), "little")
    d = (h % 3) + 1
    r = int(example.answer)
    return str(r + d if h & 8 or r - d < 0 else r - d)


def candidates(example: Example) -> list[str]:
    """K = 4 replies with true scores 3, 2, 1, 0 (in that order). Built from the gold
    answer, so only for train-split examples (`tasks.guidance.require_train`); the
    held-out pair accuracy uses `heldout_candidates`."""
    require_train(example)
    return _candidates(example)


def heldout_candidates(example: Example) -> list[str]:
    """The same four replies for a held-out example, to MEASURE the reward model on (never
    trained on): the held-out gold answer is read only by the evaluation."""
    if (example.meta or {}).get("split") != "heldout":
        raise PolicylabError(f"heldout_candidates is for held-out examples; {example.prompt[:50]!r} is in split "
                             f"{(example.meta or {}).get('split')!r}")
    return _candidates(example)


def _candidates(example: Example) -> list[str]:
    r, w = example.answer, _wrong(example)
    return [r, f"The answer is {r}.", w, f"I think it is {w}."]


def ranked(example: Example, *, heldout: bool = False) -> tuple[list[str], list[float]]:
    """(candidates, their true scores): the ranking every comparison of the prompt follows
    (train examples; `heldout=True` for the measurement on held-out ones)."""
    c = heldout_candidates(example) if heldout else candidates(example)
    return c, [true_score(example, t) for t in c]
