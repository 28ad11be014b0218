"""Fixed-budget coverage and the sharpening tax: what post-training costs in pass@K.

Paper: "Sharpening Tax in Post-Training" (the arXiv id and the published form of its
temperature policy could not be checked).

    pass@K(task) = 1 − C(n − c, K) / C(n, K)     (unbiased, n >= K; `metrics.pass_at_k`)
    cov_K        = mean over tasks of pass@K
    Tax_K        = cov_K(base) − cov_K(post)      (signed: > 0 means coverage was lost)

Both models are measured on the same tasks with the same K (anything else is refused);
each may have its own n per task (n >= K). The sign is never dropped: a negative tax is a
coverage gain. The difficulty-conditioned temperature T(x) = h(p̂(x)) of the paper is
`difficulty_temperature`, with h a required argument (its published form is unconfirmed).
Evaluation only: nothing here feeds a reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.metrics import as_counts, pass_at_k


@dataclass(frozen=True)
class Coverage:
    """pass@k of each task (float64 `[N]`, in `task_ids` order) and its mean."""

    k: int
    task_ids: tuple
    n: torch.Tensor
    c: torch.Tensor
    per_task: torch.Tensor

    @property
    def value(self) -> float:
        return float(self.per_task.mean())


def pool_counts(task_ids: Sequence, n, c) -> tuple[tuple, torch.Tensor, torch.Tensor]:
    """Merge repeated task ids (e.g. an evaluation that cycles through its problems):
    their samples are independent draws of the same task, so n and c add up. Ids keep the
    order of their first appearance."""
    n_t, c_t = torch.broadcast_tensors(as_counts(n, "n"), as_counts(c, "c"))
    if n_t.dim() != 1 or len(task_ids) != n_t.shape[0]:
        raise ShapeError(f"{len(task_ids)} task ids for counts of shape {tuple(n_t.shape)}")
    order: dict = {}
    for t in task_ids:
        order.setdefault(t, len(order))
    idx = torch.tensor([order[t] for t in task_ids], dtype=torch.long)
    pn = torch.zeros(len(order), dtype=torch.int64).index_add_(0, idx, n_t)
    pc = torch.zeros(len(order), dtype=torch.int64).index_add_(0, idx, c_t)
    return tuple(order), pn, pc


def coverage_at_k(task_ids: Sequence, n, c, k: int) -> Coverage:
    """Coverage of distinct tasks at budget k (repeated ids raise: pool them first)."""
    ids = tuple(task_ids)
    if not ids:
        raise ShapeError("no tasks: coverage is undefined")
    if len(set(ids)) != len(ids):
        raise PolicylabError("task ids repeat: merge repeated tasks with `pool_counts` first")
    n_t, c_t = torch.broadcast_tensors(as_counts(n, "n"), as_counts(c, "c"))
    if n_t.shape != (len(ids),):
        raise ShapeError(f"{len(ids)} task ids for counts of shape {tuple(n_t.shape)}")
    return Coverage(k, ids, n_t, c_t, pass_at_k(n_t, c_t, k))


def sharpening_tax(base: Coverage, post: Coverage) -> dict:
    """Tax_K = cov_K(base) − cov_K(post), signed, over identical task sets and K.

    Returns a dict: k, tasks, cov_base, cov_post, tax, and the per-task view: tasks_lost
    (pass@K lower after post-training), tasks_gained (higher), tasks_never (0 for both).
    Different K, or task sets that differ, raise."""
    if base.k != post.k:
        raise PolicylabError(f"the two models were measured at different K ({base.k} vs {post.k}): the tax "
                             "compares coverage at one fixed budget")
    if set(base.task_ids) != set(post.task_ids):
        only_b = sorted(map(str, set(base.task_ids) - set(post.task_ids)))[:3]
        only_p = sorted(map(str, set(post.task_ids) - set(base.task_ids)))[:3]
        raise PolicylabError(f"the two models were measured on different tasks (only base: {only_b}, only post: "
                             f"{only_p}): the tax needs identical tasks")
    where = {t: i for i, t in enumerate(post.task_ids)}
    p_post = post.per_task[torch.tensor([where[t] for t in base.task_ids], dtype=torch.long)]
    p_base = base.per_task
    return {
        "k": base.k, "tasks": len(base.task_ids),
        "cov_base": float(p_base.mean()), "cov_post": float(p_post.mean()),
        "tax": float(p_base.mean() - p_post.mean()),
        "tasks_lost": int((p_post < p_base).sum()), "tasks_gained": int((p_post > p_base).sum()),
        "tasks_never": int(((p_base == 0) & (p_post == 0)).sum()),
    }


def difficulty_temperature(p_hat: torch.Tensor, *, h: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Per-task sampling temperature T(x) = h(p̂(x)) from a difficulty estimate p̂ in [0, 1]
    (e.g. a pilot pass@1). `h` has no default: the paper's form is unconfirmed. The result
    must be finite and > 0 (raises otherwise)."""
    p = torch.as_tensor(p_hat, dtype=torch.float64)
    if bool(((p < 0) | (p > 1) | ~torch.isfinite(p)).any()):
        raise PolicylabError("`p_hat` must lie in [0, 1]")
    t = torch.as_tensor(h(p), dtype=torch.float64)
    if t.shape != p.shape or bool((~torch.isfinite(t) | (t <= 0)).any()):
        raise PolicylabError("h(p_hat) must return a finite temperature > 0 per task, of p_hat's shape")
    return t
