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
from typing import TextIO

from policylab import methods
from policylab.errors import PolicylabError
from policylab.methods.cards import card_text
from policylab.learn import anatomy, bank, lessons

UI = {
    "en": dict(prompt="Your answer (finish with an empty line or Ctrl-D):", yours="Your answer", skipped="(no answer given)",
               answer="Answer", example="Worked example", numbers="live numbers, computed now by {call}:", formula="Formula",
               questions="Questions", cat=dict(basics="basics", mechanism="mechanism", comparison="comparison",
                                               implementation="implementation"), vs="vs", empty="the question bank is empty",
               no_lesson="{name} has no lesson yet (it was registered outside policylab): no questions to ask about it",
               no_figure="{name} has no lesson yet (it was registered outside policylab): no figure to plot"),
    "zh": dict(prompt="你的回答（以空行或 Ctrl-D 结束）：", yours="你的回答", skipped="（未作答）", answer="答案",
               example="计算示例", numbers="实时数值（刚由 {call} 计算）：", formula="公式", questions="问题",
               cat=dict(basics="基础", mechanism="机制", comparison="比较", implementation="实现"), vs="对比",
               empty="题库为空", no_lesson="{name} 尚无讲解（它是在 policylab 之外注册的）：没有可问的问题",
               no_figure="{name} 尚无讲解（它是在 policylab 之外注册的）：没有可画的图"),
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
    return f"[{owners} · {ui['cat'][q.category]}] {q.id}"


def example_lines(q: bank.Question, lang: str) -> list[str]:
    """The example sentence and a table of every value the example function returned."""
    ui = _ui(lang)
    call = f"{q.example.function}({_args(q.example.args)})"
    lines = [f"{ui['example']}: {q.example.text[lang]}", "  " + ui["numbers"].format(call=call)]
    width = max((len(k) for k in q.example.values), default=0)
    for k, v in q.example.values.items():
        lines.append(f"    {k.ljust(width)} = {bank.render_value(v, lang)}")
    return lines


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


def _pool(method: str | None, lang: str, bank_dir=None, examples=None, topics_path=None) -> list[bank.Question]:
    if method is not None:
        name = methods.get(method).name  # UnknownMethodError with close matches
        if not lessons.is_shipped(name) and not bank.has_lesson(name, bank_dir):
            raise PolicylabError(_ui(lang)["no_lesson"].format(name=name))
        entries = bank.build_bank(lang, bank_dir=bank_dir, examples=examples, only=[name])
    else:
        entries = bank.build_bank(lang, bank_dir=bank_dir, examples=examples, complete=False)
    pool = [q for e in entries for q in e.questions]
    for q in bank.topics(lang, path=topics_path, examples=examples).questions:
        if method is None or method in q.methods:
            pool.append(q)
    return pool


def quiz(method: str | None = None, lang: str = "en", seed: int | None = None, *, stdin: TextIO | None = None,
         stdout: TextIO | None = None, bank_dir=None, examples=None, topics_path=None) -> bank.Question:
    """Ask one question chosen by `random.Random(seed)`, wait for the reader's answer on
    `stdin`, then print the answer and the example with its live numbers. Returns it."""
    ui = _ui(lang)
    stdin = sys.stdin if stdin is None else stdin
    out = sys.stdout if stdout is None else stdout
    pool = _pool(method, lang, bank_dir, examples, topics_path)
    if not pool:
        raise PolicylabError(ui["empty"] + (f" for {method}" if method else ""))
    q = random.Random(seed).choice(pool)
    out.write(f"{_heading(q, lang)}\n{q.question[lang]}\n\n{ui['prompt']}\n")
    out.flush()
    given = _read_answer(stdin)
    out.write(f"\n{ui['yours']}: {given or ui['skipped']}\n\n{ui['answer']}: {q.answer[lang]}\n\n")
    out.write("\n".join(example_lines(q, lang)) + "\n")
    out.flush()
    return q


def explain_text(name: str, lang: str = "en", *, bank_dir=None, examples=None) -> str:
    """The card, the formulas and the four questions of `name` with live numbers; for a
    method registered outside policylab without a bank file, the card, the formulas and
    "no lesson yet" (a shipped method without one is a BankError naming the file)."""
    ui = _ui(lang)
    method = methods.get(name)
    parts = [card_text(method), "", f"{ui['formula']}:", anatomy.formula_text(method), "", f"{ui['questions']}:"]
    if not lessons.is_shipped(method.name) and not bank.has_lesson(method.name, bank_dir):
        return "\n".join(parts + ["", lessons.NO_LESSON_NOTE[lang]])
    entry = bank.build_bank(lang, bank_dir=bank_dir, examples=examples, only=[method.name])[0]
    for q in entry.questions:
        parts += ["", _heading(q, lang), q.question[lang], f"{ui['answer']}: {q.answer[lang]}", *example_lines(q, lang)]
    return "\n".join(parts)


def explain(name: str, lang: str = "en", *, stdout: TextIO | None = None, bank_dir=None, examples=None) -> None:
    out = sys.stdout if stdout is None else stdout
    out.write(explain_text(name, lang, bank_dir=bank_dir, examples=examples) + "\n")
    out.flush()


FIGURE_UI = {"en": "Figure ({key}) written to {path}:\n  {caption}", "zh": "图（{key}）已写入 {path}：\n  {caption}"}


def write_plot(name: str, path, lang: str = "en", *, stdout: TextIO | None = None, defs_dir=None):
    """Compute the figure of `name` now and write it to `path` (.svg, .png, .pdf) with its
    labels, caption and alt text in `lang`; print where it went and its caption."""
    from policylab.learn import figures
    from policylab.learn.figures import render

    ui = _ui(lang)
    name = methods.get(name).name
    if not lessons.is_shipped(name) and not figures.has_definition(name, defs_dir=defs_dir):
        raise PolicylabError(ui["no_figure"].format(name=name))
    fig = figures.figure(name, defs_dir=defs_dir)
    try:
        out = render.write(fig, path, lang)
    except ValueError as exc:
        raise PolicylabError(str(exc)) from None
    (sys.stdout if stdout is None else stdout).write(
        "\n" + FIGURE_UI[lang].format(key=fig.key, path=out, caption=fig.caption[lang]) + "\n")
    return out
