"""The question format the bank, the topics and the metric bank share: the data classes,
how a value is shown, and how one question is validated, its worked example run and its
`{placeholders}` filled with the numbers the example returned.

    parse_question(raw, file, owners, examples, errors, topic) -> Question | None
    render_value(v, lang) / fill(text, values, lang)            the live numbers in the text
    load_yaml(path, errors)                                      a YAML mapping, or None

Every problem is appended to `errors` (one line naming the file, the method and the
question); the callers raise them all at once as a `BankError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from policylab import methods
from policylab.errors import PolicylabError
from policylab.methods.spec import Method

CATEGORIES = ("basics", "mechanism", "comparison", "implementation")
LANGS = ("en", "zh")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_CJK = re.compile(r"[\u3400-\u9fff]")
_Q_KEYS = {"id", "category", "compare_with", "en", "zh", "example", "boundary"}
# the three parts of an answer's boundary, in the order they are shown
BOUNDARY_PARTS = ("shows", "not_shown", "needs")
BOUNDARY_LABELS = {
    "en": {"title": "Boundary", "shows": "What the example shows", "not_shown": "What it does not show",
           "needs": "What the full result would need"},
    "zh": {"title": "边界", "shows": "本例说明了", "not_shown": "本例没有说明", "needs": "完整结论还需要"},
}
# a number typed into prose (not a digit inside a name such as k3 or SmolLM2)
_TYPED_NUMBER = re.compile(r"(?<![A-Za-z0-9_@.])\d+(?:[.,]\d+)?(?![A-Za-z0-9_])")


class BankError(PolicylabError):
    """The bank does not build; `errors` holds one message per problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__(f"the question bank does not build ({len(errors)} problem(s)):\n"
                         + "\n".join(f"  - {e}" for e in self.errors))


@dataclass(frozen=True)
class Example:
    function: str
    args: dict
    values: dict  # exactly what the example function returned (plain values)
    text: dict  # lang -> the example sentence with its placeholders filled


@dataclass(frozen=True)
class Question:
    id: str
    category: str
    methods: tuple  # (method,) for a bank question, (a, b) for a topics question
    compare_with: str | None
    question: dict  # lang -> text
    answer: dict  # lang -> text
    example: Example
    file: str
    # lang -> {shows, not_shown, needs}: what the worked example shows, what it does not,
    # and what the full result would need (the question's own, or its file's)
    boundary: dict = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class MethodEntry:
    name: str
    method: Method
    questions: tuple  # of Question, in CATEGORIES order
    file: str

    @property
    def card(self):
        return self.method.card


@dataclass(frozen=True)
class ReadingStep:
    topic: dict  # lang -> title
    methods: tuple
    why: dict  # lang -> text


@dataclass(frozen=True)
class Topics:
    reading_order: tuple = ()
    questions: tuple = ()


# ------------------------------------------------------------------------- rendering


def render_value(v: Any, lang: str = "en") -> str:
    """A returned value as shown to the reader: floats with 4 decimals (|x| < 1e-12 is
    float noise and shows as 0.0000; other |x| < 5e-5, and |x| >= 1e6, in 4 significant
    digits, e.g. 3e-05), lists element-wise, bools as true/false (是/否), None as none (无)."""
    if isinstance(v, bool):
        return ("true" if v else "false") if lang == "en" else ("是" if v else "否")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if abs(v) >= 1e6 or 1e-12 <= abs(v) < 5e-5:
            return f"{v:.4g}"
        s = f"{v:.4f}"
        return "0.0000" if s == "-0.0000" else s
    if isinstance(v, str):
        return v
    if v is None:
        return "none" if lang == "en" else "无"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(render_value(x, lang) for x in v) + "]"
    raise TypeError(f"cannot render a value of type {type(v).__name__}")


def _is_plain(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, (list, tuple)) and all(_is_plain(x) for x in v)


def placeholders(text: str) -> list[str]:
    """The `{name}` placeholders of a text (other braces are literal)."""
    return _PLACEHOLDER.findall(text)


def fill(text: str, values: Mapping[str, Any], lang: str) -> str:
    """`text` with every `{name}` replaced by the rendered `values[name]`."""
    return _PLACEHOLDER.sub(lambda m: render_value(values[m.group(1)], lang), text)


# --------------------------------------------------------------------------- parsing


def default_examples(examples):
    """`examples` when given (a test's own functions), else the package's registered
    worked examples (`learn.examples.EXAMPLES`, every example module imported)."""
    if examples is not None:
        return examples
    from policylab.learn.examples import EXAMPLES

    return EXAMPLES


def bilingual_texts(raw: dict, where: str, fields: tuple, errors: list) -> dict:
    """{lang: {field: text}}; a missing or empty translation is an error naming it."""
    out = {}
    for lang in LANGS:
        block = raw.get(lang)
        if not isinstance(block, dict):
            errors.append(f"{where}: missing translation `{lang}` (a mapping with {', '.join(fields)})")
            continue
        extra = set(block) - set(fields)
        if extra:
            errors.append(f"{where}: `{lang}` has unknown key(s) {sorted(extra)}; expected {list(fields)}")
        out[lang] = {}
        for f in fields:
            text = block.get(f)
            if not isinstance(text, str) or not text.strip():
                errors.append(f"{where}: missing translation `{lang}.{f}` (empty or absent)")
            elif lang == "zh" and not _CJK.search(text):
                errors.append(f"{where}: `zh.{f}` has no Chinese characters (untranslated?): {text[:60]!r}")
            else:
                out[lang][f] = text
    return out


def _run_example(ex: Any, where: str, examples: Mapping[str, Callable], errors: list):
    """(function, args, values, {lang: text}) or None after recording the problem."""
    if not isinstance(ex, dict):
        errors.append(f"{where}: `example` is missing (a mapping with function, args, en, zh)")
        return None
    extra = set(ex) - {"function", "args", "en", "zh"}
    if extra:
        errors.append(f"{where}: example has unknown key(s) {sorted(extra)}")
    fname, args = ex.get("function"), ex.get("args") or {}
    texts = {lang: ex.get(lang) for lang in LANGS}
    for lang, t in texts.items():
        if not isinstance(t, str) or not t.strip():
            errors.append(f"{where}: missing translation `example.{lang}` (empty or absent)")
        elif lang == "zh" and not _CJK.search(t):
            errors.append(f"{where}: `example.zh` has no Chinese characters (untranslated?): {t[:60]!r}")
    if not isinstance(args, dict):
        errors.append(f"{where}: example args must be a mapping of keyword arguments, got {type(args).__name__}")
        return None
    if fname not in examples:
        near = difflib.get_close_matches(str(fname), list(examples), n=3)
        hint = f" Did you mean: {', '.join(near)}?" if near else ""
        errors.append(f"{where}: example function {fname!r} is not in learn.examples.EXAMPLES.{hint}")
        return None
    try:
        values = examples[fname](**args)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a build error
        errors.append(f"{where}: example function {fname!r} raised {type(exc).__name__}: {exc}")
        return None
    if not isinstance(values, dict):
        errors.append(f"{where}: example function {fname!r} returned {type(values).__name__}, not a dict")
        return None
    bad = sorted(k for k, v in values.items() if not _is_plain(v))
    if bad:
        errors.append(f"{where}: example function {fname!r} returned non-plain value(s) for {bad} "
                      "(use float, int, str, bool or lists of them)")
        return None
    return fname, dict(args), values, texts


def _check_placeholders(where: str, named_texts: dict, values: dict, fname: str, errors: list) -> bool:
    ok = True
    for label, text in named_texts.items():
        for name in placeholders(text or ""):
            if name not in values:
                near = difflib.get_close_matches(name, list(values), n=3)
                hint = f" (did you mean {', '.join(near)}?)" if near else f" (it returns: {', '.join(sorted(values))})"
                errors.append(f"{where}: placeholder {{{name}}} in `{label}` is not returned by {fname!r}{hint}")
                ok = False
    return ok


def parse_boundary(raw: Any, where: str, errors: list) -> dict | None:
    """A boundary block {en: {shows, not_shown, needs}, zh: {...}}, validated: all three
    parts in both languages, the Chinese with Chinese characters, and no placeholder or
    typed-in number (a boundary says in words what the example does and does not show;
    numbers come from the example). Returns {lang: {part: text}} or None after recording
    the problems."""
    if not isinstance(raw, dict):
        errors.append(f"{where}: `boundary` must be a mapping with en and zh, each with "
                      f"{', '.join(BOUNDARY_PARTS)}, got {type(raw).__name__}")
        return None
    extra = set(raw) - set(LANGS)
    if extra:
        errors.append(f"{where}: `boundary` has unknown key(s) {sorted(extra)}; expected {list(LANGS)}")
    n = len(errors)
    texts = bilingual_texts(raw, f"{where}, boundary", BOUNDARY_PARTS, errors)
    for lang, parts in texts.items():
        for part, text in parts.items():
            if placeholders(text):
                errors.append(f"{where}, boundary: `{lang}.{part}` has a placeholder {{{placeholders(text)[0]}}}; "
                              "a boundary is the same for every example of its file: say it in words")
            m = _TYPED_NUMBER.search(text)
            if m:
                errors.append(f"{where}, boundary: `{lang}.{part}` types in the number {m.group(0)!r}; numbers "
                              "come from the worked example, a boundary says in words what it does and does not show")
    if len(errors) > n:
        return None
    return {lang: dict(parts) for lang, parts in texts.items()}


MISSING_BOUNDARY = ("missing `boundary` (what the worked example shows, what it does not show, what the full "
                    "result would need; en and zh): give it in the question or once at the top of its file")


def parse_question(raw: Any, file: str, owners: tuple, examples, errors: list, topic: bool,
                   boundary: Any = None) -> Question | None:
    """One question of `file` (owned by `owners`), with its example run and text filled.
    `boundary`: the file's boundary block, used when the question has none of its own
    (one of the two is required)."""
    where = f"{file} ({'topics' if topic else 'method ' + owners[0]})"
    if not isinstance(raw, dict):
        errors.append(f"{where}: a question must be a mapping, got {type(raw).__name__}")
        return None
    qid = raw.get("id")
    where = f"{where}, question {qid!r}"
    allowed = _Q_KEYS | ({"methods"} if topic else set())
    extra = set(raw) - allowed
    if extra:
        errors.append(f"{where}: unknown key(s) {sorted(extra)}; allowed: {sorted(allowed)}")
    cat, cw = raw.get("category"), raw.get("compare_with")
    if cat not in CATEGORIES:
        errors.append(f"{where}: category {cat!r} is not one of {', '.join(CATEGORIES)}")
    if topic and cat != "comparison":
        errors.append(f"{where}: topics questions have category `comparison`, got {cat!r}")
    if cat == "comparison" and not topic:
        if cw not in methods.REGISTRY:
            errors.append(f"{where}: compare_with {cw!r} is not a registered method" + near_methods(cw))
        elif cw in owners:
            errors.append(f"{where}: compare_with names the method itself ({cw!r})")
    elif cw is not None and not topic:
        errors.append(f"{where}: compare_with is only for comparison questions (got {cw!r})")
    texts = bilingual_texts(raw, where, ("question", "answer"), errors)
    own = raw.get("boundary")
    if own is None and boundary is None:
        errors.append(f"{where}: {MISSING_BOUNDARY}")
        bounds = None
    else:
        bounds = parse_boundary(own if own is not None else boundary, where, errors)
    ran = _run_example(raw.get("example"), where, examples, errors)
    if (bounds is None or ran is None or cat not in CATEGORIES or len(texts) != len(LANGS)
            or any(len(t) != 2 for t in texts.values())):
        return None
    fname, args, values, ex_texts = ran
    named = {f"{lang}.{f}": texts[lang][f] for lang in LANGS for f in ("question", "answer")}
    named.update({f"example.{lang}": ex_texts[lang] for lang in LANGS})
    if not _check_placeholders(where, named, values, fname, errors) or not all(ex_texts.values()):
        return None
    return Question(
        id=qid, category=cat, methods=owners, compare_with=cw,
        question={lang: fill(texts[lang]["question"], values, lang) for lang in LANGS},
        answer={lang: fill(texts[lang]["answer"], values, lang) for lang in LANGS},
        example=Example(fname, args, values, {lang: fill(ex_texts[lang], values, lang) for lang in LANGS}),
        file=file,
        boundary=bounds,
    )


def near_methods(name) -> str:
    """A ` (did you mean: ...?)` hint of registered method names close to `name`, or ""."""
    near = difflib.get_close_matches(str(name), methods.names(), n=3, cutoff=0.4)
    return f" (did you mean: {', '.join(near)}?)" if near else ""


def load_yaml(path: Path, errors: list):
    """The YAML mapping in `path`, or None after appending the problem (invalid YAML, or
    a top level that is not a mapping) to `errors`."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        errors.append(f"{path.name}: not valid YAML: {exc}")
        return None
    if not isinstance(data, dict):
        errors.append(f"{path.name}: the top level must be a mapping")
        return None
    return data


def check_lang(lang):
    """Refuse a language other than None (both), "en" or "zh"."""
    if lang is not None and lang not in LANGS:
        raise PolicylabError(f"language must be one of {', '.join(LANGS)}, got {lang!r}")


def in_lang(q: Question, lang) -> Question:
    """`q` with only `lang` kept in its texts (`lang` None: both, unchanged)."""
    if lang is None:
        return q
    ex = dataclasses.replace(q.example, text={lang: q.example.text[lang]})
    return dataclasses.replace(q, question={lang: q.question[lang]}, answer={lang: q.answer[lang]}, example=ex,
                               boundary={lang: q.boundary[lang]} if lang in q.boundary else {})
