"""The static site: every page written, every link local and resolvable, and the numbers
in the pages equal to a fresh call of each example function (fixture bank and real bank)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from policylab import methods
from policylab.errors import PolicylabError
from policylab.learn import anatomy, bank, figures, site
from policylab.learn.examples import EXAMPLES as REAL_EXAMPLES

from .conftest import EXAMPLES, FixtureBank

# the sites are session fixtures that test_browser.py opens too: one worker under xdist
pytestmark = pytest.mark.xdist_group("learn_site")

_DATA = re.compile(r'<script type="application/json" id="(example-data|index-data|figure-data)">(.*?)</script>', re.S)


class _Page(HTMLParser):
    """Collects ids, local links, and the shown value cells {(example id, key): text (lang)}."""

    def __init__(self, lang="en"):
        super().__init__()
        self.lang, self.ids, self.links, self.cells = lang, set(), [], {}
        self._table, self._cell, self._skip = None, None, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        for key in ("href", "src", "data-href"):
            if key in a:
                self.links.append(a[key])
        if tag == "table" and "data-example" in a:
            self._table = a["data-example"]
        if tag == "td" and a.get("class") == "v":
            self._cell = (self._table, a["data-key"])
            self.cells[self._cell] = ""
        if self._cell and tag == "span" and a.get("class") not in (None, self.lang):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag == "span" and self._skip:
            self._skip -= 1
        elif tag == "td":
            self._cell = None

    def handle_data(self, data):
        if self._cell and not self._skip:
            self.cells[self._cell] += data


def parse(path: Path, lang="en") -> _Page:
    p = _Page(lang)
    p.feed(path.read_text(encoding="utf-8"))
    return p


def embedded(path: Path, element_id: str):
    found = {k: v for k, v in _DATA.findall(path.read_text(encoding="utf-8"))}
    return json.loads(found[element_id])


def check_numbers_against_fresh_calls(out: Path, examples, pages) -> int:
    """Each page's embedded example values == a fresh call now; each shown cell == its
    rendering in both languages. Returns the number of examples checked."""
    n = 0
    for page in pages:
        data = embedded(out / page, "example-data")
        shown = {lang: parse(out / page, lang).cells for lang in bank.LANGS}
        for qid, ex in data.items():
            fresh = examples[ex["function"]](**ex["args"])
            # JSON on both sides: tuples and lists compare equal, NaN equals NaN, floats round-trip exactly
            assert json.dumps(ex["values"], sort_keys=True) == json.dumps(fresh, sort_keys=True), (page, qid)
            for lang in bank.LANGS:
                for key, value in fresh.items():
                    assert shown[lang][(qid, key)] == bank.render_value(value, lang), (page, qid, key, lang)
            n += 1
    return n


def test_pages_written(fixture_site):
    _, out = fixture_site
    for name in ["index.html", "compare.html", "topics.html", "method-grpo.html", "method-rloo.html",
                 "source/policylab/kernels/advantages/grpo.py.html", "source/policylab/kernels/objectives/reinforce.py.html",
                 "figures/grpo.en.svg", "figures/grpo.zh.svg", "figures/rloo.en.svg", "figures/rloo.zh.svg",
                 "overlay-clipped-objectives.html", "figures/overlay-clipped-objectives.zh.svg"]:
        assert (out / name).is_file(), name


def test_numbers_in_pages_equal_fresh_computation(fixture_site):
    fb, out = fixture_site
    n = check_numbers_against_fresh_calls(out, EXAMPLES, ["method-grpo.html", "method-rloo.html", "topics.html"])
    assert n == 9  # 4 + 4 + 1 cross-method question
    # the example sentence in the page is the YAML template filled with the fresh numbers
    text = (out / "method-grpo.html").read_text(encoding="utf-8")
    q = fb.docs["grpo"]["questions"][1]
    fresh = EXAMPLES[q["example"]["function"]](**q["example"]["args"])
    for lang in bank.LANGS:
        assert site.esc(bank.fill(q["example"][lang], fresh, lang)) in text


def test_index_json_lists_every_question_with_resolvable_urls(fixture_site):
    _, out = fixture_site
    data = embedded(out / "index.html", "index-data")
    ids = [it["id"] for it in data["items"]]
    assert ids == [f"{m}-{c}" for m in ("grpo", "rloo") for c in bank.CATEGORIES] + ["x-grpo-rloo"]
    for it in data["items"]:
        assert set(it["q"]) == set(it["a"]) == set(it["ex"]) == set(bank.LANGS)
        page, anchor = it["url"].split("#")
        assert anchor in parse(out / page).ids
    grpo_cmp = next(it for it in data["items"] if it["id"] == "grpo-comparison")
    assert grpo_cmp["methods"] == ["grpo", "rloo"] and grpo_cmp["families"] == ["advantage + objective"]


def test_every_link_is_local_and_resolves(fixture_site):
    _, out = fixture_site
    pages = sorted(out.rglob("*.html"))
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r'(src|href)="(https?:)?//', text), page  # nothing fetched or linked online
        for ref in parse(page).links:
            parts = urlsplit(ref)
            assert not parts.scheme, (page, ref)
            target = (page.parent / parts.path).resolve() if parts.path else page
            assert target.is_file(), (page, ref)
            if parts.fragment:
                assert parts.fragment in parse(target).ids, (page, ref)


def test_method_page_shows_its_figure_beside_the_formula(fixture_site):
    _, out = fixture_site
    text = (out / "method-grpo.html").read_text(encoding="utf-8")
    # one grid: the formulas in the left column, the figure in the right one, before the questions
    grid = text.index('<div class="formula-figure">')
    assert grid < text.index('<div class="formula-col">') < text.index('<div class="figure-col">') \
        < text.index('<details class="q"')
    fig = figures.figure("grpo")
    for lang in bank.LANGS:
        assert f'<img src="figures/grpo.{lang}.svg" alt="{site.esc(figures.alt_text(fig, lang))}"' in text
        assert f'<p class="{lang}" lang="{lang}">{site.esc(fig.caption[lang])}</p>' in text
    # the overlays that draw grpo are linked from its page, and every overlay from the index
    assert 'href="overlay-group-baselines.html"' in text
    index = (out / "index.html").read_text(encoding="utf-8")
    assert 'id="overlays"' in index
    for o in figures.overlay_defs():
        assert f'href="overlay-{o.key}.html"' in index
        page = (out / f"overlay-{o.key}.html").read_text(encoding="utf-8")
        assert f'src="figures/overlay-{o.key}.en.svg"' in page and site.esc(o.caption["zh"]) in page


def test_source_links_point_at_the_kernel_def(fixture_site):
    _, out = fixture_site
    links = [ln for ln in parse(out / "method-rloo.html").links if ln.startswith("source/")]
    assert len(links) == 4  # advantage + objective, href and data-href each
    for ref in links[::2]:
        path, line = ref.split("#L")
        lines = (out / path).read_text(encoding="utf-8")
        m = re.search(rf'<span id="L{line}" data-n="{line}">(.*?)</span>', lines)
        assert m and m.group(1).startswith("def "), ref


def test_comparison_page_has_every_registered_method(fixture_site):
    _, out = fixture_site
    text = (out / "compare.html").read_text(encoding="utf-8")
    assert re.findall(r'<tr data-method="([^"]+)">', text) == methods.names()
    for _, label in anatomy.COMPARISON_COLUMNS:
        assert site.esc(label["zh"]) in text and site.esc(label["en"]) in text


def test_every_ui_string_in_both_languages(fixture_site):
    _, out = fixture_site
    for table in (site.UI, site.CATEGORY, site.STAGE, dict(site.CARD_ROWS)):
        for key, d in table.items():
            assert d["en"].strip() and d["zh"].strip(), key
    for page in sorted(out.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        assert text.count('class="en" lang="en"') == text.count('class="zh" lang="zh"'), page
    assert 'data-ph-zh="搜索' in (out / "index.html").read_text(encoding="utf-8")


def test_topics_page_reading_order(fixture_site):
    _, out = fixture_site
    text = (out / "topics.html").read_text(encoding="utf-8")
    assert "无需价值网络的基线" in text and "Baselines without a critic" in text
    assert 'id="x-grpo-rloo"' in text


def test_site_requires_both_languages(fixture_site, tmp_path):
    fb, _ = fixture_site
    entries = bank.build_bank("en", **fb.bank_kwargs)
    with pytest.raises(PolicylabError, match="needs the bank in both languages"):
        site.build_site(tmp_path, entries=entries, topic_data=bank.Topics())


def test_site_build_is_strict_about_missing_methods(tmp_path):
    fb = FixtureBank(tmp_path / "b")
    with pytest.raises(bank.BankError, match="has no bank file"):
        site.build_site(tmp_path / "out", bank_dir=fb.bank_dir, examples=EXAMPLES, topics_path=fb.topics_path)


def test_real_site_numbers_equal_fresh_computation(real_site):
    """The package's bank as it stands (methods without a file yet are left out here; the
    completeness tests in test_shipped_lessons.py fail for them)."""
    built = sorted(p.name for p in real_site.glob("method-*.html"))
    have = sorted(f"method-{p.stem}.html" for p in bank.BANK_DIR.glob("*.yaml"))
    assert built == have
    n = check_numbers_against_fresh_calls(real_site, REAL_EXAMPLES, built + ["topics.html"])
    expected = 4 * len(built) + (len(yaml.safe_load(bank.TOPICS_PATH.read_text(encoding="utf-8")).get("questions") or [])
                                 if bank.TOPICS_PATH.exists() else 0)
    assert n == expected
    assert (real_site / "index.html").is_file()


def test_real_site_figures_equal_fresh_computation(real_site):
    """Every method page embeds its figure's series, equal to the figure computed now,
    and links both SVG files, which are exactly what the renderer draws now."""
    pages = sorted(real_site.glob("method-*.html"))
    assert pages
    for page in pages:
        name = page.stem.removeprefix("method-")
        data = embedded(page, "figure-data")
        fig = figures.figure(name)
        assert json.dumps({k: v for k, v in data.items() if k not in ("files", "narrow")}, sort_keys=True) == \
            json.dumps(fig.data(), sort_keys=True), name
        for lang in bank.LANGS:
            assert (real_site / data["files"][lang]).read_text(encoding="utf-8") == figures.render.svg(fig, lang)
            assert (real_site / data["narrow"][lang]).read_text(encoding="utf-8") == \
                figures.render.svg(fig, lang, columns=1)
    for o in figures.overlay_defs():
        data = embedded(real_site / f"overlay-{o.key}.html", "figure-data")
        assert data["methods"] == list(o.methods) and data["key"] == o.key


def test_metrics_and_literature_cards_have_pages_and_are_searchable(real_site):
    index = (real_site / "index.html").read_text(encoding="utf-8")
    items = embedded(real_site / "index.html", "index-data")["items"]
    for page, name in (("metric-calib_rl.html", "calib_rl"), ("metric-sharpening_tax.html", "sharpening_tax"),
                       ("metric-pass_at_k.html", "pass_at_k"), ("literature-orl.html", "orl")):
        text = (real_site / page).read_text(encoding="utf-8")
        assert text.count('<details class="q"') == 4, page
        assert f'href="{page}"' in index
        assert sum(1 for it in items if it["url"].startswith(page + "#")) == 4
        assert set(embedded(real_site / page, "example-data")) == {f"{name}-{c}" for c in bank.CATEGORIES}
