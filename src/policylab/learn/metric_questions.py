"""The metric cards' question bank: `learn/metric_bank/<name>.yaml`, one file per metric
card of `policylab.eval.cards`, in the question bank's format (top key `metric:`), each
question validated by the bank's own parser with its worked example run live.
"""

from __future__ import annotations

from pathlib import Path

from policylab.learn.questions import CATEGORIES, BankError, check_lang, default_examples, in_lang, load_yaml, parse_question

METRIC_BANK_DIR = Path(__file__).resolve().parent / "metric_bank"


def metric_bank(lang: str | None = None) -> dict:
    """Each metric card's four questions (basics, mechanism, comparison, implementation) in
    English and Chinese, in the question bank's format (`learn/metric_bank/<name>.yaml`, top
    key `metric:`), validated by the bank's own parser with every worked example run live.
    Returns {name: [Question, ...]} in category order; raises BankError listing problems."""
    from policylab.eval.cards import METRICS, metric_names

    check_lang(lang)
    examples = default_examples(None)
    errors: list[str] = []
    out = {}
    files = {p.stem: p for p in sorted(METRIC_BANK_DIR.glob("*.yaml"))}
    for stem in sorted(set(files) - set(METRICS)):
        errors.append(f"{stem}.yaml: metric bank file for unknown metric {stem!r}")
    for name in metric_names():
        if name not in files:
            errors.append(f"metric {name!r} has no bank file (expected {METRIC_BANK_DIR / (name + '.yaml')})")
            continue
        data = load_yaml(files[name], errors)
        if data is None:
            continue
        if data.get("metric") != name or set(data) != {"metric", "questions"}:
            errors.append(f"{name}.yaml: needs exactly the keys `metric: {name}` and `questions`")
            continue
        raw = data["questions"] if isinstance(data["questions"], list) else []
        cats = sorted(str(q.get("category")) for q in raw if isinstance(q, dict))
        if cats != sorted(CATEGORIES):
            errors.append(f"{name}.yaml: needs exactly four questions, one per category ({', '.join(CATEGORIES)})")
        qs = []
        for q in raw:
            if isinstance(q, dict) and q.get("id") != f"{name}-{q.get('category')}":
                errors.append(f"{name}.yaml, question {q.get('id')!r}: id must be `{name}-{q.get('category')}`")
            parsed = parse_question(q, files[name].name, (name,), examples, errors, topic=False)
            if parsed is not None:
                qs.append(in_lang(parsed, lang))
        out[name] = sorted(qs, key=lambda q: CATEGORIES.index(q.category))
    if errors:
        raise BankError(errors)
    return out
