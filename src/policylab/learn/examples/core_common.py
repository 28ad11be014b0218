"""Shared helpers of the example modules: clean floats for the text, small float64
tensors, ragged rows with their mask, and a few one-call runs of the objectives.
"""

from __future__ import annotations

import torch

from policylab.kernels import aggregate as agg_mod
from policylab.errors import PolicylabError
from policylab.kernels import objectives

F64 = torch.float64


# ---------------------------------------------------------------- helpers
def f64(x) -> torch.Tensor:
    """`x` as a float64 tensor."""
    return torch.as_tensor(x, dtype=F64)


def num(x) -> float:
    """A clean Python float (no -0.0, no 1e-17 noise)."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
    return round(float(x), 10) + 0.0


def nums(t) -> list[float]:
    """A tensor or a list as clean Python floats (see `num`)."""
    return [num(v) for v in (t.detach().tolist() if isinstance(t, torch.Tensor) else t)]


def echo(x):
    """An input echoed for the text: ints stay ints, other numbers become floats."""
    return x if isinstance(x, int) and not isinstance(x, bool) else num(x)


def group_ids(group, n: int) -> torch.Tensor:
    """The group index of each of `n` rows: `group` when given, else one group (all 0)."""
    return torch.tensor(group if group is not None else [0] * n, dtype=torch.long)


def ragged(rows, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths -> (values [B, T], mask [B, T]), padded with `fill`."""
    T = max(len(r) for r in rows)
    vals = torch.full((len(rows), T), fill, dtype=F64)
    mask = torch.zeros((len(rows), T), dtype=torch.bool)
    for i, r in enumerate(rows):
        vals[i, : len(r)] = f64(r)
        mask[i, : len(r)] = True
    return vals, mask


def lengths_mask(lengths) -> torch.Tensor:
    """The [B, T] mask of rows with the given numbers of valid tokens."""
    return ragged([[0.0] * int(n) for n in lengths])[1]


def single_token(fn, ratios, advs, **kw):
    """One token per row with lp_old = 0, lp = log ρ. Returns (coef, loss, metrics) where
    the objective's gradient is ∂ℓ/∂lp = −coef·A (coef 0 where A = 0)."""
    lp = torch.log(f64(ratios)).unsqueeze(1).requires_grad_()
    adv = f64(advs)
    loss, metrics = fn(lp, torch.zeros_like(lp), adv, torch.ones_like(lp, dtype=torch.bool), **kw)
    loss.sum().backward()
    g = lp.grad.squeeze(1)
    coef = torch.where(adv != 0, -g / torch.where(adv != 0, adv, 1.0), 0.0)
    return coef, loss.detach().squeeze(1), metrics


def grads_at_ratio_one(adv, mask, mode, *, L_norm=None, objective="ppo_clip", logp_value=-1.0):
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
def rpp_inputs(logp_old, logp_ref):
    """(logp_old, logp_ref, mask) [B, T] from ragged per-token log-prob lists."""
    old, m = ragged(logp_old)
    ref, _ = ragged(logp_ref)
    return old, ref, m


def gspo_run(fn, log_ratios, adv, eps_low, eps_high, mode="seq_mean_token_mean"):
    """Run the sequence-ratio objective `fn` on ragged per-token log ratios (logp_old = 0),
    aggregate with `mode` and backpropagate: (gradient wrt logp, metrics, mask)."""
    lp, mask = ragged(log_ratios)
    lp.requires_grad_()
    loss, metrics = fn(lp, torch.zeros_like(lp), f64(adv), mask, eps_low=eps_low, eps_high=eps_high)
    agg_mod.aggregate(loss, mask, mode).backward()
    return lp.grad, metrics, mask


def answer_texts(answers) -> list[str]:
    """A completion ending in "the answer is <a>" for each answer (None: an unfinished one)."""
    return [f"... so the answer is {a}." if a is not None else "I could not finish." for a in answers]


def all_valid(t: torch.Tensor) -> torch.Tensor:
    """An all-valid bool mask shaped like `t`."""
    return torch.ones_like(t, dtype=torch.bool)


def single_group(n: int) -> torch.Tensor:
    """The group index of `n` rows that form one group (all 0)."""
    return torch.zeros(n, dtype=torch.long)


def error_head(fn) -> str:
    """`Type: first clause` of the error `fn` raises (the message up to its first `;`), or
    "no error" when it returns."""
    try:
        fn()
    except (PolicylabError, ValueError) as exc:
        return f"{type(exc).__name__}: {str(exc).split(';')[0]}"
    return "no error"


def method_advantages(name: str, rewards, group=None) -> list[float]:
    """The registered method `name`'s own advantage stage (its parameters: std convention,
    eps, ...) on one reward per row: what a lesson quotes as "<name> gives ...", so a lesson
    cannot disagree with the code."""
    from policylab import methods
    from policylab.learn.figures.common import advantages, bare_batch

    r = [float(x) for x in rewards]
    a = advantages(methods.get(name), bare_batch(len(r), 1, group=group, rewards=r))
    return nums(a if a.dim() == 1 else a[:, 0])
