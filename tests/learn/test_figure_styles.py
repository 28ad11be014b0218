"""Every plotted line can be told apart: no two lines of a panel share colour and dash (read
back from the SVG that is drawn, for every shipped figure and overlay), each line of a
panel with several carries a direct label (its tag on the line and before its legend
entry), and the narrow drawing for small screens is one panel wide."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from policylab.learn import figures, lessons
from policylab.learn.figures import Panel, Series, T, render


@pytest.fixture(scope="module")
def all_figures():
    figs = {n: figures.figure(n) for n in sorted(lessons.shipped_names())}
    figs.update({f"overlay-{o.key}": figures.overlay(o) for o in figures.overlay_defs()})
    return figs


_G = re.compile(r'<g id="(pl-([sm])(\d+)-(\d+))">\s*<path [^>]*?style="([^"]*)"', re.S)


def drawn_line_styles(svg: str) -> dict:
    """{(panel, series): (stroke colour, dash array)} of every drawn series path, and
    {(panel, "m<k>"): ...} of the panel's reference marks."""
    out = {}
    for m in _G.finditer(svg):
        style = dict(kv.split(":", 1) for kv in m.group(5).replace(" ", "").split(";") if ":" in kv)
        key = int(m.group(4)) if m.group(2) == "s" else f"m{m.group(4)}"
        out[(int(m.group(3)), key)] = (style.get("stroke"), style.get("stroke-dasharray", "solid"))
    return out


def _panel(*refs_and_lines):
    ss = [Series(T(label), [0, 1, 2], [0, i, 2 * i], reference=ref) for i, (label, ref) in enumerate(refs_and_lines)]
    return Panel(T("t"), T("x"), T("y"), ss, "test")


def test_references_each_get_their_own_dash():
    # PPO's GAE panel before: λ = 1, λ = 0 and V_t were all grey (0, (4, 2)): three lines, one look
    p = _panel(("λ = 1", True), ("λ = 0", True), ("V_t", True), ("ours", False))
    st = render.styles(p)
    assert len({(c, str(ls)) for c, ls, _ in st}) == 4
    assert [ls for _, ls, _ in st[:3]] == list(render.REF_DASHES[:3])
    assert render.tags(p) == ["a", "b", "c", "d"]


def test_a_lone_line_and_bars_carry_no_tag():
    bars = Series(T("bars"), [0, 1], [1, 2], kind="bar")
    assert render.tags(Panel(T("t"), T("x"), T("y"), [bars, Series(T("l"), [0, 1], [1, 2])], "s")) == [None, None]


def test_no_panel_has_two_lines_of_one_style(all_figures):
    """Read back from the drawn SVG: stroke colour + dash array differ between the lines of
    every panel of every figure (both languages draw the same styles)."""
    checked = 0
    for key, fig in all_figures.items():
        drawn = drawn_line_styles(render.svg(fig, "en"))
        for pi, p in enumerate(fig.panels):
            seen = defaultdict(list)
            for si, s in enumerate(p.series):
                if s.kind in ("line", "step"):
                    assert (pi, si) in drawn, (key, pi, si)
                    seen[drawn[(pi, si)]].append(s.label["en"])
                    checked += 1
            for mi, m in enumerate(p.marks):  # a mark is a line too: its own dash, its label on it
                seen[drawn[(pi, f"m{mi}")]].append(m.label["en"])
                assert f'id="pl-m{pi}-{mi}-label"' in render.svg(fig, "en")
            dup = {k: v for k, v in seen.items() if len(v) > 1}
            assert not dup, f"{key}, panel {pi} ({p.title['en']}): lines drawn alike: {dup}"
    assert checked > 150


def test_every_line_of_a_crowded_panel_is_labelled_on_the_plot(all_figures):
    for key in ("ppo", "cord", "overlay-engine-corrections"):
        fig = all_figures[key]
        svg = render.svg(fig, "en")
        for pi, p in enumerate(fig.panels):
            tg = render.tags(p)
            lines = [si for si, s in enumerate(p.series) if s.kind in ("line", "step")]
            for si in lines:
                if len(lines) >= 2:
                    assert f'id="pl-s{pi}-{si}-tag"' in svg, (key, pi, si)
                    assert f"({tg[si]}) {p.series[si].label['en']}" in svg  # the legend entry repeats the tag
                else:
                    assert f'id="pl-s{pi}-{si}-tag"' not in svg


def test_narrow_drawing_is_one_panel_wide(all_figures):
    fig = all_figures["ppo"]
    wide, narrow = render.svg(fig, "en"), render.svg(fig, "en", columns=1)
    width = lambda s: float(re.search(r'<svg[^>]* width="([\d.]+)pt"', s).group(1))  # noqa: E731
    # one cell: LEFT + PLOT_W + RIGHT inches = 3.81 in = 274.3 pt; two columns: 548.6 pt
    assert width(narrow) == pytest.approx((render.LEFT + render.PLOT_W + render.RIGHT) * 72, abs=0.1)
    assert width(wide) == pytest.approx(2 * width(narrow), abs=0.2)
    assert drawn_line_styles(narrow) == drawn_line_styles(wide)  # the same lines, the same styles
