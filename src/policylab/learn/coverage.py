"""The coverage table: for every paper behind a subject of the learning layer (each
registered method, literature-only card and metric card, grouped by the paper its card
names) and each of the four question types, the question the project asks about it.

    rows() -> [Row]            one per paper, its subjects and its four cells
    markdown() -> str          the table as docs/learn-coverage.md has it

A cell holds the project's question (the subject's bank question of that type) or, when a
subject has none, the reason. The documentation page is generated from this module, and
`tests/learn/test_coverage.py` fails when the page and the bank disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from policylab import methods
from policylab.learn import bank, subjects
from policylab.learn.questions import CATEGORIES, placeholders

DOC = "docs/learn-coverage.md"
NO_QUESTION = "no question yet: {subject} has no bank file"


@dataclass(frozen=True)
class Row:
    paper: str  # the card's title
    arxiv: str
    subjects: tuple  # canonical names, in name order
    cells: dict  # category -> [(subject, question text)]


def _card(s: subjects.Subject):
    if s.kind == "method":
        c = methods.get(s.name).card
    elif s.kind == "literature":
        c = methods.registry.card(s.name)
    else:
        from policylab.eval.cards import METRICS

        if s.name not in METRICS:  # pass@k: the estimator of the sharpening-tax card's kernel
            return "Evaluating Large Language Models Trained on Code (the unbiased pass@k estimator)", "2107.03374"
        c = METRICS[s.name]
    return c.title, c.arxiv


def _question_texts() -> dict:
    """{(owner, category): question text in English} from the bank files; a text with a
    placeholder is rendered (its example runs), the others are read as written."""
    out = {}
    for p in bank.question_index(extra=True, topics_path="/nonexistent"):
        text = p.raw.get("en", {}).get("question", "")
        if placeholders(text):
            text = p.render("en").question["en"]
        out[(p.methods[0], p.category)] = " ".join(text.split())
    return out


def rows() -> list[Row]:
    texts = _question_texts()
    papers: dict[str, dict] = {}
    for s in subjects.subjects():
        title, arxiv = _card(s)
        key = arxiv or title
        row = papers.setdefault(key, {"paper": title, "arxiv": arxiv, "subjects": []})
        row["subjects"].append(s.name)
    out = []
    for key, r in papers.items():
        cells = {}
        for cat in CATEGORIES:
            cells[cat] = [(n, texts.get((n, cat)) or NO_QUESTION.format(subject=n)) for n in r["subjects"]]
        out.append(Row(r["paper"], r["arxiv"], tuple(r["subjects"]), cells))
    return sorted(out, key=lambda r: r.subjects[0])


def _cell(items) -> str:
    if len(items) == 1:
        return items[0][1].replace("|", "\\|")
    return "<br>".join(f"**{n}**: {t}" for n, t in items).replace("|", "\\|")


def markdown() -> str:
    rs = rows()
    n_cells = sum(len(CATEGORIES) for _ in rs)
    filled = sum(1 for r in rs for cat in CATEGORIES if not all(t.startswith("no question yet") for _, t in r.cells[cat]))
    lines = [
        "# What the learning layer asks about each paper",
        "",
        "Generated from the question bank by `policylab.learn.coverage` (do not edit by hand; "
        "`tests/learn/test_coverage.py` checks that this page matches the bank).",
        "",
        f"One row per paper behind a registered method, a literature-only card or a metric ({len(rs)} papers; "
        "methods that implement the same paper share its row). Each cell is the question `policylab quiz` and the "
        "site ask for that question type; the answer and its worked example with live numbers are on the "
        "subject's page of the site (`policylab site build`) and in `policylab explain NAME`.",
        "",
        f"Cells with a question: {filled} of {n_cells}.",
        "",
        "| paper | subject | basics | core mechanism | method comparison | implementation details |",
        "|---|---|---|---|---|---|",
    ]
    for r in rs:
        paper = r.paper.replace("|", "\\|") + (f" (arXiv {r.arxiv})" if r.arxiv else "")
        cells = " | ".join(_cell(r.cells[c]) for c in CATEGORIES)
        lines.append(f"| {paper} | {', '.join(f'`{s}`' for s in r.subjects)} | {cells} |")
    return "\n".join(lines) + "\n"
