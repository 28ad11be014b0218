"""Chinese for everything a learner reads on a card: one file, `learn/glossary_zh.yaml`.

    terms:   the terms of art, English -> Chinese (advantage -> 优势, behavior policy ->
             行为策略, ...), one rendering each; every translation below uses them
    texts:   each English text a card shows (summary, who samples, who learns, reference,
             critic, status, not shown, confirmed, each unconfirmed item, the parameters'
             descriptions), exactly as the card has it -> its Chinese

The cards themselves (`policylab.methods.families`, `policylab.eval.cards`) stay English;
the site, the comparison table and `policylab explain --lang zh` read their Chinese here.

    zh(text) -> str | None           the translation of one card text (None: none yet)
    field(text, lang) -> str         the text in `lang`; an untranslated one is shown in
                                     English behind a visible marker, never silently
    card_texts() -> [(where, text)]  every English text the shipped cards show
    missing() -> [(where, text)]     the ones without a translation
    card_text_zh(text) -> str        a card as `policylab methods NAME` prints it, in Chinese

A card text changed in the code no longer matches its entry: it shows as untranslated and
`tests/learn/test_glossary.py` names it, so a translation cannot silently describe an
older card.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

GLOSSARY_PATH = Path(__file__).resolve().parent / "glossary_zh.yaml"
UNTRANSLATED = "〔尚未翻译，英文原文〕"

# the labels of a printed card (`methods.cards.card_text`, `eval.cards.metric_card_text`)
LABELS = {
    "family": "类别", "what it does": "作用", "samples": "谁采样", "learns": "谁学习", "reference": "参考策略",
    "critic": "价值网络", "needs": "所需输入", "role passes": "角色前向", "aggregation": "聚合方式", "status": "状态",
    "not shown": "尚未证实", "confirmed": "已核对", "unconfirmed": "未核对", "parameters": "参数", "stages": "阶段",
    "decision": "决策", "kernels": "内核", "kernel": "内核",
}
# the fields whose values are prose (translated); the others are code names, kept as they are
PROSE_LABELS = ("family", "what it does", "samples", "learns", "reference", "critic", "status", "not shown",
                "confirmed", "decision", "needs", "role passes")


def _norm(text: str) -> str:
    return " ".join(str(text).split())


@lru_cache(maxsize=1)
def _data() -> tuple[dict, dict]:
    import yaml

    data = yaml.safe_load(GLOSSARY_PATH.read_text(encoding="utf-8")) if GLOSSARY_PATH.exists() else {}
    terms = {str(k): str(v) for k, v in (data.get("terms") or {}).items()}
    texts = {_norm(k): str(v) for k, v in (data.get("texts") or {}).items()}
    return terms, texts


def terms() -> dict:
    """The terms of art, English -> Chinese."""
    return dict(_data()[0])


_CODE = re.compile(r"`[^`]*`|'\w+'|\S+\.(?:md|py)\b|\S*/\S+|[A-Za-z_]+\.[A-Za-z_][\w.]*|[A-Za-z]\w*\(")


def term_problems() -> list[str]:
    """Translations that do not use the glossary's rendering of a term their English uses
    (terms matched longest first, as words, outside code names, quoted values, paths and
    function calls)."""
    found = []
    ordered = sorted(terms().items(), key=lambda kv: -len(kv[0]))
    for where, en in card_texts():
        z = zh(en)
        if z is None:
            continue
        text = _CODE.sub(" ", en)
        for term, renderings in ordered:
            pat = re.compile(r"(?<![A-Za-z_])" + re.escape(term) + r"s?(?![A-Za-z_])")
            if pat.search(text):
                text = pat.sub(" ", text)
                if not any(r in z for r in renderings.split("|")):
                    found.append(f"{where}: {term!r} should read {renderings!r}: {z[:60]!r}")
    return found


# a card's status is what was run, then its four levels (`policylab.methods.evidence.status_text`):
# translated part by part, so a level that changes (a new measurement) needs only its own entry
_LEVELS = re.compile(r"^(?P<run>.*)\. Levels: formula (?P<formula>.*); mechanism (?P<mechanism>.*); "
                     r"capability (?P<capability>.*); scale (?P<scale>.*)$", re.S)
_LEVEL_ZH = (("formula", "公式"), ("mechanism", "机制"), ("capability", "能力"), ("scale", "规模"))
_NOT_MEASURABLE = "not measurable here: "


def status_parts(text: str) -> list[str] | None:
    """The parts of a status with levels that are translated one by one (what was run, then
    each level's value; "not measurable here: R" contributes R), or None for a plain text."""
    m = _LEVELS.match(_norm(text))
    if m is None:
        return None
    parts = [m.group("run")]
    for key, _ in _LEVEL_ZH:
        v = m.group(key)
        parts.append(v[len(_NOT_MEASURABLE):] if v.startswith(_NOT_MEASURABLE) else v)
    return parts


# the mechanism and capability levels measured by `policylab evidence` are generated from one
# template each (policylab.experiments.evidence.table.card_text / capability_card_text): their
# Chinese is generated from the same parts, so a new measurement needs no new glossary entry
_MECH_RE = re.compile(r"^(?P<v>observed|not observed|one seed so far, no claim): (?P<red>mean|late-half mean|final value) of "
                      r"`(?P<key>[^`]+)` (?P<m>\S+) vs (?P<c>\S+) for the control \((?P<ctl>.+)\), difference "
                      r"(?P<d>\S+)(?: ± (?P<se>\S+))? over (?P<n>\d+) seeds \((?P<where>[^()]+)\)$")
_CAP_RE = re.compile(r"^held-out accuracy after (?P<steps>\d+) rollout steps on its evidence task, (?P<n>\d+) seeds?: "
                     r"(?P<m>\S+) vs GRPO's (?P<g>\S+) on the same prompts, difference (?P<d>\S+)"
                     r"(?: ± (?P<se>\S+) \(95% interval \[(?P<lo>\S+), (?P<hi>\S+)\], (?P<sig>significant|not significant|too few seeds for a claim)\))?"
                     r"(?:; about (?P<need>\d+) seeds would make a difference of this size significant)?"
                     r"(?P<one>; one seed so far, no claim)? \((?P<where>[^()]+)\)$")
_NEVER_RE = re.compile(r"^the runs never logged `(?P<key>[^`]+)` as a finite number at this size and budget "
                       r"\((?P<where>[^()]+)\)$")
_VERDICT_ZH = {"observed": "已观察到", "not observed": "未观察到", "one seed so far, no claim": "目前只有一个种子，不作结论"}


def _control_zh(control: str) -> str:
    return control.replace(" with ", "，").replace(" and ", "，")


def generated_zh(value: str) -> str | None:
    """The Chinese of a generated mechanism or capability level, or None when `value` is not one."""
    value = _norm(value)
    if m := _MECH_RE.match(value):
        red = {"mean": "均值", "late-half mean": "后半程均值", "final value": "最终值"}[m["red"]]
        se = f" ± {m['se']}" if m["se"] else ""
        return (f"{_VERDICT_ZH[m['v']]}：`{m['key']}` 的{red}为 {m['m']}，对照组（{_control_zh(m['ctl'])}）为 "
                f"{m['c']}，{m['n']} 个种子上的差为 {m['d']}{se}（{m['where']}）")
    if m := _CAP_RE.match(value):
        out = (f"在其证据任务上训练 {m['steps']} 个采样步后的保留集准确率（{m['n']} 个种子）：{m['m']}，同一批提示上 GRPO 为 "
               f"{m['g']}，差为 {m['d']}")
        if m["se"]:
            sig = {"significant": "显著", "not significant": "不显著", "too few seeds for a claim": "种子太少，不作结论"}[m["sig"]]
            out += f" ± {m['se']}（95% 区间 [{m['lo']}, {m['hi']}]，{sig}）"
        if m["need"]:
            out += f"；约需 {m['need']} 个种子才能使这样大小的差显著"
        if m["one"]:
            out += "；目前只有一个种子，不作结论"
        return out + f"（{m['where']}）"
    if m := _NEVER_RE.match(value):
        return f"在此规模和预算下，各次运行从未把 `{m['key']}` 记录为有限数（{m['where']}）"
    return None


def _level_zh(value: str) -> str | None:
    if value.startswith(_NOT_MEASURABLE):
        rest = value[len(_NOT_MEASURABLE):]
        reason = _data()[1].get(_norm(rest)) or generated_zh(rest)
        return None if reason is None else f"此处无法测量：{reason}"
    return _data()[1].get(_norm(value)) or generated_zh(value)


def zh(text: str) -> str | None:
    """The Chinese of one English card text, or None when the glossary has none (a status
    with levels: None when any of its parts has none)."""
    if not str(text).strip():
        return ""
    direct = _data()[1].get(_norm(text))
    if direct is None:
        direct = generated_zh(text)
    m = _LEVELS.match(_norm(text)) if direct is None else None
    if m is None:
        return direct
    run = _data()[1].get(_norm(m.group("run")))
    levels = [_level_zh(m.group(key)) for key, _ in _LEVEL_ZH]
    if run is None or any(v is None for v in levels):
        return None
    return run.rstrip("。") + "。层级：" + "；".join(f"{label} {v}" for (_, label), v in zip(_LEVEL_ZH, levels))


def field(text: str, lang: str) -> str:
    """`text` in `lang`: English unchanged; Chinese from the glossary, or the English behind
    the UNTRANSLATED marker when there is no entry."""
    if lang == "en":
        return text
    t = zh(text)
    return t if t is not None else f"{UNTRANSLATED}{text}"


def _unconfirmed(text: str, lang: str) -> str:
    """A printed unconfirmed list ("; "-joined items, an item may hold "; " itself) in
    `lang`: the longest run of pieces that is one translated item is taken each time."""
    if lang != "zh":
        return text
    parts, out, i = text.split("; "), [], 0
    while i < len(parts):
        for j in range(len(parts), i, -1):
            t = zh("; ".join(parts[i:j]))
            if t is not None:
                out.append(t)
                i = j
                break
        else:
            out.append(field(parts[i], lang))
            i += 1
    return "；".join(out)


def card_texts() -> list[tuple[str, str]]:
    """(where, English text) of every prose text a shipped card, a literature-only card or a
    metric card shows (the parameters' descriptions included), each once."""
    from policylab import methods
    from policylab.eval.cards import METRICS
    from policylab.learn.lessons import shipped_names

    out: dict[str, str] = {}

    def add(where, text):
        text = _norm(text)
        parts = status_parts(text)
        if parts is not None:  # a status with levels: each part is translated on its own
            for i, part in enumerate(parts):
                add(f"{where}[{i}]", part)
            return
        if text and text not in out:
            out[text] = where

    cards = [(n, methods.get(n).card) for n in sorted(shipped_names())]
    cards += [(n, methods.registry.card(n)) for n in methods.registry.literature_names()]
    for name, c in cards:
        for f in ("family", "summary", "samples", "learns", "reference", "critic", "status", "not_established",
                  "confirmed"):
            add(f"{name}.{f}", getattr(c, f, "") or "")
        for i, item in enumerate(c.unconfirmed):
            add(f"{name}.unconfirmed[{i}]", item)
    for name in sorted(shipped_names()):
        for q in methods.get(name).params:
            add(f"{name}.params.{q.name}", q.doc)
    for name, mc in sorted(METRICS.items()):
        for f in ("summary", "inputs", "status", "not_established", "confirmed", "decision"):
            add(f"{name}.{f}", getattr(mc, f) or "")
        for i, item in enumerate(mc.unconfirmed):
            add(f"{name}.unconfirmed[{i}]", item)
    add("any.inputs", "rewards only")
    add("any.roles", "none beyond the training forward")
    return [(where, text) for text, where in out.items()]


def missing() -> list[tuple[str, str]]:
    """The card texts without a translation (where, English)."""
    return [(w, t) for w, t in card_texts() if zh(t) is None]


_LINE = re.compile(r"^(  )([a-z][a-z ]*?)(\s{2,})(.*)$")
_PARAM = re.compile(r"^(    [A-Za-z_][A-Za-z0-9_]* = .*?  \((?:[^()]|\([^()]*\))*\) )(.*)$")
_OFF = "(off with these parameters)"


def card_text_zh(text: str) -> str:
    """A printed card with its labels and prose in Chinese; names, values, code and paper
    titles stay as they are (module doc)."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(2) in LABELS:
            label, value = m.group(2), m.group(4)
            if label == "unconfirmed":
                value = _unconfirmed(value, "zh")
            elif label in ("needs", "role passes"):
                value = field(value, "zh") if zh(value) is not None else value
            elif label == "family" and "(not a training method" in value:
                value = value.replace("metric (not a training method:", "评测指标（不是训练方法：").rstrip(")") + "）"
            elif label in PROSE_LABELS:
                value = field(value, "zh")
            out.append(f"  {LABELS[label]}{' ' * max(2, 14 - 2 * len(LABELS[label]))}{value}")
            continue
        stripped = line.strip()
        if stripped in LABELS and line.startswith("  ") and not line.startswith("   "):
            out.append(f"  {LABELS[stripped]}")
            continue
        p = _PARAM.match(line)
        if p:
            out.append(p.group(1) + field(p.group(2), "zh"))
            continue
        out.append(line.replace(_OFF, "（在这些参数下关闭）").replace("        kernel ", "        内核 "))
    return "\n".join(out)
