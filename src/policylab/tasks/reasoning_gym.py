"""Optional adapter for the `reasoning-gym` procedural datasets (`pip install reasoning-gym`).

`reasoning_gym` is imported inside `load_reasoning_gym`, so policylab does not depend on it.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable, Sequence

from ..errors import PolicylabError, ShapeError
from .example import Example

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def answer_tag_or_reply(completion: str) -> str | None:
    """Text of the last <answer>...</answer> tag if there is one, else the whole reply,
    stripped; None for an empty reply."""
    tags = _ANSWER_TAG.findall(completion)
    text = (tags[-1] if tags else completion).strip()
    return text or None


def load_reasoning_gym(
    name: str,
    *,
    size: int,
    seed: int,
    extract: Callable[[str], str | None] = answer_tag_or_reply,
    **config: Any,
) -> tuple[list[Example], Callable[..., list[float]]]:
    """`size` examples of reasoning-gym dataset `name` and a reward function that scores them.

    Examples: prompt = the dataset's question (no format instruction added; if the replies
    should use <answer> tags, say so in a system prompt, e.g. reasoning_gym.utils.SYSTEM_PROMPTS),
    answer = the reference answer as text, or "" for datasets that have no single
    reference answer (any valid solution counts; only the scorer can judge those), meta =
    {"entry": the full reasoning-gym entry, "dataset": name, "index": i}.

    Scorer: `score(completions, answers, *, metas, **_) -> [B] floats`, where metas are the
    examples' `meta` dicts (pass `context={"metas": [...]}` to `combine_rewards`). It
    extracts the reply's answer with `extract` and calls the dataset's own
    `score_answer(answer, entry)`, which reads the gold from the entry (so `answers` is
    only length-checked). Scores are the dataset's, usually in [0, 1] with partial credit.

    Extra keyword arguments are passed to `reasoning_gym.create_dataset` (dataset config).
    """
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(
            "load_reasoning_gym needs the optional `reasoning-gym` package: pip install reasoning-gym"
        ) from exc
    known = sorted(getattr(getattr(reasoning_gym, "factory", None), "DATASETS", {}) or [])
    if known and name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise PolicylabError(f"unknown reasoning-gym dataset {name!r}{hint} ({len(known)} datasets exist)")
    dataset = reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
    examples = []
    for i in range(len(dataset)):
        entry = dataset[i]
        answer = "" if entry.get("answer") is None else str(entry["answer"])
        examples.append(Example(str(entry["question"]), answer, {"entry": entry, "dataset": name, "index": i}))

    def score(completions: Sequence[str], answers: Sequence[Any], *, metas: Sequence[dict], **_: Any) -> list[float]:
        if not len(completions) == len(answers) == len(metas):
            raise ShapeError(
                f"completions ({len(completions)}), answers ({len(answers)}) and metas ({len(metas)}) differ in length"
            )
        out = []
        for i, (completion, meta) in enumerate(zip(completions, metas)):
            if not isinstance(meta, dict) or meta.get("dataset") != name or "entry" not in meta:
                raise PolicylabError(f"metas[{i}] is not an example meta of reasoning-gym dataset {name!r}")
            out.append(float(dataset.score_answer(answer=extract(completion), entry=meta["entry"])))
        return out

    score.__name__ = f"reasoning_gym_{name}"
    return examples, score
