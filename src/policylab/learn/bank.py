"""The question bank: load `learn/bank/*.yaml` and `learn/topics.yaml`, validate them
strictly, run every worked example and fill the `{placeholders}` with the live numbers.

    build_bank(lang=None)  -> [MethodEntry]   one per registered method, four questions each
    topics(lang=None)      -> Topics          reading order + cross-method questions

Every problem found is collected and raised at once as a `BankError`, one line per
problem, each naming the file, the method and the question (see LEARN_FORMAT.md for the
format). Numbers are never typed into the prose: a changed kernel changes the text, and a
kernel that starts raising breaks the build. What a method is made of (its kernels, their
equations, the comparison table) is read from the code in `learn.anatomy`.
"""

from __future__ import annotations

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

HERE = Path(__file__).resolve().parent
BANK_DIR = HERE / "bank"
TOPICS_PATH = HERE / "topics.yaml"
CATEGORIES = ("basics", "mechanism", "comparison", "implementation")
LANGS = ("en", "zh")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_CJK = re.compile(r"[\u3400-\u9fff]")
_Q_KEYS = {"id", "category", "compare_with", "en", "zh", "example"}


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


def _examples(examples):
    if examples is not None:
        return examples
    from policylab.learn.examples import EXAMPLES

    return EXAMPLES


def _texts(raw: dict, where: str, fields: tuple, errors: list) -> dict:
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


def _parse_question(raw: Any, file: str, owners: tuple, examples, errors: list, topic: bool) -> Question | None:
    """One question of `file` (owned by `owners`), with its example run and text filled."""
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
            errors.append(f"{where}: compare_with {cw!r} is not a registered method" + _near(cw))
        elif cw in owners:
            errors.append(f"{where}: compare_with names the method itself ({cw!r})")
    elif cw is not None and not topic:
        errors.append(f"{where}: compare_with is only for comparison questions (got {cw!r})")
    texts = _texts(raw, where, ("question", "answer"), errors)
    ran = _run_example(raw.get("example"), where, examples, errors)
    if ran is None or cat not in CATEGORIES or len(texts) != len(LANGS) or any(len(t) != 2 for t in texts.values()):
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
    )


def _near(name) -> str:
    near = difflib.get_close_matches(str(name), methods.names(), n=3, cutoff=0.4)
    return f" (did you mean: {', '.join(near)}?)" if near else ""


def _load_yaml(path: Path, errors: list):
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        errors.append(f"{path.name}: not valid YAML: {exc}")
        return None
    if not isinstance(data, dict):
        errors.append(f"{path.name}: the top level must be a mapping")
        return None
    return data


# ------------------------------------------------------------------------ method files


def _parse_method_file(path: Path, examples, errors: list) -> MethodEntry | None:
    data = _load_yaml(path, errors)
    if data is None:
        return None
    name, file = path.stem, path.name
    if data.get("method") != name:
        errors.append(f"{file}: `method: {data.get('method')}` does not match the file name (expected `method: {name}`)")
    extra = set(data) - {"method", "questions"}
    if extra:
        errors.append(f"{file} (method {name}): unknown top-level key(s) {sorted(extra)}")
    raw = data.get("questions")
    if not isinstance(raw, list):
        errors.append(f"{file} (method {name}): `questions` must be a list of four questions")
        return None
    cats = [q.get("category") for q in raw if isinstance(q, dict)]
    if len(raw) != len(CATEGORIES) or sorted(map(str, cats)) != sorted(CATEGORIES):
        missing = [c for c in CATEGORIES if c not in cats]
        dup = sorted({str(c) for c in cats if cats.count(c) > 1})
        errors.append(f"{file} (method {name}): needs exactly four questions, one per category "
                      f"({', '.join(CATEGORIES)}); has {len(raw)}"
                      + (f", missing {missing}" if missing else "") + (f", repeated {dup}" if dup else ""))
    questions = []
    for q in raw:
        if isinstance(q, dict) and q.get("category") in CATEGORIES and q.get("id") != f"{name}-{q['category']}":
            errors.append(f"{file} (method {name}), question {q.get('id')!r}: id must be `{name}-{q['category']}`")
        parsed = _parse_question(q, file, (name,), examples, errors, topic=False)
        if parsed is not None:
            questions.append(parsed)
    questions.sort(key=lambda q: CATEGORIES.index(q.category))
    return MethodEntry(name, methods.get(name), tuple(questions), file)


def _check_lang(lang):
    if lang is not None and lang not in LANGS:
        raise PolicylabError(f"language must be one of {', '.join(LANGS)}, got {lang!r}")


def _in_lang(q: Question, lang) -> Question:
    if lang is None:
        return q
    import dataclasses

    ex = dataclasses.replace(q.example, text={lang: q.example.text[lang]})
    return dataclasses.replace(q, question={lang: q.question[lang]}, answer={lang: q.answer[lang]}, example=ex)


def build_bank(lang: str | None = None, *, bank_dir: Path | str | None = None,
               examples: Mapping[str, Callable] | None = None, only: list[str] | None = None,
               complete: bool = True) -> list[MethodEntry]:
    """Every method's four questions, validated and rendered with live numbers.

    lang: None keeps both languages in each text dict, "en"/"zh" keeps one (both are
    always validated). bank_dir / examples: injectable for tests (default: the package's
    `learn/bank/` and `learn.examples.EXAMPLES`). only: restrict to these methods (each
    must be registered). complete: a method without a bank file is an error; with
    complete=False such methods are left out. Raises `BankError` listing every problem."""
    _check_lang(lang)
    bank_dir = Path(bank_dir) if bank_dir is not None else BANK_DIR
    examples = _examples(examples)
    wanted = [methods.get(n).name for n in only] if only is not None else methods.names()
    errors: list[str] = []
    files = {p.stem: p for p in sorted(bank_dir.glob("*.yaml"))} if bank_dir.is_dir() else {}
    if only is None:
        for p in sorted(bank_dir.glob("*.yml")) if bank_dir.is_dir() else ():
            errors.append(f"{p.name}: bank files end in .yaml")
        for stem in sorted(set(files) - set(methods.REGISTRY)):
            errors.append(f"{stem}.yaml: bank file for unknown method {stem!r}" + _near(stem))
    entries, seen = [], {}
    for name in wanted:
        if name not in files:
            if complete:
                errors.append(f"method {name!r} has no bank file (expected {bank_dir / (name + '.yaml')})")
            continue
        entry = _parse_method_file(files[name], examples, errors)
        if entry is None:
            continue
        for q in entry.questions:
            if q.id in seen:
                errors.append(f"{entry.file}: question id {q.id!r} is also used in {seen[q.id]}")
            seen[q.id] = entry.file
        entries.append(entry)
    if errors:
        raise BankError(errors)
    return [MethodEntry(e.name, e.method, tuple(_in_lang(q, lang) for q in e.questions), e.file) for e in entries]


# ----------------------------------------------------------------------------- topics


def _reading_step(raw: Any, i: int, errors: list) -> ReadingStep | None:
    where = f"topics.yaml, reading_order[{i}]"
    if not isinstance(raw, dict):
        errors.append(f"{where}: must be a mapping with topic, methods, why")
        return None
    extra = set(raw) - {"topic", "methods", "why"}
    if extra:
        errors.append(f"{where}: unknown key(s) {sorted(extra)}")
    out = {}
    for key in ("topic", "why"):
        block = raw.get(key) if isinstance(raw.get(key), dict) else {}
        texts = _texts({lang: {key: block.get(lang)} for lang in LANGS}, where, (key,), errors)
        out[key] = {lang: t[key] for lang, t in texts.items() if key in t}
    ms = raw.get("methods")
    if not isinstance(ms, list) or not ms:
        errors.append(f"{where}: `methods` must be a non-empty list of method names")
        ms = []
    for m in ms:
        if m not in methods.REGISTRY:
            errors.append(f"{where}: {m!r} is not a registered method" + _near(m))
    return ReadingStep(out["topic"], tuple(ms), out["why"])


def _topic_question(raw: Any, examples, errors: list) -> Question | None:
    ms = raw.get("methods") if isinstance(raw, dict) else None
    if not (isinstance(ms, list) and len(ms) == 2 and all(isinstance(m, str) for m in ms) and ms[0] != ms[1]):
        qid = raw.get("id") if isinstance(raw, dict) else None
        errors.append(f"topics.yaml, question {qid!r}: `methods` must be two different method names, got {ms!r}")
        return None
    for m in ms:
        if m not in methods.REGISTRY:
            errors.append(f"topics.yaml, question {raw.get('id')!r}: {m!r} is not a registered method" + _near(m))
    if raw.get("id") != f"x-{ms[0]}-{ms[1]}":
        errors.append(f"topics.yaml, question {raw.get('id')!r}: id must be `x-{ms[0]}-{ms[1]}`")
    return _parse_question(raw, "topics.yaml", tuple(ms), examples, errors, topic=True)


def topics(lang: str | None = None, *, path: Path | str | None = None,
           examples: Mapping[str, Callable] | None = None) -> Topics:
    """`learn/topics.yaml`: reading order and cross-method questions, validated like the
    bank. A missing file gives empty topics; a present one must be valid (BankError)."""
    _check_lang(lang)
    path = Path(path) if path is not None else TOPICS_PATH
    if not path.exists():
        return Topics()
    errors: list[str] = []
    data = _load_yaml(path, errors)
    steps, questions = [], []
    if data is not None:
        extra = set(data) - {"reading_order", "questions"}
        if extra:
            errors.append(f"topics.yaml: unknown top-level key(s) {sorted(extra)}")
        for i, raw in enumerate(data.get("reading_order") or []):
            steps.append(_reading_step(raw, i, errors))
        seen = set()
        for raw in data.get("questions") or []:
            q = _topic_question(raw, _examples(examples), errors)
            if q is not None:
                if q.id in seen:
                    errors.append(f"topics.yaml: question id {q.id!r} is used twice")
                seen.add(q.id)
                questions.append(q)
    if errors:
        raise BankError(errors)
    pick = (lambda d: d) if lang is None else (lambda d: {lang: d[lang]})
    steps = [ReadingStep(pick(s.topic), s.methods, pick(s.why)) for s in steps]
    return Topics(tuple(steps), tuple(_in_lang(q, lang) for q in questions))


METRIC_BANK_DIR = HERE / "metric_bank"


def metric_bank(lang: str | None = None) -> dict:
    """Each metric card's four questions (basics, mechanism, comparison, implementation) in
    English and Chinese, in the question bank's format (`learn/metric_bank/<name>.yaml`, top
    key `metric:`), validated by the bank's own parser with every worked example run live.
    Returns {name: [Question, ...]} in category order; raises BankError listing problems."""
    from policylab.eval.cards import METRICS, metric_names

    _check_lang(lang)
    examples = _examples(None)
    errors: list[str] = []
    out = {}
    files = {p.stem: p for p in sorted(METRIC_BANK_DIR.glob("*.yaml"))}
    for stem in sorted(set(files) - set(METRICS)):
        errors.append(f"{stem}.yaml: metric bank file for unknown metric {stem!r}")
    for name in metric_names():
        if name not in files:
            errors.append(f"metric {name!r} has no bank file (expected {METRIC_BANK_DIR / (name + '.yaml')})")
            continue
        data = _load_yaml(files[name], errors)
        if data is None:
            continue
        if data.get("metric") != name or set(data) != {"metric", "questions"}:
            errors.append(f"{name}.yaml: needs exactly the keys `metric: {name}` and `questions`")
            continue
        raw = data["questions"] if isinstance(data["questions"], list) else []
        cats = sorted(str(q.get("category")) for q in raw if isinstance(q, dict))
        if cats != sorted(CATEGORIES):
            errors.append(f"{name}.yaml: needs exactly four questions, one per category ({', '.join(CATEGORIES)})")
        qs = []
        for q in raw:
            if isinstance(q, dict) and q.get("id") != f"{name}-{q.get('category')}":
                errors.append(f"{name}.yaml, question {q.get('id')!r}: id must be `{name}-{q.get('category')}`")
            parsed = _parse_question(q, files[name].name, (name,), examples, errors, topic=False)
            if parsed is not None:
                qs.append(_in_lang(parsed, lang))
        out[name] = sorted(qs, key=lambda q: CATEGORIES.index(q.category))
    if errors:
        raise BankError(errors)
    return out
