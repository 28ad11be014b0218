"""Views of the mixed-policy methods: the weight a token gets from the method's own loss
according to where its row came from (its `source`), and ERILS's per-source advantages.

Each curve is autograd through `methods.loss.policy_loss` (the method's objective ×
corrections) on a batch whose rows carry the provenance the method's source stage would
write, or the method's own advantage stage on such a batch."""

from __future__ import annotations

import dataclasses
import math

import torch

from policylab.methods.loss import policy_loss, tensor_inputs
from policylab.methods.spec import Method
from policylab.learn.figures.model import Mark, Panel, Series, T, view
from policylab.learn.figures.common import COEF, F64, grid, objective_only, stage_context

_PRODUCER = {"native": "policy", "demonstration": "solver", "gold": "solver", "expert": "solver",
             "guided": "policy+solver", "hinted": "policy", "external": "external"}
_SOURCE_TEXT = {
    "native": T("native row (the learner's own rollout)", "原生行（学习方自己的 rollout）"),
    "demonstration": T("demonstration row (μ = 1)", "示范行（μ = 1）"),
    "gold": T("gold row", "标准答案行"),
    "guided": T("guided row", "引导行"),
    "expert": T("expert row", "专家行"),
    "hinted": T("hinted row", "带提示的行"),
    "external": T("external row", "外部行"),
}
TOKEN_PROB = T("token probability π_θ(y_t)", "词元概率 π_θ(y_t)")


def _producer(label: str) -> str:
    return label.split(":", 1)[1] if label.startswith("peer:") else _PRODUCER[label]


def _coefficient(method: Method, lp: torch.Tensor, sign: float, *, source: str, logp_old: torch.Tensor,
                 logp_behavior: torch.Tensor, extras: dict) -> list[float]:
    """−(∂ℓ/∂lp)/A of a one-token row of `source`, through the method's own policy loss."""
    B = lp.shape[0]
    leaf = lp.detach().clone().requires_grad_(True)
    adv = torch.full((B,), sign, dtype=F64)
    mask = torch.ones_like(lp, dtype=torch.bool)
    inp = tensor_inputs(leaf, adv, mask, logp_old=logp_old, logp_behavior=logp_behavior, extras=extras)
    batch = inp.batch.replace(source=(source,) * B, producer=(_producer(source),) * B).validate()
    inp = dataclasses.replace(inp, batch=batch)
    loss, _ = policy_loss(method, inp)
    (g,) = torch.autograd.grad(loss.sum(), leaf, allow_unused=True)
    g = torch.zeros_like(leaf) if g is None else g
    return [float(v) + 0.0 for v in (-g[:, 0] / sign).tolist()]


def _extras(spec: dict, B: int) -> dict:
    """Row extras from plain values: a number or bool is broadcast to [B] (per row) or,
    for names ending in `_match`, to [B, 1] (per token)."""
    out = {}
    for k, v in spec.items():
        shape = (B, 1) if k.endswith("_match") else (B,)
        out[k] = torch.full(shape, float(v), dtype=F64)
    return out


def _label(entry: dict) -> dict:
    if "label" in entry:
        return dict(entry["label"])
    return _SOURCE_TEXT.get(entry["source"], T(f"{entry['source']} row"))


@view("source_weight")
def source_weight(method: Method, *, rows: list, p_old: float = 0.1, lo: float = 0.02, hi: float = 0.9,
                  points: int = 121) -> list[Panel]:
    """Two panels (A > 0, A < 0): the weight on A·∇log π of one token against its
    probability π_θ, for rows of different provenance. Each entry of `rows`:
    {source, p_behavior (optional: μ of that row, default p_old), extras (optional,
    e.g. {grin_alpha: 0.25, grin_gold_match: true}), label (optional)}. π_old of every row
    is `p_old` (a native token's clip bounds sit at (1 ± ε)·p_old)."""
    m = objective_only(method)
    keys = [p_old]
    if "eps_low" in m.objective.params and m.p.eps_low is not None:
        keys.append((1 - m.p.eps_low) * p_old)
    if "eps_high" in m.objective.params:
        keys.append((1 + m.p.eps_high) * p_old)
    xs = grid(lo, hi, points, log=True, keys=keys)
    lp = torch.tensor(xs, dtype=F64).log().unsqueeze(-1)
    B = lp.shape[0]
    marks = [Mark("x", p_old, T(f"π_old = {p_old:g}"))]
    panels = []
    for sign, title in ((1.0, T("A > 0", "A > 0（优势为正）")), (-1.0, T("A < 0", "A < 0（优势为负）"))):
        series = []
        for entry in rows:
            pb = float(entry.get("p_behavior", p_old))
            y = _coefficient(m, lp, sign, source=entry["source"], logp_old=torch.full((B, 1), math.log(p_old),
                                                                                        dtype=F64),
                             logp_behavior=torch.full((B, 1), math.log(pb), dtype=F64),
                             extras=_extras(entry.get("extras", {}), B))
            series.append(Series(_label(entry), xs, y))
        panels.append(Panel(title, TOKEN_PROB, COEF, series, marks=list(marks), xscale="log",
                            source=f"methods.loss.policy_loss({method.name}) + autograd, rows labelled by source"))
    return panels


@view("source_advantages")
def source_advantages(method: Method, *, native: list, external: int = 2, lo: float = 0.0, hi: float = 1.0,
                      points: int = 41, spread: float = 0.1) -> list[Panel]:
    """One panel: the advantage of each native row (rewards `native`) against the mean
    reward of `external` external rows in the same group (spread ± `spread` around it),
    with the method's own advantage stage; the pooled GRPO normalization of the same
    group (the group-wide mean and std) as the reference curve."""
    from policylab.kernels import advantages as adv_mod

    n = len(native)
    xs = grid(lo, hi, points)
    stage = method.advantage
    per: list[list[float]] = [[] for _ in range(n)]
    pooled: list[list[float]] = [[] for _ in range(n)]
    offsets = [spread * (2 * j / (external - 1) - 1) if external > 1 else 0.0 for j in range(external)]
    for x in xs:
        r = torch.tensor(list(native) + [x + o for o in offsets], dtype=F64)
        B = r.numel()
        inp = tensor_inputs(torch.zeros((B, 1), dtype=F64), torch.zeros(B, dtype=F64),
                            torch.ones((B, 1), dtype=torch.bool), group=torch.zeros(B, dtype=torch.long), rewards=r)
        src = ("native",) * n + ("external",) * external
        batch = inp.batch.replace(source=src, producer=tuple(_producer(s) for s in src)).validate()
        a = stage.fn(batch, stage_context(method, stage)).adv.detach().to(F64)
        g = adv_mod.grpo(r, torch.zeros(B, dtype=torch.long), std=method.p.std, eps=method.p.eps)
        for i in range(n):
            per[i].append(float(a[i]))
            pooled[i].append(float(g[i]))
    series = [Series(T(f"native row, r = {native[i]:g}", f"原生行，r = {native[i]:g}"), xs, per[i]) for i in range(n)]
    series += [Series(T(f"pooled GRPO, native r = {native[i]:g}", f"合并归一化（GRPO），原生 r = {native[i]:g}"),
                      xs, pooled[i], reference=True) for i in range(n)]
    return [Panel(T("native advantages as the external rows get better", "外部行变好时原生行的优势"),
                  T("mean reward of the external rows", "外部行的平均奖励"), T("advantage A", "优势 A"), series,
                  source=f"{method.name}: {stage.name} stage; advantages.grpo for the pooled reference")]
