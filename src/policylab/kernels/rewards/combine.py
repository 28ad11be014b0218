"""Combine several reward functions into one scalar reward per sample.

A reward function follows `RewardFn`: it scores a whole batch and returns one value per
sample, a float or None. None means "not applicable to this sample" (e.g. a code-test
reward on a math prompt); it is neither 0 nor a failure.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, Callable, Protocol, Sequence

import torch

from policylab.errors import MissingQuantityError, NonFiniteError, ShapeError


class RewardFn(Protocol):
    """`fn(completions [B], answers [B], **context) -> [B]` of float | None.

    `context` holds optional per-sample lists the caller has (`prompts`, `metas`, ...);
    every reward function must accept (and may ignore) unknown keywords. It must not
    mutate its inputs; on failure it may be called again on single samples (see
    `combine_rewards`), so side effects should be idempotent.
    """

    def __call__(self, completions: list[str], answers: list[Any], **context: Any) -> Sequence[float | None]: ...


class RewardFnError(RuntimeError):
    """A reward function raised. The message names the function, the sample and its prompt."""


def _show(prompts: Sequence[str] | None, i: int) -> str:
    if prompts is None:
        return "prompt not given"
    text = str(prompts[i])
    return f"prompt {text[:200]!r}" + ("..." if len(text) > 200 else "")


def _call(name: str, fn: Callable, completions: list, answers: list, ctx: dict, prompts) -> Sequence:
    """Run `fn` on the batch; if it raises, find the first sample that raises on its own."""
    try:
        return fn(completions, answers, **ctx)
    except Exception as batch_exc:
        for i in range(len(completions)):
            single = {k: v[i : i + 1] for k, v in ctx.items()}
            try:
                fn(completions[i : i + 1], answers[i : i + 1], **single)
            except Exception as exc:
                raise RewardFnError(
                    f"reward function {name!r} raised on sample {i} ({_show(prompts, i)}): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        raise RewardFnError(
            f"reward function {name!r} raised on the batch of {len(completions)} samples but on "
            f"no single sample alone: {type(batch_exc).__name__}: {batch_exc}"
        ) from batch_exc


def _values(name: str, out: Any, n: int, prompts) -> list[float | None]:
    """Check one function's output: n entries, each None or a finite real number."""
    if hasattr(out, "tolist"):  # a tensor or numpy array; NaN stays NaN and is refused below
        out = out.tolist()
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence) or len(out) != n:
        got = f"{len(out)} values" if isinstance(out, Sequence) else type(out).__name__
        raise ShapeError(f"reward function {name!r} must return {n} values (one per sample), got {got}")
    values = []
    for i, v in enumerate(out):
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if v is not None and not isinstance(v, Real):
            raise TypeError(
                f"reward function {name!r} returned {type(v).__name__} {v!r} for sample {i} "
                f"({_show(prompts, i)}); expected a float or None"
            )
        if v is not None and not math.isfinite(v):
            raise NonFiniteError(
                f"reward function {name!r} returned {v} for sample {i} ({_show(prompts, i)}); "
                "return None for 'not applicable', never NaN"
            )
        values.append(None if v is None else float(v))
    return values


def combine_rewards(
    fns: Sequence[tuple[str, RewardFn, float]],
    completions: Sequence[str],
    answers: Sequence[Any],
    *,
    prompts: Sequence[str] | None = None,
    context: dict[str, Sequence[Any]] | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted total reward `[B]` and each function's rewards `[B]`.

        A_i   = {f : r_f,i is not None}          (functions applicable to sample i)
        total_i = (Σ_f |w_f| / Σ_{f∈A_i} |w_f|) · Σ_{f∈A_i} w_f r_f,i

    i.e. the weights are renormalized over the applicable functions, so a sample keeps the
    scale it would have if every function applied (with all applicable, total_i is the
    plain weighted sum Σ_f w_f r_f,i). Example: weights correct = 1.0, format = 0.5;
    format not applicable on sample i -> total_i = 1.5 · r_correct,i. If the applicable
    functions all have weight 0, total_i = 0. A sample no function applies to raises
    (MissingQuantityError): it has no reward, and 0 would be a made-up one.

    Args:
        fns: (name, fn, weight) triples; names unique; weights finite (may be 0 or < 0).
        completions, answers: `[B]` each.
        prompts: `[B]`, optional; passed to every function as `prompts=` and quoted in errors.
        context: other per-sample lists passed to every function by keyword (e.g.
            `{"metas": [ex.meta for ex in batch]}` for the reasoning-gym scorer).
        dtype: of the returned tensors (default: torch's default dtype).

    Returns:
        total `[B]`, and per_fn {name: `[B]`} with NaN where that function returned None, so
        `torch.nanmean(per_fn[name])` is its mean over the samples it applies to. Only
        `total` is meant for advantages; per_fn is for logging.

    Raises:
        RewardFnError (a function raised; names function, sample index and prompt, chained
        to the original exception), NonFiniteError (NaN/inf reward: names function and
        sample; never zero-filled), ShapeError / TypeError (wrong output length or type).
    """
    n = len(completions)
    dtype = dtype or torch.get_default_dtype()
    if len(answers) != n:
        raise ShapeError(f"`completions` has {n} entries but `answers` has {len(answers)}")
    ctx = dict(context or {})
    if prompts is not None:
        ctx["prompts"] = prompts
    for key, value in ctx.items():
        if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != n:
            raise ShapeError(f"context `{key}` must be a list with one entry per sample ({n})")
    ctx = {k: list(v) for k, v in ctx.items()}
    if not fns:
        raise ShapeError("`fns` is empty: there is no reward function to combine")
    names = [f[0] for f in fns]
    if len(set(names)) != len(names):
        raise ShapeError(f"reward function names must be unique, got {names}")
    for name, _, weight in fns:
        if isinstance(weight, bool) or not isinstance(weight, Real) or not math.isfinite(weight):
            raise NonFiniteError(f"weight of reward function {name!r} must be a finite number, got {weight!r}")

    per_fn: dict[str, torch.Tensor] = {}
    for name, fn, _ in fns:
        out = _call(name, fn, list(completions), list(answers), ctx, prompts)
        values = _values(name, out, n, prompts)
        per_fn[name] = torch.tensor([math.nan if v is None else v for v in values], dtype=dtype)

    rewards = torch.stack([per_fn[name] for name in names])  # [F, B]
    applicable = ~torch.isnan(rewards)
    missing = (~applicable.any(0)).nonzero()
    if missing.numel():
        i = int(missing[0])
        raise MissingQuantityError(
            "combine_rewards", f"a reward for sample {i} ({_show(prompts, i)})",
            f"None of {names} applies to it ({missing.numel()} such sample(s)); add a reward "
            "function that scores these samples or leave them out of the batch.",
        )
    weights = torch.tensor([float(f[2]) for f in fns], dtype=dtype).unsqueeze(1)  # [F, 1]
    weighted = torch.where(applicable, weights * rewards, torch.zeros_like(rewards)).sum(0)
    applicable_mass = torch.where(applicable, weights.abs(), torch.zeros_like(rewards)).sum(0)
    scale = weights.abs().sum() / applicable_mass.clamp_min(torch.finfo(dtype).tiny)
    total = torch.where(applicable_mass > 0, scale * weighted, torch.zeros_like(weighted))
    return total, per_fn
