"""Weight-only integer quantization for a behavior engine that samples from quantized
weights (`FastEngine(weights="int8" | "int4")`, `rollout.engine_dtype=int8 | int4`).

Symmetric round-to-nearest with one absmax scale per group of `group` consecutive input
weights of an output row (group = 0: one scale per output row), the scheme of the common
weight-only formats (int8 per channel / per group; 4-bit in groups of 32):

    q_max = 2^(bits-1) - 1                    (127 for int8, 7 for int4)
    s_g   = max_{j in g} |w_j| / q_max        (a group of zeros keeps s_g = 0: w_hat = 0)
    q_j   = clamp(round(w_j / s_g), -q_max, q_max)      round half to even (torch.round)
    w_hat_j = q_j * s_g

The grid is symmetric (int4 uses -7..7, not -8): every group's largest weight is exactly
representable (|w_hat| = |w| there), and the rounding error of every weight is at most s_g / 2.

`fake_quantize` returns w_hat in w's dtype: the engine keeps that copy and runs its
usual matmuls on it (weights on the integer grid, activations and accumulation in the
compute dtype, i.e. W8A32 / W4A32). The sampled distribution is the quantized model's;
the speed is not an integer kernel's (none is used), and memory holds one more copy of
the weights.
"""

from __future__ import annotations

import torch

BITS = {"int8": 8, "int4": 4}


def fake_quantize(w: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """w_hat (same shape and dtype as the 2-D weight `w` [out, in]), see the module doc.

    `group` must divide the input width (0: the whole row is one group)."""
    if w.dim() != 2:
        raise ValueError(f"fake_quantize expects a 2-D weight [out, in], got shape {tuple(w.shape)}")
    if bits not in (2, 3, 4, 5, 6, 7, 8):
        raise ValueError(f"bits must be in 2..8, got {bits}")
    out_f, in_f = w.shape
    g = in_f if group == 0 else int(group)
    if g < 1 or in_f % g:
        raise ValueError(f"quantization group {group} does not divide the input width {in_f}")
    qmax = 2 ** (bits - 1) - 1
    x = w.detach().reshape(out_f, in_f // g, g)
    work = x if x.dtype == torch.float64 else x.float()
    scale = work.abs().amax(-1, keepdim=True) / qmax
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(work / safe), -qmax, qmax)
    return (q * scale).reshape(out_f, in_f).to(w.dtype)


def quantize_codes(w: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(integer codes q [out, in] int8, scales [out, in // group] fp32): the stored form of
    `fake_quantize` (w_hat = q * scale broadcast over each group), for tests and inspection."""
    out_f, in_f = w.shape
    g = in_f if group == 0 else int(group)
    if g < 1 or in_f % g:
        raise ValueError(f"quantization group {group} does not divide the input width {in_f}")
    qmax = 2 ** (bits - 1) - 1
    x = w.detach().float().reshape(out_f, in_f // g, g)
    scale = x.abs().amax(-1, keepdim=True) / qmax
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(x / safe), -qmax, qmax)
    return q.reshape(out_f, in_f).to(torch.int8), scale.squeeze(-1)
