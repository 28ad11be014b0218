"""Gradient geometry: CORD (project the RL gradient off a protected objective's), GCPO (LoRA
updates kept out of the base weights' top-k singular spaces), ISO (frozen spectra,
trained orthonormal frames). Each keeps GRPO's advantage and clipped surrogate as its host
and changes only what happens to the gradient or the weights: model stages (LoRA frames
for GCPO, fixed-spectrum layers for ISO), gradient stages on the accumulated full-step
gradient (CORD's projection, GCPO's projected factor gradients) and post-step constraints
(GCPO's re-projection, ISO's retraction). Kernels in `policylab.kernels.geometry`.
"""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from policylab.errors import MissingQuantityError, PolicylabError
from policylab.kernels import geometry as geo
from policylab.kernels.geometry.cord import MODES, SCOPES
from policylab.kernels.geometry.spectrum import RETRACTIONS
from policylab.methods.params import clip, group_std, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.retention import SOURCES, RetentionSet
from policylab.methods.spec import Card, Param, Stage, StateSpec, non_negative, positive
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses

RETENTION_STATE = "cord_retention"

# ----------------------------------------------------------------------------- cord


def cord_project(model: nn.Module, ctx) -> dict:
    """Replace the accumulated RL gradient in `.grad` by CORD's combination with the
    protected objective (the retention set's NLL): one extra forward/backward through
    `model` on the whole retention set, once per optimizer step. On return every trainable
    parameter's `.grad` holds the combined gradient and nothing else."""
    retention = ctx.state.get(RETENTION_STATE)
    if retention is None:
        raise MissingQuantityError(
            "cord", "a protected loss (its retention-set state)",
            f"the projection needs the `{RETENTION_STATE}` state the method declares; build the run through the "
            "Trainer (or pass the state in the stage context) so the retention set exists")
    if not retention.built:
        retention.build(ctx)
    p = ctx.p
    params = [q for q in model.parameters() if q.requires_grad]
    rl = [q.grad for q in params]
    for q in params:
        q.grad = None
    with torch.enable_grad():
        nll = retention.nll(model)
        nll.backward()
    if all(q.grad is None for q in params):
        raise MissingQuantityError("cord", "a protected gradient",
                                   "the retention loss reaches no trainable parameter (its graph does not pass "
                                   "through the model's trainable weights)")
    ret = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
    rl = [g if g is not None else torch.zeros_like(q) for g, q in zip(rl, params)]
    # a retention gradient that is exactly zero (every answer token already at probability 1,
    # or a zero weight on it) is a real state of the run, not an error: with nothing to
    # project on, `cord_combine` returns g_p + λ·g_o unprojected; counted in the metrics
    retention_zero = not any(bool(g.any()) for g in ret)
    ret = [p.protected_weight * g for g in ret]
    protected, other = (ret, rl) if p.protect == "retention" else (rl, ret)
    combined, info = geo.cord_combine(protected, other, weight=p.cord_lambda, mode=p.cord_mode, scope=p.cord_scope)
    for q, g in zip(params, combined):
        q.grad = g
    return {"cord/retention_nll": float(nll.detach()), "cord/retention_zero": float(retention_zero),
            **{f"cord/{k}": float(v) for k, v in info.items()}}


CORD_PROJECT = Stage("grad", cord_project, needs=("rollout.greedy",), kernels=(geo.cord_combine,),
                     params=("cord_mode", "cord_lambda", "cord_scope", "protect", "protected_weight"))

# ----------------------------------------------------------------------------- gcpo


def _lora_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """PEFT LoRA layers: modules with a `base_layer` and `lora_A` / `lora_B` dicts."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(getattr(m, "lora_A", None), nn.ModuleDict) and isinstance(getattr(m, "lora_B", None),
                                                                                     nn.ModuleDict)
            and hasattr(m, "base_layer") and len(m.lora_A)]


def gcpo_setup(model: nn.Module, setup) -> nn.Module:
    """Per LoRA layer: the top-k singular frames of its frozen base weight (fp64 SVD, once;
    non-persistent buffers `gcpo_U` [m, k], `gcpo_V` [n, k], outside every optimizer group
    and rebuilt from the base weight when a run is rebuilt); the LoRA rank checked against
    what the complements can hold; the initial factors projected (B = 0, A ← A P_R)."""
    layers = _lora_layers(model)
    if not layers:
        raise PolicylabError(
            "gcpo projects LoRA updates, and this model has no LoRA adapter: set train.lora_rank > 0 (e.g. "
            "train: {lora_rank: 8}); the adapter rank r is train.lora_rank, gcpo's protected_rank k is the number "
            "of top singular directions kept out of the update (r <= min(out, in) − k per layer)")
    k = setup.p.protected_rank
    for name, layer in layers:
        W0 = layer.base_layer.weight
        U, V, _ = geo.principal_frames(W0, k, name=name)
        for A in layer.lora_A.values():
            geo.check_lora_rank(A.weight.shape[0], tuple(W0.shape), k, name)
        layer.register_buffer("gcpo_U", U.to(W0.dtype), persistent=False)
        layer.register_buffer("gcpo_V", V.to(W0.dtype), persistent=False)
        with torch.no_grad():
            for adapter in layer.lora_A:
                _project_factors(layer, adapter)
    return model


def _project_factors(layer, adapter: str) -> None:
    B, A = layer.lora_B[adapter].weight, layer.lora_A[adapter].weight
    pB, pA = geo.project_lora_factors(B, A, layer.gcpo_U, layer.gcpo_V)
    B.copy_(pB)
    A.copy_(pA)


def _frames(model: nn.Module) -> list[tuple[str, nn.Module]]:
    layers = [(n, m) for n, m in _lora_layers(model) if hasattr(m, "gcpo_U")]
    if not layers:
        raise PolicylabError("gcpo: no LoRA layer carries its principal frames; the model stage gcpo_setup did not "
                             "run on this model")
    return layers


def gcpo_project_grads(model: nn.Module, ctx) -> dict:
    """∂L/∂B ← P_L ∂L/∂B and ∂L/∂A ← ∂L/∂A P_R on every adapter: with the factors already
    in the complements this is the gradient of the paper's parametrization
    δW = α P_L B A P_R, so the optimizer's moments see only feasible directions."""
    n = 0
    for _, layer in _frames(model):
        for adapter in layer.lora_A:
            A, B = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
            if A.grad is not None:
                A.grad = geo.project_out_right(A.grad, layer.gcpo_V)
            if B.grad is not None:
                B.grad = geo.project_out_left(B.grad, layer.gcpo_U)
            n += 1
    return {"gcpo/adapters": float(n)}


def gcpo_reproject(model: nn.Module, ctx) -> dict:
    """B ← P_L B, A ← A P_R after every optimizer step (AdamW's elementwise step and
    weight decay leave the complements); logs how far the step had moved the effective
    update BA into the protected spaces before the projection, and after it."""
    drift = after = 0.0
    with torch.no_grad():
        for _, layer in _frames(model):
            for adapter in layer.lora_A:
                A, B = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
                drift = max(drift, *geo.lora_overlap(B, A, layer.gcpo_U, layer.gcpo_V))
                _project_factors(layer, adapter)
                after = max(after, *geo.lora_overlap(B, A, layer.gcpo_U, layer.gcpo_V))
    return {"gcpo/overlap_before_projection/max": drift, "gcpo/overlap/max": after}


GCPO_SETUP = Stage("model", gcpo_setup, learner=True, kernels=(geo.principal_frames, geo.project_lora_factors),
                   params=("protected_rank",))
GCPO_GRADS = Stage("grad", gcpo_project_grads, kernels=(geo.bilateral_complement,), params=("project_gradients",),
                   active=lambda p: p.project_gradients)
GCPO_REPROJECT = Stage("poststep", gcpo_reproject, kernels=(geo.project_lora_factors, geo.lora_overlap))

# ----------------------------------------------------------------------------- iso


def iso_setup(model: nn.Module, setup) -> nn.Module:
    """Replace every plain `nn.Linear` whose qualified name matches one of the
    comma-separated glob patterns of `iso_targets` by a `FixedSpectrumLinear` built from
    its own SVD. The output head (tied to the input embedding) and LoRA models are
    refused."""
    if _lora_layers(model) or hasattr(model, "peft_config"):
        raise PolicylabError("iso reparametrizes the full weights (W = U Σ₀ Vᵀ) and cannot run on LoRA adapters: "
                             "set train.lora_rank: 0")
    patterns = [s.strip() for s in setup.p.iso_targets.split(",") if s.strip()]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    chosen = [(n, m) for n, m in linears if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]
    if not chosen:
        names = ", ".join(n for n, _ in linears[:3])
        raise PolicylabError(f"iso_targets {setup.p.iso_targets!r} matches no linear layer of the model (its names "
                             f"look like {names}); give glob patterns such as *.self_attn.q_proj")
    for name, lin in chosen:
        if lin is head:
            raise PolicylabError(f"iso_targets matches `{name}`, the output head, whose weight is tied to the input "
                                 "embedding: leave it out of iso_targets")
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, geo.FixedSpectrumLinear.from_linear(lin))
    return model


def iso_layers(model: nn.Module) -> list[tuple[str, geo.FixedSpectrumLinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, geo.FixedSpectrumLinear)]


def iso_retract(model: nn.Module, ctx) -> dict:
    """Put every frame U, V back on the Stiefel manifold after the optimizer step
    (`retraction`: "polar", the nearest orthonormal frame, or "qr"); Σ₀ is not touched."""
    layers = iso_layers(model)
    if not layers:
        raise PolicylabError("iso: the model has no fixed-spectrum layer; the model stage iso_setup did not run")
    method = ctx.p.retraction
    before = after = 0.0
    svd = 0
    with torch.no_grad():
        for _, layer in layers:
            for frame in (layer.U, layer.V):
                if method == "polar":
                    Q, info = geo.polar_retraction(frame)
                    before, after = max(before, info["error_before"]), max(after, info["error_after"])
                    svd += int(info["svd"])
                else:
                    Q = geo.qr_retraction(frame)
                frame.copy_(Q)
    out = {"iso/layers": float(len(layers))}
    if method == "polar":
        out.update({"iso/orth_err_before_retraction/max": before, "iso/orth_err_fp64/max": after,
                    "iso/svd_fallbacks": float(svd)})
    return out


ISO_SETUP = Stage("model", iso_setup, learner=True, kernels=(geo.FixedSpectrumLinear.from_linear,), params=("iso_targets",))
ISO_RETRACT = Stage("poststep", iso_retract, kernels=(geo.polar_retraction, geo.qr_retraction),
                    params=("retraction",))


# ----------------------------------------------------------------------------- registration

_SAMPLES = "rollout engine at the current weights (G samples per prompt); π_old = trainer recompute at those weights"
_HOST = dict(advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean", kl=(0.0, "k3", "loss"),
             min_group_size=2)
_HOST_PARAMS = clip(0.2, 0.2) + group_std()


def _retention(p, seed: int) -> RetentionSet:
    return RetentionSet(p.retention_size, p.retention_source)


register(policy_gradient_method(
    "cord",
    Card(
        title="CORD: Conflict-Aware Optimization for Joint RL and Distillation in Agents", arxiv="",
        family="gradient-geometry", samples=_SAMPLES + "; the protected objective reads a held retention set built "
        "once from the training split (gold answers, or the base policy's greedy replies)",
        learns="π_θ, with the full-step gradient g = β·g_retention + λ·g_rl', g_rl' projected off g_retention "
               "where they conflict (or always)",
        reference="none in the RL loss by default (kl_coef 0); the retention set's likelihood is the protected "
                  "anchor",
        summary="once per optimizer step, after accumulation: the RL gradient loses its component along the "
                "protected (retention NLL) gradient when the two conflict, then both are summed",
        not_established="that protecting the retention likelihood preserves capabilities on this task; the paper's "
                        "setting (agents, a teacher model's distillation loss) is not reproduced: the protected "
                        "objective here is the NLL of a retention set; AdamW can still hurt the protected objective "
                        "(the guarantee is first order, before the optimizer)",
        unconfirmed=("title, arXiv id (the paper could not be checked)", "which objective the paper protects (protect)",
                     "λ (cord_lambda = 1.0) and the protected weight (protected_weight = 1.0)",
                     "whole-vector vs per-parameter-group projection (cord_scope = global)"),
        confirmed="the specification's projection rule and invariants (hand-worked cases, conflict-only and always, "
                  "λ = 0, the full-step vs per-micro-batch difference): tested; a retention gradient that is exactly "
                  "zero skips the projection (nothing to project on) and is counted in cord/retention_zero and "
                  "cord/protected_zero instead of stopping the run (tested; it used to raise); no text of the paper "
                  "could be checked",
    ),
    **_HOST, grad=(CORD_PROJECT,),
    params=_HOST_PARAMS + (
        Param("cord_mode", str, "conflict_only", "project the other gradient only when ⟨g_other, g_protected⟩ < 0 "
              "(conflict_only) or always", choices=MODES),
        Param("cord_lambda", float, 1.0, "λ, the weight of the non-protected objective's gradient (unconfirmed)",
              check=non_negative),
        Param("cord_scope", str, "global", "project the whole flattened gradient (global) or each parameter tensor "
              "on its own (per_tensor)", choices=SCOPES),
        Param("protect", str, "retention", "which objective is protected: the retention NLL (the RL gradient is "
              "projected) or the RL loss (the retention gradient is projected)", choices=("retention", "rl")),
        Param("protected_weight", float, 1.0, "β, a weight on the retention NLL's gradient before the combination "
              "(library decision; the projection does not depend on it)", check=positive),
        Param("retention_size", int, 8, "examples in the retention set, drawn once from the training stream",
              check=positive),
        Param("retention_source", str, "gold", "retention answers: the examples' gold answers, or the base "
              "policy's greedy replies (base_greedy: distillation from the frozen initial policy)", choices=SOURCES),
    ),
    state=(StateSpec(RETENTION_STATE, _retention, params=("retention_size", "retention_source"),
                     doc="the held retention set (token ids), built at the first optimizer step, checkpointed"),),
))

register(policy_gradient_method(
    "gcpo",
    Card(
        title="GCPO: Diagnosing and Constraining Subspace Geometry in Rollout RL for LLMs", arxiv="2608.11674",
        family="gradient-geometry", samples=_SAMPLES,
        learns="LoRA adapters (train.lora_rank) whose effective update P_L·BA·P_R avoids the top-k left and right "
               "singular spaces of each frozen base weight",
        reference="none by default (kl_coef 0); the frozen base weights' SVDs define what is protected",
        summary="per adapted layer: gradients of B and A projected onto the complements of W_0's top-k singular "
                "spaces before the step, and the factors re-projected after it",
        not_established="the paper's stability, capability-retention and length results (8B/9B models); that k = 8 "
                        "suits a 135M model",
        unconfirmed=("parametrization in the forward (as the paper describes δW = α P_L L R P_R) vs re-projection "
                     "of the factors after each step (here, with projected factor gradients: the same constraint "
                     "on the effective update)", "which layers are adapted (every linear layer here)",
                     "the host objective (GRPO's clipped surrogate here)"),
        confirmed="against the paper's abstract and a summary of its method: hard bilateral orthogonal projection "
                  "onto the complements of the pretrained weight's top-k left and right singular spaces, trainable "
                  "low-rank factors, k = 8 as the paper's best value (its runs: LoRA rank 32, α 16); bilateral beats "
                  "one-sided in its ablation (a one-sided projection fails the bilateral test here)",
    ),
    **_HOST, model=(GCPO_SETUP,), grad=(GCPO_GRADS,), poststep=(GCPO_REPROJECT,),
    params=_HOST_PARAMS + (
        Param("protected_rank", int, 8, "k, the top singular directions of each base weight (left and right) the "
              "update must not touch; needs train.lora_rank <= min(out, in) − k in every layer", check=non_negative),
        Param("project_gradients", bool, True, "also project the factors' gradients before the step (the gradient "
              "of the parametrized update; library decision), not only the factors after it"),
    ),
    exercise={"train": {"lora_rank": 8}},
))

register(policy_gradient_method(
    "iso",
    Card(
        title="ISO: An RLVR-Native Optimization Stack", arxiv="2607.19331",
        family="gradient-geometry", samples=_SAMPLES,
        learns="the orthonormal frames U, V of every targeted linear layer, W = U Σ₀ Vᵀ; Σ₀ frozen (a buffer, in no "
               "optimizer group)",
        reference="none by default (kl_coef 0)",
        summary="targeted linear layers reparametrized by their SVD with the singular values frozen; the optimizer "
                "steps the frames and a retraction puts them back on the Stiefel manifold after every step",
        not_established="the paper's step-efficiency claims; anything of the ISO stack beyond the fixed-spectrum "
                        "optimizer; the reparametrized forward y = ((xV)⊙σ)Uᵀ rounds differently from x·W₀ᵀ (the "
                        "initial policy equals the base model up to fp32 rounding, not bit for bit)",
        unconfirmed=("which layers (iso_targets: every decoder projection; embeddings and the tied head left out)",
                     "free frames with a retraction vs U = U₀R, V = V₀R' with R, R' orthogonal",
                     "whether Newton–Schulz iterations are an acceptable way to the polar factor (same factor, "
                     "fp64, SVD fallback)"),
        confirmed="against a description of the paper (not its full text): the fixed-spectrum family "
                  "{U Σ₀ Vᵀ : U ∈ St(m, q), V ∈ St(n, q)}, q = min(m, n) (its Eq. 2), frame gradients G_U = G_W V Σ₀, "
                  "G_V = G_Wᵀ U Σ₀, a base optimizer step on the frames, then a polar retraction computed in fp64",
    ),
    **_HOST, model=(ISO_SETUP,), poststep=(ISO_RETRACT,),
    params=_HOST_PARAMS + (
        Param("iso_targets", str, "*.self_attn.*_proj,*.mlp.*_proj", "comma-separated glob patterns of the linear "
              "layers to reparametrize (qualified module names)"),
        Param("retraction", str, "polar", "how the frames return to the Stiefel manifold after each step: the "
              "nearest orthonormal frame (polar, the paper's) or QR", choices=RETRACTIONS),
    ),
))
