"""Recompute the cheap elementwise parts of a Llama decoder layer in the backward instead
of keeping their intermediates (`train.recompute_elementwise`, on by default).

A training forward keeps, for every trained token and layer, the tensors its backward
reads. Two parts of a Llama layer keep far more than their inputs:

    RMSNorm   y = w * (x * rsqrt(mean(x^2) + eps))      keeps x and the normalized x (fp32)
    gated MLP h = silu(g) * u,  g = W_g x, u = W_u x     keeps g, silu(g) and u

Run under non-reentrant activation checkpointing (`torch.utils.checkpoint`), each part
keeps only its inputs (x; g and u); the backward runs the same operations again on them
and then the same backward formulas. The forward is the module's own code, the
recomputation repeats it exactly (elementwise operations, no randomness, autocast state
restored), so outputs and gradients are bit-identical to the plain modules
(tests/models/test_recompute.py); the cost is one more pass of these elementwise
operations per trained token, against the matrix products around them.

Per token and layer this drops one hidden-size vector in fp32 per RMSNorm (two norms) and
one intermediate-size vector (silu(g)) in the compute dtype: on SmolLM2-135M
(H = 576, I = 1536, 30 layers) 10.5 KB of the ~44 KB a layer keeps per token in fp32
training, 7.5 KB of ~30 KB under bf16 autocast (besides the bf16 weight copies autocast
keeps for the backward). The estimate of `policylab.trainer.memory` follows the setting.

Only the exact Hugging Face Llama classes are changed (`LlamaRMSNorm`, `LlamaMLP`: their
forward is known); every other module, and every module outside a gradient-recording
forward (sampling, evaluation, reference passes), runs as before. The change is a class
swap on the instances, so `state_dict`, `save_pretrained`, `copy.deepcopy` and LoRA
wrapping see the same parameters.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["recompute_elementwise", "recomputed_modules"]


def _records(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _gated(act_fn, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return act_fn(g) * u


def _classes():
    from transformers.models.llama import modeling_llama as ml

    class RecomputedLlamaRMSNorm(ml.LlamaRMSNorm):
        """LlamaRMSNorm whose intermediates are recomputed in the backward (module doc)."""

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            if not _records(hidden_states, self.weight):
                return super().forward(hidden_states)
            return checkpoint(super().forward, hidden_states, use_reentrant=False, preserve_rng_state=False)

    class RecomputedLlamaMLP(ml.LlamaMLP):
        """LlamaMLP whose silu(g) is recomputed in the backward (module doc)."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            g = self.gate_proj(x)
            u = self.up_proj(x)
            if not _records(g, u):
                return self.down_proj(self.act_fn(g) * u)
            h = checkpoint(_gated, self.act_fn, g, u, use_reentrant=False, preserve_rng_state=False)
            return self.down_proj(h)

    return {ml.LlamaRMSNorm: RecomputedLlamaRMSNorm, ml.LlamaMLP: RecomputedLlamaMLP}


_SWAP = None


def recompute_elementwise(model: torch.nn.Module) -> int:
    """Swap every exact LlamaRMSNorm / LlamaMLP instance of `model` for its recomputing
    subclass (module doc); returns how many modules changed (0: nothing of the kind, e.g.
    another architecture, or already swapped). Idempotent."""
    global _SWAP
    if _SWAP is None:
        _SWAP = _classes()
    n = 0
    for m in model.modules():
        new = _SWAP.get(type(m))
        if new is not None:
            m.__class__ = new
            n += 1
    return n


def recomputed_modules(model: torch.nn.Module) -> int:
    """How many modules of `model` recompute their elementwise parts."""
    if _SWAP is None:
        return 0
    swapped = set(_SWAP.values())
    return sum(type(m) in swapped for m in model.modules())
