"""Views of advantage estimators: what the method's own advantage stage (and its round
stages) makes of example rewards, groups, values, steps, intervals and vectors."""

from __future__ import annotations

import torch

from policylab.kernels import advantages as A
from policylab.methods.spec import Method
from policylab.learn.figures.model import Mark, Panel, Series, T, view
from policylab.learn.figures.common import F64, advantages, bare_batch, grid

ADV = T("advantage A", "优势 A")
POS = T("position t in the response", "回答中的位置 t")


def _src(method: Method) -> str:
    return f"{method.name} advantage stage ({method.advantage.name})"


@view("group_advantages")
def group_advantages(method: Method, *, rewards=(0.0, 0.2, 0.4, 0.5, 0.7, 1.0), group_size: int = 8) -> list[Panel]:
    """Two panels through the method's advantage stage: (1) one example group, advantage
    against reward; (2) a binary group of `group_size` replies with k correct: the
    advantage of a correct and of a wrong reply against k."""
    r = [float(v) for v in rewards]
    a = advantages(method, bare_batch(len(r), 1, rewards=r))
    order = sorted(range(len(r)), key=lambda i: r[i])
    p1 = Panel(T(f"one group of {len(r)} replies", f"一组 {len(r)} 个回答"), T("reward r", "奖励 r"), ADV,
               [Series(T(method.name), [r[i] for i in order], [float(a[i]) for i in order], markers=True)],
               marks=[Mark("y", 0.0, T("A = 0"))], source=_src(method))
    G = int(group_size)
    ks, right, wrong = list(range(G + 1)), [], []
    for k in ks:
        adv = advantages(method, bare_batch(G, 1, rewards=[1.0] * k + [0.0] * (G - k)))
        right.append(float(adv[0]) if k > 0 else None)
        wrong.append(float(adv[-1]) if k < G else None)
    p2 = Panel(T(f"binary rewards, group of {G}", f"二元奖励，每组 {G} 个"),
               T("number of correct replies k", "正确回答数 k"), ADV,
               [Series(T("a correct reply", "正确的回答"), [k for k in ks if right[k] is not None],
                       [v for v in right if v is not None], markers=True),
                Series(T("a wrong reply", "错误的回答"), [k for k in ks if wrong[k] is not None],
                       [v for v in wrong if v is not None], markers=True)],
               marks=[Mark("y", 0.0, T("A = 0"))], source=_src(method))
    return [p1, p2]


@view("remax_advantages")
def remax_advantages(method: Method, *, greedy=(0.0, 0.5, 1.0), points: int = 11) -> list[Panel]:
    """ReMax: the advantage of a sampled reply against its reward, for several rewards of
    the greedy reply of the same prompt (the method's stage, with `greedy_rewards`)."""
    xs = grid(0.0, 1.0, points)
    series = []
    for g in greedy:
        b = bare_batch(len(xs), 1, rewards=xs, greedy_rewards=torch.full((len(xs),), float(g), dtype=F64))
        series.append(Series(T(f"greedy reply's reward = {g:g}", f"贪心回答的奖励 = {g:g}"), xs,
                             advantages(method, b).tolist()))
    return [Panel(T("one sampled reply", "一个采样回答"), T("reward of the sampled reply", "采样回答的奖励"), ADV, series,
                  marks=[Mark("y", 0.0, T("A = 0"))], source=_src(method))]


@view("return_to_go")
def return_to_go(method: Method, *, length: int = 12, rewards=(1.0, 0.0), ref_log_ratio: float = 2.0) -> list[Panel]:
    """REINFORCE++: token advantages along two responses whose every token has
    log π_old − log π_ref = `ref_log_ratio`: the method's KL-in-reward round stage, then
    its advantage stage (return-to-go, whitened over the batch); and the same with the
    KL coefficient at 0 for comparison."""
    B, L = len(rewards), int(length)
    lp_old = torch.full((B, L), -1.0, dtype=F64)
    fields = dict(logp_old=lp_old, logp_ref=lp_old - float(ref_log_ratio))
    xs = list(range(L))
    series = []
    with_kl = advantages(method, bare_batch(B, L, rewards=list(rewards), **fields))
    plain = advantages(method.with_params({**method.p, "kl_coef": 0.0}), bare_batch(B, L, rewards=list(rewards), **fields))
    beta = method.p.kl_coef
    for i, r in enumerate(rewards):
        series.append(Series(T(f"reward {r:g}, KL β = {beta:g}", f"奖励 {r:g}，KL β = {beta:g}"), xs,
                             with_kl[i].tolist(), kind="step"))
    for i, r in enumerate(rewards):
        series.append(Series(T(f"reward {r:g}, no KL", f"奖励 {r:g}，无 KL"), xs, plain[i].tolist(), kind="step",
                             reference=True))
    return [Panel(T(f"{B} responses, log π_old − log π_ref = {ref_log_ratio:g} per token",
                    f"{B} 个回答，每个词元 log π_old − log π_ref = {ref_log_ratio:g}"), POS, ADV, series,
                  source=_src(method) + " after kl_reward_penalty")]


@view("gae_advantages")
def gae_advantages(method: Method, *, length: int = 16, reward: float = 1.0, values=(0.2, 0.7),
                   lams=(1.0, 0.0)) -> list[Panel]:
    """GAE along one response with its outcome reward at the last token and critic values
    rising linearly from values[0] to values[1]: the method's advantage stage at its own λ,
    and at the `lams` for comparison (λ = 1: return minus value; λ = 0: one-step TD).
    π_old = π_ref here, so a KL-in-reward penalty is 0 (the figure shows the estimator)."""
    L = int(length)
    v = torch.linspace(float(values[0]), float(values[1]), L, dtype=F64).unsqueeze(0)
    xs = list(range(L))
    lp = torch.full((1, L), -1.0, dtype=F64)

    def run(m):
        return advantages(m, bare_batch(1, L, rewards=[float(reward)], values=v, logp_old=lp, logp_ref=lp))[0].tolist()

    lam = method.p.lam
    series = [Series(T(f"{method.name}, λ = {lam:g}"), xs, run(method), markers=True)]
    for other in lams:
        series.append(Series(T(f"λ = {other:g}"), xs, run(method.with_params({**method.p, "lam": float(other)})),
                             reference=True))
    series.append(Series(T("critic value V_t", "价值网络估计 V_t"), xs, v[0].tolist(), reference=True))
    return [Panel(T(f"one response, reward {reward:g} at the end", f"一个回答，结尾奖励 {reward:g}"), POS, ADV, series,
                  source=_src(method))]


@view("vapo_lambda")
def vapo_lambda(method: Method, *, max_length: int = 400) -> list[Panel]:
    """VAPO's length-adaptive λ of the policy's GAE against the response length
    (`advantages.length_adaptive_lambda` with the method's α); the critic's λ as a line."""
    xs = list(range(1, int(max_length) + 1))
    lam, _ = A.length_adaptive_lambda(torch.tensor(xs, dtype=F64), alpha=method.p.alpha)
    lc = method.p.lam_critic
    return [Panel(T(f"α = {method.p.alpha:g}"), T("response length l (tokens)", "回答长度 l（词元数）"),
                  T("λ of the policy's GAE", "策略 GAE 的 λ"), [Series(T("λ_policy = 1 − 1/(α·l)"), xs, lam.tolist())],
                  marks=[Mark("y", lc, T(f"λ_critic = {lc:g}"))], ylim=(0.0, 1.05),
                  source="advantages.length_adaptive_lambda")]


@view("process_advantages")
def process_advantages(method: Method, *, step_rewards=((1.0, 1.0, 1.0), (1.0, 0.0, 0.0)), step_ends=(3, 7, 11)
                       ) -> list[Panel]:
    """Process supervision: token advantages of two responses of one group with three
    scored steps each (the method's stage, extras step_rewards / step_ends / step_mask)."""
    B, K, L = len(step_rewards), len(step_ends), max(step_ends) + 1
    ex = {"step_rewards": torch.tensor(step_rewards, dtype=F64),
          "step_ends": torch.tensor([list(step_ends)] * B, dtype=torch.long),
          "step_mask": torch.ones((B, K), dtype=torch.bool)}
    a = advantages(method, bare_batch(B, L, rewards=[0.0] * B, extras=ex))
    xs = list(range(L))
    series = [Series(T(f"step rewards {list(map(float, sr))}", f"步骤奖励 {list(map(float, sr))}"), xs, a[i].tolist(),
                     kind="step") for i, sr in enumerate(step_rewards)]
    marks = [Mark("x", e, T(f"end of step {k + 1}", f"第 {k + 1} 步结束")) for k, e in enumerate(step_ends)]
    return [Panel(T("one group, two responses", "一组中的两个回答"), POS, ADV, series, marks=marks, source=_src(method))]


@view("interval_advantages")
def interval_advantages(method: Method, *, intervals=((0.0, 0.2), (0.1, 0.5), (0.6, 0.9), (0.8, 1.0)),
                        gap: float = 0.4, points: int = 61) -> list[Panel]:
    """Range-GRPO through the method's stage: (1) one group of reward intervals, each
    reply's advantage at its interval's midpoint, with the point limit (every interval
    shrunk to its midpoint); (2) two replies whose intervals, centred `gap` apart, widen:
    the upper reply's advantage against the half-width."""
    iv = torch.tensor(intervals, dtype=F64)
    mid = iv.mean(-1)
    a = advantages(method, bare_batch(len(iv), 1, reward_intervals=iv))
    point = advantages(method, bare_batch(len(iv), 1, reward_intervals=torch.stack([mid, mid], -1)))
    order = mid.argsort().tolist()
    p1 = Panel(T(f"one group of {len(iv)} intervals", f"一组 {len(iv)} 个奖励区间"),
               T("reward interval (point: midpoint)", "奖励区间（点：中点）"), ADV,
               [Series(T("intervals", "区间"), [float(mid[i]) for i in order], [float(a[i]) for i in order], kind="scatter",
                       xerr=[(float(iv[i, 0]), float(iv[i, 1])) for i in order]),
                Series(T("point limit [m, m]", "点极限 [m, m]"), [float(mid[i]) for i in order],
                       [float(point[i]) for i in order], reference=True, markers=True)],
               marks=[Mark("y", 0.0, T("A = 0"))], source=_src(method))
    hs = grid(0.0, 0.4, points, keys=(gap / 2,))
    ys = []
    for h in hs:
        pair = torch.tensor([[0.3 + gap - h, 0.3 + gap + h], [0.3 - h, 0.3 + h]], dtype=F64)
        ys.append(float(advantages(method, bare_batch(2, 1, reward_intervals=pair))[0]))
    p2 = Panel(T(f"two replies, centres {gap:g} apart", f"两个回答，中心相距 {gap:g}"),
               T("half-width h of both intervals", "两个区间的半宽 h"), ADV,
               [Series(T("the upper reply", "较高的回答"), hs, ys)],
               marks=[Mark("x", gap / 2, T("intervals touch", "区间相接"))], source=_src(method))
    return [p1, p2]


@view("dimension_advantages")
def dimension_advantages(method: Method, *, vectors=((1.0, 1.0, 0.0), (0.0, 0.5, 1.0), (0.0, 0.2, 1.0), (1.0, 1.0, 1.0),
                                                     (0.0, 0.1, 0.0), (0.0, 0.5, 0.0))) -> list[Panel]:
    """GPRL through the method's stage: each reply's advantage against its weighted reward
    sum, next to the estimator that sums first and standardizes the sum
    (`advantages.grpo` on Σ_d w_d r_d, same std convention)."""
    r = torch.tensor(vectors, dtype=F64)
    a = advantages(method, bare_batch(len(r), 1, reward_vectors=r))
    w = torch.tensor([float(x) for x in method.p.dimension_weights.split(",")], dtype=F64)
    total = (r * w).sum(-1)
    summed = A.grpo(total, torch.zeros(len(r), dtype=torch.long), std=method.p.std, eps=method.p.eps)
    order = total.argsort(stable=True).tolist()
    xs = [float(total[i]) for i in order]
    return [Panel(T("one group of reward vectors", "一组奖励向量"), T("weighted reward sum Σ_d w_d·r_d", "加权奖励和 Σ_d w_d·r_d"),
                  ADV, [Series(T(f"{method.name}: each dimension standardized", f"{method.name}：逐维标准化"), xs,
                               [float(a[i]) for i in order], kind="scatter"),
                        Series(T("sum first, then standardize", "先求和再标准化"), xs, [float(summed[i]) for i in order],
                               kind="scatter", reference=True)],
                  marks=[Mark("y", 0.0, T("A = 0"))], source=_src(method) + " and advantages.grpo")]


@view("gibbs_coefficients")
def gibbs_coefficients(method: Method, *, rewards=(1.0, 1.0, 0.0, 0.0), lo: float = -10.0, hi: float = 10.0,
                       points: int = 81) -> list[Panel]:
    """GGPO's coefficients κ (they take the advantage's place) in one group, as the first
    reply's log-ratio to the reference moves and the others stay at 0 (the method's
    advantage stage, from `logp_current` and `logp_ref`): κ of the first reply, of the
    next reply with the same reward, and of the first reply with a lower reward."""
    B = len(rewards)
    shown = [0] + [i for i in range(1, B) if rewards[i] == rewards[0]][:1] + \
        [i for i in range(1, B) if rewards[i] < rewards[0]][:1]
    c = method.p.coef_clip
    xs = grid(lo, hi, points, keys=(-c, c, 0.0))
    base = -1.0 - max(abs(lo), abs(hi))  # log π_ref of the one token of each reply (log-probs stay < 0)
    ys = {i: [] for i in shown}
    for x in xs:
        cur = torch.full((B, 1), base, dtype=F64)
        cur[0, 0] += x
        kappa = advantages(method, bare_batch(B, 1, rewards=list(rewards), logp_current=cur,
                                              logp_ref=torch.full((B, 1), base, dtype=F64)))
        for i in shown:
            ys[i].append(float(kappa[i]))
    def name(i):
        base = T("the first reply", "第一个回答") if i == 0 else T(f"reply {i + 1}", f"第 {i + 1} 个回答")
        return {lang: f"{base[lang]} (r = {rewards[i]:g})" for lang in base}

    series = [Series(name(i), xs, ys[i]) for i in shown]
    return [Panel(T(f"group rewards {list(map(float, rewards))}, β = {method.p.beta:g}",
                    f"组内奖励 {list(map(float, rewards))}，β = {method.p.beta:g}"),
                  T("log π/π_ref of the first reply (the others: 0)", "第一个回答的 log π/π_ref（其余为 0）"),
                  T("coefficient κ", "系数 κ"), series,
                  marks=[Mark("x", -c, T(f"−c = {-c:g}")), Mark("x", c, T(f"c = {c:g}"))], source=_src(method))]
