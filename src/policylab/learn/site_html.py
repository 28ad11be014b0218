"""The site's building blocks: escaping, the bilingual span, links, the page frame, a
question and its values, formula lines, a card's cells and a figure's markup; the pages
themselves are put together in `policylab.learn.site`."""

from __future__ import annotations

import html
import json
from pathlib import Path

from policylab.learn import anatomy, bank, figures, glossary
from policylab.learn.bank import LANGS, MethodEntry, Question
from policylab.learn.questions import BOUNDARY_LABELS, BOUNDARY_PARTS
from policylab.learn.site_text import CATEGORY, UI

ASSETS = Path(__file__).resolve().parent / "assets"


def esc(s) -> str:
    return html.escape(str(s), quote=True)


def bi(d: dict, tag: str = "span") -> str:
    """Both languages of a text; CSS shows the current one."""
    return "".join(f'<{tag} class="{lang}" lang="{lang}">{esc(d[lang])}</{tag}>' for lang in LANGS)


def ui(key: str, tag: str = "span") -> str:
    return bi(UI[key], tag)


def link(href: str, inner: str, cls: str = "") -> str:
    """An internal link; site.js appends ?lang= to it (data-href keeps the original)."""
    c = f' class="{cls}"' if cls else ""
    return f'<a{c} data-href="{esc(href)}" href="{esc(href)}">{inner}</a>'


def json_script(element_id: str, obj) -> str:
    text = json.dumps(obj, ensure_ascii=False, sort_keys=True).replace("<", "\\u003c")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def method_href(name: str) -> str:
    return f"method-{name}.html"


def method_link(name: str, have: set, cls: str = "") -> str:
    """A link to a method page, or the bare name when this build has no page for it."""
    if name in have:
        return link(method_href(name), esc(name), cls)
    return f'<span class="{cls}">{esc(name)}</span>' if cls else esc(name)


def page(title: dict, body: str, root: str = "") -> str:
    css = (ASSETS / "site.css").read_text(encoding="utf-8")
    js = (ASSETS / "site.js").read_text(encoding="utf-8")
    nav = " ".join([link(f"{root}index.html", ui("questions")), link(f"{root}compare.html", ui("compare")),
                    link(f"{root}topics.html", ui("topics")), link(f"{root}index.html#overlays", ui("overlays_nav"))])
    return (
        '<!doctype html>\n<html lang="en" data-lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<title data-t-en="{esc(title["en"])}" data-t-zh="{esc(title["zh"])}">{esc(title["en"])}</title>'
        f"<style>{css}</style></head><body>"
        f'<header>{link(root + "index.html", "policylab", "brand")}<nav>{nav}</nav>'
        '<span class="langs"><button type="button" data-set-lang="en" aria-pressed="true">EN</button> '
        '<button type="button" data-set-lang="zh" aria-pressed="false">中文</button></span></header>'
        f"<main>{body}</main><script>{js}</script></body></html>\n"
    )


# ------------------------------------------------------------------------ questions


def values_table(q: Question) -> str:
    rows = []
    for k, v in q.example.values.items():
        shown = {lang: bank.render_value(v, lang) for lang in LANGS}
        cell = esc(shown["en"]) if shown["en"] == shown["zh"] else bi(shown)
        rows.append(f'<tr><td>{esc(k)}</td><td class="v" data-key="{esc(k)}">{cell}</td></tr>')
    return f'<table class="values" data-example="{esc(q.id)}">{"".join(rows)}</table>'


def question_html(q: Question, have: set) -> str:
    owners = " ".join(method_link(m, have, "badge") for m in q.methods)
    vs = ""
    if q.compare_with:
        vs = f' <span class="muted">{ui("compare_with")} {method_link(q.compare_with, have)}</span>'
    args = ", ".join(f"{k}={v!r}" for k, v in q.example.args.items())
    return (
        f'<details class="q" id="{esc(q.id)}" data-category="{q.category}">'
        f'<summary><span class="badge">{bi(CATEGORY[q.category])}</span>{bi(q.question)}</summary>'
        f'<p class="muted">{owners}{vs}</p>'
        f'<div class="answer"><strong>{ui("answer")}</strong>{bi(q.answer, "p")}</div>'
        f"{boundary_html(q)}"
        f'<div class="example"><strong>{ui("example")}</strong>{bi(q.example.text, "p")}{values_table(q)}'
        f'<p class="muted">{ui("computed")} <code>{esc(q.example.function)}({esc(args)})</code></p></div>'
        "</details>"
    )


def boundary_html(q: Question) -> str:
    """The answer's boundary as a definition list: what the worked example shows, what it
    does not, what the full result would need (each part in both languages)."""
    if not q.boundary:
        return ""
    rows = "".join(
        f'<dt>{bi({lang: BOUNDARY_LABELS[lang][p] for lang in LANGS})}</dt>'
        f'<dd>{bi({lang: q.boundary[lang][p] for lang in LANGS if lang in q.boundary})}</dd>'
        for p in BOUNDARY_PARTS)
    title = bi({lang: BOUNDARY_LABELS[lang]["title"] for lang in LANGS})
    return f'<div class="boundary"><strong>{title}</strong><dl>{rows}</dl></div>'


def example_data(questions) -> dict:
    return {q.id: {"function": q.example.function, "args": q.example.args, "values": q.example.values}
            for q in questions}


# --------------------------------------------------------------------------- pages


def formula_lines(text: str) -> str:
    """A formula block, one block-level span per line: on a wide window a line too long for
    the column wraps with a hanging indent (CSS); copied text keeps its line breaks."""
    return "".join(f'<span class="fl">{esc(line) or " "}\n</span>' for line in text.splitlines())


# card rows whose values are prose, shown in Chinese from the glossary (the others are
# names, numbers and code)
PROSE_ROWS = ("family", "summary", "samples", "learns", "reference", "critic", "status", "not_established",
              "confirmed", "unconfirmed", "inputs", "changes")


def card_cell(key: str, value: str, items=()) -> str:
    """One card value in both languages when it is prose (`learn.glossary`), else as is;
    `items`: the card's unconfirmed list (translated item by item)."""
    if key not in PROSE_ROWS:
        return esc(value)
    if key == "unconfirmed":
        zh = "；".join(glossary.field(item, "zh") for item in items)
    elif key == "inputs" and glossary.zh(value) is None:
        return esc(value)  # field names, not prose
    else:
        zh = glossary.field(value, "zh")
    return esc(value) if zh == value else bi({"en": value, "zh": zh})


def card_rows(entry: MethodEntry) -> dict:
    r, c = entry.method, entry.method.card
    vals = dict(title=c.title, arxiv=c.arxiv, family=c.family, summary=c.summary, samples=c.samples, learns=c.learns,
                reference=c.reference, critic=c.critic, inputs=", ".join(r.required_fields) or "rewards only",
                stages=anatomy.stages_text(r), params=", ".join(f"{k}={v}" for k, v in r.p.items()) or "(none)",
                status=c.status, not_established=c.not_established, confirmed=c.confirmed,
                unconfirmed="; ".join(c.unconfirmed))
    return {k: v for k, v in vals.items() if v}


def figure_file(key: str, lang: str, narrow: bool = False) -> str:
    return f"figures/{key}.{lang}{'.narrow' if narrow else ''}.svg"


# below this window width the page shows the one-column drawing of a figure (at about its
# natural size: 8-pt text stays 8 pt on a phone), and a visible link to the full-size one
NARROW_MEDIA = "(max-width: 40rem)"


def figure_html(fig: figures.Figure, key: str) -> str:
    """Both languages of the figure (CSS shows one), alt text and caption in each, and
    what was called to compute it."""
    imgs = "".join(
        f'<a class="{lang}" lang="{lang}" href="{esc(figure_file(key, lang))}" '
        f'title="{esc(UI["full_size"][lang])}"><picture>'
        f'<source media="{NARROW_MEDIA}" srcset="{esc(figure_file(key, lang, narrow=True))}">'
        f'<img src="{esc(figure_file(key, lang))}" '
        f'alt="{esc(figures.alt_text(fig, lang))}" data-figure="{esc(key)}" loading="eager"></picture></a>'
        for lang in LANGS)
    zoom = "".join(f'<a class="zoom {lang}" lang="{lang}" href="{esc(figure_file(key, lang))}">'
                   f'{esc(UI["zoom"][lang])}</a>' for lang in LANGS)
    sources = "; ".join(dict.fromkeys(p.source for p in fig.panels))
    return (f'<figure class="plot" id="figure">{imgs}<figcaption>{zoom}{bi(fig.caption, "p")}'
            f'<p class="muted">{ui("figure_source")} <code>{esc(sources)}</code></p></figcaption></figure>')


def figure_data(fig: figures.Figure, key: str) -> dict:
    return {**fig.data(), "files": {lang: figure_file(key, lang) for lang in LANGS},
            "narrow": {lang: figure_file(key, lang, narrow=True) for lang in LANGS}}
