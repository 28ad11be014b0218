"""The coverage table (docs/learn-coverage.md): one row per paper behind a subject, a
question in every cell (or the reason there is none), and the page equal to what the
bank generates now."""

from __future__ import annotations

from pathlib import Path

from policylab import methods
from policylab.learn import coverage
from policylab.learn.questions import CATEGORIES

ROOT = Path(__file__).resolve().parents[2]


def test_every_paper_has_a_question_of_every_type():
    rows = coverage.rows()
    covered = {s for r in rows for s in r.subjects}
    assert set(methods.names()) | set(methods.registry.literature_names()) | {"calib_rl", "sharpening_tax"} <= covered
    assert len(rows) >= 55
    for r in rows:
        for cat in CATEGORIES:
            assert len(r.cells[cat]) == len(r.subjects)
            for subject, text in r.cells[cat]:
                assert text.strip() and "{" not in text, (r.paper, cat, subject)
                assert not text.startswith("no question yet"), (r.paper, cat, subject)
    shared = {r.subjects for r in rows if len(r.subjects) > 1}
    assert ("grpo", "grpo_process") in shared  # one paper, two methods: one row


def test_the_page_is_up_to_date():
    page = (ROOT / coverage.DOC).read_text(encoding="utf-8")
    assert page == coverage.markdown(), (
        f"{coverage.DOC} is stale: regenerate it with `python -c \"from policylab.learn import coverage; "
        f"open('{coverage.DOC}', 'w').write(coverage.markdown())\"`")
    n = len(coverage.rows())
    assert f"Cells with a question: {4 * n} of {4 * n}." in page


def test_the_reading_order_covers_every_method_and_is_numbered_once():
    from policylab.learn import bank, lessons

    t = bank.topics("en")
    have = {m for s in t.reading_order for m in s.methods}
    assert set(lessons.shipped_names()) <= have, sorted(set(lessons.shipped_names()) - have)
    for s in bank.topics().reading_order:  # the page's <ol> numbers the steps: titles carry no number
        for lang, title in s.topic.items():
            assert not title[:1].isdigit(), (lang, title)
