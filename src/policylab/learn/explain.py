"""`policylab explain NAME` and its `--plot`: the card (fields in the reader's language),
the formulas and every question with its worked example computed now ("no lesson yet" for
a method registered outside policylab), and the method's figure written to a file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from policylab.errors import PolicylabError
from policylab.learn.views import answer_lines, example_lines, heading, ui_words

if TYPE_CHECKING:
    from policylab.learn import subjects


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

    ui = ui_words(lang)
    subject = subjects.resolve(name)
    if subject.kind != "method":
        from policylab.learn.metric_questions import subject_questions

        parts = [localized_card(subject_card_text(subject), lang), "", f"{ui['questions']}:"]
        for q in subject_questions(subject, lang, examples=examples):
            parts += ["", heading(q, lang), q.question[lang], *answer_lines(q, lang), *example_lines(q, lang)]
        return "\n".join(parts)
    method = methods.get(subject.name)
    parts = [localized_card(card_text(method), lang), "", f"{ui['formula']}:", anatomy.formula_text(method), "",
             f"{ui['questions']}:"]
    if not lessons.is_shipped(method.name) and not bank.has_lesson(method.name, bank_dir):
        return "\n".join(parts + ["", lessons.NO_LESSON_NOTE[lang]])
    entry = bank.build_bank(lang, bank_dir=bank_dir, examples=examples, only=[method.name])[0]
    for q in entry.questions:
        parts += ["", heading(q, lang), q.question[lang], *answer_lines(q, lang), *example_lines(q, lang)]
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

    ui = ui_words(lang)
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
