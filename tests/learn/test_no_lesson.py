"""A method registered outside the package (here by a fixture, as a user's own module
would) has no lesson: `explain` prints its card and formulas and says so, the quiz and
`explain --plot` refuse in one line, the site lists it with "no lesson yet" on a page of
its card and formulas, and neither the bank nor the figures count it missing. With a
bank file of its own it gets its questions, still without a figure."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest

from policylab import methods
from policylab.errors import PolicylabError
from policylab.learn import bank, figures, glossary, lessons, quiz, site
from policylab.methods.cards import card_text
from policylab.methods.registry import REGISTRY

from .conftest import EXAMPLES, FixtureBank, bank_data
from .test_site import embedded, parse

TOY = "toy_unlessoned"


@pytest.fixture
def toy():
    """GRPO's stages and card under another name, registered like a user's method, and
    removed afterwards."""
    base = methods.get("grpo")
    method = dataclasses.replace(base, name=TOY, card=dataclasses.replace(base.card, title="A toy registered by a test"))
    methods.register(method)
    try:
        yield method
    finally:
        del REGISTRY[TOY]


def test_it_is_not_shipped_though_it_has_a_shipped_methods_stages(toy):
    assert toy.advantage is methods.get("grpo").advantage  # its stages cannot tell
    assert not lessons.is_shipped(TOY) and TOY not in lessons.shipped_names()
    assert lessons.is_shipped("grpo")
    assert not bank.has_lesson(TOY) and bank.has_lesson("grpo")


def test_explain_prints_the_card_the_formulas_and_no_lesson_yet(toy):
    for lang in ("en", "zh"):
        text = quiz.explain_text(TOY, lang)
        assert text.startswith(card_text(toy) if lang == "en" else glossary.card_text_zh(card_text(toy)))
        assert "advantage: policylab.kernels.advantages.grpo.grpo" in text  # formulas from its own stages
        assert text.endswith(lessons.NO_LESSON_NOTE[lang])
        assert f"[{TOY}" not in text  # no question headings


def test_the_cli_explains_it_and_refuses_its_plot_and_quiz(toy, tmp_path, capsys):
    from policylab.learn.cli import main

    assert main(["explain", TOY]) == 0
    assert "No lesson yet" in capsys.readouterr().out
    assert main(["explain", TOY, "--plot", str(tmp_path / "toy.svg")]) == 2
    assert f"{TOY} has no lesson yet (it was registered outside policylab): no figure to plot" in capsys.readouterr().err
    assert not (tmp_path / "toy.svg").exists()
    with pytest.raises(PolicylabError, match=f"{TOY} 尚无讲解.*没有可问的问题"):
        quiz.quiz(TOY, "zh", 0, stdin=io.StringIO(""), stdout=io.StringIO())


def test_bank_and_figures_do_not_count_it_missing_unless_asked_for(toy):
    assert TOY not in [e.name for e in bank.build_bank()]  # complete, and the toy left out
    figures.check_complete()
    assert TOY not in figures.definitions()
    with pytest.raises(bank.BankError, match=f"method '{TOY}' has no bank file"):
        bank.build_bank(only=[TOY])
    with pytest.raises(figures.FigureError, match=f"method '{TOY}' has no figure: write"):
        figures.definitions([TOY])


def test_a_complete_site_build_fails_only_for_the_shipped_methods(toy, tmp_path):
    fb = FixtureBank(tmp_path / "b")  # grpo and rloo only
    with pytest.raises(bank.BankError) as err:
        site.build_site(tmp_path / "out", bank_dir=fb.bank_dir, examples=EXAMPLES, topics_path=fb.topics_path)
    assert "method 'dapo' has no bank file" in str(err.value) and TOY not in str(err.value)


def _site(tmp_path, docs=None):
    fb = FixtureBank(tmp_path / "b", docs)
    site.build_site(tmp_path / "out", bank_dir=fb.bank_dir, examples=EXAMPLES, topics_path=fb.topics_path,
                    complete=False)
    return tmp_path / "out"


def test_the_site_lists_it_with_no_lesson_yet(toy, tmp_path):
    out = _site(tmp_path)
    index = (out / "index.html").read_text(encoding="utf-8")
    entry = re.search(rf'<li><a data-href="method-{TOY}.html".*?</li>', index).group(0)
    for lang in ("en", "zh"):
        assert site.esc(lessons.NO_LESSON[lang]) in entry
    assert f'<option value="{TOY}"' not in index  # no questions to filter on
    assert [it for it in embedded(out / "index.html", "index-data")["items"] if TOY in it["methods"]] == []
    page = out / f"method-{TOY}.html"
    text = page.read_text(encoding="utf-8")
    assert "A toy registered by a test" in text and "policylab.kernels.advantages.grpo.grpo" in text
    for lang in ("en", "zh"):
        assert site.esc(lessons.NO_LESSON_NOTE[lang]) in text
    assert 'id="figure-data"' not in text and not list(out.glob(f"figures/{TOY}.*"))
    assert embedded(page, "example-data") == {}
    for ref in parse(page).links:  # its formulas link to the kernel sources, written with the site
        assert (page.parent / ref.split("#")[0]).is_file(), ref
    assert f'<tr data-method="{TOY}">' in (out / "compare.html").read_text(encoding="utf-8")


def test_with_a_bank_file_of_its_own_it_has_questions_and_no_figure(toy, tmp_path):
    docs = bank_data()  # the toy's file: the fixture's GRPO questions under its own name and ids
    docs[TOY] = {"method": TOY, "boundary": docs["grpo"]["boundary"],
                 "questions": [dict(q, id=q["id"].replace("grpo", TOY)) for q in docs["grpo"]["questions"]]}
    out = _site(tmp_path, docs)
    text = (out / f"method-{TOY}.html").read_text(encoding="utf-8")
    assert f'id="{TOY}-basics"' in text and site.esc(lessons.NO_LESSON_NOTE["en"]) not in text
    assert 'id="figure-data"' not in text and not list(out.glob(f"figures/{TOY}.*"))
    explained = quiz.explain_text(TOY, bank_dir=tmp_path / "b" / "bank", examples=EXAMPLES)
    assert f"[{TOY} vs rloo · comparison] {TOY}-comparison" in explained
    assert lessons.NO_LESSON_NOTE["en"] not in explained
