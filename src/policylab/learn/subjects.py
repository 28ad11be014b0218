"""What the learning layer can be asked about, and how a name typed by a reader finds it.

    resolve(name) -> Subject     a registered method, a literature-only card or a metric
    subjects()    -> [Subject]   all of them, methods first

A subject is one of three kinds:

    method      a registered method (`policylab.methods`): card, formulas, figure, lesson
    literature  a literature-only card (`methods.registry.LITERATURE`, e.g. orl): nothing
                of it runs; its lesson says what it is and why policylab does not run it
    metric      an evaluation measurement: the metric cards of `policylab.eval.cards`
                (sharpening_tax, calib_rl) and pass@k, the kernel of `policylab eval
                --metrics pass@k` (`kernels.metrics.pass_at_k`), whose numbers the
                sharpening-tax card reports

`resolve` accepts any case and `-`/space for `_` ("DAPO", "Dr-GRPO", "calibration",
"pass@k"), the aliases of `policylab eval --metrics`, an import path "pkg.mod:OBJECT" and
an installed entry point (both through `methods.get`); anything else raises
`UnknownMethodError` with the closest names ("did you mean: dapo?").
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from policylab import methods
from policylab.learn.index import norm
from policylab.methods.registry import UnknownMethodError

KINDS = ("method", "literature", "metric")
# the metric without a card of its own: the unbiased estimator behind the sharpening tax
PASS_AT_K = "pass_at_k"


@dataclass(frozen=True)
class Subject:
    kind: str  # method | literature | metric
    name: str  # the canonical name (registry key, literature key, metric name)


def metric_names() -> list[str]:
    """The metric subjects: every metric card, and pass@k."""
    from policylab.eval.cards import metric_names as cards

    return sorted(set(cards()) | {PASS_AT_K})


def _aliases() -> dict[str, str]:
    """`policylab eval --metrics` names -> metric subject (pass@k, calibration, ...)."""
    from policylab.eval.suite import ALIASES

    return {alias: (PASS_AT_K if target == "pass@k" else target) for alias, target in ALIASES.items()}


def subjects() -> list[Subject]:
    return ([Subject("method", n) for n in methods.names()]
            + [Subject("literature", n) for n in methods.registry.literature_names()]
            + [Subject("metric", n) for n in metric_names()])


_norm = norm


def catalogue() -> dict[str, Subject]:
    """Normalized spelling -> subject (every canonical name and every metric alias)."""
    out = {_norm(s.name): s for s in subjects()}
    for alias, target in _aliases().items():
        out.setdefault(_norm(alias), Subject("metric", target))
    return out


def resolve(name) -> Subject:
    """The subject `name` denotes, in any case (module doc); an unknown name raises
    UnknownMethodError naming up to three close matches."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownMethodError(f"a method name must be a non-empty string, got {name!r}. "
                                 "`policylab methods` lists them all.")
    if ":" in name:  # an import path: methods.get imports it (and says why when it cannot)
        return Subject("method", methods.get(name).name)
    cat = catalogue()
    key = _norm(name)
    if key in cat:
        return cat[key]
    if name in methods.registry.entry_points():
        return Subject("method", methods.get(name).name)
    near = list(dict.fromkeys(cat[k].name for k in difflib.get_close_matches(key, list(cat), n=5, cutoff=0.5)))[:3]
    hint = f" Did you mean: {', '.join(near)}?" if near else ""
    raise UnknownMethodError(f"unknown method {name!r}.{hint} `policylab methods` lists the methods, the "
                             "literature-only cards and the metrics.")
