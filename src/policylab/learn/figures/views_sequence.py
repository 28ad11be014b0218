"""Views of the sequence, token and turn objectives (conspo, zcpo, stare, reco, erpo,
tlm_dre, rlid): each curve is a fresh call of the method's own kernel (or its advantage
stage) with the method's parameters, on a one-dimensional sweep."""

from __future__ import annotations

import torch

from policylab.methods.spec import Method
from policylab.kernels.objectives import conspo as conspo_k
from policylab.kernels.objectives import erpo as erpo_k
from policylab.kernels.objectives import reco as reco_k
from policylab.kernels.objectives import rlid as rlid_k
from policylab.kernels.objectives import tlm_dre as tlm_k
from policylab.learn.figures.model import RUN, Mark, Panel, Series, T, view
from policylab.learn.figures.common import F64, advantages, bare_batch, grid


def _ones(B: int, T_: int = 1) -> torch.Tensor:
    return torch.ones((B, T_), dtype=torch.bool)


@view("conspo_credit")
def conspo_credit(method: Method, *, positive: float = -1.0, other_negative: float = -2.5, lo: float = -3.5,
                  hi: float = 0.0, points: int = 71) -> list[Panel]:
    """One group: a correct response scoring `positive`, a wrong one at `other_negative`,
    a second wrong one whose score s_n sweeps [lo, hi]; the gradient of ConSPO's loss on
    each score (`objectives.conspo.conspo`, the method's τ and full margin, autograd)."""
    p = method.p
    xs = grid(lo, hi, points, keys=(positive,))
    g_pos, g_sweep, g_other = [], [], []
    for s in xs:
        lp = torch.tensor([[positive], [s], [other_negative]], dtype=F64, requires_grad=True)
        loss, _ = conspo_k.conspo(lp, _ones(3), torch.zeros(3, dtype=torch.long), torch.tensor([True, False, False]),
                                  tau=p.conspo_tau, margin=p.conspo_margin_max)
        (g,) = torch.autograd.grad(loss.sum(), lp)
        g_pos.append(float(g[0, 0]))
        g_sweep.append(float(g[1, 0]))
        g_other.append(float(g[2, 0]))
    return [Panel(T("gradient on each score", "每个得分上的梯度"),
                  T("score s_n of the swept wrong response", "被扫描的错误回答的得分 s_n"),
                  T("∂loss/∂score", "∂损失/∂得分"),
                  [Series(T("the correct response", "正确回答"), xs, g_pos),
                   Series(T("the swept wrong response", "被扫描的错误回答"), xs, g_sweep),
                   Series(T(f"the other wrong response (s = {other_negative:g})",
                            f"另一个错误回答（s = {other_negative:g}）"), xs, g_other)],
                  marks=[Mark("x", positive, T(f"score of the correct one = {positive:g}",
                                               f"正确回答的得分 = {positive:g}"))],
                  source=f"objectives.conspo.conspo(tau={p.conspo_tau:g}, margin={p.conspo_margin_max:g}) + autograd")]


@view("zcpo_coefficients")
def zcpo_coefficients(method: Method, *, rewards=(1.0, 1.0, 0.0, 0.0), drift: float = 0.2, lo: float = 0.0,
                      hi: float = 0.6, points: int = 61) -> list[Panel]:
    """One group with `rewards`; response 0's mean full-vocabulary drift K_0 sweeps
    [lo, hi], the others sit at `drift`: every response's coefficient, from the method's
    own advantage stage (the drift enters as extras['zcpo_kl'])."""
    B = len(rewards)
    xs = grid(lo, hi, points, keys=(drift,))
    ys = [[] for _ in range(B)]
    for k in xs:
        kl = torch.full((B, 1), float(drift), dtype=F64)
        kl[0, 0] = k
        batch = bare_batch(B, 1, rewards=list(rewards), extras={"zcpo_kl": kl})
        c = advantages(method, batch)
        for i in range(B):
            ys[i].append(float(c[i]))
    series = [Series(T(f"response {i} (r = {r:g}){' – its drift swept' if i == 0 else ''}",
                       f"回答 {i}（r = {r:g}）{'——漂移被扫描' if i == 0 else ''}"), xs, ys[i])
              for i, r in enumerate(rewards)]
    return [Panel(T("zero-sum coefficients of one group", "同一组的零和系数"),
                  T("mean KL drift K_0 of response 0 (nats)", "回答 0 的平均 KL 漂移 K_0（nats）"),
                  T("coefficient c", "系数 c"), series,
                  marks=[Mark("x", drift, T(f"the others' drift = {drift:g}", f"其余回答的漂移 = {drift:g}"))],
                  source=f"{method.name} advantage stage (objectives.zcpo.zcpo_coefficients, "
                         f"β = {method.p.drift_coef:g})")]


@view("stare_gate")
def stare_gate(method: Method, *, lo: float = 0.0, hi: float = 0.8, points: int = 81) -> list[Panel]:
    """A group of two responses (rewards 1 and 0), two tokens each, one rare (critical) and
    one common; the current entropy H sweeps [lo, hi]: each token's advantage after the
    method's own advantage stage, for the method's weights and for the two-sided variant."""
    target = method.p.stare_target_entropy
    xs = grid(lo, hi, points, keys=(target,))
    lp_old = torch.tensor([[-0.05, -3.0], [-0.05, -3.0]], dtype=F64)
    variants = [(method, T(method.name))]
    if method.p.stare_attenuate == 1.0:
        variants.append((method.with_params({"stare_attenuate": 0.9}), T("two-sided (M = 0.9)", "双侧（M = 0.9）")))
    series = []
    for m, name in variants:
        rare_pos, rare_neg = [], []
        for H in xs:
            batch = bare_batch(2, 2, rewards=[1.0, 0.0], logp_old=lp_old,
                               extras={"stare_entropy": torch.tensor(H)})
            a = advantages(m, batch)
            rare_pos.append(float(a[0, 1] / a[0, 0]))
            rare_neg.append(float(a[1, 1] / a[1, 0]))
        series += [Series({lang: f"{name[lang]}: {w[lang]}" for lang in ("en", "zh")}, xs, ys, kind="step")
                   for w, ys in ((T("rare token, A > 0", "罕见词元，A > 0"), rare_pos),
                                 (T("rare token, A < 0", "罕见词元，A < 0"), rare_neg))]
    return [Panel(T("weight on a critical token's advantage", "关键词元优势上的权重"),
                  T("current mean entropy H (nats)", "当前平均熵 H（nats）"),
                  T("A'/A (critical vs. common token)", "A'/A（关键词元相对常见词元）"), series,
                  marks=[Mark("x", target, T(f"target H* = {target:g}", f"目标 H* = {target:g}"))],
                  source=f"{method.name} advantage stage (objectives.stare.stare_reweight)")]


@view("reco_weights")
def reco_weights(method: Method, *, p_old: float = 0.5, points: int = 81, group_size: int | None = None
                 ) -> list[Panel]:
    """Left: the token weight g(v) against the current probability p of a token whose old
    probability is `p_old`. Right: the response weight against its old sequence
    probability, for the method's G (`objectives.reco.reco_weights` with the method's bounds,
    `objectives.reco.expected_counts`)."""
    p = method.p
    G = int(group_size or p.reco_group_size or RUN.group_size)
    kw = dict(eps_v=p.reco_eps_v, g_min=p.reco_g_min, g_max=p.reco_g_max)
    xs = grid(0.01, 0.99, points, keys=(p_old,))
    lp = torch.log(torch.tensor(xs, dtype=F64)).reshape(-1, 1)
    w, _ = reco_k.reco_weights(lp, torch.full_like(lp, float(torch.log(torch.tensor(p_old)))), _ones(len(xs)),
                               group_size=1, **kw)
    seq = grid(1e-4, 1.0, points, log=True, keys=(1.0 / G,))
    lps = torch.log(torch.tensor(seq, dtype=F64)).reshape(-1, 1)
    ws = 1.0 / reco_k.expected_counts(lps, _ones(len(seq)), G).exp().clamp(min=1.0)
    return [
        Panel(T("token weight", "词元权重"), T("current probability p of the token", "该词元当前的概率 p"),
              T("g(v), v = p(1−p)/(p_old(1−p_old))", "g(v)，v = p(1−p)/(p_old(1−p_old))"),
              [Series(T(f"p_old = {p_old:g}"), xs, [float(v) for v in w[:, 0]])],
              marks=[Mark("x", p_old, T("p = p_old"))], source="objectives.reco.reco_weights"),
        Panel(T("response weight", "回答权重"), T("old probability π_old(y) of the response", "回答的旧概率 π_old(y)"),
              T("1/max(1, G·π_old(y))"), [Series(T(f"G = {G}"), seq, [float(v) for v in ws.reshape(-1)])],
              xscale="log", marks=[Mark("x", 1.0 / G, T(f"1/G = {1.0 / G:g}"))],
              source="objectives.reco.expected_counts"),
    ]


@view("erpo_weights")
def erpo_weights(method: Method, *, others=(-2.0, -1.5), lo: float = -4.0, hi: float = 0.0, points: int = 81,
                 coefs=None) -> list[Panel]:
    """Three questions, the first one's typicality τ_0 swept over [lo, hi], the others at
    `others`: the first question's weight ω_0 for the method's λ_Q and two neighbours
    (`objectives.erpo.question_weights`)."""
    lam = method.p.qkl_coef
    coefs = coefs or (lam / 4, lam, lam * 4)
    xs = grid(lo, hi, points)
    series = []
    for c in coefs:
        ys = []
        for t in xs:
            w, _ = erpo_k.question_weights(torch.tensor([t, *others], dtype=F64), qkl_coef=c)
            ys.append(float(w[0]))
        series.append(Series(T(f"λ_Q = {c:g}"), xs, ys))
    return [Panel(T("weight of one question", "一个问题的权重"),
                  T("typicality τ_0 of the question (mean reference log-prob)", "问题的典型度 τ_0（参考模型平均对数概率）"),
                  T("question weight ω_0 (mean over the batch = 1)", "问题权重 ω_0（批次均值 = 1）"), series,
                  marks=[Mark("y", 1.0, T("ω = 1 (plain GRPO)", "ω = 1（普通 GRPO）"))],
                  source="objectives.erpo.question_weights")]


@view("tlm_turns")
def tlm_turns(method: Method, *, first_turn: float = -0.5, lo: float = -3.0, hi: float = 0.0, points: int = 61,
              u_lo: float = -3.0, u_hi: float = 3.0) -> list[Panel]:
    """Left: the two turn weights of a two-turn trajectory against the second turn's
    reference confidence (the first at `first_turn`). Right: the gradient on log π of one
    token against u = log(π_θ/π_ref), for a positive and a negative trajectory
    (`objectives.tlm_dre`, the method's τ and κ, autograd)."""
    p = method.p
    xs = grid(lo, hi, points, keys=(first_turn,))
    w0, w1 = [], []
    for c in xs:
        lam = tlm_k.turn_weights(torch.tensor([[first_turn, c]], dtype=F64), torch.tensor([[True, True]]),
                                 tau=p.turn_tau)
        w0.append(float(lam[0, 0]))
        w1.append(float(lam[0, 1]))
    us = grid(u_lo, u_hi, points, keys=(0.0,))
    grads = {}
    for name, pol in (("pos", 1.0), ("neg", -1.0)):
        ys = []
        for u in us:
            lp_ref = torch.tensor([[-1.0]], dtype=F64)
            lp = (lp_ref + u).requires_grad_(True)
            loss, _ = tlm_k.tlm_dre(lp, lp_ref, torch.tensor([pol], dtype=F64), torch.zeros((1, 1), dtype=torch.long),
                                    _ones(1), tau=p.turn_tau, kappa_pos=p.kappa_pos, kappa_neg=p.kappa_neg)
            (g,) = torch.autograd.grad(loss.sum(), lp)
            ys.append(float(-g[0, 0]))
        grads[name] = ys
    return [
        Panel(T("turn weights", "轮次权重"), T("confidence c_1 of turn 1 (mean reference log-prob)",
                                             "第 1 轮的置信度 c_1（参考模型平均对数概率）"),
              T("turn weight λ_k", "轮次权重 λ_k"),
              [Series(T(f"turn 0 (c_0 = {first_turn:g})", f"第 0 轮（c_0 = {first_turn:g}）"), xs, w0),
               Series(T("turn 1", "第 1 轮"), xs, w1)],
              marks=[Mark("x", first_turn, T("c_1 = c_0"))], source="objectives.tlm_dre.turn_weights"),
        Panel(T("push on one token", "对单个词元的推动"), T("u = log(π_θ/π_ref)"),
              T("−∂loss/∂log π (turn weight 1)", "−∂损失/∂log π（轮次权重为 1）"),
              [Series(T(f"positive trajectory (κ₊ = {p.kappa_pos:g})", f"正轨迹（κ₊ = {p.kappa_pos:g}）"), us,
                      grads["pos"]),
               Series(T(f"negative trajectory (κ₋ = {p.kappa_neg:g})", f"负轨迹（κ₋ = {p.kappa_neg:g}）"), us,
                      grads["neg"])],
              marks=[Mark("y", 0.0, T("no push", "无推动"))], source="objectives.tlm_dre.tlm_dre + autograd"),
    ]


@view("rlid_marginal")
def rlid_marginal(method: Method, *, confidence: float = 0.9, points: int = 81, max_length: int = 6) -> list[Panel]:
    """Left: the label-marginal regularizer R = KL(U‖m̄) of a two-label menu against the
    share of decisions whose confident choice (probability `confidence`) is label 0:
    every row is confident, R only sees the marginal. Right: the per-decision weight
    L̄/L_e of an episode against its length, beside an episode of length 1
    (`objectives.rlid`)."""
    xs = grid(0.0, 1.0, points, keys=(0.5,))
    ys = []
    n = 20
    for share in xs:
        k = round(share * n)
        rows = [[confidence, 1 - confidence]] * k + [[1 - confidence, confidence]] * (n - k)
        ys.append(float(rlid_k.label_marginal_kl(torch.log(torch.tensor(rows, dtype=F64)),
                                                 torch.zeros(n, dtype=torch.long))))
    lengths = list(range(1, int(max_length) + 1))
    w_long, w_one = [], []
    for L in lengths:
        ids = torch.tensor([0] * L + [1])
        w = rlid_k.episode_weights(ids, torch.tensor([L] * L + [1]))
        w_long.append(float(w[0]))
        w_one.append(float(w[-1]))
    return [
        Panel(T("label-marginal regularizer", "标签边际正则项"),
              T(f"share of decisions choosing label 0 with p = {confidence:g}",
                f"以 p = {confidence:g} 选择标签 0 的决策所占比例"),
              T("R = KL(U ‖ m̄)"), [Series(T(method.name), xs, ys)],
              marks=[Mark("x", 0.5, T("balanced labels: R = 0", "标签均衡：R = 0"))],
              source=f"objectives.rlid.label_marginal_kl (over {n} decisions)"),
        Panel(T("episode-length weights", "回合长度权重"), T("length L of an episode", "一个回合的长度 L"),
              T("weight per decision", "每个决策的权重"),
              [Series(T("each decision of the episode of length L", "长度为 L 的回合中的每个决策"), lengths, w_long,
                      markers=True),
               Series(T("the decision of an episode of length 1", "长度为 1 的回合中的决策"), lengths, w_one,
                      markers=True)],
              source="objectives.rlid.episode_weights"),
    ]
