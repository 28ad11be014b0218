"""Shared helpers of the offpolicy_* example modules (inputs as small tensors).
"""

from __future__ import annotations

import math

import torch

from policylab.kernels import corrections
from policylab import methods

F64 = torch.float64


# ----------------------------------------------------------------------------- helpers


def row_tensor(values) -> torch.Tensor:
    """A [1, T] float64 tensor."""
    return torch.tensor([float(v) for v in values], dtype=F64).reshape(1, -1)


def log_row(probs) -> torch.Tensor:
    """The [1, T] log of a list of probabilities."""
    return torch.log(row_tensor(probs))


def ones_mask(t: torch.Tensor) -> torch.Tensor:
    """An all-valid bool mask shaped like `t`."""
    return torch.ones_like(t, dtype=torch.bool)


def flat(t: torch.Tensor) -> list[float]:
    """Every value of `t` as a clean Python float, flattened."""
    return [float(v) + 0.0 for v in t.detach().reshape(-1).tolist()]  # + 0.0: no "-0.0"


def scalar(t) -> float:
    """A tensor (or number) as a clean Python float."""
    return (float(t.detach()) if isinstance(t, torch.Tensor) else float(t)) + 0.0


def grad_leaf(t: torch.Tensor) -> torch.Tensor:
    """A detached copy of `t` that records its gradient."""
    return t.detach().clone().requires_grad_(True)


def grad_of(loss_sum: torch.Tensor, leaf: torch.Tensor) -> list[float]:
    """The gradient of `loss_sum` wrt `leaf`, flattened to floats."""
    (g,) = torch.autograd.grad(loss_sum, leaf)
    return flat(g)


def method_loss(name: str, params: dict, lp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, **roles):
    """The registered method's own policy loss (objective x its corrections, as the
    trainer composes it) on bare tensors: (loss [B, T], metrics)."""
    from policylab.methods.loss import policy_loss, tensor_inputs

    return policy_loss(methods.get(name).with_params(params), tensor_inputs(lp, adv, mask, **roles))


def error_text(fn) -> str:
    """The message of the error `fn` raises ("no error" if it returns)."""
    try:
        fn()
    except (ValueError, TypeError) as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def engine_pair(ratios, base_prob: float = 0.1):
    """(logp_old, logp_behavior) [1, T] whose engine ratio exp(lp_old - lp_mu) = ratios."""
    lp_mu = torch.full((1, len(ratios)), math.log(base_prob), dtype=F64)
    return lp_mu + torch.log(row_tensor(ratios)), lp_mu


def padded_rows(rows, fill: float = 0.0):
    """[B, T] tensor + bool mask from ragged lists."""
    T = max(len(r) for r in rows)
    x = torch.full((len(rows), T), fill, dtype=F64)
    m = torch.zeros((len(rows), T), dtype=torch.bool)
    for i, r in enumerate(rows):
        x[i, : len(r)] = torch.tensor([float(v) for v in r], dtype=F64)
        m[i, : len(r)] = True
    return x, m


# --------------------------------------------------------------------------------- tis


def constant_sequences(per_token_log_ratio, lengths, base=-1.0):
    """(shifted, base, mask): rows of the given lengths at log-prob `base`, and the same
    rows shifted by a per-token log ratio that is constant along each row (one per row)."""
    lp_mu, mask = padded_rows([[base] * n for n in lengths])
    shift = torch.tensor([float(d) for d in per_token_log_ratio], dtype=F64).unsqueeze(-1)
    return torch.where(mask, lp_mu + shift, lp_mu), lp_mu, mask


def versioned(lp, version, engine):
    """The behavior log-probs tagged with their policy version and engine."""
    return corrections.VersionedLogprobs(lp, version, engine)


def sis_inputs(behavior_topk, current_topk, sampled, positions):
    """`positions` identical positions with a top-K of the given probabilities."""
    K = len(behavior_topk)
    ids = torch.arange(K).expand(1, positions, K).clone()
    lp_mu_k = torch.log(torch.tensor([float(p) for p in behavior_topk], dtype=F64)).expand(1, positions, K)
    lp_pi_k = torch.log(torch.tensor([float(p) for p in current_topk], dtype=F64)).expand(1, positions, K)
    tokens = torch.full((1, positions), int(sampled))
    lp = lp_pi_k[..., int(sampled)].clone()
    lp_mu = lp_mu_k[..., int(sampled)].clone()
    return lp, ids, lp_mu_k.clone(), lp_pi_k.clone(), tokens, lp_mu, ones_mask(lp)


def tapo_rows(log_ratios):
    """(logp_old, logp) [1, T] whose per-token log ratios are `log_ratios`."""
    lp_old = torch.full((1, len(log_ratios)), -1.0, dtype=F64)
    return lp_old, lp_old + row_tensor(log_ratios)


def wide_eps(t: torch.Tensor) -> torch.Tensor:
    """A per-token clip range of 10 everywhere (wide enough that nothing is clipped)."""
    return torch.full(t.shape, 10.0, dtype=F64)  # ε(t) = 10 everywhere: no clipping


def seq_batch(lengths, mean_log_ratios=None):
    """(logp_old, logp, mask) of rows of the given lengths, each row shifted by its mean
    log ratio (0 when not given)."""
    lp_old, mask = padded_rows([[-1.0] * n for n in lengths])
    shift = torch.tensor([float(d) for d in (mean_log_ratios or [0.0] * len(lengths))], dtype=F64)
    return lp_old, torch.where(mask, lp_old + shift.unsqueeze(-1), lp_old), mask


def first_valid(grad: list[float], mask: torch.Tensor) -> list[float]:
    """The gradient at the first token of each row (`grad` flattened from `mask`'s shape)."""
    g = torch.tensor(grad, dtype=F64).reshape(mask.shape)
    return [float(g[i, 0]) for i in range(mask.shape[0])]


def row_sums(grad: list[float], mask: torch.Tensor) -> list[float]:
    """The gradient summed over each row (`grad` flattened from `mask`'s shape)."""
    return flat(torch.tensor(grad, dtype=F64).reshape(mask.shape).sum(-1))
