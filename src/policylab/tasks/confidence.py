"""Arithmetic with a stated confidence: "What is 3 × 4? Reply with the number, then on a
new line 'Confidence: ' and the probability (from 0 to 1) that your number is right."

The problems, the train stream and the disjoint held-out split are those of
`ArithmeticTask` (same split rule); only the prompt asks for the confidence field. The
verifier is `rewards.calibration.confidence_answer_reward` (the number before the field
must equal the gold answer); `rlcr` reads the field itself with the strict parser
`rewards.calibration.parse_confidence`.
"""

from __future__ import annotations

from policylab.tasks.arithmetic import ArithmeticTask
from policylab.tasks.example import Example

SUFFIX = (" Reply with the number, then on a new line 'Confidence: ' followed by the probability (from 0 to 1) "
          "that your number is right.")


class ConfidenceTask:
    """`ArithmeticTask` whose prompts ask for "<number>\\nConfidence: <q>"."""

    def __init__(self, ops=("+", "*"), digits: int = 1, *, seed: int = 0):
        self.arith = ArithmeticTask(ops=ops, digits=digits, seed=seed)

    @staticmethod
    def wrap(e: Example) -> Example:
        question = e.prompt.split("?")[0] + "?"
        return Example(question + SUFFIX, e.answer, {**e.meta, "format": "answer_then_confidence"})

    def train_prompts(self, n: int) -> list[Example]:
        return [self.wrap(e) for e in self.arith.train_prompts(n)]

    def heldout(self, n: int, *, repeat: bool = False) -> list[Example]:
        return [self.wrap(e) for e in self.arith.heldout(n, repeat=repeat)]

    def heldout_size(self):
        return self.arith.heldout_size()

    def state_dict(self) -> dict:
        return self.arith.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.arith.load_state_dict(state)
