"""Views of corrections: the weight a token gets against the engine ratio k = π_old/μ
(through the method's own loss, so the host is the method's), KPop's two binary KLs,
GMC's group mass, SIS's acceptance probability."""

from __future__ import annotations

import math

import torch

from policylab.kernels import corrections as C
from policylab.methods.spec import Method
from policylab.learn.figures.model import Mark, Panel, Series, T, view
from policylab.learn.figures.common import (
    COEF,
    ENGINE_RATIO,
    F64,
    coefficient,
    grid,
    host_only,
    objective_only,
    variant_label,
)


def _band_marks(method: Method, only=None) -> tuple[list[float], list[Mark]]:
    """Lines at the engine-ratio edges the corrections declare (float parameters named
    *_low, *_high, *_cap, or the names in `only`): read from `Stage.params`, not typed in."""
    keys, marks = [1.0], []
    for stage in method.active("correction"):
        for name in stage.params:
            v = method.p[name]
            wanted = name in only if only is not None else name.endswith(("_low", "_high", "_cap"))
            if isinstance(v, float) and not isinstance(v, bool) and wanted and v > 0:
                keys.append(v)
                marks.append(Mark("x", v, T(f"{name} = {v:g}")))
    return keys, marks


def _engine_rows(xs, po: float, length: int, vary: str):
    B = len(xs)
    lp_old = torch.full((B, length), math.log(po), dtype=F64)
    lp_mu = lp_old.clone()
    k = torch.log(torch.tensor(xs, dtype=F64))
    if vary == "all":
        lp_mu -= k.unsqueeze(-1)
    elif vary == "one":
        lp_mu[:, 0] -= k
    else:
        raise ValueError(f"engine_weight: vary must be 'all' or 'one', got {vary!r}")
    return lp_old, lp_mu


@view("engine_weight")
def engine_weight(method: Method, *, lo: float = 0.2, hi: float = 8.0, points: int = 121, p_old=(0.1,),
                  length: int = 1, vary: str = "all", host: bool = True, marks=None) -> list[Panel]:
    """The weight on A·∇log π of a token at policy ratio 1 (π_θ = π_old, the first
    minibatch) against the engine ratio k = π_old/μ: autograd through the method's policy
    loss, so it is the correction × the host's coefficient. `length` tokens per sequence,
    all at ratio k (`vary: all`) or only the first (`vary: one`, the others at 1); points
    where μ = π_old/k would exceed 1 are left out. `host`: also the host objective alone.
    `marks`: the parameters to draw as lines (default: the corrections' band edges; none
    when only one token moves, as the band then applies to the sequence)."""
    keys, lines = _band_marks(method, marks)
    if vary == "one":
        lines = []
    xs_all = grid(lo, hi, points, log=True, keys=keys)
    m, series = objective_only(method), []
    for po in p_old:
        xs = [x for x in xs_all if po / x <= 1.0]
        lp_old, lp_mu = _engine_rows(xs, po, int(length), vary)
        mask = torch.ones_like(lp_old, dtype=torch.bool)
        y = coefficient(m, lp_old, torch.ones(len(xs), dtype=F64), mask, column=0, logp_old=lp_old, logp_behavior=lp_mu)
        label = variant_label([(T("π_old"), po)]) if len(p_old) > 1 else T(method.name)
        series.append(Series(label, xs, y))
    if host:
        xs = [x for x in xs_all if min(p_old) / x <= 1.0]
        lp_old, lp_mu = _engine_rows(xs, min(p_old), int(length), vary)
        y = coefficient(host_only(method), lp_old, torch.ones(len(xs), dtype=F64),
                        torch.ones_like(lp_old, dtype=torch.bool), column=0, logp_old=lp_old, logp_behavior=lp_mu)
        series.append(Series(T("host objective alone (no correction)", "仅宿主目标（无修正）"), xs, y, reference=True))
    what = {"all": T(f"every token of a {length}-token sequence at k", f"长度为 {length} 的序列中每个词元的比率都为 k"),
            "one": T(f"one token of a {length}-token sequence at k, the rest at 1",
                     f"长度为 {length} 的序列中一个词元比率为 k，其余为 1")}[vary]
    title = what if (length > 1 or vary == "one") else T("one token, policy ratio 1", "单个词元，策略比率为 1")
    return [Panel(title, ENGINE_RATIO, COEF, series, xscale="log", marks=lines,
                  source=f"methods.loss.policy_loss({method.name}) + autograd")]


@view("kpop_binary_kl")
def kpop_binary_kl(method: Method, *, lo: float = 0.3, hi: float = 3.0, points: int = 81, p_old: float = 0.1
                   ) -> list[Panel]:
    """KPop's two binary (token vs rest) KLs between the engines against k, at a fixed
    π_old, from `corrections.kpop`'s own metrics on one token, with the threshold δ."""
    p = method.p
    xs = [x for x in grid(lo, hi, points, log=True, keys=(1.0,)) if p_old / x <= 1.0]
    fwd, rev = [], []
    for x in xs:
        lp_old = torch.tensor([[math.log(p_old)]], dtype=F64)
        lp_mu = lp_old - math.log(x)
        _, mt = C.kpop(lp_old, lp_mu, torch.ones((1, 1), dtype=torch.bool), delta=p.kpop_delta,
                       in_region_weight=p.kpop_weight)
        fwd.append(float(mt["kpop/kl_forward_mean"]))
        rev.append(float(mt["kpop/kl_reverse_mean"]))
    d = p.kpop_delta
    return [Panel(T(f"π_old = {p_old:g}"), ENGINE_RATIO, T("binary KL", "二元 KL"),
                  [Series(T("KL(train ‖ serve)", "KL(训练 ‖ 推理)"), xs, fwd),
                   Series(T("KL(serve ‖ train)", "KL(推理 ‖ 训练)"), xs, rev)],
                  xscale="log", marks=[Mark("y", d, T(f"δ = {d:g}"))], ylim=(0.0, 4 * d),
                  source="corrections.kpop")]


@view("group_mass")
def group_mass(method: Method, *, group_size: int = 8, hi: float = 16.0, points: int = 81) -> list[Panel]:
    """GMC on one group: the first trajectory's weight w moves, the others stay at 1;
    the capped weights and the group's mass before and after (`corrections.gmc` with the
    method's cap)."""
    cap = method.p.gmc_cap
    xs = grid(0.0, hi, points)
    mine, other, before, after = [], [], [], []
    for w0 in xs:
        w = torch.ones(group_size, dtype=F64)
        w[0] = w0
        capped, _ = C.gmc(w, torch.zeros(group_size, dtype=torch.long), cap=cap)
        mine.append(float(capped[0]))
        other.append(float(capped[1]))
        before.append(float(w.sum()))
        after.append(float(capped.sum()))
    xl = T("weight w of one trajectory (the other ones: 1)", "一条轨迹的权重 w（其余为 1）")
    return [
        Panel(T("capped weights", "封顶后的权重"), xl, T("weight after capping", "封顶后的权重"),
              [Series(T("that trajectory", "该轨迹"), xs, mine), Series(T("each other trajectory", "其余每条轨迹"), xs, other),
               Series(T("uncapped w", "未封顶的 w"), xs, xs, reference=True)],
              source="corrections.gmc"),
        Panel(T("group mass", "组内总权重"), xl, T("Σ of the group's weights", "组内权重之和"),
              [Series(T("after capping", "封顶后"), xs, after), Series(T("before capping", "封顶前"), xs, before, reference=True)],
              marks=[Mark("y", cap, T(f"cap C = {cap:g}", f"上限 C = {cap:g}"))], source="corrections.gmc"),
    ]


@view("sis_acceptance")
def sis_acceptance(method: Method, *, lo: float = 0.1, hi: float = 2.5, points: int = 81,
                   envelopes=(1.0, 1.5)) -> list[Panel]:
    """SIS's acceptance probability of a sampled token against q = π(y)/μ(y), for a
    behavior top-K of two tokens where the other token's π/μ is `envelope`
    (`corrections.sis`, its `accept_prob_mean` on one position)."""
    xs = grid(lo, hi, points, log=True, keys=(1.0,) + tuple(envelopes))
    mu = torch.tensor([0.2, 0.3], dtype=F64)
    series = []
    for env in envelopes:
        ys = []
        for q in xs:
            pi = torch.tensor([0.2 * q, 0.3 * env], dtype=F64)
            ids = torch.tensor([[[0, 1]]])
            _, mt = C.sis(torch.log(pi[:1]).reshape(1, 1), ids, torch.log(mu).reshape(1, 1, 2),
                          torch.log(pi).reshape(1, 1, 2), torch.zeros((1, 1), dtype=torch.long),
                          torch.log(mu[:1]).reshape(1, 1), torch.ones((1, 1), dtype=torch.bool),
                          generator=torch.Generator().manual_seed(0))
            ys.append(float(mt["sis/accept_prob_mean"]))
        series.append(Series(T(f"other top-K token: π/μ = {env:g}", f"另一个 top-K 词元：π/μ = {env:g}"), xs, ys))
    return [Panel(T("rejection test", "拒绝采样检验"), T("q = π(y)/μ(y) of the sampled token", "采样词元的 q = π(y)/μ(y)"),
                  T("acceptance probability", "接受概率"), series, xscale="log", source="corrections.sis")]
