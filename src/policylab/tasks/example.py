"""One task example and its chat-message form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Example:
    """A prompt, its gold answer as text, and free-form metadata.

    `answer` is training-side gold for training splits and evaluation gold for held-out
    splits; self-labeling rewards (TTRL) must not be given it. `meta` carries
    task-specific fields (operands, source line, the reasoning-gym entry ...).
    """

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


class Gold(str):
    """A gold answer: the answer text (a `str`, equal to and hashed as that text) that also
    carries its example's metadata as `.meta`.

    Every scoring path hands a verifier the examples' answers, `(completions, answers)`
    (the trainer's reward stages, the held-out evaluator, shaping functions); a verifier
    that needs more than the text (a reasoning-gym dataset's own scorer reads the
    generated entry) finds it on the answer it is given, whatever path called it. Copies
    and pickles keep the metadata; `str(gold)` is the plain text without it."""

    def __new__(cls, text: str, meta: dict[str, Any] | None = None):
        obj = super().__new__(cls, text)
        obj.meta = dict(meta or {})
        return obj

    def __reduce__(self):
        return (Gold, (str(self), self.meta))

    def __repr__(self) -> str:
        return f"Gold({str(self)!r})"


def as_messages(example: Example) -> list[dict[str, str]]:
    """Chat-template input: a single user turn holding the prompt (no system prompt)."""
    return [{"role": "user", "content": example.prompt}]
