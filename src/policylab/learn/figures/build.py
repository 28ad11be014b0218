"""Building a figure now: a method's definition (or an overlay's) is resolved into panels
by calling its views on the registered method with its defaults resolved against `RUN`.

    figure(name)   -> Figure   a registered method's figure
    overlay(key)   -> Figure   several methods' curves from one view on shared axes
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from policylab import methods
from policylab.errors import PolicylabError
from policylab.learn.figures.definitions import FigureDef, OverlayDef, definitions, derived_panels, overlay_defs
from policylab.learn.figures.model import LANGS, RUN, VIEWS, Figure, FigureError, Panel, PanelRef, T
from policylab.methods.spec import Method


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
