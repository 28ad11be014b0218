"""Load prompt / answer examples from a JSON-lines file (one JSON object per line)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from policylab.errors import PolicylabError
from policylab.tasks.example import Example


def load_jsonl(path: str | Path, *, prompt_field: str = "prompt", answer_field: str = "answer") -> list[Example]:
    """Read every example of a JSONL file.

    Each non-blank line must be a JSON object with a string `prompt_field` and an
    `answer_field` that is a string or a number (numbers become their text, 42 -> "42").
    All other fields go to `Example.meta`, plus meta["jsonl_line"] (1-based line number;
    a record that already has a `jsonl_line` field is refused rather than overwritten).
    Blank lines are skipped. Errors name the file and line: a missing file
    (FileNotFoundError), bytes that are not UTF-8, invalid JSON (bare NaN, Infinity and
    -Infinity are not JSON, and a number too large for a float is not finite: refused
    wherever they appear), a line that is not an object, a missing or null field, a field
    of the wrong type, and a file with no example at all (PolicylabError). Whether each
    answer suits the task's verifier is checked by `policylab.tasks.source` when it builds
    the task (`check_golds`). Records sharing an `id` field, and one prompt given different
    answers, are accepted with a PolicylabWarning naming the lines.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"JSONL task file not found: {path}")
    examples = []
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            where = f"{path}:{line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PolicylabError(
                    f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                    "save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line, parse_constant=_not_json, parse_float=_finite_float)
            except json.JSONDecodeError as exc:
                raise PolicylabError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            except ValueError as exc:
                raise PolicylabError(f"{where}: {exc}") from None
            if not isinstance(record, dict):
                raise PolicylabError(f"{where}: expected a JSON object, got {type(record).__name__}")
            for name in (prompt_field, answer_field):
                if record.get(name) is None:
                    raise PolicylabError(f"{where}: missing field {name!r} (fields present: {sorted(record)})")
            prompt, answer = record[prompt_field], record[answer_field]
            if not isinstance(prompt, str):
                raise PolicylabError(f"{where}: field {prompt_field!r} must be a string, got {type(prompt).__name__}")
            if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
                raise PolicylabError(
                    f"{where}: field {answer_field!r} must be a string or a number, got {type(answer).__name__}"
                )
            if "jsonl_line" in record:
                raise PolicylabError(f"{where}: field 'jsonl_line' is reserved for the line number")
            meta = {k: v for k, v in record.items() if k not in (prompt_field, answer_field)}
            examples.append(Example(prompt, str(answer), {**meta, "jsonl_line": line_no}))
    if not examples:
        raise PolicylabError(f"{path}: no examples (the file is empty or blank)")
    _warn_duplicates(path, examples)
    return examples


def _not_json(name: str):
    raise ValueError(f"{name} is not a JSON value (write a finite number, or the answer as a string)")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"the number {text[:40]} is too large to be a finite float (write it as a string)")
    return v


def _lines(xs: list[int], limit: int = 5) -> str:
    shown = ", ".join(map(str, xs[:limit]))
    return shown + (f" and {len(xs) - limit} more" if len(xs) > limit else "")


def _warn_duplicates(path: Path, examples: list[Example]) -> None:
    """Warn (PolicylabWarning) about records that share an `id`, and about one prompt given
    different answers: the verifier can only count one of them as correct."""
    import warnings

    from policylab.errors import PolicylabWarning

    by_id: dict = {}
    for ex in examples:
        if "id" in ex.meta and isinstance(ex.meta["id"], (str, int, float)) and not isinstance(ex.meta["id"], bool):
            by_id.setdefault(ex.meta["id"], []).append(ex.meta["jsonl_line"])
    dup_ids = {k: v for k, v in by_id.items() if len(v) > 1}
    if dup_ids:
        first = next(iter(dup_ids))
        warnings.warn(
            f"{path}: {len(dup_ids)} id(s) appear on more than one line, e.g. id {first!r} on lines "
            f"{_lines(dup_ids[first])}", PolicylabWarning, stacklevel=3)
    by_prompt: dict[str, dict[str, list[int]]] = {}
    for ex in examples:
        by_prompt.setdefault(ex.prompt, {}).setdefault(ex.answer, []).append(ex.meta["jsonl_line"])
    conflicts = {p: a for p, a in by_prompt.items() if len(a) > 1}
    if conflicts:
        prompt, answers = next(iter(conflicts.items()))
        shown = "; ".join(f"{a!r} on line(s) {_lines(ls)}" for a, ls in list(answers.items())[:3])
        short = prompt if len(prompt) <= 60 else prompt[:57] + "..."
        warnings.warn(
            f"{path}: {len(conflicts)} prompt(s) are given different answers, e.g. {short!r}: {shown}",
            PolicylabWarning, stacklevel=3)
