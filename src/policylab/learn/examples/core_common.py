"""Shared helpers of the core_* example modules.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels import advantages as adv_mod
from policylab.kernels import aggregate as agg_mod
from policylab.kernels import filters, kl, objectives
from policylab.errors import PolicylabError
from policylab.kernels.rewards import overlong_penalty, pseudo_label_agreement, ttrl_rewards
from policylab.kernels.rewards.verifiers import exact_numeric_reward
from policylab.learn.examples import example

F64 = torch.float64


# ---------------------------------------------------------------- helpers
def _t(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=F64)


def _num(x) -> float:
    """A clean Python float (no -0.0, no 1e-17 noise)."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
    return round(float(x), 10) + 0.0


def _nums(t) -> list[float]:
    return [_num(v) for v in (t.detach().tolist() if isinstance(t, torch.Tensor) else t)]


def _echo(x):
    """An input echoed for the text: ints stay ints, other numbers become floats."""
    return x if isinstance(x, int) and not isinstance(x, bool) else _num(x)


def _group(group, n: int) -> torch.Tensor:
    return torch.tensor(group if group is not None else [0] * n, dtype=torch.long)


def _ragged(rows, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths -> (values [B, T], mask [B, T]), padded with `fill`."""
    T = max(len(r) for r in rows)
    vals = torch.full((len(rows), T), fill, dtype=F64)
    mask = torch.zeros((len(rows), T), dtype=torch.bool)
    for i, r in enumerate(rows):
        vals[i, : len(r)] = _t(r)
        mask[i, : len(r)] = True
    return vals, mask


def _lengths_mask(lengths) -> torch.Tensor:
    return _ragged([[0.0] * int(n) for n in lengths])[1]


def _single_token(fn, ratios, advs, **kw):
    """One token per row with lp_old = 0, lp = log ρ. Returns (coef, loss, metrics) where
    the objective's gradient is ∂ℓ/∂lp = −coef·A (coef 0 where A = 0)."""
    lp = torch.log(_t(ratios)).unsqueeze(1).requires_grad_()
    adv = _t(advs)
    loss, metrics = fn(lp, torch.zeros_like(lp), adv, torch.ones_like(lp, dtype=torch.bool), **kw)
    loss.sum().backward()
    g = lp.grad.squeeze(1)
    coef = torch.where(adv != 0, -g / torch.where(adv != 0, adv, 1.0), 0.0)
    return coef, loss.detach().squeeze(1), metrics


def _at_ratio_one_grads(adv, mask, mode, *, L_norm=None, objective="ppo_clip", logp_value=-1.0):
    """Per-token gradient of the aggregated loss at the first minibatch (lp = lp_old)."""
    lp = torch.full(mask.shape, logp_value, dtype=F64, requires_grad=True)
    if objective == "reinforce":
        loss, _ = objectives.reinforce(lp, adv, mask)
    else:
        loss, _ = objectives.ppo_clip(lp, lp.detach().clone(), adv, mask, eps_low=0.2, eps_high=0.2)
    value = agg_mod.aggregate(loss, mask, mode, L_norm=L_norm)
    value.backward()
    return value.detach(), lp.grad


# ---------------------------------------------------------------- GRPO family
def _rpp_inputs(logp_old, logp_ref):
    old, m = _ragged(logp_old)
    ref, _ = _ragged(logp_ref)
    return old, ref, m


def _gspo_run(fn, log_ratios, adv, eps_low, eps_high, mode="seq_mean_token_mean"):
    lp, mask = _ragged(log_ratios)
    lp.requires_grad_()
    loss, metrics = fn(lp, torch.zeros_like(lp), _t(adv), mask, eps_low=eps_low, eps_high=eps_high)
    agg_mod.aggregate(loss, mask, mode).backward()
    return lp.grad, metrics, mask


def _completions(answers) -> list[str]:
    return [f"... so the answer is {a}." if a is not None else "I could not finish." for a in answers]
