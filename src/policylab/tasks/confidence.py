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

    @staticmethod
    def heldout_metrics(replies: list[str], correct: list[bool]) -> dict:
        """How well the stated confidence of held-out replies matches their correctness, whatever
        the method that trained the model (a correctness-only run is measured the same way):
        `confidence/parsed_frac`, the fraction of replies with a parseable confidence in [0, 1]
        (the RLCR parser: `kernels.rewards.calibration.parse_confidence`), and over those only
        `confidence/brier` = mean (q − 1[correct])² and `confidence/mean`; the last two are absent
        when no reply states one (never a made-up value)."""
        from policylab.kernels.rewards.calibration import parse_confidence

        if len(replies) != len(correct):
            raise ValueError(f"{len(replies)} replies but {len(correct)} correctness flags")
        qs = [(parse_confidence(r).q, bool(c)) for r, c in zip(replies, correct)]
        parsed = [(q, c) for q, c in qs if q is not None]
        out = {"confidence/parsed_frac": len(parsed) / len(qs) if qs else 0.0, "confidence/parsed": len(parsed)}
        if parsed:
            out["confidence/brier"] = sum((q - float(c)) ** 2 for q, c in parsed) / len(parsed)
            out["confidence/mean"] = sum(q for q, _ in parsed) / len(parsed)
        return out

    def heldout_size(self):
        return self.arith.heldout_size()

    def state_dict(self) -> dict:
        return self.arith.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.arith.load_state_dict(state)
