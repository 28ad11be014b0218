"""What the terminal views of the bank share (`learn.quiz`'s round and `learn.explain`):
the fixed words in each language, a question's heading, its answer with the boundary, and
its worked example with the live values."""

from __future__ import annotations

from typing import TYPE_CHECKING

from policylab.errors import PolicylabError

if TYPE_CHECKING:
    from policylab.learn import bank

UI = {
    "en": dict(prompt="Your answer (finish with an empty line or Ctrl-D):", yours="Your answer", skipped="(no answer given)",
               answer="Answer", example="Worked example", numbers="live numbers, computed now by {call}:", formula="Formula",
               questions="Questions", cat=dict(basics="basics", mechanism="mechanism", comparison="comparison",
                                               implementation="implementation"), vs="vs", empty="the question bank is empty",
               no_lesson="{name} has no lesson yet (it was registered outside policylab): no questions to ask about it",
               no_figure="{name} has no lesson yet (it was registered outside policylab): no figure to plot",
               no_figure_kind="{name} is {kind}: it has no figure to plot (only methods have one)",
               kinds=dict(metric="a metric", literature="a literature-only card (nothing of it runs)"),
               no_dir="--plot: the directory {dir} does not exist (create it first, or write {path} elsewhere)",
               not_dir="--plot: {dir} is not a directory", is_dir="--plot: {path} is a directory, not a file name",
               not_writable="--plot: cannot write {path} (permission denied)",
               verdict="Did you have it? [y = yes, anything else = no]:", score="Score: {score}/{n}",
               review="Review of the missed questions:", filters="filters"),
    "zh": dict(prompt="你的回答（以空行或 Ctrl-D 结束）：", yours="你的回答", skipped="（未作答）", answer="答案",
               example="计算示例", numbers="实时数值（刚由 {call} 计算）：", formula="公式", questions="问题",
               cat=dict(basics="基础", mechanism="机制", comparison="比较", implementation="实现"), vs="对比",
               empty="题库为空", no_lesson="{name} 尚无讲解（它是在 policylab 之外注册的）：没有可问的问题",
               no_figure="{name} 尚无讲解（它是在 policylab 之外注册的）：没有可画的图",
               no_figure_kind="{name} 是{kind}：没有可画的图（只有方法才有图）",
               kinds=dict(metric="评测指标", literature="仅文献卡片（没有可运行的部分）"),
               no_dir="--plot：目录 {dir} 不存在（请先创建，或把 {path} 写到别处）",
               not_dir="--plot：{dir} 不是目录", is_dir="--plot：{path} 是目录，不是文件名",
               not_writable="--plot：无法写入 {path}（权限不足）",
               verdict="你答对了吗？[y = 对，其他 = 不对]：", score="得分：{score}/{n}",
               review="回顾答错的问题：", filters="筛选条件"),
}


def ui_words(lang: str) -> dict:
    if lang not in UI:
        raise PolicylabError(f"language must be one of {', '.join(UI)}, got {lang!r}")
    return UI[lang]


def heading(q: bank.Question, lang: str) -> str:
    ui = ui_words(lang)
    owners = f" {ui['vs']} ".join(q.methods)
    if q.compare_with:
        owners += f" {ui['vs']} {q.compare_with}"
    return f"[{owners} · {ui['cat'].get(q.category, q.category)}] {q.id}"


def example_lines(q: bank.Question, lang: str) -> list[str]:
    """The example sentence and a table of every value the example function returned."""
    from policylab.learn.questions import render_value

    ui = ui_words(lang)
    call = f"{q.example.function}({call_args(q.example.args)})"
    lines = [f"{ui['example']}: {q.example.text[lang]}", "  " + ui["numbers"].format(call=call)]
    width = max((len(k) for k in q.example.values), default=0)
    for k, v in q.example.values.items():
        lines.append(f"    {k.ljust(width)} = {render_value(v, lang)}")
    return lines


def boundary_lines(q: bank.Question, lang: str) -> list[str]:
    """The answer's boundary: what the worked example shows, what it does not, and what
    the full result would need (`questions.BOUNDARY_PARTS`), in `lang`."""
    from policylab.learn.questions import BOUNDARY_LABELS, BOUNDARY_PARTS

    labels = BOUNDARY_LABELS[lang]
    parts = q.boundary.get(lang) or {}
    sep = ": " if lang == "en" else "："
    return [f"{labels['title']}{sep.rstrip()}"] + [f"  {labels[p]}{sep}{parts[p]}" for p in BOUNDARY_PARTS if p in parts]


def answer_lines(q: bank.Question, lang: str) -> list[str]:
    """The answer, then its boundary."""
    return [f"{ui_words(lang)['answer']}: {q.answer[lang]}", *boundary_lines(q, lang)]


def call_args(args: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())
