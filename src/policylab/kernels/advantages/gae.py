"""Generalized Advantage Estimation over the valid tokens of each sequence.

Mask assumption (documented once, used by `gae`, `mc_returns`, `vapo_advantages`): the
valid tokens of row i are exactly the positions where `mask[i]` is True, taken in order.
Positions with mask False are skipped entirely: their reward and value never enter, they
are not a step for γ or λ, and their advantage/return is exactly 0. For the usual
right-padded mask this is textbook GAE with V = 0 after the last valid token; for a mask
with interior holes (e.g. tool output inside a multi-turn response) the valid tokens on
either side of the hole are treated as consecutive steps. Nothing else about the layout
is assumed (a row may even have no valid token: it gets all zeros).
"""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_finite, check_mask, check_same_shape
from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.advantages.group import check_nonneg


def _check_unit_interval(value: float | torch.Tensor, name: str, batch: int) -> torch.Tensor | float:
    """A scalar in [0, 1], or a finite `[B]` tensor with every entry in [0, 1]."""
    if isinstance(value, torch.Tensor):
        if value.shape != (batch,):
            raise ShapeError(f"`{name}` as a tensor must be [B] = ({batch},), got {tuple(value.shape)}")
        if not value.is_floating_point():
            raise ShapeError(f"`{name}` must be floating point, got {value.dtype}")
        bad = ~((value >= 0) & (value <= 1))  # NaN fails both comparisons
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise PolicylabError(f"`{name}` must lie in [0, 1]; entry {i} is {value[i].item()}")
        return value.detach()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise PolicylabError(f"`{name}` must be a number in [0, 1], got {value!r}")
    return float(value)


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and return targets, both `[B, T]` and detached.

        δ_t = r_t + γ·V(s_{t+1}) − V(s_t)          V(s_{t+1}) = 0 after the last valid token
        Â_t = Σ_{l≥0} (γλ)^l δ_{t+l} = δ_t + γλ·Â_{t+1}   (backward over valid tokens)
        R_t = Â_t + V(s_t)

    Papers: "High-Dimensional Continuous Control Using Generalized Advantage Estimation"
    (Schulman et al., arXiv:1506.02438); its truncated form as used in "Proximal Policy
    Optimization Algorithms" (arXiv:1707.06347, Eqs. 11-12).

    Args:
        token_rewards: `[B, T]` reward of each position (e.g. outcome reward on the last
            valid token plus per-token KL shaping). Entries where `mask` is False are
            ignored and may hold anything, even NaN.
        values: `[B, T]` critic values V(s_t) read at rollout time (detached here).
        mask: `[B, T]` bool, True = a valid response token (see the module docstring for
            how holes are treated).
        gamma: discount in [0, 1].
        lam: GAE λ in [0, 1], a float or a per-sequence `[B]` tensor (VAPO's
            length-adaptive λ_policy).

    Returns `(advantages [B, T], returns [B, T])`, exactly 0 where `mask` is False.
    λ = 1 gives the Monte-Carlo return minus V; λ = 0 gives δ.

    Deviations / decisions: the end of the valid tokens is always terminal (a response cut
    by the length budget is not bootstrapped); masked positions are skipped, not treated
    as zero-reward steps. Detached: everything (inputs are detached on entry). A Python
    loop runs over T; each step is vectorized over B.
    """
    check_mask(mask, "mask")
    if token_rewards.dim() != 2:
        raise ShapeError(f"`token_rewards` must be [B, T], got {tuple(token_rewards.shape)}")
    check_same_shape("token_rewards", token_rewards, values=values, mask=mask)
    if not (token_rewards.is_floating_point() and values.is_floating_point()):
        raise ShapeError(f"`token_rewards` and `values` must be floating point, got {token_rewards.dtype}, {values.dtype}")
    check_finite(token_rewards, "token_rewards", mask)
    check_finite(values, "values", mask)
    B, T = token_rewards.shape
    if isinstance(gamma, torch.Tensor):
        raise PolicylabError("`gamma` must be a float (per-sequence discounts are not supported)")
    gamma = _check_unit_interval(gamma, "gamma", B)
    lam = _check_unit_interval(lam, "lam", B)

    dtype = torch.promote_types(token_rewards.dtype, values.dtype)
    zero = torch.zeros((), dtype=dtype, device=values.device)
    r = torch.where(mask, token_rewards.detach().to(dtype), zero)
    v = torch.where(mask, values.detach().to(dtype), zero)
    if isinstance(lam, torch.Tensor):
        decay = gamma * lam.to(device=v.device, dtype=dtype)
    else:
        decay = torch.full((B,), gamma * lam, dtype=dtype, device=v.device)

    adv = torch.zeros_like(v)
    next_value = v.new_zeros(B)  # V of the next valid token (0 past the last one)
    running = v.new_zeros(B)  # Â of the next valid token
    for t in range(T - 1, -1, -1):
        m = mask[:, t]
        a_t = r[:, t] + gamma * next_value - v[:, t] + decay * running
        running = torch.where(m, a_t, running)
        next_value = torch.where(m, v[:, t], next_value)
        adv[:, t] = torch.where(m, a_t, zero)
    return adv, torch.where(mask, adv + v, zero)


def whiten(
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps: float,
    std: str = "population",
) -> torch.Tensor:
    """Batch whitening of `[B, T]` advantages over all valid tokens of the batch.

        Â ← (Â − mean_valid(Â)) / (std_valid(Â) + eps)

    One mean and one std for the whole batch (every valid token weighs the same, whatever
    its sequence). `std` is the convention: "population" (ddof 0, default) or "unbiased"
    (ddof 1; with a single valid token the divisor is clamped at 1, giving 0). Callers
    opt in with an explicit flag; nothing in policylab whitens implicitly.

    Returns `[B, T]`, detached, exactly 0 where `mask` is False. Raises if `mask` has no
    True entry (there is nothing to normalize: skip the step instead). A `[B]` advantage
    is not accepted: broadcast it first, since whitening per token weighs long responses
    more than whitening per sequence.
    """
    check_mask(mask, "mask")
    if adv.dim() != 2:
        raise ShapeError(f"`adv` must be [B, T], got {tuple(adv.shape)}")
    check_same_shape("adv", adv, mask=mask)
    if std not in ("population", "unbiased"):
        raise PolicylabError(f"`std` must be 'population' or 'unbiased', got {std!r}")
    check_nonneg(eps, "eps")
    check_finite(adv, "adv", mask)
    n = int(mask.sum())
    if n == 0:
        raise PolicylabError("`mask` has no True entry: there are no valid tokens to whiten")
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    x = torch.where(mask, adv.detach(), zero)
    mean = x.sum() / n
    centred = torch.where(mask, x - mean, zero)
    ddof = 1 if std == "unbiased" else 0
    var = (centred * centred).sum() / max(n - ddof, 1)
    return torch.where(mask, centred / (var.sqrt() + eps), zero)
