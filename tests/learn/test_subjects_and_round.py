"""`explain` finds a subject in any case and suggests close names; metrics and literature-
only cards are subjects of their own; `--plot` checks its path and fonts before any work;
the quiz is a round with a score and a review, running only the examples it asks."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from policylab import methods
from policylab.errors import PolicylabError
from policylab.learn import quiz, subjects
from policylab.learn.figures import render

from .conftest import EXAMPLES

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("typed, kind, name", [
    ("DAPO", "method", "dapo"), ("Dr-GRPO", "method", "dr_grpo"), ("dr grpo", "method", "dr_grpo"),
    ("calib_rl", "metric", "calib_rl"), ("calibration", "metric", "calib_rl"), ("Pass@K", "metric", "pass_at_k"),
    ("Sharpening Tax", "metric", "sharpening_tax"), ("ORL", "literature", "orl"),
])
def test_resolve_any_case_and_aliases(typed, kind, name):
    assert subjects.resolve(typed) == subjects.Subject(kind, name)


@pytest.mark.parametrize("typed, first", [("DAPOO", "dapo"), ("grpoo", "grpo"), ("calib-r", "calib_rl"),
                                          ("sharpen_tax", "sharpening_tax")])
def test_near_misses_name_the_closest(typed, first):
    with pytest.raises(methods.UnknownMethodError) as exc:
        subjects.resolve(typed)
    assert f"unknown method {typed!r}. Did you mean: {first}" in str(exc.value)


def test_nothing_close_gives_no_suggestion():
    with pytest.raises(methods.UnknownMethodError) as exc:
        subjects.resolve("zzzzzz")
    assert "Did you mean" not in str(exc.value) and "`policylab methods` lists" in str(exc.value)


def test_explain_upper_case_is_the_same_text(fixture_bank):
    kw = dict(bank_dir=fixture_bank.bank_dir, examples=EXAMPLES)
    assert quiz.explain_text("RLOO", **kw) == quiz.explain_text("rloo", **kw)


@pytest.mark.parametrize("typed, heading", [("calib_rl", "[calib_rl · basics] calib_rl-basics"),
                                            ("pass@k", "[pass_at_k · mechanism] pass_at_k-mechanism"),
                                            ("orl", "[orl vs grpo · comparison] orl-comparison")])
def test_metrics_and_literature_are_explained(typed, heading):
    text = quiz.explain_text(typed)
    assert heading in text and text.count("Worked example: ") == 4
    if typed == "pass@k":
        # n = 4, c = 3, k = 2: n − c = 1 < k, every pair holds a correct reply -> exactly 1;
        # c = 2: 1 − C(2,2)/C(4,2) = 1 − 1/6 = 0.8333
        assert "pass@k = 1.0000 (exactly 1: true); with one correct reply fewer: 0.8333" in text
        assert text.startswith("pass_at_k: Unbiased pass@k per task")
    if typed == "orl":
        assert text.startswith(methods.cards.literature_card_text("orl", methods.registry.card("orl")))
        assert "raises LiteratureOnlyError" in text


def _fixture_cli(tmp_path, *args, stdin=""):
    return subprocess.run([sys.executable, str(HERE / "fixture_cli.py"), str(tmp_path / "fx"), *args],
                          input=stdin, capture_output=True, text=True, timeout=120)


def test_plot_into_a_missing_directory_fails_before_printing(tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "grpo.svg"
    res = _fixture_cli(tmp_path, "explain", "grpo", "--plot", str(target))
    assert res.returncode == 2 and res.stdout == ""
    assert f"--plot: the directory {target.parent} does not exist" in res.stderr
    (tmp_path / "d.svg").mkdir()
    res = _fixture_cli(tmp_path, "explain", "grpo", "--plot", str(tmp_path / "d.svg"))  # a directory, not a file
    assert res.returncode == 2 and res.stdout == "" and "is a directory" in res.stderr


def test_plot_of_a_metric_is_refused_first(tmp_path):
    with pytest.raises(PolicylabError, match="calib_rl is a metric: it has no figure"):
        quiz.check_plot("calibration", tmp_path / "x.svg")


def test_chinese_png_without_a_cjk_font_refuses_naming_the_package(tmp_path, monkeypatch):
    from policylab.learn import figures

    monkeypatch.setattr(render, "cjk_fonts", lambda: [])
    with pytest.raises(render.MissingFontError, match="apt-get install fonts-wqy-microhei"):
        quiz.check_plot("kpop", tmp_path / "kpop.png", "zh")
    fig = figures.figure("kpop")
    for suffix in (".png", ".pdf"):
        with pytest.raises(render.MissingFontError, match="fonts-wqy-microhei"):
            render.write(fig, tmp_path / f"kpop{suffix}", "zh")
    assert list(tmp_path.iterdir()) == []
    render.write(fig, tmp_path / "kpop.svg", "zh")  # an SVG keeps its text as text: allowed
    render.write(fig, tmp_path / "kpop.png", "en")  # English needs no CJK font
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kpop.png", "kpop.svg"]


def test_missing_glyphs_at_draw_time_refuse_and_write_nothing(tmp_path, monkeypatch):
    """Even when a CJK font is thought present, a glyph drawn as a box is refused."""
    from policylab.learn import figures

    rc = render._rc()
    monkeypatch.setattr(render, "_rc", lambda: {**rc, "font.family": ["DejaVu Sans"]})
    with pytest.raises(render.MissingFontError, match="glyph"):
        render.write(figures.figure("kpop"), tmp_path / "kpop.png", "zh")
    assert list(tmp_path.iterdir()) == []


class Counting(dict):
    """The fixture's example functions, counting the calls."""

    def __init__(self):
        super().__init__()
        self.calls = []
        for k, fn in EXAMPLES.items():
            self[k] = (lambda fn, k: lambda **a: (self.calls.append(k), fn(**a))[1])(fn, k)


class FirstWrite(io.StringIO):
    """Records how many examples had run when the first question was written."""

    def __init__(self, counter):
        super().__init__()
        self.counter, self.at_first = counter, None

    def write(self, s):
        if self.at_first is None and "[1/" in s:
            self.at_first = len(self.counter.calls)
        return super().write(s)


def test_round_scores_reviews_and_runs_only_what_it_asks(fixture_bank):
    ex = Counting()
    out = FirstWrite(ex)
    # three questions: answer, empty line, then the verdict (y, n, then EOF)
    answers = io.StringIO("guess one\n\ny\nguess two\n\nno\nguess three\n\n")
    r = quiz.quiz_round(3, None, "en", 4, stdin=answers, stdout=out, bank_dir=fixture_bank.bank_dir, examples=ex,
                        topics_path=fixture_bank.topics_path)
    text = out.getvalue()
    assert out.at_first == 0  # no example ran before the first question was shown (the bank has 9)
    assert len(ex.calls) == 3 and len(r.asked) == 3 and len({q.id for q in r.asked}) == 3
    assert r.right == [True, False, False] and r.score == 1
    assert "Score: 1/3" in text and [q.id for q in r.missed] == [q.id for q in r.asked[1:]]
    review = text.split("Review of the missed questions:")[1]
    for q in r.missed:  # each missed question comes back with its answer and its live numbers
        assert q.question["en"] in review and q.answer["en"] in review and q.example.text["en"] in review
    assert r.asked[0].question["en"] not in review


def test_round_filters_by_method_topic_and_category(fixture_bank):
    kw = dict(bank_dir=fixture_bank.bank_dir, topics_path=fixture_bank.topics_path)
    assert {p.id for p in quiz.select("RLOO", category="implementation", **kw)} == {"rloo-implementation"}
    assert {p.id for p in quiz.select(topic="baselines", category="comparison", **kw)} == {
        "grpo-comparison", "rloo-comparison", "x-grpo-rloo"}
    assert len(quiz.select(**kw)) == 9
    with pytest.raises(PolicylabError, match="no reading-order topic matches 'nope'"):
        quiz.select(topic="nope", **kw)
    with pytest.raises(PolicylabError, match="category must be one of"):
        quiz.select(category="trivia", **kw)


def test_round_in_chinese_and_larger_than_the_pool(fixture_bank):
    out = io.StringIO()
    r = quiz.quiz_round(50, "rloo", "zh", 0, stdin=io.StringIO(""), stdout=out, bank_dir=fixture_bank.bank_dir,
                        examples=EXAMPLES, topics_path=fixture_bank.topics_path)
    assert len(r.asked) == 6 and r.score == 0  # rloo's 4, grpo's comparison with rloo, the cross question
    assert "得分：0/6" in out.getvalue() and "回顾答错的问题：" in out.getvalue()


def test_cli_round_through_a_pipe(tmp_path):
    res = _fixture_cli(tmp_path, "quiz", "-n", "2", "--method", "grpo", "--seed", "1", stdin="a\n\ny\nb\n\ny\n")
    assert res.returncode == 0, res.stderr
    assert "[1/2]" in res.stdout and "[2/2]" in res.stdout and "Score: 2/2" in res.stdout
    assert "Review of the missed" not in res.stdout
