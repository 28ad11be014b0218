"""fp32 forward, bf16 backward: `train.dtype: bf16-backward`.

The forward of a training step decides everything a method's loss reads: the learner's
log-probs, hence every ratio π_θ/π_old, every clip and mask decision, every advantage
weight and every logged loss. Under bf16 autocast those values move (the trainer's bf16
forward is off the fp32 one by mean |Δlog p| 0.017, max 0.34 on the embedded model,
benchmarks/results/fast_mode_error.md), so a token can cross a clip boundary because of
rounding. This mode leaves the forward exactly as in fp32 and puts bf16 only where the
values are not read by the loss: the two matrix products of every linear layer's
backward.

For a linear layer y = x Wᵀ + b with upstream gradient g = ∂L/∂y:

    forward   y = x Wᵀ + b                         fp32, the same kernel as nn.Linear (bit-identical)
    backward  ∂L/∂x = bf16(g) · bf16(W)            fp32 accumulation, result returned in fp32
              ∂L/∂W = bf16(g)ᵀ · bf16(x)           fp32 accumulation, result returned in fp32
              ∂L/∂b = Σ g                          fp32

bf16(·) rounds to bfloat16 (8 significant bits, relative error ≤ 2⁻⁹ per element). The
gradients are therefore approximations of the fp32 gradients of the exact fp32 loss;
nothing in the forward is approximated or detached differently. The layer keeps bf16(x)
for its backward instead of x (half the bytes; one cast shared by the layers that read
the same input, e.g. q/k/v and gate/up), and casts W when its backward runs (no bf16
weight copy is kept between forwards). Everything that is not a linear layer (attention,
norms, activations, the log-softmax, the loss) runs forward and backward in fp32.

It applies to every `torch.nn.functional.linear` call made inside the region (so to any
architecture, a LoRA adapter's layers and the output head alike) whose inputs are fp32
and record a gradient; calls without gradient (sampling, evaluation, the π_old and
reference passes) and fp64 / bf16 inputs run as they would outside it.

How far the gradient moves, measured against the fp32 gradient on the embedded model and
compared with the gradient's own sampling noise: benchmarks/fast_mode_error.py
(`policylab.methods.fast_mode` says what the fast mode's `train.dtype: auto` does with
it). Where bf16 matrix products are emulated (a CPU without AVX-512 BF16 or AMX) the mode
is correct but slower than fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils.weak import WeakTensorKeyDictionary

__all__ = ["Bf16Backward", "active_region", "bf16_backward_linear"]

_BF16 = torch.bfloat16


class _LinearBf16Backward(torch.autograd.Function):
    """y = F.linear(x, W, b) in the input's dtype; the backward's two products from
    bf16-rounded operands (module doc). `x_bf16` is bf16(x), made by the caller so that
    layers reading one input share one cast."""

    @staticmethod
    def forward(ctx, x, weight, bias, x_bf16):
        ctx.save_for_backward(x_bf16, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x_bf16, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        g = grad_out.to(_BF16)
        grad_x = grad_w = grad_b = None
        if need_x:
            grad_x = torch.matmul(g, weight.to(_BF16)).to(grad_out.dtype)
        if need_w:
            g2 = g.reshape(-1, g.shape[-1])
            grad_w = torch.mm(g2.t(), x_bf16.reshape(-1, x_bf16.shape[-1])).to(weight.dtype)
        if ctx.has_bias and need_b:
            grad_b = grad_out.reshape(-1, grad_out.shape[-1]).sum(0)
        return grad_x, grad_w, grad_b, None


def bf16_backward_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                         x_bf16: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` whose backward multiplies in bf16 (module doc)."""
    if x_bf16 is None:
        x_bf16 = x.detach().to(_BF16)
    return _LinearBf16Backward.apply(x, weight, bias, x_bf16)


class Bf16Backward(TorchFunctionMode):
    """The region of `train.dtype: bf16-backward`: inside it, every fp32
    `F.linear` that records a gradient runs with `bf16_backward_linear`; every other call
    is passed through unchanged. Use as a context manager around the forwards (and, or
    not, the backwards) of a step:

        with Bf16Backward():
            loss = objective(model_logprobs(model, ...))
        loss.backward()
    """

    def __init__(self):
        super().__init__()
        self._casts = WeakTensorKeyDictionary()  # x -> (x._version, bf16(x)) while x lives
        self.calls = 0  # linear calls routed to the bf16 backward (read by tests and diagnostics)

    def _cast(self, x: torch.Tensor) -> torch.Tensor:
        hit = self._casts.get(x)
        if hit is not None and hit[0] == x._version:
            return hit[1]
        xb = x.detach().to(_BF16)
        self._casts[x] = (x._version, xb)
        return xb

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and torch.is_grad_enabled():
            x = args[0] if args else kwargs["input"]
            weight = args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if (x.dtype == torch.float32 and weight.dtype == torch.float32
                    and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))):
                self.calls += 1
                return _LinearBf16Backward.apply(x, weight, bias, self._cast(x))
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        self._casts = WeakTensorKeyDictionary()
        return super().__exit__(*exc)


def active_region() -> Bf16Backward | None:
    """The innermost `Bf16Backward` region on this thread's torch function mode stack
    (None outside any; torch keeps that stack, the same one `torch.get_default_device` reads).

    A forward that is recomputed in the backward (`torch.utils.checkpoint`, e.g. the
    chunked log-probs of `policylab.models.logprobs`) must run its recomputation inside
    the region its forward ran in: otherwise the recomputed linear layers are plain
    `F.linear` calls that save other tensors than the forward's did, and the checkpoint
    refuses them. torch leaves a function mode while it handles a call (such as
    `Tensor.backward`) and the backward may be called outside the region anyway, so the
    checkpoint is given this region, found when the forward runs, to enter again around
    the recomputation."""
    return next((m for m in reversed(_get_current_function_mode_stack()) if isinstance(m, Bf16Backward)), None)
