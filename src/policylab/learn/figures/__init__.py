"""Live figures of the methods: the curves are computed when they are drawn (site build,
`policylab explain NAME --plot FILE`) by calling the library's own kernels, and the
methods' own stages and loss, on a grid. Nothing is drawn by hand.

    figure(name)         -> Figure        a registered method's figure (its panels' data)
    overlay(key)         -> Figure        several methods' curves on the same axes
    overlay_defs()       -> [OverlayDef]  the natural comparisons (overlays.yaml)
    check_complete()     raises FigureError naming every shipped method without a figure
    render.svg(fig, lang) -> str          the SVG (text kept as text), caption and alt text

Definitions. Every method the project ships has `learn/figures/defs/<method>.yaml`:

    method: tis
    panels:                       # optional: without it the panels are derived from the stages
      - view: engine_weight       # a name in VIEWS (learn/figures/views_*.py)
        args: {p_old: [0.1]}      # keyword arguments of the view (plain values)
    en: {caption: "What to look at, in English."}
    zh: {caption: "看什么（简体中文）。"}

Without `panels`, `derived_panels(method)` reads the spec: the engine-weight view for a
method whose corrections read only the engine roles, otherwise the group-advantage view
for an estimator that reads only rewards and groups and the policy-ratio view for an
objective with a ratio (one that reads `logp_old`). A method the project ships without a
definition fails the site build (and `tests/learn/test_shipped_lessons.py`) with a message
naming it and the file to write; a method registered elsewhere without one has no
lesson yet, and the site draws no figure for it (`learn.lessons`).

Views. A view is `fn(method, **args) -> [Panel]`, registered with `@view("name")`; it
calls the method's stages (`method.advantage.fn`, reward stages, round stages) or its
policy loss (`methods.loss.policy_loss` with `methods.loss.tensor_inputs`, autograd
through the real objective x corrections) and returns the curves with bilingual labels.
The same view applied to several methods gives an overlay (`overlays.yaml`).

Modules: `model` (Figure, Panel, Series, Mark, T, the `view` registry, alt text),
`definitions` (the YAML definitions and overlays), `build` (figure, overlay), `render`
(SVG / PNG / PDF), `common` (what the views share), `views_*` (the views). This package
only re-exports their names for callers.
"""

from policylab.learn.figures.build import figure, overlay, resolved
from policylab.learn.figures.definitions import (
    DEFS_DIR,
    OVERLAYS_PATH,
    PLACEHOLDERS,
    FigureDef,
    OverlayDef,
    check_complete,
    definitions,
    derived_panels,
    has_definition,
    missing_message,
    overlay_defs,
)
from policylab.learn.figures.model import (
    LANGS,
    RUN,
    VIEWS,
    Figure,
    FigureError,
    Mark,
    Panel,
    PanelRef,
    Series,
    T,
    alt_text,
    series_id,
    view,
)

__all__ = ["DEFS_DIR", "LANGS", "OVERLAYS_PATH", "PLACEHOLDERS", "RUN", "VIEWS", "Figure", "FigureDef", "FigureError",
           "Mark", "OverlayDef", "Panel", "PanelRef", "Series", "T", "alt_text", "check_complete", "definitions",
           "derived_panels", "figure", "has_definition", "missing_message", "overlay", "overlay_defs", "resolved", "series_id", "view"]
