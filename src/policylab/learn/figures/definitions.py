"""The figure definitions: `learn/figures/defs/<method>.yaml` (what each method's figure
shows, its caption in both languages) and `learn/figures/overlays.yaml` (several methods
through one view), validated strictly; every problem is collected into one `FigureError`.
The format is described in the package's docstring (`policylab.learn.figures`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from policylab import methods
import policylab.learn.figures.all_views  # noqa: F401  (the views a definition may name)
from policylab.learn.figures.model import LANGS, VIEWS, FigureError, PanelRef
from policylab.learn.lessons import is_shipped
from policylab.learn.questions import load_yaml
from policylab.methods.spec import Method

HERE = Path(__file__).resolve().parent
DEFS_DIR = HERE / "defs"
OVERLAYS_PATH = HERE / "overlays.yaml"


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
        data = load_yaml(files[other], [])
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
              f"    Check: .venv/bin/python -m pytest -q tests/learn/test_shipped_lessons.py -k {name}; "
              f".venv/bin/policylab explain {name} --plot /tmp/{name}.svg. Walk-through: docs/adding-a-method.md, step 5."]
    return "\n".join(lines)


def _definition(name: str, path: Path, errors: list) -> FigureDef | None:
    """The definition of `name` in `path`, validated (problems appended to `errors`)."""
    data = load_yaml(path, errors)
    if data is None:
        return None
    where = f"{path.name} (method {name})"
    if data.get("method") != name:
        errors.append(f"{where}: `method: {data.get('method')}` does not match the file name")
    extra = set(data) - {"method", "panels", "en", "zh"}
    if extra:
        errors.append(f"{where}: unknown top-level key(s) {sorted(extra)}")
    caption = _texts(data, where, ("caption",), errors)["caption"]
    panels = _panel_refs(data.get("panels"), where, errors)
    if panels is None and not derived_panels(methods.get(name)):
        errors.append(f"{where}: no panel can be derived from the stages of {name}; list `panels`")
    return FigureDef(name, panels, caption, path.name)


def definitions(names: list[str] | None = None, *, defs_dir: Path | str | None = None,
                complete: bool = True) -> dict[str, FigureDef]:
    """{method: FigureDef} for `names` (default: every registered method), validated.
    complete: a method without a file is an error when `names` lists it or the project
    ships it (`learn.lessons`); a method registered elsewhere without one is left out (it
    has no lesson yet), and with complete=False every method without a file is."""
    defs_dir = Path(defs_dir) if defs_dir is not None else DEFS_DIR
    wanted = [methods.get(n).name for n in names] if names is not None else methods.names()
    files = {p.stem: p for p in sorted(defs_dir.glob("*.yaml"))} if defs_dir.is_dir() else {}
    errors: list[str] = []
    if names is None:
        for stem in sorted(set(files) - set(methods.REGISTRY)):
            errors.append(f"{files[stem].name}: figure definition for unknown method {stem!r}")
    out = {}
    for name in wanted:
        if name in files:
            d = _definition(name, files[name], errors)
            if d is not None:
                out[name] = d
        elif complete and (names is not None or is_shipped(name)):
            errors.append(missing_message(name, defs_dir, files))
    if errors:
        raise FigureError(errors)
    return out


def has_definition(name: str, *, defs_dir: Path | str | None = None) -> bool:
    """Whether the registered method `name` has a figure definition file."""
    defs_dir = Path(defs_dir) if defs_dir is not None else DEFS_DIR
    return (defs_dir / f"{methods.get(name).name}.yaml").is_file()


def check_complete(*, defs_dir: Path | str | None = None) -> None:
    """Raise FigureError naming every shipped method without a valid definition (and every
    definition of an unknown method); a method registered elsewhere needs none."""
    definitions(None, defs_dir=defs_dir, complete=True)


def overlay_defs(path: Path | str | None = None) -> list[OverlayDef]:
    path = Path(path) if path is not None else OVERLAYS_PATH
    errors: list[str] = []
    if not path.exists():
        return []
    data = load_yaml(path, errors) or {}
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
