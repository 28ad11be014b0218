"""Load prompt / answer examples from a JSON-lines file (one JSON object per line)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import PolicylabError
from .example import Example


def load_jsonl(path: str | Path, *, prompt_field: str = "prompt", answer_field: str = "answer") -> list[Example]:
    """Read every example of a JSONL file.

    Each non-blank line must be a JSON object with a string `prompt_field` and an
    `answer_field` that is a string or a number (numbers become their text, 42 -> "42").
    All other fields go to `Example.meta`, plus meta["jsonl_line"] (1-based line number;
    a record that already has a `jsonl_line` field is refused rather than overwritten).
    Blank lines are skipped. Errors name the file and line: a missing file
    (FileNotFoundError), invalid JSON, a line that is not an object, a missing or null
    field, a field of the wrong type, and a file with no example at all (PolicylabError).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"JSONL task file not found: {path}")
    examples = []
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PolicylabError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
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
    return examples
