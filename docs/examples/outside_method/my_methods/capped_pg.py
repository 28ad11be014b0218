"""Kernel: a policy-gradient loss whose advantage is capped at ±cap.

    L_{i,t} = −clip(A_i, −cap, cap) · lp_{i,t}    on counted tokens (mask True), 0 elsewhere

lp is the learner's log-prob (differentiable); the capped advantage is detached. A toy
for the example: the loss matrix [B, T] and detached diagnostics, never aggregated here.
"""

from __future__ import annotations

import torch


def capped_pg(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *, cap: float):
    """logp [B, T], adv [B] or [B, T], mask [B, T] bool -> (loss [B, T], metrics)."""
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    a = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(logp)
    capped = a.detach().clamp(-cap, cap)
    loss = torch.where(mask, -capped * logp, torch.zeros((), dtype=logp.dtype))
    n = mask.sum().clamp(min=1)
    frac = ((a.detach().abs() > cap) & mask).sum().to(logp.dtype) / n
    return loss, {"capped_pg/capped_frac": frac.detach()}
