"""Small input checks shared by every kernel. Each raises a policylab error that names
the argument and what is wrong with it; none of them copies or changes its input."""

from __future__ import annotations

import torch

from policylab.errors import GroupError, NonFiniteError, ShapeError


def check_mask(mask: torch.Tensor, name: str = "loss_mask") -> None:
    """`mask` must be a bool tensor (True = the position counts)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ShapeError(f"`{name}` must be a bool tensor (True = counts), got {got}")


def check_same_shape(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    """Every tensor in `others` (None is skipped) has the shape of `ref`."""
    for name, t in others.items():
        if t is not None and t.shape != ref.shape:
            raise ShapeError(
                f"`{name}` has shape {tuple(t.shape)} but `{ref_name}` has {tuple(ref.shape)}"
            )


def check_finite(t: torch.Tensor, name: str, mask: torch.Tensor | None = None) -> bool:
    """No NaN or inf in `t` (only at positions where `mask` is True, if given).

    Returns True when every entry is finite, False when only the counted ones are (a
    caller can then mask with a product instead of `torch.where`, see `zero_outside`)."""
    if t.is_floating_point() and bool(torch.isfinite(t.detach().sum())):
        return True  # fast path: a finite sum has no NaN or inf term (an overflowing sum falls through)
    if not t.is_floating_point():
        return True
    bad = ~torch.isfinite(t)
    if mask is not None:
        bad = bad & mask
    if bool(bad.any()):
        idx = bad.nonzero()[0].tolist()
        raise NonFiniteError(
            f"`{name}` has {int(bad.sum())} non-finite value(s), first at index {idx}: "
            f"{t[tuple(idx)].item()}"
        )
    return bool(torch.isfinite(t).all())


def float_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bool `mask` as 0/1 values of `dtype`. Through a uint8 view: the direct bool ->
    float conversion takes a slow path on CPU (~9x slower at 1M entries)."""
    return mask.view(torch.uint8).to(dtype)


def masked(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`t` where the bool `mask` is True, exactly 0 elsewhere: the plain masking of every
    formula kernel. A select (`torch.where`), never a product, so NaN/inf/huge values at
    masked positions reach neither the value nor the gradient (the gradient there is 0)."""
    return torch.where(mask, t, torch.zeros((), dtype=t.dtype, device=t.device))


def zero_outside(t: torch.Tensor, mask: torch.Tensor, mask_f: torch.Tensor | None = None, *,
                 finite: bool | None = None) -> torch.Tensor:
    """`t` where `mask` is True, 0 elsewhere (an out-of-place, differentiable masking: the
    gradient at masked positions is 0). When every entry of `t` is finite (one sum tells,
    or the caller passes `finite=True` from `check_finite`) this is `t * mask_f` (`mask_f`
    = the mask as t's dtype, built here unless passed), several times faster on CPU than
    `torch.where` with a bool condition; otherwise `torch.where`, so NaN/inf in padding
    never survive (a product would turn them into NaN). Masked entries may come out as
    -0.0, which compares and sums as 0."""
    if finite is None:
        finite = bool(torch.isfinite(t.detach().sum()))
    if finite:
        return t * (float_mask(mask, t.dtype) if mask_f is None else mask_f)
    return torch.where(mask, t, torch.zeros((), dtype=t.dtype, device=t.device))


def zero_outside_(t: torch.Tensor, mask: torch.Tensor, *, finite: bool | None = None) -> torch.Tensor:
    """In-place `zero_outside` for a tensor the caller has just created (never an input).
    Returns `t`. Outside autograd: torch.where written into `t` (no [B, T] temporary: at
    1M entries a fresh 4 MiB block can cost more than the select; NaN/inf at masked
    positions become 0 as well). In an autograd graph: the product with the float mask
    when `t` is finite (`finite`, else one sum tells; the gradient at masked positions is
    0, and autograd allows it: the product's backward does not need `t`), or masked_fill_
    when `t` holds NaN/inf. (A product with the mask's uint8 view would look cheaper but
    converts it to a float temporary inside the op.)"""
    if not t.requires_grad:
        return torch.where(mask, t, torch.zeros((), dtype=t.dtype, device=t.device), out=t)
    if finite or finite is None and _all_finite(t):
        return t.mul_(float_mask(mask, t.dtype))
    return t.masked_fill_(~mask, 0.0)


def _all_finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t.detach().sum()))


def masked_mean(x: torch.Tensor, mask: torch.Tensor, *, zero_outside: bool = False) -> torch.Tensor:
    """Mean of `x` over the positions where `mask` is True, as a detached float64 0-dim
    tensor (0 when nothing counts). NaN/inf at masked positions never enter (a select, no
    boolean indexing); `zero_outside=True` promises x is already 0 there and skips the
    select."""
    x = x.detach()
    n = int(torch.count_nonzero(mask))
    total = x.sum(dtype=torch.float64) if zero_outside else \
        torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dtype=torch.float64)
    return total / max(n, 1)


def count_true(mask: torch.Tensor, mask_f: torch.Tensor | None = None) -> torch.Tensor:
    """Number of True entries (0-dim int64). From the float mask when there is one and the
    count is exactly representable (a float32 sum of 0/1 values is exact below 2**24);
    `count_nonzero` otherwise (bool .sum() converts to int64 first: ~15x slower)."""
    if mask_f is not None and mask.numel() < 2**24 and mask_f.dtype in (torch.float32, torch.float64):
        return mask_f.sum().to(torch.int64)
    return torch.count_nonzero(mask)


def expand_adv(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Advantages given per sequence `[B]` broadcast to `[B, T]`; `[B, T]` passes through."""
    if adv.dim() == 1 and adv.shape[0] == like.shape[0]:
        return adv.unsqueeze(-1).expand_as(like)
    if adv.shape == like.shape:
        return adv
    raise ShapeError(
        f"`adv` must be [B] or [B, T] = {tuple(like.shape)}, got {tuple(adv.shape)}"
    )


def group_index(group: torch.Tensor, n: int | None = None) -> tuple[torch.Tensor, int]:
    """Map arbitrary (not necessarily contiguous or sorted) group ids to 0..n_groups-1.

    Returns (dense ids `[B]`, number of groups). Group ids must be a 1-D integer tensor.
    """
    if group.dim() != 1 or group.dtype in (torch.float16, torch.float32, torch.float64, torch.bool):
        raise GroupError(f"`group` must be a 1-D integer tensor, got {group.dtype} {tuple(group.shape)}")
    if n is not None and group.shape[0] != n:
        raise ShapeError(f"`group` has {group.shape[0]} entries but there are {n} sequences")
    if group.numel():
        lo, hi = (int(v) for v in torch.aminmax(group))
        if hi - lo <= 8 * group.numel() + 1024:
            # ids in a range a few times the batch: a presence table and its running count
            # give the same dense ids as torch.unique (ascending raw id) without a sort,
            # which dominates the advantage kernels at batch sizes of ~10^4
            shifted = group - lo
            present = torch.zeros(hi - lo + 1, dtype=torch.bool, device=group.device).index_fill_(0, shifted, True)
            rank = torch.cumsum(present, 0) - 1
            return torch.index_select(rank, 0, shifted), int(rank[-1]) + 1
    uniq, dense = torch.unique(group, return_inverse=True)
    return dense, int(uniq.numel())
