"""The site's fixed texts, each in English and Simplified Chinese: the interface strings,
the category and stage names, and the rows of a method's card."""

from __future__ import annotations

from policylab.learn import lessons

UI = {
    "site": {"en": "policylab method explorer", "zh": "policylab 方法浏览器"},
    "questions": {"en": "Questions", "zh": "问题"},
    "compare": {"en": "Comparison", "zh": "方法对比"},
    "topics": {"en": "Topics", "zh": "专题"},
    "intro": {"en": "Every registered method, four questions each; the numbers in the examples were computed by "
                    "policylab's kernels when this site was built.",
              "zh": "每个已注册的方法各有四个问题；示例中的数字都是在构建本站时由 policylab 的内核实时计算的。"},
    "search": {"en": "Search questions, answers, methods…", "zh": "搜索问题、答案、方法……"},
    "all_methods": {"en": "all methods", "zh": "全部方法"},
    "all_families": {"en": "all families", "zh": "全部类别"},
    "all_categories": {"en": "all categories", "zh": "全部题型"},
    "count": {"en": "{n} questions", "zh": "共 {n} 个问题"},
    "methods": {"en": "Methods", "zh": "方法"},
    "subjects": {"en": "Metrics and literature-only cards", "zh": "评测指标与仅文献卡片"},
    "kind_metric": {"en": "metric", "zh": "评测指标"},
    "kind_literature": {"en": "literature-only card", "zh": "仅文献卡片"},
    "noscript": {"en": "Search needs JavaScript; the method pages below work without it.",
                 "zh": "搜索需要 JavaScript；下面的方法页面无需 JavaScript 即可浏览。"},
    "card": {"en": "Card", "zh": "方法卡片"},
    "formula": {"en": "Formula", "zh": "公式"},
    "formula_note": {"en": "From the docstrings of the kernels the method's stages call (pipeline order).",
                     "zh": "摘自该方法各阶段所调用内核的文档字符串（按流水线顺序）。"},
    "source": {"en": "source", "zh": "源代码"},
    "answer": {"en": "Answer", "zh": "答案"},
    "example": {"en": "Worked example", "zh": "计算示例"},
    "computed": {"en": "computed at build time by", "zh": "构建时由以下函数计算："},
    "compare_with": {"en": "compared with", "zh": "对比对象"},
    "reading_order": {"en": "Reading order", "zh": "阅读顺序"},
    "cross": {"en": "Cross-method questions", "zh": "跨方法问题"},
    "no_topics": {"en": "No topics yet.", "zh": "暂无专题。"},
    "compare_note": {"en": "From the registry cards; required inputs = the method's required batch fields.",
                     "zh": "来自注册表中的方法卡片；所需输入即该方法需要的批数据字段。"},
    "figure": {"en": "Figure", "zh": "图"},
    "figure_source": {"en": "Computed when this site was built by", "zh": "构建本站时由以下调用计算："},
    "full_size": {"en": "open the figure at full size", "zh": "查看原尺寸图"},
    "zoom": {"en": "Open the figure at full size ↗", "zh": "查看原尺寸图 ↗"},
    "overlays": {"en": "Overlays: several methods on the same axes", "zh": "对比图：多个方法画在同一坐标轴上"},
    "overlays_nav": {"en": "Overlays", "zh": "对比图"},
    "overlay_methods": {"en": "Methods drawn", "zh": "图中的方法"},
    "in_overlays": {"en": "Also drawn with other methods in", "zh": "与其他方法一同出现在"},
    "no_lesson": lessons.NO_LESSON,
    "no_lesson_note": lessons.NO_LESSON_NOTE,
}
CATEGORY = {"basics": {"en": "basics", "zh": "基础"}, "mechanism": {"en": "mechanism", "zh": "机制"},
            "comparison": {"en": "comparison", "zh": "比较"}, "implementation": {"en": "implementation", "zh": "实现"}}
STAGE = {"reward": {"en": "reward", "zh": "奖励"}, "filter": {"en": "filter", "zh": "过滤"},
         "round": {"en": "round stage", "zh": "轮次阶段"}, "advantage": {"en": "advantage", "zh": "优势估计"},
         "objective": {"en": "objective", "zh": "目标函数"}, "correction": {"en": "correction", "zh": "修正"},
         "addend": {"en": "loss addend", "zh": "损失附加项"}, "term": {"en": "loss term", "zh": "损失项"},
         "grad": {"en": "gradient transform", "zh": "梯度变换"}}
CARD_ROWS = (
    ("title", {"en": "paper", "zh": "论文"}), ("arxiv", {"en": "arXiv", "zh": "arXiv"}),
    ("family", {"en": "family", "zh": "类别"}), ("summary", {"en": "what it does", "zh": "作用"}),
    ("samples", {"en": "who samples", "zh": "谁采样"}), ("learns", {"en": "who learns", "zh": "谁学习"}),
    ("reference", {"en": "reference", "zh": "参考策略"}), ("critic", {"en": "critic", "zh": "价值网络"}),
    ("inputs", {"en": "required inputs", "zh": "所需输入"}), ("stages", {"en": "stages", "zh": "阶段"}),
    ("params", {"en": "parameters", "zh": "参数"}), ("status", {"en": "status", "zh": "状态"}),
    ("not_established", {"en": "not shown", "zh": "尚未证实"}), ("confirmed", {"en": "confirmed", "zh": "已核对"}),
    ("unconfirmed", {"en": "unconfirmed", "zh": "未核对"}),
)
