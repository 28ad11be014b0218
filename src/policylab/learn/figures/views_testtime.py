"""Views of the test-time adaptation methods: which tokens TTPO's two terms train, what
Probe-ERPO's two branches give each ranked candidate, and TASCO's stability term against
the perturbed-prefix log-ratio. Every curve comes from the method's own stages or
objective; no gold answer is involved (these methods take none)."""

from __future__ import annotations

import math

import torch

from policylab.methods.context import Sampled
from policylab.methods.loss import tensor_inputs
from policylab.methods.spec import Method
from policylab.trainer.rollout import apply_changes
from policylab.kernels.testtime import probe as PR
from policylab.learn.figures.model import Mark, Panel, Series, T, view
from policylab.learn.figures.common import F64, bare_batch, grid, stage_context, stage_named

WEIGHT = T("weight on ∇log π of the token", "该词元 ∇log π 上的权重")


@view("ttpo_split")
def ttpo_split(method: Method, *, lo: float = 0.02, hi: float = 1.0, points: int = 99,
               answers=("12", "12", "7")) -> list[Panel]:
    """One unlabeled group (`answers`: a majority and a dissent). Every response column
    holds a token the sampler drew with probability p (the x axis); the method's vote
    (reward stage `self_vote`), split (round stage `ttpo_split`), advantage stage and
    self-distillation term give each token's weight on ∇log π: the distillation weight on
    an agreeing reply (0 once p > τ_conv), the RL advantage on the dissenting reply (0 once
    p > τ_err)."""
    p = method.p
    xs = grid(lo, hi, points, keys=(p.ttpo_tau_conv, p.ttpo_tau_err))
    B, T_ = len(answers), len(xs)
    texts = [f"... so the answer is {a}." for a in answers]
    vote = stage_named(method, "reward", "self_vote")
    batch = bare_batch(B, T_, group=[0] * B, rewards=[0.0] * B)
    changes, _ = vote.fn(Sampled(batch, texts, [None] * B, [], []), stage_context(method, vote))
    batch = apply_changes(batch, changes, vote)
    lp_b = torch.log(torch.tensor(xs, dtype=F64)).expand(B, T_).clone()
    batch = batch.replace(logp_behavior=lp_b).validate()
    split = stage_named(method, "round", "ttpo_split")
    changes, _ = split.fn(batch, stage_context(method, split))
    batch = apply_changes(batch, changes, split)
    adv = method.advantage.fn(batch, stage_context(method, method.advantage)).adv.detach().to(F64)
    term = stage_named(method, "term", "self_distill")
    leaf = lp_b.clone().requires_grad_(True)
    inp = tensor_inputs(leaf, adv, batch.loss_mask, logp_behavior=lp_b, group=batch.group, rewards=batch.rewards,
                        extras=batch.extras)
    mat, _ = term.fn(inp, method.view(term))
    (g,) = torch.autograd.grad(mat.sum(), leaf)
    agree = [i for i in range(B) if float(batch.rewards[i]) == 1.0]
    dissent = [i for i in range(B) if float(batch.rewards[i]) == 0.0]
    series = [Series(T("agreeing reply: self-distillation", "与多数一致的回答：自蒸馏"), xs, (-g[agree[0]]).tolist(),
                     kind="step")]
    if dissent:
        series.append(Series(T("dissenting reply: RL advantage", "与多数不一致的回答：RL 优势"), xs,
                             adv[dissent[0]].tolist(), kind="step"))
    return [Panel(T(f"answers {', '.join(answers)}: majority {answers[agree[0]]}",
                    f"答案 {', '.join(answers)}：多数为 {answers[agree[0]]}"),
                  T("sampler probability p of the token", "采样器给该词元的概率 p"), WEIGHT, series,
                  marks=[Mark("x", p.ttpo_tau_conv, T("τ_conv")), Mark("x", p.ttpo_tau_err, T("τ_err"))],
                  source="reward stage self_vote, round stage ttpo_split, advantage stage, term self_distill "
                         "(testtime.ttpo)")]


@view("probe_branches")
def probe_branches(method: Method, *, group_size: int = 8, pcrs=(0.75, 0.25)) -> list[Panel]:
    """The advantage of each ranked candidate of a group of `group_size` (rank 0 = top),
    from the method's advantage stage, for a prompt whose probe consistency rate is each
    of `pcrs` (the branch from `testtime.probe_branch` with the method's τ)."""
    G = int(group_size)
    ranks = torch.arange(G)
    panels = []
    for pcr in pcrs:
        low = PR.probe_branch(torch.full((G,), float(pcr)), tau=method.p.probe_tau)
        batch = bare_batch(G, 1, rewards=[0.0] * G, group=[0] * G, logp_behavior=torch.zeros((G, 1), dtype=F64),
                           extras={"probe_rank": ranks, "probe_low": low, "probe_pcr": torch.full((G,), float(pcr))})
        adv = method.advantage.fn(batch, stage_context(method, method.advantage)).adv.detach().to(F64)
        tau = method.p.probe_tau
        title = T(f"PCR = {pcr:g} < τ = {tau:g}: low branch", f"PCR = {pcr:g} < τ = {tau:g}：低分支") if bool(low[0]) \
            else T(f"PCR = {pcr:g} ≥ τ = {tau:g}: high branch", f"PCR = {pcr:g} ≥ τ = {tau:g}：高分支")
        panels.append(Panel(title,
                            T("candidate rank (0 = top)", "候选排名（0 = 最靠前）"), T("advantage", "优势"),
                            [Series(T("advantage", "优势"), list(range(G)), adv.tolist(), kind="bar")],
                            categories=[str(r) for r in range(G)],
                            source="advantage stage (testtime.probe_erpo_advantages), testtime.probe_branch"))
    return panels


@view("tasco_stability")
def tasco_stability(method: Method, *, lo: float = -2.0, hi: float = 1.3, points: int = 67,
                    p_clean: float = 0.25) -> list[Panel]:
    """TASCO's objective on one reply sampled under P (token probability `p_clean`) and its
    K copies scored under P + ξ_k, each copy's token at log-ratio x = log π_{P+ξ}(y) −
    log π_P(y) (the x axis, the same for every copy). Entropy 0, so what remains is the
    instability term per token (the loss, token-mean aggregated as the trainer does) and
    its gradient on the clean and on the perturbed log-probs (both sides learn)."""
    p = method.p
    K = int(p.tasco_perturbations)
    if not (lo < hi <= -math.log(p_clean)):
        raise ValueError(f"the log-ratio grid must stay below log(1/p_clean) = {-math.log(p_clean):.3f}")
    xs = grid(lo, hi, points, keys=(0.0,))
    T_ = len(xs)
    x = torch.tensor(xs, dtype=F64)
    clean = torch.full((T_,), math.log(p_clean), dtype=F64)
    lp = torch.stack([clean] + [clean + x] * K)
    leaf = lp.clone().requires_grad_(True)
    B = K + 1
    mask = torch.ones((B, T_), dtype=torch.bool)
    extras = {"tasco_copy": torch.arange(B), "tasco_pair": torch.zeros(B, dtype=torch.long)}
    inp = tensor_inputs(leaf, torch.zeros(B, dtype=F64), mask, entropy=torch.zeros((B, T_), dtype=F64),
                        group=torch.zeros(B, dtype=torch.long), extras=extras)
    loss, _ = method.objective.fn(inp, method.view(method.objective))
    per_token = loss.sum(0) / B  # token_mean over the (K + 1)·N counted tokens, per column
    (g,) = torch.autograd.grad(per_token.sum(), leaf)
    div = p.tasco_divergence
    xl = T("log-ratio x = log π_{P+ξ}(y) − log π_P(y)", "对数比 x = log π_{P+ξ}(y) − log π_P(y)")
    return [
        Panel(T(f"λ = {p.tasco_lambda:g}, K = {K}, D = {div}"), xl, T("loss per token (instability)", "每词元损失（不稳定项）"),
              [Series(T(f"λ · D_{div}(x)"), xs, per_token.detach().tolist())], marks=[Mark("x", 0.0, T("x = 0"))],
              source="objective tasco (testtime.tasco_loss)"),
        Panel(T("gradient of the loss", "损失的梯度"), xl, T("∂L/∂log π", "∂L/∂log π"),
              [Series(T("clean reply under P", "P 下的原回答"), xs, g[0].tolist()),
               Series(T("perturbed copies under P + ξ (summed)", "P + ξ 下的扰动副本（求和）"), xs, g[1:].sum(0).tolist())],
              marks=[Mark("x", 0.0, T("x = 0"))], source="objective tasco (testtime.tasco_loss), autograd"),
    ]
