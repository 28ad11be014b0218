"""The question index: every question of the bank read from its file, none rendered.

    question_index(...) -> [Pending]      method files, metric and literature files, topics
    reading_steps(...)  -> [dict]         the reading order's raw steps
    norm(name)          -> str            the spelling a subject name is matched by

This module imports neither torch nor the method registry, so `policylab quiz` can put
its first question on the screen before any kernel is loaded: a question's example runs
(and the registry is read) only in `Pending.render`. The full validation of the bank is
`bank.build_bank` / `bank.topics` / `metric_questions.extra_bank` (the site build, the
tests).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BANK_DIR = HERE / "bank"
TOPICS_PATH = HERE / "topics.yaml"
METRIC_BANK_DIR = HERE / "metric_bank"
LITERATURE_BANK_DIR = HERE / "literature_bank"
DIRS = {"metric": METRIC_BANK_DIR, "literature": LITERATURE_BANK_DIR}
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def norm(name: str) -> str:
    """Lower case, runs of spaces and '-' as one '_' ("Dr-GRPO" -> "dr_grpo")."""
    return re.sub(r"[\s\-]+", "_", name.strip().lower())


def _error(lines):
    from policylab.learn.questions import BankError

    return BankError(lines)


@dataclass(frozen=True)
class Pending:
    """A question read from its file but not yet rendered: its example has not run."""

    id: str
    category: str
    methods: tuple  # its owners: (subject,) or the two methods of a topics question
    compare_with: str | None
    file: Path
    raw: dict
    topic: bool
    boundary: dict | None = None  # the file's boundary block (a question may have its own)

    def text(self, lang: str) -> str | None:
        """The question as written in `lang` when it needs no number from its example
        (no placeholder), else None: it is shown only after `render`."""
        block = self.raw.get(lang)
        text = block.get("question") if isinstance(block, dict) else None
        if not isinstance(text, str) or not text.strip() or _PLACEHOLDER.search(text):
            return None
        return text

    def render(self, lang: str | None = None, *, examples: Mapping[str, Callable] | None = None):
        """Validate this one question and run its example (BankError naming the problem)."""
        from policylab.learn.questions import default_examples, in_lang, parse_question

        errors: list[str] = []
        q = parse_question(self.raw, self.file.name, self.methods, default_examples(examples), errors, self.topic,
                           boundary=self.boundary)
        if errors or q is None:
            raise _error(errors or [f"{self.file.name}: question {self.id!r} does not build"])
        return in_lang(q, lang)


def load(path: Path):
    """The YAML document in `path` (BankError naming the file when it is not YAML)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    except yaml.YAMLError as exc:
        raise _error([f"{path.name}: not valid YAML: {exc}"]) from None


def _pending(path: Path, owners: tuple | None, topic: bool) -> list[Pending]:
    data = load(path)
    raw = data.get("questions") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise _error([f"{path.name}: `questions` must be a list"])
    out = []
    for q in raw:
        if not isinstance(q, dict):
            raise _error([f"{path.name}: a question must be a mapping, got {type(q).__name__}"])
        ms = tuple(q.get("methods") or ()) if topic else owners
        out.append(Pending(str(q.get("id")), str(q.get("category")), ms, q.get("compare_with"), path, q, topic,
                           data.get("boundary")))
    return out


def question_index(*, bank_dir: Path | str | None = None, topics_path: Path | str | None = None,
                   extra: bool | None = None, registered: Callable[[str], bool] | None = None) -> list[Pending]:
    """Every question of the bank (method files, then the metric and literature files with
    `extra`, default: when the bank is the package's own, then the cross-method questions
    of topics.yaml), read but not rendered: no example runs until `Pending.render`.
    registered: keep only the method files whose name it accepts (None: every file; a
    file for an unknown method then fails when its question is rendered)."""
    extra = bank_dir is None if extra is None else extra
    bank_dir = Path(bank_dir) if bank_dir is not None else BANK_DIR
    out: list[Pending] = []
    for p in sorted(bank_dir.glob("*.yaml")) if bank_dir.is_dir() else ():
        if registered is None or registered(p.stem):
            out += _pending(p, (p.stem,), topic=False)
    if extra:
        for folder in DIRS.values():
            for p in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
                out += _pending(p, (p.stem,), topic=False)
    path = Path(topics_path) if topics_path is not None else TOPICS_PATH
    if path.exists():
        out += _pending(path, None, topic=True)
    return out


def reading_steps(topics_path: Path | str | None = None) -> list[dict]:
    """The reading order's raw steps ({topic: {en, zh}, methods: [...]}) without running
    anything (the quiz's --topic filter)."""
    path = Path(topics_path) if topics_path is not None else TOPICS_PATH
    if not path.exists():
        return []
    data = load(path)
    return [s for s in (data.get("reading_order") or []) if isinstance(s, dict)] if isinstance(data, dict) else []
