"""Live figures of the methods: the curves are computed when they are drawn (site build,
`policylab explain NAME --plot FILE`) by calling the library's own kernels, and the
methods' own stages and loss, on a grid. Nothing is drawn by hand.

    figure(name)         -> Figure        a registered method's figure (its panels' data)
    overlay(key)         -> Figure        several methods' curves on the same axes
    overlay_defs()       -> [OverlayDef]  the natural comparisons (overlays.yaml)
    check_complete()     raises FigureError naming every registered method without a figure
    render.svg(fig, lang) -> str          the SVG (text kept as text), caption and alt text

Definitions. Every registered method has `learn/figures/defs/<method>.yaml`:

    method: tis
    panels:                       # optional: without it the panels are derived from the stages
      - view: engine_weight       # a name in VIEWS (learn/figures/views_*.py)
        args: {p_old: [0.1]}      # keyword arguments of the view (plain values)
    en: {caption: "What to look at, in English."}
    zh: {caption: "看什么（简体中文）。"}

Without `panels`, `derived_panels(method)` reads the spec: the engine-weight view for a
method whose corrections read only the engine roles, otherwise the group-advantage view
for an estimator that reads only rewards and groups and the policy-ratio view for an
objective with a ratio (one that reads `logp_old`). A method registered without a
definition fails the site build (and `tests/learn/test_figures.py`) with a message naming
it and the file to write.

Views. A view is `fn(method, **args) -> [Panel]`, registered with `@view("name")`; it
calls the method's stages (`method.advantage.fn`, reward stages, round stages) or its
policy loss (`methods.loss.policy_loss` with `methods.loss.tensor_inputs`, autograd
through the real objective x corrections) and returns the curves with bilingual labels.
The same view applied to several methods gives an overlay (`overlays.yaml`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from policylab import methods
from policylab.learn.bank import _load_yaml
from policylab.errors import PolicylabError
from policylab.methods.spec import Method, RunShape

HERE = Path(__file__).resolve().parent
DEFS_DIR = HERE / "defs"
OVERLAYS_PATH = HERE / "overlays.yaml"
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


# ------------------------------------------------------------------------------ data


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
    view: str
    args: dict


@dataclass(frozen=True)
class FigureDef:
    method: str
    panels: tuple | None  # of PanelRef; None = derived from the stages
    caption: dict
    file: str


@dataclass(frozen=True)
class OverlayDef:
    key: str
    view: str
    args: dict
    methods: tuple
    title: dict
    caption: dict


def derived_panels(method: Method) -> tuple[PanelRef, ...]:
    """The panels a method's stages imply when its definition lists none (module doc)."""
    engine = {"logp", "logp_old", "logp_behavior"}
    corrections = method.active("correction")
    if corrections:
        if all(set(s.reads) <= engine for s in corrections):
            return (PanelRef("engine_weight", {}),)
        return ()
    refs = []
    if set(method.advantage.reads) <= {"rewards", "group"}:
        refs.append(PanelRef("group_advantages", {}))
    if "logp_old" in method.objective.reads:
        refs.append(PanelRef("policy_ratio", {}))
    return tuple(refs)


# ------------------------------------------------------------------------ definitions

_CJK = ("\u3400", "\u9fff")


def _has_cjk(text: str) -> bool:
    return any(_CJK[0] <= ch <= _CJK[1] for ch in text)


_ZH_PUNCT = "，。：；、！？（）《》“”‘’"


def _tidy(text: str, lang: str) -> str:
    """One line; in Chinese, the spaces YAML folding puts at line ends are dropped where
    they fall between two ideographs or next to full-width punctuation."""
    words = text.split()
    if lang != "zh":
        return " ".join(words)
    out = words[0] if words else ""
    for w in words[1:]:
        a, b = out[-1], w[0]
        tight = (_has_cjk(a) and _has_cjk(b)) or a in _ZH_PUNCT or b in _ZH_PUNCT
        out += w if tight else " " + w
    return out


def _texts(raw: dict, where: str, fields: tuple, errors: list) -> dict:
    out = {f: {} for f in fields}
    for lang in LANGS:
        block = raw.get(lang)
        if not isinstance(block, dict):
            errors.append(f"{where}: missing `{lang}` (a mapping with {', '.join(fields)})")
            continue
        extra = set(block) - set(fields)
        if extra:
            errors.append(f"{where}: `{lang}` has unknown key(s) {sorted(extra)}; expected {list(fields)}")
        for f in fields:
            text = block.get(f)
            if not isinstance(text, str) or not text.strip():
                errors.append(f"{where}: missing `{lang}.{f}` (empty or absent)")
            elif text.strip() in PLACEHOLDERS.values():
                errors.append(f"{where}: `{lang}.{f}` is still the placeholder of the template: say what to look at")
            elif lang == "zh" and not _has_cjk(text):
                errors.append(f"{where}: `zh.{f}` has no Chinese characters (untranslated?): {text[:60]!r}")
            else:
                out[f][lang] = _tidy(text, lang)
    return out


def _panel_refs(raw, where: str, errors: list) -> tuple | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        errors.append(f"{where}: `panels` must be a non-empty list of {{view, args}}")
        return ()
    refs = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            item = {"view": item}
        if not isinstance(item, dict) or set(item) - {"view", "args"}:
            errors.append(f"{where}: panel {i} must be a view name or a mapping with `view` and `args`")
            continue
        name, args = item.get("view"), item.get("args") or {}
        if name not in VIEWS:
            near = difflib.get_close_matches(str(name), list(VIEWS), n=3)
            errors.append(f"{where}: panel {i}: unknown view {name!r}" + (f" (did you mean: {', '.join(near)}?)" if near
                                                                           else f"; views: {', '.join(sorted(VIEWS))}"))
            continue
        if not isinstance(args, dict):
            errors.append(f"{where}: panel {i}: `args` must be a mapping")
            continue
        refs.append(PanelRef(name, args))
    return tuple(refs)




def _where(defs_dir: Path, name: str) -> str:
    try:
        return str((defs_dir / f"{name}.yaml").relative_to(HERE.parents[3]))
    except ValueError:
        return str(defs_dir / f"{name}.yaml")


PLACEHOLDERS = {"en": "<what to look at in the figure, in English>", "zh": "<同一句说明，用简体中文>"}


def _family_views(method: Method, files: dict) -> list[str]:
    """The views the figure files of other methods of the same family use (a hint)."""
    out: list[str] = []
    for other in methods.names():
        if other == method.name or other not in files or methods.get(other).card.family != method.card.family:
            continue
        data = _load_yaml(files[other], [])
        for p in (data or {}).get("panels") or []:
            v = p.get("view") if isinstance(p, dict) else p
            if isinstance(v, str) and v in VIEWS and v not in out:
                out.append(v)
        if data is not None and data.get("panels") is None:
            out.extend(r.view for r in derived_panels(methods.get(other)) if r.view not in out)
    return out


def missing_message(name: str, defs_dir: Path, files: dict) -> str:
    """What a method author adds for a method without a figure: the file, its content
    (ready to paste), the views to choose from, and how to check it."""
    m = methods.get(name)
    path = _where(defs_dir, name)
    derived = [r.view for r in derived_panels(m)]
    lines = [f"method {name!r} has no figure: write {path} with", f"      method: {name}"]
    if derived:
        lines.append(f"      # no `panels`: derived from its stages as [{', '.join(derived)}]; list them only to change that")
    else:
        hint = _family_views(m, files)
        lines += ["      panels:   # required: nothing can be derived from its stages (module doc of learn/figures)",
                  f"        - view: {hint[0] if hint else 'VIEW'}"
                  + (f"   # used by other {m.card.family} methods: {', '.join(hint)}" if hint else "")]
    lines += [f"      en: {{caption: \"{PLACEHOLDERS['en']}\"}}", f"      zh: {{caption: \"{PLACEHOLDERS['zh']}\"}}",
              "    and replace both captions (the placeholders are refused). Views: " + ", ".join(sorted(VIEWS)) + ";",
              "    if none shows what the method does, register one with @view(\"name\") in "
              "src/policylab/learn/figures/views_<kind>.py, calling the method's own stage or loss.",
              f"    Check: .venv/bin/python -m pytest -q tests/learn/test_figures.py -k {name}; "
              f".venv/bin/policylab explain {name} --plot /tmp/{name}.svg. Walk-through: docs/adding-a-method.md, step 5."]
    return "\n".join(lines)


def definitions(names: list[str] | None = None, *, defs_dir: Path | str | None = None,
                complete: bool = True) -> dict[str, FigureDef]:
    """{method: FigureDef} for `names` (default: every registered method), validated.
    A method without a file is an error (`complete`), or left out (`complete=False`)."""
    defs_dir = Path(defs_dir) if defs_dir is not None else DEFS_DIR
    wanted = [methods.get(n).name for n in names] if names is not None else methods.names()
    files = {p.stem: p for p in sorted(defs_dir.glob("*.yaml"))} if defs_dir.is_dir() else {}
    errors: list[str] = []
    if names is None:
        for stem in sorted(set(files) - set(methods.REGISTRY)):
            errors.append(f"{files[stem].name}: figure definition for unknown method {stem!r}")
    out = {}
    for name in wanted:
        if name not in files:
            if complete:
                errors.append(missing_message(name, defs_dir, files))
            continue
        data = _load_yaml(files[name], errors)
        if data is None:
            continue
        where = f"{files[name].name} (method {name})"
        if data.get("method") != name:
            errors.append(f"{where}: `method: {data.get('method')}` does not match the file name")
        extra = set(data) - {"method", "panels", "en", "zh"}
        if extra:
            errors.append(f"{where}: unknown top-level key(s) {sorted(extra)}")
        caption = _texts(data, where, ("caption",), errors)["caption"]
        panels = _panel_refs(data.get("panels"), where, errors)
        if panels is None and not derived_panels(methods.get(name)):
            errors.append(f"{where}: no panel can be derived from the stages of {name}; list `panels`")
        out[name] = FigureDef(name, panels, caption, files[name].name)
    if errors:
        raise FigureError(errors)
    return out


def check_complete(*, defs_dir: Path | str | None = None) -> None:
    """Raise FigureError naming every registered method without a valid definition."""
    definitions(None, defs_dir=defs_dir, complete=True)


def overlay_defs(path: Path | str | None = None) -> list[OverlayDef]:
    path = Path(path) if path is not None else OVERLAYS_PATH
    errors: list[str] = []
    if not path.exists():
        return []
    data = _load_yaml(path, errors) or {}
    out, seen = [], set()
    for i, raw in enumerate(data.get("overlays") or []):
        where = f"{path.name}: overlay {i}"
        if not isinstance(raw, dict):
            errors.append(f"{where}: must be a mapping")
            continue
        key = raw.get("id")
        where = f"{path.name}: overlay {key!r}"
        if not isinstance(key, str) or not key.replace("-", "").isalnum() or key in seen:
            errors.append(f"{where}: `id` must be a unique name of letters, digits and dashes")
        seen.add(key)
        extra = set(raw) - {"id", "view", "args", "methods", "en", "zh"}
        if extra:
            errors.append(f"{where}: unknown key(s) {sorted(extra)}")
        refs = _panel_refs([{"view": raw.get("view"), "args": raw.get("args") or {}}], where, errors)
        ms = raw.get("methods")
        if not isinstance(ms, list) or len(ms) < 2:
            errors.append(f"{where}: `methods` must list at least two methods")
            ms = []
        for m in ms:
            if m not in methods.REGISTRY:
                errors.append(f"{where}: unknown method {m!r}")
        texts = _texts(raw, where, ("title", "caption"), errors)
        if refs:
            out.append(OverlayDef(key, refs[0].view, refs[0].args, tuple(ms), texts["title"], texts["caption"]))
    if errors:
        raise FigureError(errors)
    return out


# ---------------------------------------------------------------------------- building


def resolved(name: str) -> Method:
    """The registered method with its defaults resolved against RUN."""
    return methods.get(name).with_params(run=RUN)


def _call(ref: PanelRef, method: Method, where: str) -> list[Panel]:
    try:
        panels = VIEWS[ref.view](method, **ref.args)
    except PolicylabError as exc:
        raise FigureError([f"{where}: view {ref.view!r} failed for {method.name}: {exc}"]) from exc
    except (TypeError, ValueError, RuntimeError) as exc:
        raise FigureError([f"{where}: view {ref.view!r} failed for {method.name}: {type(exc).__name__}: {exc}"]) from exc
    if not panels or not all(isinstance(p, Panel) for p in panels):
        raise FigureError([f"{where}: view {ref.view!r} returned no panels for {method.name}"])
    return panels


def figure(name: str, *, defs_dir: Path | str | None = None, definition: FigureDef | None = None) -> Figure:
    """The figure of a registered method, computed now."""
    d = definition or definitions([name], defs_dir=defs_dir)[methods.get(name).name]
    m = resolved(d.method)
    refs = d.panels if d.panels is not None else derived_panels(m)
    panels = [p for ref in refs for p in _call(ref, m, d.file)]
    title = T(f"{m.name}: {m.card.title}")
    return Figure(m.name, title, d.caption, panels, (m.name,))


def overlay(key: str | OverlayDef, *, path: Path | str | None = None) -> Figure:
    """Several methods' curves from the same view on shared axes: a method's own curves are
    labelled with its name, reference curves (e.g. the host alone) are kept once."""
    if isinstance(key, OverlayDef):
        d = key
    else:
        found = {o.key: o for o in overlay_defs(path)}
        if key not in found:
            raise FigureError([f"unknown overlay {key!r}; overlays: {', '.join(found) or '(none)'}"])
        d = found[key]
    merged: list[Panel] | None = None
    sources: list[list[str]] = []
    for g, name in enumerate(d.methods):
        m = resolved(name)
        panels = _call(PanelRef(d.view, d.args), m, f"overlay {d.key}")
        if merged is None:
            merged = [dataclasses.replace(p, series=[], marks=[]) for p in panels]
        if len(panels) != len(merged):
            raise FigureError([f"overlay {d.key}: view {d.view} gives {name} {len(panels)} panels, "
                               f"{d.methods[0]} {len(merged)}"])
        sources.append([p.source for p in panels])
        for target, p in zip(merged, panels):
            own = [s for s in p.series if not s.reference]
            for s in p.series:
                if s.reference:
                    if all(r.label != s.label for r in target.series if r.reference):
                        target.series.append(s)
                    continue
                label = T(name) if len(own) == 1 else {lang: f"{name}: {s.label[lang]}" for lang in LANGS}
                target.series.append(dataclasses.replace(s, label=label, group=g))
    for i, p in enumerate(merged or []):  # reference curves last, so each method keeps its colour across panels
        p.series.sort(key=lambda s: s.reference)
        p.source = "; ".join(dict.fromkeys(src[i] for src in sources))
    return Figure(d.key, d.title, d.caption, merged or [], d.methods)


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


from policylab.learn.figures import (
    views_advantages,
    views_corrections,
    views_geometry,
    views_mixed,
    views_sequence as views_more,
    views_objectives,
    views_pipelines,
    views_rewards,
    views_rich_rewards as views_rewards_more,
    views_testtime,
)  # noqa: E402,F401  (register the views)
