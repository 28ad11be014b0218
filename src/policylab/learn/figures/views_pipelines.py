"""Views of the pipeline methods: ppo_rlhf's shaped per-token reward (the reward model's
score once at the end, the KL to the SFT reference at every token) and what GAE makes
of it; fusion's MOPD signal from the teacher of a row's domain.

Every curve comes from the method's own stages: the KL-in-reward round stage and the
advantage stage (`_common.advantages`), `methods.stages.advantages.token_rewards` for
the reward the advantage stage reads, the MOPD advantage stage on a batch tagged with
domains and teacher log-probs."""

from __future__ import annotations

import math

import torch

from policylab.methods.spec import Method
from policylab.methods.stages.advantages import token_rewards
from policylab.trainer.rollout import apply_changes
from policylab.learn.figures.model import Mark, Panel, Series, T, view
from policylab.learn.figures.common import F64, advantages, bare_batch, grid, stage_context

POS = T("position t in the response", "回答中的位置 t")


def _shaped(method: Method, batch) -> list[float]:
    for stage in method.active("round"):
        if stage.name == "kl_reward_penalty":
            changes, _ = stage.fn(batch, stage_context(method, stage))
            batch = apply_changes(batch, changes, stage)
    return token_rewards(batch, method.name)[0].tolist()


@view("rlhf_reward")
def rlhf_reward(method: Method, *, length: int = 12, rm_score: float = 1.0, log_ratio: float = 0.5,
                values=(0.2, 0.6), beta_compare: float = 0.2) -> list[Panel]:
    """Two panels along one response whose every token has lp_old − lp_ref = `log_ratio`
    and whose reward-model score is `rm_score`: (1) the per-token reward the advantage
    stage reads (−β·k1 at every token, the score added once at the last), at the method's
    β, at `beta_compare` and at β = 0; (2) the GAE advantages of those rewards with critic
    values rising from values[0] to values[1]."""
    L = int(length)
    lp_old = torch.full((1, L), -1.0, dtype=F64)
    fields = dict(logp_old=lp_old, logp_ref=lp_old - float(log_ratio),
                  values=torch.linspace(float(values[0]), float(values[1]), L, dtype=F64).unsqueeze(0))
    xs = list(range(L))
    variants = [(method.p.kl_coef, False), (float(beta_compare), True), (0.0, True)]
    rew, adv = [], []
    for beta, ref in variants:
        m = method if beta == method.p.kl_coef and not ref else method.with_params({**method.p, "kl_coef": beta})
        label = T(f"β = {beta:g}" + ("" if ref else f" ({method.name})"))
        rew.append(Series(label, xs, _shaped(m, bare_batch(1, L, rewards=[rm_score], **fields)), kind="step",
                          reference=ref))
        adv.append(Series(label, xs, advantages(m, bare_batch(1, L, rewards=[rm_score], **fields))[0].tolist(),
                          markers=not ref, reference=ref))
    title = T(f"RM score {rm_score:g} once, log-ratio {log_ratio:g} per token",
              f"奖励模型得分 {rm_score:g}（一次），每词元对数比 {log_ratio:g}")
    return [
        Panel(title, POS, T("per-token reward r_t", "逐词元奖励 r_t"), rew, marks=[Mark("y", 0.0, T("r = 0"))],
              source=f"{method.name}: kl_reward_penalty round stage + token_rewards (the score at the last token)"),
        Panel(T("GAE advantages of these rewards", "这些奖励的 GAE 优势"), POS, T("advantage A", "优势 A"), adv,
              source=f"{method.name}: kl_reward_penalty + {method.advantage.name} advantage stage"),
    ]


def _mopd_batch(lp_student: torch.Tensor, lp_teacher: torch.Tensor, domain: int = 0):
    B, L = lp_student.shape
    return bare_batch(B, L, logp_current=lp_student,
                      extras={"logp_teacher": lp_teacher, "domain": torch.full((B,), domain, dtype=torch.long)})


@view("mopd_signal")
def mopd_signal(method: Method, *, p_student=(0.1, 0.5), lo: float = 0.02, hi: float = 0.99, points: int = 99,
                gaps=(0.5, -0.2, 0.1, 0.0, -0.4, 0.3)) -> list[Panel]:
    """Two panels through the method's MOPD advantage stage: (1) the advantage of one
    token against the teacher's probability of it, for several student probabilities
    (the teacher of the row's domain raises what it finds likelier than the student, and
    lowers the rest); (2) along one response with per-token gaps lp_student − lp_teacher =
    `gaps`, the 'token' horizon against the 'sequence' horizon (the sum to the end)."""
    xs = grid(lo, hi, points, log=True, keys=list(p_student))
    series, marks = [], []
    for ps in p_student:
        lt = torch.tensor(xs, dtype=F64).log().unsqueeze(-1)
        ls = torch.full_like(lt, math.log(ps))
        a = method.advantage.fn(_mopd_batch(ls, lt), stage_context(method, method.advantage)).adv[:, 0]
        series.append(Series(T(f"student π_θ = {ps:g}", f"学生 π_θ = {ps:g}"), xs, a.tolist()))
        marks.append(Mark("x", ps, T(f"teacher = student ({ps:g})", f"教师 = 学生（{ps:g}）")))
    p1 = Panel(T("one token of the student's own sample", "学生自己采样的一个词元"),
               T("domain teacher's probability of the token", "领域教师给该词元的概率"),
               T("advantage A", "优势 A"), series, marks=marks + [Mark("y", 0.0, T("A = 0"))], xscale="log",
               source=f"{method.name}: {method.advantage.name} advantage stage")
    L = len(gaps)
    ls = torch.full((1, L), -1.0, dtype=F64)
    lt = ls - torch.tensor([list(gaps)], dtype=F64)
    pos = list(range(L))
    out = []
    for horizon in ("token", "sequence"):
        m = method.with_params({**method.p, "mopd_horizon": horizon})
        a = m.advantage.fn(_mopd_batch(ls, lt), stage_context(m, m.advantage)).adv[0].tolist()
        ref = horizon != method.p.mopd_horizon
        out.append(Series(T(f"horizon '{horizon}'" + ("" if ref else f" ({method.name})"),
                            f"视野 '{horizon}'" + ("" if ref else f"（{method.name}）")), pos, a, kind="step",
                          reference=ref))
    p2 = Panel(T("one response, two horizons", "一个回答，两种视野"), POS, T("advantage A", "优势 A"), out,
               marks=[Mark("y", 0.0, T("A = 0"))],
               source=f"{method.name}: {method.advantage.name} advantage stage, both horizons, gaps lp_student − "
                      "lp_teacher = " + ", ".join(f"{g:g}" for g in gaps))
    return [p1, p2]
