"""The figures' data model: what a view returns and what the renderer draws.

    Figure -> [Panel] -> [Series] (+ [Mark])   plain numbers and bilingual labels
    T(en, zh)                                  a bilingual text
    view("name")                               registers `fn(method, **args) -> [Panel]` in VIEWS
    alt_text(fig, lang)                        the text description, generated from the data

Nothing here computes a curve; the views (`views_*.py`) do, by calling the methods'
stages and loss.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Callable

from policylab.errors import PolicylabError
from policylab.methods.spec import RunShape

LANGS = ("en", "zh")
# the run shape a figure resolves run-dependent defaults from (L_norm, the overlong budget)
RUN = RunShape()


class FigureError(PolicylabError):
    """The figures do not build; `errors` holds one message per problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__(f"the method figures do not build ({len(errors)} problem(s)):\n"
                         + "\n".join(f"  - {e}" for e in self.errors))


def T(en: str, zh: str | None = None) -> dict:
    """A bilingual text; `zh` None = the same text in both (names, formulas)."""
    return {"en": en, "zh": en if zh is None else zh}


@dataclass
class Series:
    """One curve (or set of bars / points) of a panel.

    kind       line | step | scatter | bar
    reference  a comparison curve (e.g. the host objective alone): drawn grey and dashed,
               kept once in an overlay
    xerr       scatter only: per point (low, high) drawn as a horizontal interval
    group      overlays: the index of the method the series belongs to (one colour per
               method, the line style tells its series apart)
    """

    label: dict
    x: list
    y: list
    kind: str = "line"
    reference: bool = False
    markers: bool = False
    xerr: list | None = None
    group: int | None = None

    def __post_init__(self):
        if self.kind not in ("line", "step", "scatter", "bar"):
            raise ValueError(f"series kind must be line, step, scatter or bar, got {self.kind!r}")
        if len(self.x) != len(self.y) or not self.x:
            raise ValueError(f"series {self.label.get('en')!r}: x and y must have the same non-zero length")
        self.x = [float(v) + 0.0 for v in self.x]
        self.y = [float(v) + 0.0 for v in self.y]
        if not all(math.isfinite(v) for v in self.x + self.y):
            raise ValueError(f"series {self.label.get('en')!r}: non-finite value (a figure shows finite numbers)")


@dataclass
class Mark:
    """A labelled reference line: `axis` "x" (vertical line at x = value) or "y"."""

    axis: str
    value: float
    label: dict


@dataclass
class Panel:
    """One set of axes. `source`: what was called to compute it (shown under the figure).
    `categories`: tick labels of a bar panel (x = 0, 1, ...)."""

    title: dict
    xlabel: dict
    ylabel: dict
    series: list
    source: str
    xscale: str = "linear"
    marks: list = field(default_factory=list)
    categories: list | None = None
    ylim: tuple | None = None


@dataclass
class Figure:
    key: str  # the method name, or the overlay id
    title: dict
    caption: dict
    panels: list
    methods: tuple  # the methods whose kernels the curves come from

    def data(self) -> dict:
        """Plain JSON data of every plotted series, with the SVG id of its drawing."""
        return {"key": self.key, "methods": list(self.methods), "panels": [
            {"title": p.title, "xscale": p.xscale, "source": p.source,
             "series": [{"id": series_id(i, j), "label": s.label, "kind": s.kind, "x": s.x, "y": s.y}
                        for j, s in enumerate(p.series)]}
            for i, p in enumerate(self.panels)]}

    def fingerprint(self) -> str:
        return json.dumps({"d": self.data(), "c": self.caption, "t": self.title, "m": [
            [dataclasses.asdict(m) for m in p.marks] for p in self.panels], "l": [
            [p.xlabel, p.ylabel, p.categories, p.ylim, [(s.reference, s.markers, s.xerr, s.group) for s in p.series]]
            for p in self.panels]}, sort_keys=True, ensure_ascii=False)


def series_id(panel: int, series: int) -> str:
    """The SVG id of a series' drawing (`<g id="pl-s1-0">`)."""
    return f"pl-s{panel}-{series}"


# ----------------------------------------------------------------------------- views

VIEWS: dict[str, Callable[..., list[Panel]]] = {}


def view(name: str):
    """Register `fn(method, **args) -> [Panel]` as the view `name`."""
    def register(fn):
        if name in VIEWS:
            raise ValueError(f"figure view {name!r} is registered twice")
        VIEWS[name] = fn
        return fn

    return register


@dataclass(frozen=True)
class PanelRef:
    """One panel of a definition: the name of a view in VIEWS and its keyword arguments."""

    view: str
    args: dict


# ----------------------------------------------------------------------------- alt text

_KIND = {"line": T("line", "折线"), "step": T("step line", "阶梯线"), "scatter": T("points", "散点"),
         "bar": T("bars", "柱")}


def _num(v: float) -> str:
    return f"{v:.4g}"


def alt_text(fig: Figure, lang: str) -> str:
    """A text description of the figure: per panel what is plotted against what, over
    which range, and the series (generated from the data, so it cannot drift)."""
    parts = []
    for i, p in enumerate(fig.panels, 1):
        xs = [v for s in p.series for v in s.x]
        if p.categories:
            span = ", ".join(p.categories) if lang == "en" else "、".join(p.categories)
            span = (f"for {span}" if lang == "en" else f"类别：{span}")
        else:
            span = (f"x from {_num(min(xs))} to {_num(max(xs))}" if lang == "en"
                    else f"x 从 {_num(min(xs))} 到 {_num(max(xs))}")
        if p.xscale == "log":
            span += " (log scale)" if lang == "en" else "（对数刻度）"
        names = ("; " if lang == "en" else "；").join(
            f"{s.label[lang]} ({_KIND[s.kind][lang]})" for s in p.series)
        if lang == "en":
            parts.append(f"Panel {i}, {p.title['en']}: {p.ylabel['en']} against {p.xlabel['en']}, {span}; "
                         f"series: {names}.")
        else:
            parts.append(f"第 {i} 幅，{p.title['zh']}：{p.ylabel['zh']} 随 {p.xlabel['zh']} 的变化，{span}；"
                         f"曲线：{names}。")
    head = (f"Figure {fig.key}: {fig.caption['en']} " if lang == "en" else f"图 {fig.key}：{fig.caption['zh']} ")
    return head + " ".join(parts)
