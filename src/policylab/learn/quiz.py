"""Terminal views of the bank: `policylab quiz` and `policylab explain`.

    quiz(method=None, lang="en", seed=None)   one random (seeded) question: ask, read the
                                              reader's answer from stdin (EOF-safe, works
                                              piped), reveal the answer and run the example
    explain(name, lang="en")                  the card, the formulas and every question with
                                              its worked example computed now ("no lesson
                                              yet" for a method registered outside policylab)
    write_plot(name, path, lang="en")         the method's figure (the site's), computed now

The formula lines are the equation blocks of the docstrings of the kernels the method's
stages call (`anatomy.formula_text`: the method's kernels in pipeline order; the
card summary stands in for a kernel whose docstrings show no equation).
"""

from __future__ import annotations

import random
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from policylab.errors import PolicylabError
from policylab.learn import index

if TYPE_CHECKING:  # the round imports torch and the registry only after its first question is shown
    from policylab.learn import bank, subjects

UI = {
    "en": dict(prompt="Your answer (finish with an empty line or Ctrl-D):", yours="Your answer", skipped="(no answer given)",
               answer="Answer", example="Worked example", numbers="live numbers, computed now by {call}:", formula="Formula",
               questions="Questions", cat=dict(basics="basics", mechanism="mechanism", comparison="comparison",
                                               implementation="implementation"), vs="vs", empty="the question bank is empty",
               no_lesson="{name} has no lesson yet (it was registered outside policylab): no questions to ask about it",
               no_figure="{name} has no lesson yet (it was registered outside policylab): no figure to plot",
               no_figure_kind="{name} is {kind}: it has no figure to plot (only methods have one)",
               kinds=dict(metric="a metric", literature="a literature-only card (nothing of it runs)"),
               no_dir="--plot: the directory {dir} does not exist (create it first, or write {path} elsewhere)",
               not_dir="--plot: {dir} is not a directory", is_dir="--plot: {path} is a directory, not a file name",
               not_writable="--plot: cannot write {path} (permission denied)",
               verdict="Did you have it? [y = yes, anything else = no]:", score="Score: {score}/{n}",
               review="Review of the missed questions:", filters="filters"),
    "zh": dict(prompt="你的回答（以空行或 Ctrl-D 结束）：", yours="你的回答", skipped="（未作答）", answer="答案",
               example="计算示例", numbers="实时数值（刚由 {call} 计算）：", formula="公式", questions="问题",
               cat=dict(basics="基础", mechanism="机制", comparison="比较", implementation="实现"), vs="对比",
               empty="题库为空", no_lesson="{name} 尚无讲解（它是在 policylab 之外注册的）：没有可问的问题",
               no_figure="{name} 尚无讲解（它是在 policylab 之外注册的）：没有可画的图",
               no_figure_kind="{name} 是{kind}：没有可画的图（只有方法才有图）",
               kinds=dict(metric="评测指标", literature="仅文献卡片（没有可运行的部分）"),
               no_dir="--plot：目录 {dir} 不存在（请先创建，或把 {path} 写到别处）",
               not_dir="--plot：{dir} 不是目录", is_dir="--plot：{path} 是目录，不是文件名",
               not_writable="--plot：无法写入 {path}（权限不足）",
               verdict="你答对了吗？[y = 对，其他 = 不对]：", score="得分：{score}/{n}",
               review="回顾答错的问题：", filters="筛选条件"),
}


def _ui(lang: str) -> dict:
    if lang not in UI:
        raise PolicylabError(f"language must be one of {', '.join(UI)}, got {lang!r}")
    return UI[lang]


def _heading(q: bank.Question, lang: str) -> str:
    ui = _ui(lang)
    owners = f" {ui['vs']} ".join(q.methods)
    if q.compare_with:
        owners += f" {ui['vs']} {q.compare_with}"
    return f"[{owners} · {ui['cat'].get(q.category, q.category)}] {q.id}"


def example_lines(q: bank.Question, lang: str) -> list[str]:
    """The example sentence and a table of every value the example function returned."""
    from policylab.learn.questions import render_value

    ui = _ui(lang)
    call = f"{q.example.function}({_args(q.example.args)})"
    lines = [f"{ui['example']}: {q.example.text[lang]}", "  " + ui["numbers"].format(call=call)]
    width = max((len(k) for k in q.example.values), default=0)
    for k, v in q.example.values.items():
        lines.append(f"    {k.ljust(width)} = {render_value(v, lang)}")
    return lines


def boundary_lines(q: bank.Question, lang: str) -> list[str]:
    """The answer's boundary: what the worked example shows, what it does not, and what
    the full result would need (`questions.BOUNDARY_PARTS`), in `lang`."""
    from policylab.learn.questions import BOUNDARY_LABELS, BOUNDARY_PARTS

    labels = BOUNDARY_LABELS[lang]
    parts = q.boundary.get(lang) or {}
    sep = ": " if lang == "en" else "："
    return [f"{labels['title']}{sep.rstrip()}"] + [f"  {labels[p]}{sep}{parts[p]}" for p in BOUNDARY_PARTS if p in parts]


def answer_lines(q: bank.Question, lang: str) -> list[str]:
    """The answer, then its boundary."""
    return [f"{_ui(lang)['answer']}: {q.answer[lang]}", *boundary_lines(q, lang)]


def _args(args: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def _read_answer(stdin: TextIO | None) -> str:
    """Lines up to an empty line or end of input; never blocks past EOF (no stdin at all,
    e.g. a closed descriptor 0, counts as EOF)."""
    if stdin is None:
        return ""
    lines = []
    while True:
        try:
            line = stdin.readline()
        except (EOFError, OSError, ValueError):  # closed or unreadable stdin
            break
        if not line or not line.strip():
            break
        lines.append(line.rstrip("\n"))
    return "\n".join(lines)


def _score_answer(stdin: TextIO | None) -> bool:
    """The reader's own verdict after the reveal: a line starting with y/yes/是/对 counts
    as right; anything else, an empty line or EOF, as missed."""
    if stdin is None:
        return False
    try:
        line = stdin.readline()
    except (EOFError, OSError, ValueError):
        return False
    return line.strip().lower() in ("y", "yes", "是", "对", "对了")


def _topic_methods(topic: str, topics_path=None) -> set:
    """The methods of the reading-order steps whose title (either language) contains
    `topic` (case-insensitive); none matching is an error listing the titles."""
    steps = index.reading_steps(topics_path)
    key = topic.strip().lower()
    hit = [s for s in steps if any(key in str(t).lower() for t in (s.get("topic") or {}).values())]
    if not hit:
        titles = "; ".join(str((s.get("topic") or {}).get("en")) for s in steps)
        raise PolicylabError(f"no reading-order topic matches {topic!r}; the topics are: {titles}")
    return {m for s in hit for m in s.get("methods") or ()}


def select(method: str | None = None, topic: str | None = None, category: str | None = None, *, lang: str = "en",
           bank_dir=None, topics_path=None) -> list[index.Pending]:
    """The questions a round draws from: every question of the bank (methods, metrics,
    literature-only cards, cross-method questions), narrowed to one subject (`method`,
    any spelling `subjects.resolve` accepts), to the methods of a reading-order topic, and
    to one category. Nothing is rendered (no example runs), and a subject named by the
    name of its bank file (any case) is found without loading the method registry."""
    if category is not None and category not in CATEGORIES:
        raise PolicylabError(f"category must be one of {', '.join(CATEGORIES)}, got {category!r}")
    pool = index.question_index(bank_dir=bank_dir, topics_path=topics_path)
    if method is not None:
        name = _subject_name(method, pool, lang, bank_dir)
        pool = [p for p in pool if name in p.methods or p.compare_with == name]
        pool.sort(key=lambda p: (p.methods[0] != name, p.topic))  # its own questions first
    if topic is not None:
        ms = _topic_methods(topic, topics_path)
        pool = [p for p in pool if set(p.methods) <= ms]
    if category is not None:
        pool = [p for p in pool if p.category == category]
    return pool


CATEGORIES = ("basics", "mechanism", "comparison", "implementation")  # = questions.CATEGORIES (tested)


def _subject_name(typed: str, pool: list, lang: str, bank_dir) -> str:
    """The subject `typed` names: the owner of a bank file spelled that way (any case,
    '-' or space for '_'), else whatever `subjects.resolve` finds (aliases, import paths,
    close-match suggestions; this loads the registry)."""
    if isinstance(typed, str):
        files = {index.norm(p.methods[0]): p.methods[0] for p in pool if not p.topic}
        if index.norm(typed) in files:
            return files[index.norm(typed)]
    from policylab.learn import bank, lessons, subjects

    s = subjects.resolve(typed)
    if s.kind == "method" and not lessons.is_shipped(s.name) and not bank.has_lesson(s.name, bank_dir):
        raise PolicylabError(_ui(lang)["no_lesson"].format(name=s.name))
    return s.name


@dataclass
class Round:
    """What a round asked, in order, and the reader's verdicts."""

    asked: list = field(default_factory=list)  # [Question]
    right: list = field(default_factory=list)  # [bool], one per question

    @property
    def score(self) -> int:
        return sum(self.right)

    @property
    def missed(self) -> list:
        return [q for q, ok in zip(self.asked, self.right) if not ok]


class _Renderer:
    """Renders the round's questions in order in a background thread (the first import of
    torch and the registry happens there, while the reader reads the first question);
    `get(i)` waits for question i and re-raises what rendering it raised. Rendering stops
    at the first failure or at `close()`, which waits for the question in progress (an
    interpreter must not exit while the thread is inside an import)."""

    def __init__(self, picked: list, lang: str, examples):
        self._picked, self._lang, self._examples = picked, lang, examples
        self._done = [threading.Event() for _ in picked]
        self._out: list = [None] * len(picked)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quiz-render", daemon=True)

    def start(self) -> None:
        """Begin rendering (once; `get` starts it too)."""
        if self._thread.ident is None:
            self._thread.start()

    def _run(self) -> None:
        for i, p in enumerate(self._picked):
            if self._stop.is_set():
                break
            try:
                self._out[i] = (True, p.render(self._lang, examples=self._examples))
            except BaseException as exc:  # noqa: BLE001 - handed to the reader's thread
                self._out[i] = (False, exc)
                self._stop.set()
            self._done[i].set()

    def get(self, i: int):
        self.start()
        self._done[i].wait()
        ok, value = self._out[i]
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()


def quiz_round(n: int = 5, method: str | None = None, lang: str = "en", seed: int | None = None, *,
               topic: str | None = None, category: str | None = None, stdin: TextIO | None = None,
               stdout: TextIO | None = None, bank_dir=None, examples=None, topics_path=None) -> Round:
    """A round of `n` different questions chosen by `random.Random(seed)` from `select(...)`
    (fewer when the pool is smaller): each is asked, the reader's answer read from `stdin`
    (up to an empty line or EOF), the answer with its boundary and the worked example with
    its live numbers shown, and the reader says whether they had it (y / anything else).
    Then the score and a review of the missed questions with their examples. Only the
    asked questions' examples run, in a background thread started once the first question
    is on the screen, in the order they are asked: a question whose text needs no number
    is shown before its example has run (the first one before torch is even imported),
    its answer once the example has."""
    ui = _ui(lang)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PolicylabError(f"a round has at least one question, got n = {n!r}")
    stdin = sys.stdin if stdin is None else stdin
    out = sys.stdout if stdout is None else stdout
    pool = select(method, topic, category, lang=lang, bank_dir=bank_dir, topics_path=topics_path)
    if not pool:
        raise PolicylabError(ui["empty"] + (f" ({ui['filters']}: {_filters(method, topic, category)})"
                                            if method or topic or category else ""))
    picked = random.Random(seed).sample(pool, min(n, len(pool)))
    rendered = _Renderer(picked, lang, examples)
    try:
        return _ask(picked, rendered, lang, stdin, out)
    finally:
        rendered.close()


def _ask(picked: list, rendered: _Renderer, lang: str, stdin, out) -> Round:
    ui = _ui(lang)
    result = Round()
    for i, p in enumerate(picked, 1):
        text = p.text(lang)
        if text is None:  # the question itself holds a live number: wait for its example
            q = rendered.get(i - 1)
            text = q.question[lang]
        out.write(f"[{i}/{len(picked)}] {_heading(p, lang)}\n{text}\n\n{ui['prompt']}\n")
        out.flush()
        rendered.start()  # the examples run (torch loads) while the reader reads the question
        given = _read_answer(stdin)
        q = rendered.get(i - 1)
        out.write(f"\n{ui['yours']}: {given or ui['skipped']}\n\n" + "\n".join(answer_lines(q, lang)) + "\n\n")
        out.write("\n".join(example_lines(q, lang)) + f"\n\n{ui['verdict']}\n")
        out.flush()
        result.asked.append(q)
        result.right.append(_score_answer(stdin))
        out.write("\n")
    out.write(ui["score"].format(score=result.score, n=len(picked)) + "\n")
    if result.missed:
        out.write(f"\n{ui['review']}\n")
        for q in result.missed:
            out.write(f"\n{_heading(q, lang)}\n{q.question[lang]}\n" + "\n".join(answer_lines(q, lang)) + "\n")
            out.write("\n".join(example_lines(q, lang)) + "\n")
    out.flush()
    return result


def _filters(method, topic, category) -> str:
    return ", ".join(f"{k}={v}" for k, v in (("method", method), ("topic", topic), ("category", category)) if v)


def quiz(method: str | None = None, lang: str = "en", seed: int | None = None, *, stdin: TextIO | None = None,
         stdout: TextIO | None = None, bank_dir=None, examples=None, topics_path=None) -> bank.Question:
    """A round of one question (`quiz_round(1, ...)`); returns the question asked."""
    return quiz_round(1, method, lang, seed, stdin=stdin, stdout=stdout, bank_dir=bank_dir, examples=examples,
                      topics_path=topics_path).asked[0]


def subject_card_text(subject: subjects.Subject) -> str:
    """The card of a method, a literature-only entry or a metric, as `policylab methods NAME`
    prints it (pass@k, which has no card of its own, shows its kernel's docstring)."""
    from policylab import methods
    from policylab.methods.cards import card_text, literature_card_text

    if subject.kind == "method":
        return card_text(methods.get(subject.name))
    if subject.kind == "literature":
        return literature_card_text(subject.name, methods.registry.card(subject.name))
    from policylab.eval.cards import METRICS, metric_card_text

    if subject.name in METRICS:
        return metric_card_text(METRICS[subject.name])
    import inspect

    from policylab.kernels.metrics import pass_at_k
    from policylab.methods.spec import source_location

    qual, path, line = source_location(pass_at_k)
    doc = inspect.cleandoc(pass_at_k.__doc__ or "").split("\n\n")
    return "\n".join([f"pass_at_k: {doc[0]}", "  family        metric (not a training method: "
                      "`policylab eval RUN --metrics pass@k`; the sharpening_tax card reports its numbers)",
                      "  kernel        " + f"{qual}  {path}:{line}", *("  " + t for t in doc[1].splitlines())])


def explain_text(name: str, lang: str = "en", *, bank_dir=None, examples=None) -> str:
    """The card, the formulas and the four questions of `name` (any spelling
    `subjects.resolve` accepts: a method, a literature-only card or a metric) with live
    numbers; for a method registered outside policylab without a bank file, the card, the
    formulas and "no lesson yet" (a shipped method without one is a BankError naming the
    file). The fixed words are in `lang`; a card's fields are shown in `lang` through the
    glossary (`learn.glossary`)."""
    from policylab import methods
    from policylab.learn import anatomy, bank, lessons, subjects
    from policylab.methods.cards import card_text

    ui = _ui(lang)
    subject = subjects.resolve(name)
    if subject.kind != "method":
        from policylab.learn.metric_questions import subject_questions

        parts = [localized_card(subject_card_text(subject), lang), "", f"{ui['questions']}:"]
        for q in subject_questions(subject, lang, examples=examples):
            parts += ["", _heading(q, lang), q.question[lang], *answer_lines(q, lang), *example_lines(q, lang)]
        return "\n".join(parts)
    method = methods.get(subject.name)
    parts = [localized_card(card_text(method), lang), "", f"{ui['formula']}:", anatomy.formula_text(method), "",
             f"{ui['questions']}:"]
    if not lessons.is_shipped(method.name) and not bank.has_lesson(method.name, bank_dir):
        return "\n".join(parts + ["", lessons.NO_LESSON_NOTE[lang]])
    entry = bank.build_bank(lang, bank_dir=bank_dir, examples=examples, only=[method.name])[0]
    for q in entry.questions:
        parts += ["", _heading(q, lang), q.question[lang], *answer_lines(q, lang), *example_lines(q, lang)]
    return "\n".join(parts)


def localized_card(text: str, lang: str) -> str:
    """A card as printed, with its field labels and values in `lang` (English unchanged)."""
    if lang == "en":
        return text
    from policylab.learn import glossary

    return glossary.card_text_zh(text)


def explain(name: str, lang: str = "en", *, stdout: TextIO | None = None, bank_dir=None, examples=None) -> None:
    out = sys.stdout if stdout is None else stdout
    out.write(explain_text(name, lang, bank_dir=bank_dir, examples=examples) + "\n")
    out.flush()


FIGURE_UI = {"en": "Figure ({key}) written to {path}:\n  {caption}", "zh": "图（{key}）已写入 {path}：\n  {caption}"}


def check_plot(name: str, path, lang: str = "en", *, defs_dir=None) -> Path:
    """Everything `write_plot` needs, checked before any work is done: a .svg/.png/.pdf
    suffix, an existing writable directory to write into (and not a directory at `path`
    itself), a subject with a figure (a method; metrics and literature-only cards have
    none), and for a Chinese PNG/PDF a CJK font (`render.require_cjk_font`). Returns the
    path; raises PolicylabError naming the problem."""
    import os

    from policylab.learn import figures, lessons, subjects
    from policylab.learn.figures import render

    ui = _ui(lang)
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".svg", ".png", ".pdf"):
        raise PolicylabError(f"--plot writes .svg, .png or .pdf files, got {str(path)!r}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise PolicylabError(ui["no_dir"].format(dir=parent, path=path))
    if not parent.is_dir():
        raise PolicylabError(ui["not_dir"].format(dir=parent))
    if path.is_dir():
        raise PolicylabError(ui["is_dir"].format(path=path))
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise PolicylabError(ui["not_writable"].format(path=path))
    subject = subjects.resolve(name)
    if subject.kind != "method":
        raise PolicylabError(ui["no_figure_kind"].format(name=subject.name, kind=ui["kinds"][subject.kind]))
    if not lessons.is_shipped(subject.name) and not figures.has_definition(subject.name, defs_dir=defs_dir):
        raise PolicylabError(ui["no_figure"].format(name=subject.name))
    if suffix in (".png", ".pdf"):
        render.require_cjk_font(lang)
    return path


def write_plot(name: str, path, lang: str = "en", *, stdout: TextIO | None = None, defs_dir=None):
    """Compute the figure of `name` now and write it to `path` (.svg, .png, .pdf) with its
    labels, caption and alt text in `lang`; print where it went and its caption. The path
    and the fonts are checked first (`check_plot`)."""
    from policylab.learn import figures, subjects
    from policylab.learn.figures import render

    path = check_plot(name, path, lang, defs_dir=defs_dir)
    fig = figures.figure(subjects.resolve(name).name, defs_dir=defs_dir)
    try:
        out = render.write(fig, path, lang)
    except ValueError as exc:
        raise PolicylabError(str(exc)) from None
    (sys.stdout if stdout is None else stdout).write(
        "\n" + FIGURE_UI[lang].format(key=fig.key, path=out, caption=fig.caption[lang]) + "\n")
    return out
