"""Views of gradient-geometry methods: what the method's own grad, model and poststep
stages do to a gradient or to a layer's weights, on small tensors (a two-parameter model
for CORD, one LoRA-adapted layer for GCPO, one reparametrized linear layer for ISO)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn

from policylab.methods.context import SetupContext
from policylab.methods.spec import Method
from policylab.methods.families.gradient_geometry import RETENTION_STATE, iso_layers
from policylab.learn.figures.model import RUN, Mark, Panel, Series, T, view
from policylab.learn.figures.common import F64, grid, stage_context, stage_named


def _setup(method: Method, stage) -> SetupContext:
    return SetupContext(p=method.view(stage), run=RUN, state={}, tokenizer=None)


# ----------------------------------------------------------------------------- cord


class _Plane(nn.Module):
    """A model with one parameter θ ∈ R²: gradients are arrows in the plane."""

    def __init__(self):
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(2, dtype=F64))


def _cord_step(method: Method, g_protected: torch.Tensor, g_other: torch.Tensor) -> torch.Tensor:
    """The gradient the method's grad stage leaves in `.grad`: the RL gradient `g_other`
    already accumulated, the protected (retention) loss ⟨g_protected, θ⟩ whose gradient
    is `g_protected`."""
    stage = stage_named(method, "grad", "cord_project")
    model = _Plane()
    model.theta.grad = g_other.clone()
    retention = SimpleNamespace(built=True, nll=lambda m: (g_protected * m.theta).sum())
    stage.fn(model, stage_context(method, stage, state={RETENTION_STATE: retention}))
    return model.theta.grad.detach()


@view("cord_projection")
def cord_projection(method: Method, *, points: int = 73) -> list[Panel]:
    """The protected gradient g_p = (1, 0) and an RL gradient of norm 1 at angle θ to it:
    the component of the combined gradient along g_p against θ, through the method's grad
    stage at its own mode and at the other one; the plain sum g_p + λ·g_rl for comparison."""
    lam = float(method.p.cord_lambda)
    xs = grid(0.0, 360.0, points, keys=(90.0, 270.0))
    gp = torch.tensor([1.0, 0.0], dtype=F64)
    modes = [method.p.cord_mode] + [m for m in ("conflict_only", "always") if m != method.p.cord_mode]
    series = []
    for i, mode in enumerate(modes):
        m = method.with_params({**method.p, "cord_mode": mode})
        ys = [float(_cord_step(m, gp, torch.tensor([math.cos(math.radians(a)), math.sin(math.radians(a))],
                                                    dtype=F64))[0]) for a in xs]
        label = T(f"{method.name}, {mode}") if i == 0 else T(mode)
        series.append(Series(label, xs, ys, reference=i > 0))
    series.append(Series(T(f"plain sum g_p + λ·g_rl (λ = {lam:g})", f"直接相加 g_p + λ·g_rl（λ = {lam:g}）"), xs,
                         [1.0 + lam * math.cos(math.radians(a)) for a in xs], reference=True))
    marks = [Mark("y", 1.0, T("g_p alone", "仅 g_p")), Mark("x", 90.0, T("⟨g_rl, g_p⟩ = 0")),
             Mark("x", 270.0, T("⟨g_rl, g_p⟩ = 0"))]
    return [Panel(T("g_p = (1, 0), ‖g_rl‖ = 1 at angle θ", "g_p = (1, 0)，‖g_rl‖ = 1，夹角 θ"),
                  T("angle θ between g_rl and g_p (degrees)", "g_rl 与 g_p 的夹角 θ（度）"),
                  T("component of the step gradient along g_p", "更新梯度在 g_p 方向上的分量"), series, marks=marks,
                  source=f"{method.name} grad stage (cord_project)")]


# ----------------------------------------------------------------------------- gcpo


class _LoraLayer(nn.Module):
    """One linear layer with a LoRA adapter, laid out as PEFT lays it out (base_layer,
    lora_A / lora_B dicts)."""

    def __init__(self, W0: torch.Tensor, rank: int):
        super().__init__()
        m, n = W0.shape
        self.base_layer = nn.Linear(n, m, bias=False, dtype=F64)
        with torch.no_grad():
            self.base_layer.weight.copy_(W0)
        self.base_layer.requires_grad_(False)
        self.lora_A = nn.ModuleDict({"default": nn.Linear(n, rank, bias=False, dtype=F64)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(rank, m, bias=False, dtype=F64)})


@view("gcpo_subspaces")
def gcpo_subspaces(method: Method, *, shape=(24, 20), lora_rank: int = 4, seed: int = 0) -> list[Panel]:
    """A random base weight W_0 and a LoRA update BA as an unconstrained optimizer step
    leaves it: the share of the update's energy along each left singular direction u_i of
    W_0 (‖u_iᵀ ΔW‖² / ‖ΔW‖²) and each right one v_i, before and after the method's
    post-step projection (its model stage computed the frames)."""
    gen = torch.Generator().manual_seed(int(seed))
    m, n = (int(v) for v in shape)
    W0 = torch.randn((m, n), generator=gen, dtype=F64) / math.sqrt(n)
    root = nn.Module()
    root.layer = _LoraLayer(W0, int(lora_rank))
    setup = stage_named(method, "model", "gcpo_setup")
    root = setup.fn(root, _setup(method, setup))
    layer = root.layer
    with torch.no_grad():  # the factors after an optimizer step that ignored the constraint
        layer.lora_A["default"].weight.copy_(torch.randn((int(lora_rank), n), generator=gen, dtype=F64))
        layer.lora_B["default"].weight.copy_(torch.randn((m, int(lora_rank)), generator=gen, dtype=F64))
    before = layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    post = stage_named(method, "poststep", "gcpo_reproject")
    post.fn(root, stage_context(method, post))
    after = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight).detach()
    U, _, Vh = torch.linalg.svd(W0, full_matrices=False)
    k = int(method.p.protected_rank)
    idx = list(range(1, U.shape[1] + 1))

    def shares(d, side):
        e = (U.T @ d).pow(2).sum(1) if side == "left" else (d @ Vh.T).pow(2).sum(0)
        return (e / d.pow(2).sum()).tolist()

    panels = []
    for side, title, lab in (("left", T("left (output) directions u_i", "左（输出）方向 u_i"), "‖u_iᵀ ΔW‖² / ‖ΔW‖²"),
                             ("right", T("right (input) directions v_i", "右（输入）方向 v_i"), "‖ΔW v_i‖² / ‖ΔW‖²")):
        panels.append(Panel(
            title, T("singular direction i of W_0 (by singular value)", "W_0 的奇异方向 i（按奇异值排序）"),
            T(f"share of the update's energy {lab}", f"更新能量的占比 {lab}"),
            [Series(T(f"{method.name}: after the projection", f"{method.name}：投影之后"), idx, shares(after, side),
                    markers=True),
             Series(T("the same step, not projected", "同一步，未投影"), idx, shares(before.detach(), side),
                    reference=True, markers=True)],
            marks=[Mark("x", k + 0.5, T(f"top-k = {k} protected", f"前 k = {k} 个受保护"))],
            source=f"{method.name} model stage (gcpo_setup), poststep stage (gcpo_reproject)"))
    return panels


# ----------------------------------------------------------------------------- iso


def _iso_model(W0: torch.Tensor) -> nn.Module:
    """A root module whose one linear layer is named like a decoder projection."""
    attn = nn.Module()
    attn.q_proj = nn.Linear(W0.shape[1], W0.shape[0], bias=False, dtype=F64)
    with torch.no_grad():
        attn.q_proj.weight.copy_(W0)
    block = nn.Module()
    block.self_attn = attn
    root = nn.Module()
    root.layers = nn.ModuleList([block])
    return root


@view("iso_spectrum")
def iso_spectrum(method: Method, *, shape=(16, 12), steps: int = 20, lr: float = 0.05, seed: int = 0) -> list[Panel]:
    """One linear layer fitted by SGD to a random target map for `steps` steps, through the
    method's model stage (fixed-spectrum reparametrization) and its post-step retraction,
    next to the same layer trained without them: its singular values after the steps, and
    along the steps how far the weight and its spectrum have moved."""
    gen = torch.Generator().manual_seed(int(seed))
    m, n = (int(v) for v in shape)
    W0 = torch.randn((m, n), generator=gen, dtype=F64) / math.sqrt(n)
    target = torch.randn((m, n), generator=gen, dtype=F64) / math.sqrt(n)
    x = torch.randn((64, n), generator=gen, dtype=F64)
    y = x @ target.T
    setup = stage_named(method, "model", "iso_setup")
    iso = setup.fn(_iso_model(W0), _setup(method, setup))
    plain = _iso_model(W0)
    retract = stage_named(method, "poststep", "iso_retract")
    ctx = stage_context(method, retract)
    s0 = torch.linalg.svdvals(W0)
    norm0 = float(W0.norm())

    def weight(model):
        return model.layers[0].self_attn.q_proj.weight.detach()

    track = {"iso": ([0.0], [0.0]), "plain": ([0.0], [0.0])}
    for model, key in ((iso, "iso"), (plain, "plain")):
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=float(lr))
        for _ in range(int(steps)):
            opt.zero_grad()
            loss = (model.layers[0].self_attn.q_proj(x) - y).pow(2).mean()
            loss.backward()
            opt.step()
            if key == "iso":
                retract.fn(model, ctx)
            W = weight(model)
            track[key][0].append(float((W - W0).norm()) / norm0)
            track[key][1].append(float((torch.linalg.svdvals(W) - s0).abs().max()) / float(s0[0]))
    if not iso_layers(iso):
        raise ValueError("iso_setup did not reparametrize the layer")
    idx = list(range(1, s0.numel() + 1))
    p1 = Panel(T(f"singular values of W after {steps} steps", f"{steps} 步之后 W 的奇异值"),
               T("index i", "序号 i"), T("singular value σ_i", "奇异值 σ_i"),
               [Series(T(f"{method.name}: W = U Σ₀ Vᵀ", f"{method.name}：W = U Σ₀ Vᵀ"), idx,
                       torch.linalg.svdvals(weight(iso)).tolist(), markers=True),
                Series(T("the same steps on W itself", "同样的步数直接更新 W"), idx,
                       torch.linalg.svdvals(weight(plain)).tolist(), markers=True),
                Series(T("W_0", "W_0"), idx, s0.tolist(), reference=True)],
               source=f"{method.name} model stage (iso_setup), poststep stage (iso_retract)")
    xs = list(range(int(steps) + 1))
    p2 = Panel(T("along the steps", "随训练步数"), T("optimizer step", "优化步"),
               T("relative change", "相对变化"),
               [Series(T(f"{method.name}: ‖W − W_0‖ / ‖W_0‖", f"{method.name}：‖W − W_0‖ / ‖W_0‖"), xs, track["iso"][0]),
                Series(T(f"{method.name}: max |σ_i − σ_i⁰| / σ_1⁰", f"{method.name}：max |σ_i − σ_i⁰| / σ_1⁰"), xs,
                       track["iso"][1], markers=True),
                Series(T("W itself: ‖W − W_0‖ / ‖W_0‖", "直接更新 W：‖W − W_0‖ / ‖W_0‖"), xs, track["plain"][0],
                       reference=True),
                Series(T("W itself: max |σ_i − σ_i⁰| / σ_1⁰", "直接更新 W：max |σ_i − σ_i⁰| / σ_1⁰"), xs,
                       track["plain"][1], reference=True)],
               source=f"{method.name} model stage (iso_setup), poststep stage (iso_retract)")
    return [p1, p2]
