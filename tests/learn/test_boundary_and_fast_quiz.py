"""Every answer states its boundary (what the worked example shows, what it does not, what
the full result would need), in both languages, wherever an answer is shown; and the quiz
puts its first question on the screen before any example runs or torch is imported."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from policylab.learn import bank, quiz, site
from policylab.learn.metric_questions import extra_bank
from policylab.learn.questions import BOUNDARY_LABELS, BOUNDARY_PARTS, BankError

from .conftest import EXAMPLES, boundary

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


# ------------------------------------------------------------------------ the format


def test_a_file_boundary_reaches_every_question_and_a_question_may_have_its_own(make_bank):
    own = boundary("only the basics question")

    def mutate(docs, topics):
        docs["grpo"]["questions"][0]["boundary"] = own

    fb = make_bank(mutate)
    entries = {e.name: e for e in bank.build_bank(**fb.bank_kwargs)}
    grpo = entries["grpo"].questions
    assert grpo[0].boundary == {lang: own[lang] for lang in ("en", "zh")}
    assert all(q.boundary == fb.docs["grpo"]["boundary"] for q in grpo[1:])
    assert bank.build_bank("zh", **fb.bank_kwargs)[0].questions[1].boundary == {"zh": fb.docs["grpo"]["boundary"]["zh"]}


@pytest.mark.parametrize("mutate, message", [
    (lambda d, t: d["rloo"].pop("boundary"), "rloo.yaml (method rloo), question 'rloo-basics': missing `boundary`"),
    (lambda d, t: d["rloo"]["boundary"]["zh"].pop("needs"), "missing translation `zh.needs`"),
    (lambda d, t: d["rloo"]["boundary"]["zh"].update(shows="only English here"), "`zh.shows` has no Chinese"),
    (lambda d, t: d["rloo"]["boundary"]["en"].update(not_shown="a run of 20 steps"), "types in the number '20'"),
    (lambda d, t: d["rloo"]["boundary"]["zh"].update(not_shown="训练了20步"), "types in the number '20'"),
    (lambda d, t: d["rloo"]["boundary"]["en"].update(needs="more than {advantages}"), "has a placeholder"),
    (lambda d, t: d["rloo"].update(boundary="not a mapping"), "`boundary` must be a mapping"),
    (lambda d, t: t["questions"][0].pop("boundary"), "topics.yaml (topics), question 'x-grpo-rloo': missing `boundary`"),
])
def test_a_bad_or_missing_boundary_is_a_build_error_naming_it(make_bank, mutate, message):
    fb = make_bank(mutate)
    with pytest.raises(BankError) as err:
        bank.build_bank(**fb.bank_kwargs)
        bank.topics(path=fb.topics_path, examples=EXAMPLES)
    assert message in str(err.value), str(err.value)


def test_names_inside_words_are_not_typed_numbers(make_bank):
    def mutate(docs, topics):
        docs["rloo"]["boundary"]["en"]["shows"] = "the k3 term and SmolLM2-135M-Instruct, not pass@k"

    bank.build_bank(**make_bank(mutate).bank_kwargs)  # builds


# ------------------------------------------------------------- the shipped bank


def test_every_shipped_answer_has_a_boundary_in_both_languages():
    questions = [q for e in bank.build_bank() for q in e.questions] + list(bank.topics().questions)
    questions += [q for qs in extra_bank().values() for q in qs]
    assert len(questions) >= 240
    for q in questions:
        for lang in ("en", "zh"):
            parts = q.boundary[lang]
            assert set(parts) == set(BOUNDARY_PARTS), (q.id, lang)
            assert all(len(parts[p].strip()) >= 12 for p in BOUNDARY_PARTS), (q.id, lang)  # a sentence, not a word
    # a topics question states its own boundary, not one of its methods' files
    topics = {q.id: q for q in bank.topics().questions}
    grpo = bank.build_bank(only=["grpo"])[0].questions[0]
    assert topics["x-dr_grpo-grpo"].boundary != grpo.boundary


# ------------------------------------------------------ where an answer is shown


def _boundary_texts(q, lang):
    return [q.boundary[lang][p] for p in BOUNDARY_PARTS] + [BOUNDARY_LABELS[lang][p] for p in BOUNDARY_PARTS]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_explain_shows_each_answer_with_its_boundary(fixture_bank, lang):
    text = quiz.explain_text("rloo", lang, bank_dir=fixture_bank.bank_dir, examples=EXAMPLES)
    q = bank.build_bank(lang, **fixture_bank.bank_kwargs)[1].questions[0]
    for t in _boundary_texts(q, lang):
        assert t in text
    answer = text.index(q.answer[lang])
    assert answer < text.index(q.boundary[lang]["shows"]) < text.index(q.example.text[lang])


def test_the_quiz_shows_the_boundary_after_the_answer_and_in_the_review(fixture_bank):
    out = io.StringIO()
    r = quiz.quiz_round(1, "rloo", "zh", 0, stdin=io.StringIO("猜测\n\n不知道\n"), stdout=out,
                        bank_dir=fixture_bank.bank_dir, examples=EXAMPLES, topics_path=fixture_bank.topics_path)
    text, q = out.getvalue(), r.asked[0]
    review = text.split("回顾答错的问题：")[1]
    for t in _boundary_texts(q, "zh"):
        assert t in text.split("回顾答错的问题：")[0] and t in review


def test_the_site_shows_the_boundary_in_both_languages(fixture_site):
    fb, out = fixture_site
    page = (out / "method-rloo.html").read_text(encoding="utf-8")
    q = bank.build_bank(**fb.bank_kwargs)[1].questions[0]
    block = page.split(f'id="{q.id}"')[1].split("</details>")[0]
    assert 'class="boundary"' in block
    for lang in ("en", "zh"):
        for t in _boundary_texts(q, lang):
            assert site.esc(t) in block
    topics = (out / "topics.html").read_text(encoding="utf-8")
    assert site.esc(fb.topics["questions"][0]["boundary"]["en"]["needs"]) in topics


# ------------------------------------------------------------------ a fast quiz


class _Gate:
    """An example function that runs only after the first question has been written (it
    waits for the reader's screen); without that order the round would never proceed."""

    def __init__(self):
        self.shown = threading.Event()
        self.ran_before_shown = []

    def __call__(self, **kw):
        self.ran_before_shown.append(not self.shown.is_set())
        if not self.shown.wait(60):  # a deadlock guard, not a timing check
            raise AssertionError("the example was asked to run before the question was shown")
        return EXAMPLES["fx_leave_one_out"](**kw)


def test_the_first_question_is_shown_before_its_example_runs(fixture_bank):
    gate = _Gate()
    examples = {**EXAMPLES, "fx_leave_one_out": gate}

    class Screen(io.StringIO):
        def write(self, s):
            n = super().write(s)
            if "[1/" in s:
                gate.shown.set()
            return n

    out = Screen()
    r = quiz.quiz_round(2, "rloo", "en", 3, stdin=io.StringIO(""), stdout=out, bank_dir=fixture_bank.bank_dir,
                        examples=examples, topics_path=fixture_bank.topics_path, category="basics")
    assert r.asked[0].id == "rloo-basics" and gate.ran_before_shown == [False]
    assert r.asked[0].example.values["advantages"] == EXAMPLES["fx_leave_one_out"](rewards=[1.0, 0.0, 0.5])["advantages"]


def test_a_failing_example_is_reported_after_its_question_and_the_round_stops(make_bank):
    def mutate(docs, topics):
        for q in docs["rloo"]["questions"]:
            q["example"]["function"] = "fx_broken"

    fb = make_bank(mutate)
    out = io.StringIO()
    with pytest.raises(BankError, match="deliberately broken example"):
        quiz.quiz_round(2, "rloo", "en", 0, stdin=io.StringIO(""), stdout=out, bank_dir=fb.bank_dir,
                        examples=EXAMPLES, topics_path=fb.topics_path, category="mechanism")
    assert out.getvalue().startswith("[1/1] [rloo · mechanism] rloo-mechanism")


PROBE = """
import io, sys
events = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "torch" not in events:
            events.append("torch")
class Screen(io.StringIO):
    def write(self, s):
        if s.startswith("[1/") and "question" not in events:
            events.append("question")
        return super().write(s)
sys.meta_path.insert(0, Watch())
import policylab
assert "torch" not in sys.modules, "import policylab loaded torch"
from policylab.learn.quiz import quiz_round
quiz_round(1, sys.argv[1] if len(sys.argv) > 1 else None, "en", 5, stdin=io.StringIO(""), stdout=Screen())
print(",".join(events))
"""


@pytest.mark.parametrize("args", [[], ["GSPO"]])
def test_the_real_round_shows_its_first_question_before_torch_is_imported(args):
    res = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=False,
                         env={"PYTHONPATH": str(SRC), "PATH": ""}, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "question,torch"


def test_the_main_cli_takes_the_quiz_path_and_keeps_its_error_format(tmp_path):
    res = subprocess.run([sys.executable, "-m", "policylab.cli", "quiz", "--method", "DAPOO"], capture_output=True,
                         text=True, check=False, env={"PYTHONPATH": str(SRC), "PATH": ""}, cwd=tmp_path, timeout=600)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("policylab: error: unknown method 'DAPOO'. Did you mean: dapo")
