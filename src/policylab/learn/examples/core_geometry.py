"""Worked examples: gradient geometry (cord's projection, gcpo's complement projection,
iso's fixed spectrum), computed with the real kernels of `policylab.kernels.geometry`."""

from __future__ import annotations

import torch

from policylab.kernels import geometry as geo
from policylab.errors import PolicylabError
from policylab.learn.examples.registry import example
from policylab.learn.examples.core_common import F64, num, nums, f64


def _rows(m: torch.Tensor) -> str:
    """A small matrix as text, entries to 4 decimals."""
    return str([[round(x, 4) + 0.0 for x in nums(row)] for row in m])


def _combine(g_p, g_o, weight, mode):
    g, info = geo.cord_combine([f64(g_p)], [f64(g_o)], weight=float(weight), mode=mode, scope="global")
    return g[0], info


@example("cord_modes")
def cord_modes(protected, other, weight):
    """The same pair of gradients combined in both modes."""
    conflict, info = _combine(protected, other, weight, "conflict_only")
    always, _ = _combine(protected, other, weight, "always")
    plain = f64(protected) + float(weight) * f64(other)
    return {"protected": nums(protected), "other": nums(other), "weight": num(weight), "dot": num(info["dot"]),
            "conflict_only": nums(conflict), "always": nums(always), "plain_sum": nums(plain),
            "inner_conflict_only": num(conflict @ f64(protected)), "inner_always": num(always @ f64(protected)),
            "protected_sq": num(f64(protected) @ f64(protected))}


@example("cord_full_step")
def cord_full_step(protected, micro_batches):
    """Projecting each micro-batch's gradient vs the accumulated one."""
    gp = f64(protected)
    per_mb = gp.clone()
    for mb in micro_batches:
        g, _ = _combine(protected, mb, 1.0, "conflict_only")
        per_mb = per_mb + (g - gp)
    total = torch.stack([f64(mb) for mb in micro_batches]).sum(0)
    full, info = _combine(protected, total.tolist(), 1.0, "conflict_only")
    return {"protected": nums(protected), "micro_batches": str([nums(mb) for mb in micro_batches]),
            "accumulated": nums(total), "full_step": nums(full), "per_micro_batch": nums(per_mb),
            "dot": num(info["dot"])}


@example("cord_swap")
def cord_swap(a, b):
    """Which objective is protected changes the update."""
    protect_a, _ = _combine(a, b, 1.0, "conflict_only")
    protect_b, _ = _combine(b, a, 1.0, "conflict_only")
    return {"a": nums(a), "b": nums(b), "protect_a": nums(protect_a), "protect_b": nums(protect_b)}


@example("cord_missing_protected")
def cord_missing_protected():
    """The projection without a protected gradient is refused."""
    try:
        geo.cord_combine(None, [f64([1.0, 0.0])], weight=1.0, mode="conflict_only", scope="global")
        err = "no error"
    except PolicylabError as exc:
        err = f"{type(exc).__name__}: {exc}"
    return {"error": err}


@example("gcpo_projection")
def gcpo_projection(singular_values, delta, k):
    """A diagonal base weight, an update, its bilateral complement projection."""
    W = torch.diag(f64(singular_values))
    U, V, _ = geo.principal_frames(W, int(k))
    d = f64(delta)
    out = geo.bilateral_complement(d, U, V)
    before, after = geo.subspace_overlap(d, U, V), geo.subspace_overlap(out, U, V)
    return {"singular_values": nums(singular_values), "k": int(k), "delta": _rows(d), "projected": _rows(out),
            "overlap_before": num(before["overlap"]), "null": num(before["null"]),
            "overlap_after": num(after["overlap"]), "left_after": num(after["left"]),
            "right_after": num(after["right"])}


@example("gcpo_one_sided")
def gcpo_one_sided(singular_values, delta, k):
    """Projecting only the output side leaves the protected inputs updated."""
    W = torch.diag(f64(singular_values))
    U, V, _ = geo.principal_frames(W, int(k))
    d = f64(delta)
    left = geo.project_out_left(d, U)
    both = geo.bilateral_complement(d, U, V)
    return {"left_only": _rows(left), "bilateral": _rows(both),
            "left_only_input_leak": num((left @ V).norm()), "bilateral_input_leak": num((both @ V).norm())}


@example("gcpo_lora_rank")
def gcpo_lora_rank(out_features, in_features, k, rank):
    """How much LoRA rank the complements of a layer leave, and the refusal beyond it."""
    room = min(int(out_features), int(in_features)) - int(k)
    try:
        geo.check_lora_rank(int(rank), (int(out_features), int(in_features)), int(k), "layer")
        err = "accepted"
    except PolicylabError as exc:
        err = str(exc)
    return {"out": int(out_features), "in": int(in_features), "k": int(k), "rank": int(rank), "room": room,
            "result": err}


def _layer(weight) -> geo.FixedSpectrumLinear:
    W = f64(weight)
    lin = torch.nn.Linear(W.shape[1], W.shape[0], bias=False).to(F64)
    with torch.no_grad():
        lin.weight.copy_(W)
    return geo.FixedSpectrumLinear.from_linear(lin)


@example("iso_step")
def iso_step(weight, step, seed):
    """An arbitrary step on the frames, retracted: Σ₀ fixed, W moved."""
    layer = _layer(weight)
    sigma = layer.sigma.clone()
    W0 = layer.weight.detach().clone()
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for frame in (layer.U, layer.V):
            frame.add_(float(step) * torch.randn(frame.shape, generator=gen, dtype=F64))
        err = max(geo.orthonormality_error(layer.U), geo.orthonormality_error(layer.V))
        free = torch.linalg.svdvals(layer.weight.detach())
        for frame in (layer.U, layer.V):
            frame.copy_(geo.retract(frame, "polar"))
    W = layer.weight.detach()
    return {"sigma": nums(sigma), "orth_error_after_step": num(err), "sigma_before_retraction": nums(free),
            "sigma_after": nums(torch.linalg.svdvals(W)), "weight_change": num((W - W0).abs().max()),
            "sigma_buffer_unchanged": bool(torch.equal(layer.sigma, sigma))}


@example("iso_retractions")
def iso_retractions(frame):
    """Polar and QR retractions of the same off-manifold frame."""
    X = f64(frame)
    P, info = geo.polar_retraction(X)
    Q = geo.qr_retraction(X)
    return {"frame": _rows(X), "polar": _rows(P), "qr": _rows(Q), "polar_distance": num((P - X).norm()),
            "qr_distance": num((Q - X).norm()), "iterations": int(info["iterations"]),
            "svd_route": bool(info["svd"])}


@example("iso_weight_refused")
def iso_weight_refused(weight):
    """Assigning W directly to a fixed-spectrum layer is refused."""
    layer = _layer(weight)
    try:
        layer.weight = torch.zeros_like(layer.weight)
        err = "no error"
    except PolicylabError as exc:
        err = str(exc)
    params = sorted(n for n, _ in layer.named_parameters())
    return {"parameters": ", ".join(params), "buffers": ", ".join(n for n, _ in layer.named_buffers()), "error": err}
