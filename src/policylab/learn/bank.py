"""The question bank: load `learn/bank/*.yaml` and `learn/topics.yaml`, validate them
strictly, run every worked example and fill the `{placeholders}` with the live numbers.

    build_bank(lang=None)  -> [MethodEntry]   one per method with a bank file, four questions each
    has_lesson(name)       -> bool            whether the method has a bank file
    topics(lang=None)      -> Topics          reading order + cross-method questions
    question_index()       -> [Pending]       every question read, none rendered (the quiz)
    metric_bank(lang=None) -> {metric: [Question]}   the metric cards' questions (learn.metric_questions)

Every problem found is collected and raised at once as a `BankError`, one line per
problem, each naming the file, the method and the question (see LEARN_FORMAT.md for the
format; one question is parsed by `learn.questions`). Numbers are never typed into the
prose: a changed kernel changes the text, and a kernel that starts raising breaks the
build. What a method is made of (its kernels, their equations, the comparison table) is
read from the code in `learn.anatomy`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from policylab import methods
from policylab.learn import index as _index
from policylab.learn.index import BANK_DIR, TOPICS_PATH, Pending
from policylab.learn.lessons import is_shipped
from policylab.learn.metric_questions import METRIC_BANK_DIR, metric_bank
from policylab.learn.questions import (
    CATEGORIES,
    LANGS,
    BankError,
    Example,
    MethodEntry,
    Question,
    ReadingStep,
    Topics,
    bilingual_texts,
    check_lang,
    default_examples,
    fill,
    in_lang,
    load_yaml,
    near_methods,
    parse_question,
    placeholders,
    render_value,
)

__all__ = ["BANK_DIR", "CATEGORIES", "LANGS", "METRIC_BANK_DIR", "TOPICS_PATH", "BankError", "Example",
           "MethodEntry", "Pending", "Question", "ReadingStep", "Topics", "build_bank", "fill", "has_lesson", "metric_bank",
           "placeholders", "question_index", "reading_steps", "render_value", "topics"]


# ------------------------------------------------------------------------ method files


def _parse_method_file(path: Path, examples, errors: list) -> MethodEntry | None:
    data = load_yaml(path, errors)
    if data is None:
        return None
    name, file = path.stem, path.name
    if data.get("method") != name:
        errors.append(f"{file}: `method: {data.get('method')}` does not match the file name (expected `method: {name}`)")
    extra = set(data) - {"method", "questions", "boundary"}
    if extra:
        errors.append(f"{file} (method {name}): unknown top-level key(s) {sorted(extra)}")
    raw = data.get("questions")
    if not isinstance(raw, list):
        errors.append(f"{file} (method {name}): `questions` must be a list of four questions")
        return None
    cats = [q.get("category") for q in raw if isinstance(q, dict)]
    if len(raw) != len(CATEGORIES) or sorted(map(str, cats)) != sorted(CATEGORIES):
        missing = [c for c in CATEGORIES if c not in cats]
        dup = sorted({str(c) for c in cats if cats.count(c) > 1})
        errors.append(f"{file} (method {name}): needs exactly four questions, one per category "
                      f"({', '.join(CATEGORIES)}); has {len(raw)}"
                      + (f", missing {missing}" if missing else "") + (f", repeated {dup}" if dup else ""))
    questions = []
    for q in raw:
        if isinstance(q, dict) and q.get("category") in CATEGORIES and q.get("id") != f"{name}-{q['category']}":
            errors.append(f"{file} (method {name}), question {q.get('id')!r}: id must be `{name}-{q['category']}`")
        parsed = parse_question(q, file, (name,), examples, errors, topic=False, boundary=data.get("boundary"))
        if parsed is not None:
            questions.append(parsed)
    questions.sort(key=lambda q: CATEGORIES.index(q.category))
    return MethodEntry(name, methods.get(name), tuple(questions), file)


def build_bank(lang: str | None = None, *, bank_dir: Path | str | None = None,
               examples: Mapping[str, Callable] | None = None, only: list[str] | None = None,
               complete: bool = True) -> list[MethodEntry]:
    """Every method's four questions, validated and rendered with live numbers.

    lang: None keeps both languages in each text dict, "en"/"zh" keeps one (both are
    always validated). bank_dir / examples: injectable for tests (default: the package's
    `learn/bank/` and `learn.examples.EXAMPLES`). only: restrict to these methods (each
    must be registered). complete: a method without a bank file is an error when the
    project ships it (`learn.lessons`) or `only` names it; a method registered elsewhere
    without one is left out (it has no lesson yet), and with complete=False every method
    without a file is. Raises `BankError` listing every problem."""
    check_lang(lang)
    bank_dir = Path(bank_dir) if bank_dir is not None else BANK_DIR
    examples = default_examples(examples)
    wanted = [methods.get(n).name for n in only] if only is not None else methods.names()
    errors: list[str] = []
    files = {p.stem: p for p in sorted(bank_dir.glob("*.yaml"))} if bank_dir.is_dir() else {}
    if only is None:
        for p in sorted(bank_dir.glob("*.yml")) if bank_dir.is_dir() else ():
            errors.append(f"{p.name}: bank files end in .yaml")
        for stem in sorted(set(files) - set(methods.REGISTRY)):
            errors.append(f"{stem}.yaml: bank file for unknown method {stem!r}" + near_methods(stem))
    entries, seen = [], {}
    for name in wanted:
        if name not in files:
            if complete and (only is not None or is_shipped(name)):
                errors.append(f"method {name!r} has no bank file (expected {bank_dir / (name + '.yaml')})")
            continue
        entry = _parse_method_file(files[name], examples, errors)
        if entry is None:
            continue
        for q in entry.questions:
            if q.id in seen:
                errors.append(f"{entry.file}: question id {q.id!r} is also used in {seen[q.id]}")
            seen[q.id] = entry.file
        entries.append(entry)
    if errors:
        raise BankError(errors)
    return [MethodEntry(e.name, e.method, tuple(in_lang(q, lang) for q in e.questions), e.file) for e in entries]


def has_lesson(name: str, bank_dir: Path | str | None = None) -> bool:
    """Whether the registered method `name` has a bank file (in `bank_dir`, default the
    package's `learn/bank/`)."""
    bank_dir = Path(bank_dir) if bank_dir is not None else BANK_DIR
    return (bank_dir / f"{methods.get(name).name}.yaml").is_file()


# ----------------------------------------------------------------------------- topics


def _reading_step(raw: Any, i: int, errors: list) -> ReadingStep | None:
    where = f"topics.yaml, reading_order[{i}]"
    if not isinstance(raw, dict):
        errors.append(f"{where}: must be a mapping with topic, methods, why")
        return None
    extra = set(raw) - {"topic", "methods", "why"}
    if extra:
        errors.append(f"{where}: unknown key(s) {sorted(extra)}")
    out = {}
    for key in ("topic", "why"):
        block = raw.get(key) if isinstance(raw.get(key), dict) else {}
        texts = bilingual_texts({lang: {key: block.get(lang)} for lang in LANGS}, where, (key,), errors)
        out[key] = {lang: t[key] for lang, t in texts.items() if key in t}
    ms = raw.get("methods")
    if not isinstance(ms, list) or not ms:
        errors.append(f"{where}: `methods` must be a non-empty list of method names")
        ms = []
    for m in ms:
        if m not in methods.REGISTRY:
            errors.append(f"{where}: {m!r} is not a registered method" + near_methods(m))
    return ReadingStep(out["topic"], tuple(ms), out["why"])


def _topic_question(raw: Any, examples, errors: list) -> Question | None:
    ms = raw.get("methods") if isinstance(raw, dict) else None
    if not (isinstance(ms, list) and len(ms) == 2 and all(isinstance(m, str) for m in ms) and ms[0] != ms[1]):
        qid = raw.get("id") if isinstance(raw, dict) else None
        errors.append(f"topics.yaml, question {qid!r}: `methods` must be two different method names, got {ms!r}")
        return None
    for m in ms:
        if m not in methods.REGISTRY:
            errors.append(f"topics.yaml, question {raw.get('id')!r}: {m!r} is not a registered method" + near_methods(m))
    if raw.get("id") != f"x-{ms[0]}-{ms[1]}":
        errors.append(f"topics.yaml, question {raw.get('id')!r}: id must be `x-{ms[0]}-{ms[1]}`")
    return parse_question(raw, "topics.yaml", tuple(ms), examples, errors, topic=True)


def topics(lang: str | None = None, *, path: Path | str | None = None,
           examples: Mapping[str, Callable] | None = None) -> Topics:
    """`learn/topics.yaml`: reading order and cross-method questions, validated like the
    bank. A missing file gives empty topics; a present one must be valid (BankError)."""
    check_lang(lang)
    path = Path(path) if path is not None else TOPICS_PATH
    if not path.exists():
        return Topics()
    errors: list[str] = []
    data = load_yaml(path, errors)
    steps, questions = [], []
    if data is not None:
        extra = set(data) - {"reading_order", "questions"}
        if extra:
            errors.append(f"topics.yaml: unknown top-level key(s) {sorted(extra)}")
        for i, raw in enumerate(data.get("reading_order") or []):
            steps.append(_reading_step(raw, i, errors))
        seen = set()
        for raw in data.get("questions") or []:
            q = _topic_question(raw, default_examples(examples), errors)
            if q is not None:
                if q.id in seen:
                    errors.append(f"topics.yaml: question id {q.id!r} is used twice")
                seen.add(q.id)
                questions.append(q)
    if errors:
        raise BankError(errors)
    pick = (lambda d: d) if lang is None else (lambda d: {lang: d[lang]})
    steps = [ReadingStep(pick(s.topic), s.methods, pick(s.why)) for s in steps]
    return Topics(tuple(steps), tuple(in_lang(q, lang) for q in questions))


# ------------------------------------------------------------------- lazy question index
# (learn.index: read without torch or the registry; here the index keeps only the files of
# registered methods, as the bank does)


def question_index(*, bank_dir: Path | str | None = None, topics_path: Path | str | None = None,
                   extra: bool | None = None) -> list[Pending]:
    """`index.question_index` with the method files of registered methods only."""
    return _index.question_index(bank_dir=bank_dir, topics_path=topics_path, extra=extra,
                                 registered=lambda name: name in methods.REGISTRY)


reading_steps = _index.reading_steps
