"""The question banks of the subjects that are not registered methods (`learn.subjects`):

    learn/metric_bank/<name>.yaml       one per metric (top key `metric:`): every metric card
                                        of `policylab.eval.cards`, and pass_at_k
    learn/literature_bank/<name>.yaml   one per literature-only card (top key `literature:`)

Each file has the question bank's format (four questions, one per category, both
languages), each question validated by the bank's own parser with its worked example run
live.

    metric_bank(lang=None)                -> {metric card: [Question]}  (the cards only)
    subject_questions(subject, lang=None) -> [Question]                 one subject's four
    extra_bank(lang=None, only=None)      -> {Subject: [Question]}      every such subject
"""

from __future__ import annotations

from pathlib import Path

from policylab.learn.questions import CATEGORIES, BankError, check_lang, default_examples, in_lang, load_yaml, parse_question
from policylab.learn.subjects import Subject, metric_names

from policylab.learn.index import DIRS, LITERATURE_BANK_DIR, METRIC_BANK_DIR  # noqa: F401 (re-exported)


def _names(kind: str) -> list[str]:
    from policylab import methods

    return metric_names() if kind == "metric" else methods.registry.literature_names()


def _parse_file(kind: str, name: str, path: Path, examples, errors: list) -> list:
    data = load_yaml(path, errors)
    if data is None:
        return []
    if data.get(kind) != name or not {kind, "questions"} <= set(data) <= {kind, "questions", "boundary"}:
        errors.append(f"{path.name}: needs the keys `{kind}: {name}` and `questions` (and may have `boundary`)")
        return []
    raw = data["questions"] if isinstance(data["questions"], list) else []
    cats = sorted(str(q.get("category")) for q in raw if isinstance(q, dict))
    if cats != sorted(CATEGORIES) or len(raw) != len(CATEGORIES):
        errors.append(f"{path.name}: needs exactly four questions, one per category ({', '.join(CATEGORIES)})")
    qs = []
    for q in raw:
        if isinstance(q, dict) and q.get("id") != f"{name}-{q.get('category')}":
            errors.append(f"{path.name}, question {q.get('id')!r}: id must be `{name}-{q.get('category')}`")
        parsed = parse_question(q, path.name, (name,), examples, errors, topic=False, boundary=data.get("boundary"))
        if parsed is not None:
            qs.append(parsed)
    return sorted(qs, key=lambda q: CATEGORIES.index(q.category))


def extra_bank(lang: str | None = None, only: list[Subject] | None = None, *, examples=None) -> dict:
    """{Subject: [Question]} for every metric and literature-only subject (or those in
    `only`), each with its file read and its examples run; a subject without a file, a
    file for an unknown subject, or a bad question raises BankError listing every problem."""
    check_lang(lang)
    examples = default_examples(examples)
    errors: list[str] = []
    out = {}
    for kind, folder in DIRS.items():
        files = {p.stem: p for p in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}
        known = _names(kind)
        if only is None:
            for stem in sorted(set(files) - set(known)):
                errors.append(f"{stem}.yaml: {kind} bank file for unknown {kind} {stem!r}")
        for name in known:
            subject = Subject(kind, name)
            if only is not None and subject not in only:
                continue
            if name not in files:
                errors.append(f"{kind} {name!r} has no bank file (expected {folder / (name + '.yaml')})")
                continue
            out[subject] = [in_lang(q, lang) for q in _parse_file(kind, name, files[name], examples, errors)]
    if errors:
        raise BankError(errors)
    return out


def subject_questions(subject: Subject, lang: str | None = None, *, examples=None) -> list:
    """The four questions of one metric or literature-only subject (BankError if it has no
    valid file)."""
    return extra_bank(lang, only=[subject], examples=examples)[subject]


def metric_bank(lang: str | None = None) -> dict:
    """Each metric card's four questions (basics, mechanism, comparison, implementation) in
    English and Chinese, validated by the bank's own parser with every worked example run
    live. Returns {name: [Question, ...]} in category order; raises BankError listing problems."""
    from policylab.eval.cards import metric_names as cards

    wanted = [Subject("metric", n) for n in cards()]
    return {s.name: qs for s, qs in extra_bank(lang, only=wanted).items()}
