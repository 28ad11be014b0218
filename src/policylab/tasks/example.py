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


def as_messages(example: Example) -> list[dict[str, str]]:
    """Chat-template input: a single user turn holding the prompt (no system prompt)."""
    return [{"role": "user", "content": example.prompt}]
