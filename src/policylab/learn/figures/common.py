"""What the views share: grids, a method's own policy loss on bare tensors (and the
gradient coefficient autograd gives through it), and a method's stages called the way
the trainer calls them (a `StageContext` with the method's parameter view, a bare
`RolloutBatch`)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import torch

from policylab.batch import SamplingSettings
from policylab.methods.context import Sampled, StageContext
from policylab.methods.loss import policy_loss, tensor_inputs
from policylab.methods.spec import Method, Stage
from policylab.trainer.rollout import apply_changes
from policylab.learn.figures.model import RUN, T

F64 = torch.float64


def grid(lo: float, hi: float, points: int, *, log: bool = False, keys=()) -> list[float]:
    """`points` values from lo to hi (geometric when `log`), plus the `keys` inside [lo, hi]
    (kinks such as clip bounds, so a curve turns exactly where the kernel does)."""
    if not (hi > lo and points >= 2) or (log and lo <= 0):
        raise ValueError(f"a grid needs lo < hi and points >= 2 (lo > 0 on a log axis), got {lo}, {hi}, {points}")
    if log:
        a, b = math.log(lo), math.log(hi)
        xs = [math.exp(a + (b - a) * i / (points - 1)) for i in range(points)]
    else:
        xs = [lo + (hi - lo) * i / (points - 1) for i in range(points)]
    xs += [float(k) for k in keys if lo <= k <= hi]
    return sorted(set(round(x, 12) for x in xs))


def objective_only(method: Method) -> Method:
    """The method without its addends (KL and entropy terms do not depend on A and would
    blur the objective's coefficient)."""
    return dataclasses.replace(method, addends=())


def host_only(method: Method) -> Method:
    """The host objective without the method's corrections (and addends)."""
    return dataclasses.replace(method, addends=(), corrections=())


def loss_gradient(method: Method, lp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, **roles) -> torch.Tensor:
    """∂(Σ of the method's policy-loss matrix)/∂lp [B, T], autograd through
    `methods.loss.policy_loss` (objective × corrections, as the trainer composes it)."""
    leaf = lp.detach().clone().requires_grad_(True)
    loss, _ = policy_loss(method, tensor_inputs(leaf, adv, mask, **roles))
    (g,) = torch.autograd.grad(loss.sum(), leaf, allow_unused=True)
    return torch.zeros_like(leaf) if g is None else g.detach()


def coefficient(method: Method, lp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *, column: int = -1,
                **roles) -> list[float]:
    """The weight on A·∇log π of the token in `column` of each row: −(∂ℓ/∂lp)/A."""
    g = loss_gradient(method, lp, adv, mask, **roles)[:, column]
    a = adv if adv.dim() == 1 else adv[:, column]
    return [float(v) + 0.0 for v in (-g / a).tolist()]


def bare_batch(B: int, T_: int, *, mask: torch.Tensor | None = None, group=None, rewards=None, **fields):
    """A validated RolloutBatch of B rows and T response columns holding only what a
    stage reads (`fields` are RolloutBatch fields: values, greedy_rewards, extras, ...)."""
    mask = torch.ones((B, T_), dtype=torch.bool) if mask is None else mask
    g = torch.as_tensor(group if group is not None else [0] * B, dtype=torch.long)
    r = None if rewards is None else torch.as_tensor(rewards, dtype=F64)
    batch = tensor_inputs(torch.zeros((B, T_), dtype=F64), torch.zeros(B, dtype=F64), mask, group=g, rewards=r).batch
    return batch.replace(**fields).validate()


def stage_context(method: Method, stage: Stage, *, run=None, **services) -> StageContext:
    """The context the trainer hands `stage`, without backends (math stages need none)."""
    base = dict(state=method.state_objects(0), run=run or RUN, policy_version=0, sampling=SamplingSettings(),
                rollout=None, worker=None, score=None, next_train=None, encode=None, new_groups=None, decode=None,
                task_reward=None)
    base.update(services)
    return StageContext(p=method.view(stage), **base)


def advantages(method: Method, batch) -> torch.Tensor:
    """The method's own advantage stage on `batch`, after its active round stages that
    need no backend (the KL-in-reward penalty)."""
    for stage in method.active("round"):
        if stage.name == "kl_reward_penalty":
            changes, _ = stage.fn(batch, stage_context(method, stage))
            batch = apply_changes(batch, changes, stage)
    return method.advantage.fn(batch, stage_context(method, method.advantage)).adv.detach().to(F64)


def stage_named(method: Method, kind: str, name: str) -> Stage:
    for s in method.active(kind):
        if s.name == name:
            return s
    raise ValueError(f"{method.name} has no active {kind} stage {name!r} "
                     f"(its {kind} stages: {', '.join(s.name for s in method.active(kind)) or 'none'})")


def reward_stage(method: Method, name: str, texts: list[str], answers: list, group=None, **services):
    """Run the method's reward stage `name` on replies `texts` (gold `answers`): the
    fields it writes."""
    stage = stage_named(method, "reward", name)
    B = len(texts)
    batch = bare_batch(B, 1, group=group, rewards=[0.0] * B)
    examples = [SimpleNamespace(answer=a, prompt="") for a in answers]
    s = Sampled(batch, list(texts), examples, [], [])
    changes, _ = stage.fn(s, stage_context(method, stage, **services))
    return changes


def variant_label(parts: list[tuple[dict, object]]) -> dict:
    """"π_old = 0.1, t = 64" from the (name, value) pairs of the dimensions that vary."""
    def fmt(v):
        if isinstance(v, bool):
            return {"en": "true" if v else "false", "zh": "是" if v else "否"}
        return T(f"{v:g}" if isinstance(v, float) else str(v))
    return {lang: ", ".join(f"{n[lang]} = {fmt(v)[lang]}" for n, v in parts) for lang in ("en", "zh")}


SAME_RATIO = T("policy ratio ρ = π_θ/π_old", "策略比率 ρ = π_θ/π_old")
ENGINE_RATIO = T("engine ratio k = π_old/μ", "引擎比率 k = π_old/μ")
COEF = T("weight on A·∇log π", "A·∇log π 的权重")
