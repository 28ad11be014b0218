"""Views of the rewards that read more than a verifier's 0/1: the stated confidence
(rlcr), a group's class frequencies (mad_rl), the model's answer posteriors (rlcpr), the
runtime of correct code (code_opt) and a frozen critic's value (rfpo).

rlcr and mad_rl call the method's own reward stage on chosen replies. rlcpr's stage is
called with the posteriors it would read from the policy's scoring forward given as
inputs (a figure has no model: the panel says so). code_opt's and rfpo's stages need the
sandbox and a trained critic, so their panels call the kernels those stages call, with
the method's own parameters and synthetic timings and values, labelled as such."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from policylab.methods.context import Sampled
from policylab.methods.spec import Method
from policylab.kernels.rewards import critic_reward as crit
from policylab.kernels.rewards import runtime as rt
from policylab.kernels.rewards.verifiers import exact_numeric_reward
from policylab.learn.figures.model import Mark, Panel, Series, T, view
from policylab.learn.figures.common import F64, bare_batch, grid, reward_stage, stage_context, stage_named

REWARD = T("reward", "奖励")


@view("confidence_reward")
def confidence_reward(method: Method, *, gold: int = 12, wrong: int = 7, points: int = 21) -> list[Panel]:
    """RLCR's reward against the stated confidence q, for a right and a wrong answer (the
    method's reward stage on replies "<answer>, confidence: q"), and the reward of replies
    whose confidence does not parse (its penalty path)."""
    qs = grid(0.0, 1.0, points)
    out = {}
    for name, ans in (("right", gold), ("wrong", wrong)):
        texts = [f"The answer is {ans}. confidence: {q:.2f}" for q in qs]
        out[name] = reward_stage(method, "rlcr_confidence", texts, [str(gold)] * len(qs),
                                 task_reward=exact_numeric_reward)["rewards"].tolist()
    tails = ("", " confidence: high", " confidence: 1.4")
    bad_r = {name: reward_stage(method, "rlcr_confidence", [f"The answer is {ans}.{t}" for t in tails],
                                [str(gold)] * len(tails), task_reward=exact_numeric_reward)["rewards"].tolist()
             for name, ans in (("right", gold), ("wrong", wrong))}
    pen = float(method.p.invalid_confidence_penalty)
    return [
        Panel(T(f"gold answer {gold}", f"标准答案 {gold}"), T("stated confidence q", "给出的置信度 q"), REWARD,
              [Series(T(f"right answer ({gold}): 1 − (q − 1)²", f"答案正确（{gold}）：1 − (q − 1)²"), qs, out["right"]),
               Series(T(f"wrong answer ({wrong}): −q²", f"答案错误（{wrong}）：−q²"), qs, out["wrong"])],
              source="reward stage rlcr_confidence (rewards.calibration.rlcr_rewards)"),
        Panel(T(f"confidence that does not parse (penalty {pen:g})", f"无法解析的置信度（惩罚 {pen:g}）"),
              T("confidence field of the reply", "回答的置信度字段"), REWARD,
              [Series(T(f"right answer: 1 − {pen:g}", f"答案正确：1 − {pen:g}"), list(range(len(tails))),
                      bad_r["right"], kind="bar"),
               Series(T(f"wrong answer: 0 − {pen:g}", f"答案错误：0 − {pen:g}"), list(range(len(tails))),
                      bad_r["wrong"], kind="bar")],
              categories=["missing", "'high'", "1.4"],
              source="reward stage rlcr_confidence (rewards.calibration.parse_confidence)"),
    ]


@view("class_match")
def class_match(method: Method, *, classes=("heads", "tails"), target=(0.5, 0.5, 0.0),
                replies=("heads", "heads", "heads", "heads", "heads", "tails", "tails", "maybe")) -> list[Panel]:
    """MaD-RL on one group: the group's class frequencies (the invalid class kept in the
    denominator) against the target, and the reward each reply gets from the method's
    reward stage (every reply valid = correct 1, plus λ times its class's match term)."""
    G = len(replies)
    cls = list(classes)
    correct = [1.0 if r in cls else 0.0 for r in replies]
    batch = bare_batch(G, 1, rewards=correct).replace(outcome={"correct": torch.tensor(correct, dtype=F64)})
    examples = [SimpleNamespace(answer="", prompt="", meta={"classes": cls, "target": list(target)})] * G
    stage = stage_named(method, "reward", "mad_match")
    changes, _ = stage.fn(Sampled(batch, list(replies), examples, [], []), stage_context(method, stage))
    ids = changes["extras"]["class_id"].tolist()
    names = cls + ["invalid"]
    freq = [sum(i == k for i in ids) / G for k in range(len(names))]
    return [
        Panel(T(f"group of {G}", f"每组 {G} 个"), T("class", "类别"), T("share of the group", "占组内比例"),
              [Series(T("sampled f̂ (invalid counted)", "采样频率 f̂（计入无效）"), list(range(len(names))), freq,
                      kind="bar"),
               Series(T("target p*", "目标 p*"), list(range(len(names))), list(target), kind="bar", reference=True)],
              categories=names, source="reward stage mad_match (rewards.distribution.group_frequencies)"),
        Panel(T("reward of each reply", "每个回答的奖励"), T("reply (its class)", "回答（其类别）"), REWARD,
              [Series(REWARD, list(range(G)), changes["rewards"].tolist(), kind="bar")],
              categories=[f"{i + 1}: {names[c]}" for i, c in enumerate(ids)],
              source=f"reward stage mad_match (rewards.distribution.mad_rl_rewards, {method.p.match_form})"),
    ]


class _CharTokenizer:
    """One id per character: the posterior continuation's lengths only."""

    eos_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return [1 + (ord(c) % 1000) for c in text]


class _GivenPosteriors:
    """Stands in for the policy's scoring forward: returns log p of the given posteriors."""

    def __init__(self, posteriors):
        self.posteriors = list(posteriors)

    def continuation_logprobs(self, batch, continuations, scored, *, strip_token=None):
        return torch.tensor([math.log(p) for p in self.posteriors], dtype=F64)


@view("posterior_gate")
def posterior_gate(method: Method, *, lengths=(6, 9, 12, 18), concentrated=(0.62, 0.64, 0.66, 0.65),
                   spread=(0.2, 0.5, 0.7, 0.9)) -> list[Panel]:
    """RLCPR's shaped reward against reply length for one group of right replies (reward
    1), once with answer posteriors within τ_post of each other (the gate opens: the
    relative length penalty) and once spread wider (no penalty). The posteriors are given
    here; in training the stage reads them from the policy's own scoring forward."""
    stage = stage_named(method, "reward", "rlcpr_posterior")
    G, L = len(lengths), max(lengths)
    mask = torch.zeros((G, L), dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    series = []
    for label, post in ((T("posteriors concentrated", "后验集中"), concentrated),
                        (T("posteriors spread", "后验分散"), spread)):
        batch = bare_batch(G, L, mask=mask, rewards=[1.0] * G)
        s = Sampled(batch, [""] * G, [SimpleNamespace(answer="12", prompt="")] * G, [], [])
        ctx = stage_context(method, stage, tokenizer=_CharTokenizer(), worker=_GivenPosteriors(post))
        changes, _ = stage.fn(s, ctx)
        rng = max(post) - min(post)
        series.append(Series({k: f"{v} (range {rng:.2f})" for k, v in label.items()}, list(lengths),
                             changes["rewards"].tolist(), markers=True))
    return [Panel(T(f"τ_post = {method.p.posterior_range:g}, L_thr = {method.p.length_threshold:g}, "
                    f"λ = {method.p.length_coef:g}"),
                  T("reply length (tokens)", "回答长度（词元数）"), REWARD, series,
                  source="reward stage rlcpr_posterior (rewards.length_gate.rlcpr_shaping), posteriors given")]


@view("runtime_reward")
def runtime_reward(method: Method, *, reference_ms: float = 10.0, spread: float = 0.3, points: int = 81) -> list[Panel]:
    """code_opt's reward against a correct candidate's median runtime relative to the
    reference's, with the noise band shaded by marks, and the flat reward of incorrect
    code: the kernel the reward stage calls, with the method's parameters, on synthetic
    timings (provenance "synthetic")."""
    p = method.p
    n = int(p.timing_repeats)
    ref = [reference_ms * (1 + spread * (2 * i / (n - 1) - 1)) for i in range(n)]
    lo, hi = rt.noise_band(ref, alpha=p.band_alpha, min_rel_band=p.min_rel_band, n_min=n)
    med = rt.runtime_statistic(ref, n_min=n)
    xs = grid(0.25, 4.0, points, log=True, keys=(lo / med, hi / med, 1.0))
    cand = [[x * t for t in ref] for x in xs]
    kw = dict(form=p.speed_form, alpha=p.band_alpha, min_rel_band=p.min_rel_band, n_min=n,
              speedup_cap=p.speedup_cap, speed_weight=p.speed_weight, incorrect_reward=p.incorrect_reward,
              provenance="synthetic")
    right, _ = rt.code_opt_rewards([True] * len(xs), cand, [ref] * len(xs), timed_out=[False] * len(xs), **kw)
    wrong, _ = rt.code_opt_rewards([False] * len(xs), cand, [ref] * len(xs), timed_out=[False] * len(xs), **kw)
    return [Panel(T(f"{p.speed_form}, speed weight {p.speed_weight:g}", f"{p.speed_form}，速度权重 {p.speed_weight:g}"),
                  T("candidate runtime / reference median", "候选运行时间 / 参考中位数"), REWARD,
                  [Series(T("passes every test", "通过全部测试"), xs, right.tolist()),
                   Series(T("fails a test (never timed into the reward)", "未通过测试（运行时间不计入奖励）"), xs,
                          wrong.tolist(), reference=True)],
                  xscale="log", marks=[Mark("x", lo / med, T("noise band, low", "噪声带下界")), Mark("x", hi / med, T("noise band, high", "噪声带上界"))],
                  source="rewards.runtime.code_opt_rewards on synthetic timings (the stage code_runtime measures them "
                         "in the sandbox)")]


@view("critic_reward")
def critic_reward(method: Method, *, bias=(-0.1, 0.01), lengths=(8, 32), points: int = 41) -> list[Panel]:
    """RFPO's reward against the frozen critic's value of a whole reply: a finished reply
    gets 1[V − b(|y|) ≥ τ] (the length-bias line b moves the step), a truncated one the
    debiased value itself as a forecast. The kernel the reward stage calls, with the
    method's τ and an example bias line (a trained critic fits its own)."""
    tau = float(method.p.tau)
    vs = grid(0.0, 1.0, points)
    v = torch.tensor(vs, dtype=F64)
    series = []
    for L in lengths:
        n = torch.full_like(v, float(L))
        r, _, _ = crit.rfpo_rewards(v, n, torch.ones(len(vs), dtype=torch.bool), bias=tuple(bias), tau=tau)
        series.append(Series(T(f"finished, |y| = {L}", f"已结束，|y| = {L}"), vs, r.tolist(), kind="step"))
    n = torch.full_like(v, float(lengths[0]))
    r, _, _ = crit.rfpo_rewards(v, n, torch.zeros(len(vs), dtype=torch.bool), bias=tuple(bias), tau=tau)
    series.append(Series(T(f"truncated, |y| = {lengths[0]} (forecast)", f"被截断，|y| = {lengths[0]}（预测）"), vs,
                         r.tolist(), reference=True))
    a, b = bias
    return [Panel(T(f"τ = {tau:g}, b(|y|) = {a:g} + {b:g}·|y|"), T("critic value V_ψ(y)", "评论家价值 V_ψ(y)"), REWARD,
                  series, marks=[Mark("y", tau, T("τ"))],
                  source="rewards.critic_reward.rfpo_rewards (the stage rfpo_critic reads V_ψ from the frozen critic)")]
