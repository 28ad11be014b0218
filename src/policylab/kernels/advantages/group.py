"""Per-group statistics by scatter over arbitrary group ids (private to `advantages`).

Group ids are mapped to dense ids 0..n-1 with `_checks.group_index`; every statistic is an
`index_add_` / `scatter_reduce` over that dense index, so there is no Python loop over
groups and ids may be non-contiguous, unsorted and interleaved. Statistics work on `[B]`
or `[B, D]` inputs (a trailing dimension is reduced per column).

Conventions shared by every group-relative estimator:

- a group whose values are all exactly equal (max == min, singletons included) is "flat":
  its centred values are set to exactly 0 (the scatter mean of equal floats can differ
  from them by one rounding step, which a std division would blow up);
- the spread is sqrt(sum of squared deviations / (n_g - ddof)), ddof 1 = `unbiased`,
  ddof 0 = `population`; the divisor is clamped at 1 so a singleton gives 0, not NaN
  (singletons are flat, so their advantage is 0 either way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from policylab.kernels.checks import check_finite, group_index
from policylab.errors import GroupError, PolicylabError, ShapeError

STD_DDOF = {"unbiased": 1, "population": 0}


def std_ddof(std: str | None) -> int | None:
    """`"unbiased"` -> 1, `"population"` -> 0, None -> None (no division by a spread)."""
    if std is None:
        return None
    if std not in STD_DDOF:
        raise PolicylabError(f"`std` must be 'unbiased', 'population' or None, got {std!r}")
    return STD_DDOF[std]


def check_nonneg(value: float, name: str) -> None:
    """A finite scalar hyper-parameter >= 0 (eps, coefficients)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PolicylabError(f"`{name}` must be a finite number >= 0, got {value!r}")


def check_rewards(rewards: torch.Tensor, name: str = "rewards", ndim: int = 1) -> None:
    """`rewards` is a non-empty floating tensor with `ndim` dims and no NaN/inf."""
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != ndim:
        got = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        want = "[B]" if ndim == 1 else "[B, D]" if ndim == 2 else f"{ndim}-D"
        raise ShapeError(f"`{name}` must be {want}, got {got}")
    if not rewards.is_floating_point():
        raise ShapeError(
            f"`{name}` must be floating point, got {rewards.dtype} (convert 0/1 outcomes with .float())"
        )
    if rewards.shape[0] == 0:
        raise ShapeError(f"`{name}` is empty")
    check_finite(rewards, name)


@dataclass(frozen=True)
class Groups:
    """Dense group index of a batch: `dense [B]` in 0..n-1, `sizes [n]`."""

    dense: torch.Tensor
    n: int
    sizes: torch.Tensor

    @staticmethod
    def of(group: torch.Tensor, batch: int) -> "Groups":
        """Groups of raw ids `group [B]` (any integers); checks it has `batch` entries."""
        dense, n = group_index(group, batch)
        return Groups.from_dense(dense, n)

    @staticmethod
    def from_dense(dense: torch.Tensor, n: int) -> "Groups":
        return Groups(dense, n, torch.bincount(dense, minlength=n))

    def _col(self, x: torch.Tensor) -> torch.Tensor:
        """The index broadcast to the shape of `x` (for scatter_reduce)."""
        return self.dense.view(-1, *([1] * (x.dim() - 1))).expand_as(x)

    def rows(self, per_group: torch.Tensor) -> torch.Tensor:
        """[B, ...]: each row's entry of a per-group tensor [n, ...] (index_select: ~2x
        faster than advanced indexing here)."""
        return torch.index_select(per_group, 0, self.dense)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """[n, ...] per-group sums of `x [B, ...]`."""
        return x.new_zeros((self.n, *x.shape[1:])).index_add_(0, self.dense, x)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """[n, ...] per-group means."""
        size = self.sizes.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
        return self.sum(x) / size

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """[n, ...] bool: the group's values are all exactly equal (singletons included)."""
        shape = (self.n, *x.shape[1:])
        hi = x.new_full(shape, -math.inf).scatter_reduce(0, self._col(x), x, "amax")
        lo = x.new_full(shape, math.inf).scatter_reduce(0, self._col(x), x, "amin")
        return hi == lo

    def centre(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x - mean_g x, flat [n, ...]); members of a flat group get exactly 0.

        Computed as y − mean_g y with y = x − max_g x: the same value, and y is exactly 0
        throughout a flat group, so its centred values are exactly 0 without a select.
        Flatness comes free from the same sums: y <= 0, and a sum of non-positive numbers
        is 0 only if every term is, so flat_g is Σ_g y == 0."""
        shape = (self.n, *x.shape[1:])
        hi = x.new_full(shape, -math.inf).scatter_reduce(0, self._col(x), x, "amax")
        y = x - self.rows(hi)
        total = self.sum(y)
        size = self.sizes.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
        return y - self.rows(total / size), total == 0

    def spread(self, c: torch.Tensor, ddof: int) -> torch.Tensor:
        """[n, ...] std of centred values `c` with the given ddof (divisor clamped at 1)."""
        denom = (self.sizes - ddof).clamp(min=1).to(c.dtype).view(-1, *([1] * (c.dim() - 1)))
        return (self.sum(c * c) / denom).sqrt()

    def standardize(self, x: torch.Tensor, ddof: int | None, eps: float) -> torch.Tensor:
        """(x - mean_g)/(std_g + eps), or x - mean_g when ddof is None; flat groups -> 0."""
        c, flat = self.centre(x)
        if ddof is None:
            return c
        # a flat group has c = 0 and std 0: 0 / eps = 0 already, except with eps = 0 (0/0)
        scale = torch.where(flat, torch.ones((), dtype=c.dtype, device=c.device), self.spread(c, ddof) + eps)
        return c / self.rows(scale)

    def positions(self) -> tuple[torch.Tensor, int]:
        """(rank of each row inside its group [B], largest group size), for a padded
        [n, G_max] layout. Rows keep their batch order inside a group."""
        order = torch.argsort(self.dense, stable=True)
        starts = torch.cumsum(self.sizes, 0) - self.sizes
        pos = torch.empty_like(self.dense)
        pos[order] = torch.arange(self.dense.numel(), device=self.dense.device) - starts[self.dense[order]]
        return pos, int(self.sizes.max())

    def refuse_singletons(self, group: torch.Tensor, method: str, why: str) -> None:
        """GroupError naming the raw ids of every group of size 1."""
        if not bool((self.sizes == 1).any()):
            return
        single = self.rows(self.sizes) == 1
        if bool(single.any()):
            ids = torch.unique(group[single]).tolist()
            shown = ids[:10] + (["..."] if len(ids) > 10 else [])
            raise GroupError(f"{method}: group id(s) {shown} have a single sample; {why}")
