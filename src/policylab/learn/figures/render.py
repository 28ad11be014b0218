"""Drawing a `Figure` with matplotlib's SVG backend: text stays text
(`svg.fonttype = "none"`, searchable and crisp, with a CSS font stack that falls back to a
CJK font for Chinese), every series' drawing carries the id `pl-s<panel>-<series>`
(tests map its path back to the data), the caption is the SVG's <title> and the alt text
its <desc>. The layout is computed in inches (no tight/constrained layout pass), so one
figure costs one draw. Output is deterministic (fixed hash salt, no date).

    svg(fig, lang, columns=2) -> str the SVG text (cached by the figure's data); columns=1 is
                                     the narrow drawing for small screens
    styles(panel) / tags(panel)      each series' colour, dash and width (no two lines of a
                                     panel alike) and its direct label (a, b, ... on the line)
    write(fig, path, lang)           .svg, or .png / .pdf through the same drawing
"""

from __future__ import annotations

import io
import math
import re
import warnings
from functools import lru_cache
from pathlib import Path
from xml.sax.saxutils import escape

from policylab.errors import PolicylabError
from policylab.learn.figures.model import Figure, Panel, alt_text, series_id


class MissingFontError(PolicylabError):
    """A raster or PDF figure would draw boxes for glyphs no installed font has."""

PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#882255")
DASHES = ("-", (0, (5, 1.5)), (0, (1.2, 1.2)), (0, (6, 1.5, 1.2, 1.5)))
REFERENCE = "#8a8f98"
MARK = "#9ba1aa"
CSS_FONTS = ("'DejaVu Sans', 'Noto Sans', 'Noto Sans CJK SC', 'Source Han Sans SC', 'WenQuanYi Micro Hei', "
             "'PingFang SC', 'Microsoft YaHei', sans-serif")
CJK_FONTS = ("Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Noto Sans SC")

# layout, inches
PLOT_W, PLOT_H, LEFT, RIGHT, TOP, XAXIS, LEGEND_ROW, GAP = 3.05, 2.05, 0.62, 0.14, 0.32, 0.46, 0.17, 0.1
COLUMNS = 2


@lru_cache(maxsize=1)
def _fonts() -> list[str]:
    from matplotlib import font_manager

    have = {f.name for f in font_manager.fontManager.ttflist}
    if not any(f in have for f in CJK_FONTS):
        # a font installed after matplotlib built its font cache (~/.cache/matplotlib) is
        # missing from it: add the system's font files the cache does not know, once
        known = {f.fname for f in font_manager.fontManager.ttflist}
        for path in font_manager.findSystemFonts():
            if path not in known:
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):  # a file FreeType cannot read is no font to use
                    continue
        have = {f.name for f in font_manager.fontManager.ttflist}
    return ["DejaVu Sans"] + [f for f in CJK_FONTS if f in have]


CJK_PACKAGE = "fonts-wqy-microhei"


def cjk_fonts() -> list[str]:
    """The CJK fonts matplotlib can use on this machine (empty: Chinese text would be boxes)."""
    return _fonts()[1:]


def require_cjk_font(lang: str) -> None:
    """A Chinese PNG/PDF needs a CJK font on this machine (an SVG keeps its text as text and
    the viewer's fonts draw it): raise MissingFontError naming the package to install."""
    if lang == "zh" and not cjk_fonts():
        raise MissingFontError(
            f"a Chinese PNG/PDF figure needs a CJK font and matplotlib finds none (looked for: "
            f"{', '.join(CJK_FONTS)}); install one, e.g. `apt-get install {CJK_PACKAGE}` (Debian/Ubuntu), then "
            "remove matplotlib's font cache (~/.cache/matplotlib) - or write an .svg, whose text the viewer draws")


def _rc() -> dict:
    return {"svg.fonttype": "none", "svg.hashsalt": "policylab-figures", "font.family": _fonts(), "font.size": 8,
            "axes.titlesize": 8.5, "axes.labelsize": 8, "legend.fontsize": 7.2, "xtick.labelsize": 7.5,
            "ytick.labelsize": 7.5, "path.simplify": False, "axes.spines.top": False, "axes.spines.right": False,
            "axes.grid": True, "grid.color": "#e6e8ec", "grid.linewidth": 0.6, "lines.linewidth": 1.6,
            "svg.image_inline": True}


def _legend_entries(p: Panel) -> int:
    return len(p.series) + len(p.marks)


def _legend_cols(p: Panel, lang: str) -> int:
    labels = [s.label[lang] for s in p.series] + [m.label[lang] for m in p.marks]
    width = max(len(t) * (2 if lang == "zh" else 1) for t in labels)
    return 2 if width <= 26 else 1


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of 2 over a short range, 1-2-5 steps per decade (thinned) over a long one."""
    inside = lambda ts: [t for t in ts if lo * 0.999 <= t <= hi * 1.001]  # noqa: E731
    ticks = inside([2.0 ** k for k in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)])
    if len(ticks) <= 7:
        return ticks
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    ticks = inside([m * 10.0 ** d for d in decades for m in (1, 2, 5)])
    return ticks if len(ticks) <= 7 else inside([10.0 ** d for d in decades])


REF_DASHES = ((0, (4, 2)), (0, (7, 2, 1.5, 2)), (0, (1.2, 1.6)), (0, (2.5, 3.5)), (0, (9, 3)))
# reference marks (thresholds, bounds): thin, light grey, each with its own dash and its
# label written along the line
MARK_DASHES = ((0, (1.5, 1.5)), (0, (5, 1.5, 1, 1.5)), (0, (3, 3)), (0, (0.8, 2.4)), (0, (6, 2)))
REF_GREYS = (REFERENCE, "#4f555e")
TAGS = "abcdefghijklmnopqrstuvwxyz"


def styles(p: Panel) -> list[tuple]:
    """(colour, line style, width) per series, no two lines (line or step series) of a
    panel alike. References are grey, each with a dash of its own (REF_DASHES, alternating
    two greys); the others get one colour per series, or per method in an overlay (when a
    method has several series the line style tells them apart; with one each, every other
    pair of methods is dashed so curves that coincide stay visible). A pair that would
    still repeat moves to the next dash."""
    counts: dict[int, int] = {}
    for s in p.series:
        if s.group is not None and not s.reference:
            counts[s.group] = counts.get(s.group, 0) + 1
    several = max(counts.values(), default=1) > 1
    out, colour, within, refs = [], 0, {}, 0
    for s in p.series:
        if s.reference:
            out.append((REF_GREYS[(refs // len(REF_DASHES)) % 2], REF_DASHES[refs % len(REF_DASHES)], 1.2))
            refs += 1
            continue
        if s.group is not None:
            k = within.get(s.group, 0)
            within[s.group] = k + 1
            c, dash = s.group, k if several else s.group // 2
        else:
            c, dash = colour, colour // 2
            colour += 1
        out.append((PALETTE[c % len(PALETTE)], DASHES[dash % len(DASHES)], 1.6))
    seen: set = set()
    for i, (s, (c, ls, lw)) in enumerate(zip(p.series, out)):
        if s.kind not in ("line", "step"):
            continue
        pool = REF_DASHES if s.reference else DASHES
        k = pool.index(ls)
        for _ in range(len(pool)):
            if (c, str(ls)) not in seen:
                break
            k = (k + 1) % len(pool)
            ls = pool[k]
        if (c, str(ls)) in seen:
            raise ValueError(f"panel {p.title.get('en')!r}: too many lines of colour {c} to tell apart")
        seen.add((c, str(ls)))
        out[i] = (c, ls, lw)
    return out


def tags(p: Panel) -> list[str | None]:
    """The direct label of each line (a, b, c, ... written on the line and before its legend
    entry) when the panel has two lines or more; None for bars, points and a lone line."""
    lines = [i for i, s in enumerate(p.series) if s.kind in ("line", "step")]
    out: list[str | None] = [None] * len(p.series)
    if len(lines) >= 2:
        for k, i in enumerate(lines):
            out[i] = TAGS[k % len(TAGS)]
    return out


def _tag_at(s, k: int, n: int) -> tuple[float, float]:
    """Where line k of n carries its tag: spread along x so coinciding lines show each tag."""
    i = min(len(s.x) - 1, max(0, round((k + 0.5) / n * (len(s.x) - 1))))
    return s.x[i], s.y[i]


def _draw_panel(ax, p: Panel, pi: int, lang: str) -> None:
    tag = tags(p)
    n_tags = sum(t is not None for t in tag)
    for si, (s, (c, ls, lw)) in enumerate(zip(p.series, styles(p))):
        sid = series_id(pi, si)
        label = s.label[lang] if tag[si] is None else f"({tag[si]}) {s.label[lang]}"
        if s.kind == "bar":
            bars = ax.bar(s.x, s.y, width=0.62, color=c, label=label)
            for k, rect in enumerate(bars):
                rect.set_gid(f"{sid}-{k}")
        elif s.kind == "scatter":
            if s.xerr is not None:
                lo = [x - a for x, (a, _) in zip(s.x, s.xerr)]
                hi = [b - x for x, (_, b) in zip(s.x, s.xerr)]
                _, caps, bars = ax.errorbar(s.x, s.y, xerr=[lo, hi], fmt="none", ecolor=c, elinewidth=1.4, capsize=2.5)
                for b in bars:
                    b.set_gid(f"{sid}-err")
            (line,) = ax.plot(s.x, s.y, linestyle="none", marker="o", markersize=4.5, color=c, label=label)
            line.set_gid(sid)
        else:
            kw = dict(color=c, linestyle=ls, linewidth=lw, label=label)
            if s.markers:
                kw.update(marker="o", markersize=3.2)
            if s.kind == "step":
                (line,) = ax.step(s.x, s.y, where="post", **kw)
            else:
                (line,) = ax.plot(s.x, s.y, **kw)
            line.set_gid(sid)
            if tag[si] is not None:
                x, y = _tag_at(s, TAGS.index(tag[si]), n_tags)
                t = ax.annotate(tag[si], (x, y), fontsize=6.8, color=c, ha="center", va="center", zorder=5,
                                bbox=dict(boxstyle="circle,pad=0.18", fc="white", ec=c, lw=0.8))
                t.set_gid(f"{sid}-tag")
    for mi, m in enumerate(p.marks):
        fn = ax.axvline if m.axis == "x" else ax.axhline
        line = fn(m.value, color=MARK, linestyle=MARK_DASHES[mi % len(MARK_DASHES)], linewidth=1.0,
                  label=m.label[lang], zorder=0.5)
        line.set_gid(f"pl-m{pi}-{mi}")
        if m.axis == "x":  # the label along the line, at the top of the axes
            t = ax.text(m.value, 0.98, m.label[lang], transform=ax.get_xaxis_transform(), rotation=90, ha="right",
                        va="top", fontsize=6.3, color="#5c626c", zorder=0.6)
        else:
            t = ax.text(0.99, m.value, m.label[lang], transform=ax.get_yaxis_transform(), ha="right", va="bottom",
                        fontsize=6.3, color="#5c626c", zorder=0.6)
        t.set_gid(f"pl-m{pi}-{mi}-label")
    if p.xscale == "log":
        ax.set_xscale("log")
        xs = [v for s in p.series for v in s.x]
        ticks = _log_ticks(min(xs), max(xs))
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    elif p.categories is None:
        from matplotlib.ticker import MaxNLocator, ScalarFormatter

        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
        fmt = ScalarFormatter(useOffset=False)
        ax.xaxis.set_major_formatter(fmt)
    if p.categories is not None:
        ax.set_xticks(range(len(p.categories)), p.categories, rotation=30 if len(p.categories) > 6 else 0,
                      ha="right" if len(p.categories) > 6 else "center")
        ax.grid(axis="x", visible=False)
    if p.ylim is not None:
        ax.set_ylim(*p.ylim)
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
    # fixed positions: matplotlib skips its bounding-box passes for titles and labels
    ax.set_title(p.title[lang], loc="left", y=1.015)
    ax.set_xlabel(p.xlabel[lang])
    ax.set_ylabel(p.ylabel[lang])
    extra = 0.1 if p.categories and len(p.categories) > 6 else 0.0
    ax.xaxis.set_label_coords(0.5, -0.29 / PLOT_H - extra / PLOT_H * 3)
    ax.yaxis.set_label_coords(-0.5 / PLOT_W, 0.5)
    ncol = _legend_cols(p, lang)
    ax.legend(loc="upper left", bbox_to_anchor=(-0.02, -XAXIS / PLOT_H - 0.02), ncol=ncol, frameon=False,
              borderaxespad=0.0, handlelength=2.6, columnspacing=1.2, labelspacing=0.3)


def _layout(fig: Figure, lang: str, columns: int = COLUMNS):
    """(width, height, [axes rect in figure fractions]) for the panels in rows of `columns`."""
    n = len(fig.panels)
    cols = min(columns, n)
    rows = [fig.panels[i:i + cols] for i in range(0, n, cols)]
    cell_w = LEFT + PLOT_W + RIGHT
    heights = []
    for row in rows:
        legend = max(math.ceil(_legend_entries(p) / _legend_cols(p, lang)) for p in row)
        extra = 0.32 if any(p.categories and len(p.categories) > 6 for p in row) else 0.0
        heights.append(TOP + PLOT_H + XAXIS + extra + legend * LEGEND_ROW + GAP)
    W, H = cols * cell_w, sum(heights)
    rects, y_top = [], H
    for row, h in zip(rows, heights):
        for j, _ in enumerate(row):
            left = j * cell_w + LEFT
            bottom = y_top - TOP - PLOT_H
            rects.append((left / W, bottom / H, PLOT_W / W, PLOT_H / H))
        y_top -= h
    return W, H, rects


def _draw(fig: Figure, lang: str, columns: int = COLUMNS):
    import matplotlib as mpl
    from matplotlib.figure import Figure as MplFigure

    with mpl.rc_context(_rc()), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        W, H, rects = _layout(fig, lang, columns)
        mfig = MplFigure(figsize=(W, H))
        for pi, (p, rect) in enumerate(zip(fig.panels, rects)):
            _draw_panel(mfig.add_axes(rect), p, pi, lang)
        return mfig


_NUM = re.compile(r"-?\d+\.\d+")
_PATH = re.compile(r'(\sd=")([^"]*)(")')
_FONT = re.compile(r"font-family: [^;\"]*")


def _round_path(m: re.Match) -> str:
    """Path coordinates to 2 decimals of a point (1/7200 inch): a third of the size."""
    return m.group(1) + _NUM.sub(lambda n: f"{float(n.group()):.2f}".rstrip("0").rstrip("."), m.group(2)) + m.group(3)


def _finish(text: str, fig: Figure, lang: str) -> str:
    text = _PATH.sub(_round_path, text)
    text = _FONT.sub("font-family: " + CSS_FONTS, text)
    i = text.index(">", text.index("<svg")) + 1
    head = (f'\n <title>{escape(fig.caption[lang])}</title>\n <desc>{escape(alt_text(fig, lang))}</desc>')
    text = text[:i] + head + text[i:]
    return text.replace('<svg xmlns:xlink', f'<svg role="img" xml:lang="{"zh-CN" if lang == "zh" else "en"}" '
                        'xmlns:xlink', 1)


_CACHE: dict[tuple[str, str, int], str] = {}


def clear_cache() -> None:
    """Forget every SVG drawn so far (the next `svg` call draws again)."""
    _CACHE.clear()


def svg(fig: Figure, lang: str, columns: int = COLUMNS) -> str:
    """The figure as SVG text in `lang` (en | zh), its panels in rows of `columns` (1: the
    narrow drawing the site shows on a phone, at full size in a 400-px window)."""
    if lang not in ("en", "zh"):
        raise ValueError(f"language must be en or zh, got {lang!r}")
    key = (fig.fingerprint(), lang, columns)
    if key not in _CACHE:
        from matplotlib.backends.backend_svg import FigureCanvasSVG

        mfig = _draw(fig, lang, columns)
        buf = io.StringIO()
        import matplotlib as mpl

        with mpl.rc_context(_rc()):
            FigureCanvasSVG(mfig).print_svg(buf, metadata={"Date": None, "Creator": "policylab (matplotlib)"})
        _CACHE[key] = _finish(buf.getvalue(), fig, lang)
    return _CACHE[key]


def write(fig: Figure, path, lang: str = "en") -> Path:
    """Write the figure to `path`: SVG (text), or PNG / PDF by the file's suffix."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".svg":
        path.write_text(svg(fig, lang), encoding="utf-8")
    elif suffix in (".png", ".pdf"):
        import matplotlib as mpl

        require_cjk_font(lang)
        mfig = _draw(fig, lang)
        with mpl.rc_context(_rc()), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tmp = path.with_name(path.name + ".partial")
            mfig.savefig(tmp, format=suffix[1:], dpi=200 if suffix == ".png" else None,
                         metadata={"Software": "policylab"} if suffix == ".png" else None)
        missing = sorted({str(w.message) for w in caught if "missing from font" in str(w.message)})
        if missing:  # boxes instead of text: refuse, and leave nothing behind
            tmp.unlink(missing_ok=True)
            raise MissingFontError(f"{path.name}: {len(missing)} glyph(s) have no font on this machine (e.g. "
                                   f"{missing[0]}); install `{CJK_PACKAGE}` (Debian/Ubuntu) or write an .svg")
        tmp.replace(path)
    else:
        raise ValueError(f"--plot writes .svg, .png or .pdf files, got {path.name!r}")
    return path
