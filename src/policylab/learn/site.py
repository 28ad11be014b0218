"""`policylab site build OUT_DIR`: a self-contained static site over the bank.

    index.html           search box + filters (method, family, category, language) in vanilla
                         JS over a JSON index embedded in the page
    metric-<name>.html, literature-<name>.html   the card and four questions of each metric
                         (calib_rl, sharpening_tax, pass_at_k) and literature-only card (orl)
    method-<name>.html   card, formulas, the four questions (answers open on click) with the
                         live numbers of their examples, links to the kernels' source
    compare.html         the comparison table of every registered method (from the cards)
    topics.html          reading order and cross-method questions
    overlay-<id>.html    one view of several methods on shared axes (learn/figures/overlays.yaml)
    figures/<key>.<lang>[.narrow].svg   every figure in both languages (and one panel wide,
                         for small screens), computed when the site is built
                         by the kernels and the methods' own stages and loss (learn/figures);
                         the method page shows its figure beside the formula
    source/policylab/<...>.py.html   the kernel source files, line-numbered, each line an
                         anchor (#L<n>): a relative link that works offline from file://

Both languages are in every page; CSS shows one (html[data-lang]) and the EN/中文 buttons
switch it (remembered in localStorage and carried in `?lang=` on internal links). CSS and
JS (learn/assets/) are inlined; nothing is fetched at view time. Each method page embeds
its examples' returned values as JSON (`<script id="example-data">`) and its figure's
plotted series (`<script id="figure-data">`, with the SVG id of each drawing), so tests
can compare the page with a fresh computation. A method the project ships without a
figure definition fails the build (`figures.FigureError`, naming the file to write); a
method registered elsewhere without a bank file is listed with "no lesson yet" on a page
of its card and formulas, and one without a figure gets no figure (`learn.lessons`).
"""

from __future__ import annotations

from pathlib import Path

from policylab import methods
from policylab.errors import PolicylabError
from policylab.learn import anatomy, bank, figures, lessons, metric_questions
from policylab.learn.bank import CATEGORIES, LANGS, MethodEntry, Topics
from policylab.learn.figures import render
from policylab.learn.site_html import (  # noqa: F401 (esc and the blocks are the site's public helpers)
    ASSETS,
    NARROW_MEDIA,
    PROSE_ROWS,
    bi,
    card_cell,
    card_rows,
    esc,
    example_data,
    figure_data,
    figure_file,
    figure_html,
    formula_lines,
    json_script,
    link,
    method_href,
    method_link,
    page,
    question_html,
    ui,
    values_table,
)
from policylab.learn.site_text import CARD_ROWS, CATEGORY, STAGE, UI


def method_page(entry: MethodEntry, have: set, fig: figures.Figure | None = None, overlays=()) -> str:
    rows = card_rows(entry)
    card = "".join(f"<tr><th>{bi(label)}</th><td>{card_cell(k, rows[k], entry.card.unconfirmed)}</td></tr>" for k, label in CARD_ROWS
                   if k in rows)
    formulas = []
    for k in anatomy.kernels(entry.method):
        src = link(f"source/{k.path}.html#L{k.line}", f"{esc(k.path)}:{k.line}")
        formulas.append(f"<h3>{bi(STAGE[k.stage])}: <code>{esc(k.qualname)}</code> "
                        f'<span class="muted">({ui("source")}: {src})</span></h3>'
                        f'<pre class="formula">{formula_lines(k.formula or entry.card.summary)}</pre>')
    plot, data = "", ""
    if fig is not None:
        also = ""
        if overlays:
            links = "".join(f"<li>{link(overlay_href(o.key), bi(o.title))}</li>" for o in overlays)
            also = f'<p class="muted">{ui("in_overlays")}:</p><ul class="overlays-list">{links}</ul>'
        plot = f'<div class="figure-col"><h2>{ui("figure")}</h2>{figure_html(fig, entry.name)}{also}</div>'
        data = json_script("figure-data", figure_data(fig, entry.name))
    body = (
        f'<h1>{esc(entry.name)} <span class="muted">{esc(entry.card.title)}</span></h1>'
        f'<h2>{ui("card")}</h2><table class="card">{card}</table>'
        f'<div class="formula-figure"><div class="formula-col"><h2>{ui("formula")}</h2>'
        f'<p class="muted">{ui("formula_note")}</p>{"".join(formulas)}</div>{plot}</div>'
        f'<h2>{ui("questions")}</h2>{"".join(question_html(q, have) for q in entry.questions) or ui("no_lesson_note", "p")}'
        + json_script("example-data", example_data(entry.questions)) + data
    )
    return page({"en": f"{entry.name} · policylab", "zh": f"{entry.name} · policylab"}, body)


def subject_href(subject) -> str:
    return f"{subject.kind}-{subject.name}.html"


def subject_page(subject, questions, have: set) -> str:
    """A metric's or a literature-only card's page: its card (as `policylab explain` prints
    it, in both languages through the glossary) and its four questions with live numbers."""
    from policylab.learn.explain import localized_card, subject_card_text

    text = subject_card_text(subject)
    kind = UI["kind_" + subject.kind]
    body = (f'<h1>{esc(subject.name)} <span class="badge">{bi(kind)}</span></h1>'
            f'<h2>{ui("card")}</h2><pre class="formula">'
            f'<span class="en" lang="en">{formula_lines(text)}</span>'
            f'<span class="zh" lang="zh">{formula_lines(localized_card(text, "zh"))}</span></pre>'
            f'<h2>{ui("questions")}</h2>{"".join(question_html(q, have) for q in questions)}'
            + json_script("example-data", example_data(questions)))
    return page({"en": f"{subject.name} · policylab", "zh": f"{subject.name} · policylab"}, body)


def _select(element_id: str, all_label: dict, options: list[tuple[str, dict]]) -> str:
    opts = [f'<option value="" data-t-en="{esc(all_label["en"])}" data-t-zh="{esc(all_label["zh"])}">'
            f'{esc(all_label["en"])}</option>']
    for value, label in options:
        opts.append(f'<option value="{esc(value)}" data-t-en="{esc(label["en"])}" data-t-zh="{esc(label["zh"])}">'
                    f'{esc(label["en"])}</option>')
    return f'<select id="{element_id}">{"".join(opts)}</select>'


def index_items(entries: list[MethodEntry], topic_data: Topics, extra=None) -> list[dict]:
    family = {e.name: e.card.family for e in entries}
    family.update({n: methods.get(n).card.family for q in topic_data.questions for n in q.methods})
    extra = extra or {}
    family.update({s.name: s.kind for s in extra})
    items = []
    for q, href in [(q, method_href(e.name)) for e in entries for q in e.questions] + \
                   [(q, subject_href(s)) for s, qs in extra.items() for q in qs] + \
                   [(q, "topics.html") for q in topic_data.questions]:
        items.append(dict(id=q.id, methods=list(q.methods) + ([q.compare_with] if q.compare_with else []),
                          families=sorted({family[m] for m in q.methods}), category=q.category,
                          q=q.question, a=q.answer, ex=q.example.text, url=f"{href}#{q.id}"))
    return items


def overlay_href(key: str) -> str:
    return f"overlay-{key}.html"


def overlay_page(d: figures.OverlayDef, fig: figures.Figure, have: set) -> str:
    ms = " ".join(method_link(m, have, "badge") for m in d.methods)
    body = (f'<h1>{bi(d.title)}</h1><p>{ui("overlay_methods")}: {ms}</p>{figure_html(fig, "overlay-" + d.key)}'
            + json_script("figure-data", figure_data(fig, "overlay-" + d.key)))
    return page(d.title, body)


def index_page(entries: list[MethodEntry], topic_data: Topics, overlays=(), extra=None) -> str:
    extra = extra or {}
    names = [e.name for e in entries if e.questions] + [s.name for s in extra]  # the filters: subjects with questions
    families = sorted({e.card.family for e in entries if e.questions} | {s.kind for s in extra})
    data = dict(items=index_items(entries, topic_data, extra), categories=CATEGORY, ui={"count": UI["count"]})
    filters = (
        f'<div class="filters"><input id="q" type="search" autocomplete="off" placeholder="{esc(UI["search"]["en"])}" '
        f'data-ph-en="{esc(UI["search"]["en"])}" data-ph-zh="{esc(UI["search"]["zh"])}">'
        + _select("f-method", UI["all_methods"], [(n, {"en": n, "zh": n}) for n in names])
        + _select("f-family", UI["all_families"], [(f, {"en": f, "zh": f}) for f in families])
        + _select("f-category", UI["all_categories"], [(c, CATEGORY[c]) for c in CATEGORIES])
        + '<select id="f-lang"><option value="en">English</option><option value="zh">中文</option></select></div>'
    )
    listing = "".join(f"<li>{link(method_href(e.name), esc(e.name))} <span class=\"muted\">{esc(e.card.family)}</span>"
                      + ("" if e.questions else f' <span class="badge no-lesson">{ui("no_lesson")}</span>') + "</li>"
                      for e in entries)
    others = "".join(f'<li>{link(subject_href(s_), esc(s_.name))} <span class="muted">{bi(UI["kind_" + s_.kind])}</span></li>'
                     for s_ in extra)
    over = "".join(f"<li>{link(overlay_href(o.key), bi(o.title))} <span class=\"muted\">{esc(', '.join(o.methods))}</span></li>"
                   for o in overlays)
    body = (f'<h1>{ui("site")}</h1>{ui("intro", "p")}{filters}<p id="count" class="count"></p>'
            f'<noscript>{ui("noscript", "p")}</noscript><ul id="results" class="results"></ul>'
            f'<h2>{ui("methods")}</h2><ul class="methods-list">{listing}</ul>'
            f'<h2 id="subjects">{ui("subjects")}</h2><ul class="methods-list">{others}</ul>'
            f'<h2 id="overlays">{ui("overlays")}</h2><ul class="overlays-list">{over}</ul>'
            + json_script("index-data", data))
    return page(UI["site"], body)


def compare_page(have: set) -> str:
    head = "".join(f"<th>{bi(label)}</th>" for _, label in anatomy.COMPARISON_COLUMNS)
    rows = []
    for row in anatomy.comparison_table():
        cells = [f"<td>{method_link(row['method'], have)}</td>"]
        cells += [f"<td>{card_cell(key, row[key])}</td>" for key, _ in anatomy.COMPARISON_COLUMNS[1:]]
        rows.append(f'<tr data-method="{esc(row["method"])}">{"".join(cells)}</tr>')
    body = (f'<h1>{ui("compare")}</h1><p class="muted">{ui("compare_note")}</p>'
            f'<div class="compare-box"><table class="compare"><tr>{head}</tr>{"".join(rows)}</table></div>')
    return page(UI["compare"], body)


def topics_page(topic_data: Topics, have: set) -> str:
    steps = []
    for s in topic_data.reading_order:
        ms = " ".join(method_link(m, have, "badge") for m in s.methods)
        steps.append(f"<li><strong>{bi(s.topic)}</strong> {ms}{bi(s.why, 'p')}</li>")
    order = f"<ol>{''.join(steps)}</ol>" if steps else ui("no_topics", "p")
    cross = "".join(question_html(q, have) for q in topic_data.questions) or ui("no_topics", "p")
    body = (f'<h1>{ui("topics")}</h1><h2>{ui("reading_order")}</h2>{order}<h2>{ui("cross")}</h2>{cross}'
            + json_script("example-data", example_data(topic_data.questions)))
    return page(UI["topics"], body)


def source_page(rel: str) -> str:
    """One kernel file, line-numbered; `#L<n>` targets line n."""
    text = (anatomy.PACKAGE_ROOT / rel).read_text(encoding="utf-8")
    root = "../" * rel.count("/") + "../"
    lines = "".join(f'<span id="L{i}" data-n="{i}">{esc(line)}</span>' for i, line in enumerate(text.splitlines(), 1))
    body = f"<h1><code>{esc(rel)}</code></h1><pre class=\"src\">{lines}</pre>"
    return page({"en": rel, "zh": rel}, body, root)


def unlessoned(have: set) -> list[MethodEntry]:
    """An entry without questions for every registered method the project does not ship
    that has no entry in `have`: its page shows its card and formulas, "no lesson yet"."""
    return [MethodEntry(n, methods.get(n), (), "") for n in methods.names()
            if n not in have and not lessons.is_shipped(n)]


def method_figures(entries: list[MethodEntry], *, complete: bool, figures_dir=None) -> dict:
    """{name: Figure} of the method pages: a shipped method's page needs its definition (and
    with `complete` every shipped method does); any other method is drawn only if it has one."""
    if complete:
        figures.check_complete(defs_dir=figures_dir)
    names = [e.name for e in entries if e.questions]
    defs = figures.definitions([n for n in names if lessons.is_shipped(n)], defs_dir=figures_dir)
    defs.update(figures.definitions([n for n in names if n not in defs], defs_dir=figures_dir, complete=False))
    return {n: figures.figure(n, definition=d) for n, d in defs.items()}


def build_site(out_dir, *, entries: list[MethodEntry] | None = None, topic_data: Topics | None = None,
               complete: bool = True, bank_dir=None, examples=None, topics_path=None, figures_dir=None,
               overlays_path=None, extra_subjects=None) -> Path:
    """Write the site into `out_dir` and return the path of its index.html.

    entries / topic_data: an already built bank (both languages); by default the package's
    bank (`complete=False` builds a preview without the shipped methods that have no file
    yet). A registered method the project does not ship and the bank has no entry for is
    listed with "no lesson yet" (`unlessoned`). Figures: see `method_figures` (default
    definitions: learn/figures/defs/; a missing one raises `figures.FigureError` naming the
    file to write). overlays_path: the overlay list (default learn/figures/overlays.yaml).
    extra_subjects: {Subject: [Question]} of the metrics and literature-only cards, each on
    a page `<kind>-<name>.html` (default: `metric_questions.extra_bank`, when the bank is
    the package's own; a fixture bank gets none)."""
    if entries is None:
        entries = bank.build_bank(None, bank_dir=bank_dir, examples=examples, complete=complete)
    if topic_data is None:
        topic_data = bank.topics(None, path=topics_path, examples=examples)
    for q in [q for e in entries for q in e.questions] + list(topic_data.questions):
        if set(q.question) != set(LANGS):
            raise PolicylabError("build_site needs the bank in both languages: build it with lang=None")
    figs = method_figures(entries, complete=complete, figures_dir=figures_dir)
    entries = sorted(list(entries) + unlessoned({e.name for e in entries}), key=lambda e: e.name)
    have = {e.name for e in entries}
    overlay_defs = figures.overlay_defs(overlays_path)
    overlay_figs = {o.key: figures.overlay(o) for o in overlay_defs}
    extra = extra_subjects if extra_subjects is not None else (
        metric_questions.extra_bank(None, examples=examples) if bank_dir is None else {})
    pages = {"index.html": index_page(entries, topic_data, overlay_defs, extra), "compare.html": compare_page(have),
             "topics.html": topics_page(topic_data, have)}
    for subj, qs in extra.items():
        pages[subject_href(subj)] = subject_page(subj, qs, have)
    for e in entries:
        pages[method_href(e.name)] = method_page(e, have, figs.get(e.name),
                                                 [o for o in overlay_defs if e.name in o.methods])
    for o in overlay_defs:
        pages[overlay_href(o.key)] = overlay_page(o, overlay_figs[o.key], have)
    for key, fig in {**figs, **{f"overlay-{k}": f for k, f in overlay_figs.items()}}.items():
        for lang in LANGS:
            pages[figure_file(key, lang)] = render.svg(fig, lang)
            pages[figure_file(key, lang, narrow=True)] = render.svg(fig, lang, columns=1)
    for rel in sorted({k.path for e in entries for k in anatomy.kernels(e.method)}):
        pages[f"source/{rel}.html"] = source_page(rel)
    return write_pages(Path(out_dir), pages)


def write_pages(out: Path, pages: dict[str, str]) -> Path:
    """Write {relative path: text} under `out`; return the path of its index.html."""
    for name, text in pages.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return out / "index.html"
