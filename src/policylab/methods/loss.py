"""The one loss contract: a method's per-token loss terms from `LossInputs`.

    policy = objective(inputs') × Π detached correction weights + Σ addends
             inputs' = inputs with the ratio denominator replaced by any correction that
             replaces it (SIS: sg(logp) on accepted tokens)
    <term> = each active term (e.g. VAPO's positive-example NLL), on its own mask

Each term is reduced by `policylab.kernels.aggregate.aggregate` with a normalizer computed once
per optimizer step over the term's mask (`term_masks`), so micro-batch splits never
change the update. The trainer, the verl and the TRL adapters all call these two
functions; none of them composes a loss by itself.
"""

from __future__ import annotations

import torch

from policylab.methods.spec import LossInputs, Method

NORM_MODE = "seq_mean_token_sum_norm"


def policy_loss(method: Method, inp: LossInputs) -> tuple[torch.Tensor, dict]:
    """The policy term's loss matrix [B, T] and its detached metrics."""
    weights, metrics = [], {}
    for stage in method.active("correction"):
        w = stage.fn(inp, method.view(stage))
        if w.logp_old is not None:
            inp = inp.replace(logp_old=w.logp_old)
        if w.weight is not None:
            weights.append(w.weight)
        metrics.update({f"correction/{k}": v for k, v in w.metrics.items()})
    obj = method.objective
    loss, m = obj.fn(inp, method.view(obj))
    metrics = {**{f"policy/{k}": v for k, v in m.items()}, **metrics}
    for w in weights:
        loss = loss * (w.unsqueeze(-1) if w.dim() == 1 else w)
    for stage in method.active("addend"):
        add, m = stage.fn(inp, method.view(stage))
        loss = loss + add
        metrics.update(m)
    return loss, metrics


def loss_terms(method: Method, inp: LossInputs) -> tuple[dict[str, torch.Tensor], dict]:
    """Every term's loss matrix by name ("policy" first), and the detached metrics."""
    policy, metrics = policy_loss(method, inp)
    terms = {"policy": policy}
    for stage in method.active("term"):
        mat, m = stage.fn(inp, method.view(stage))
        terms[stage.name] = mat
        metrics.update(m)
    return terms, metrics


def term_masks(method: Method, batch) -> dict[str, tuple[torch.Tensor, str, float | None]]:
    """Each term's (mask, aggregation mode, L_norm) over `batch` (the optimizer batch,
    for normalizers; or a micro-batch, for the numerators)."""
    out = {"policy": (batch.loss_mask, method.aggregation, _L_norm(method, method.aggregation))}
    for stage in method.active("term"):
        mode = stage.term_aggregation
        out[stage.name] = (stage.term_mask(batch, method.view(stage)), mode, _L_norm(method, mode))
    return out


def _L_norm(method: Method, mode: str) -> float | None:
    """Dr. GRPO's constant normalizer: the method's declared `L_norm` (only that mode uses it)."""
    return float(method.p["L_norm"]) if mode == NORM_MODE else None


def tensor_inputs(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *, logp_old: torch.Tensor | None = None,
                  logp_behavior: torch.Tensor | None = None, logp_ref: torch.Tensor | None = None,
                  entropy: torch.Tensor | None = None, group: torch.Tensor | None = None,
                  rewards: torch.Tensor | None = None, outcome: dict | None = None, extras: dict | None = None,
                  policy_version: int = 0, batch_id: str = "tensors") -> LossInputs:
    """`LossInputs` from bare response-aligned tensors ([B, T] log-probs and mask, [B] or
    [B, T] advantages), for callers that hold no `RolloutBatch`: another engine's loss
    hook (verl, TRL), a worked example, a test. `logp_old` None = a single on-policy
    update (π_old = sg(logp)). The batch behind it has a one-column dummy prompt (no
    token ids are read by any loss stage); roles given here are also set on it, so
    corrections find `logp_old` / `logp_behavior` where they look for them."""
    from policylab.batch import RolloutBatch

    B, T = mask.shape
    dev = mask.device
    batch = RolloutBatch(
        tokens=torch.zeros((B, T + 1), dtype=torch.long, device=dev),
        attention_mask=torch.cat([torch.ones((B, 1), dtype=torch.bool, device=dev), mask], dim=1),
        loss_mask=mask, prompt_width=1,
        group=group if group is not None else torch.arange(B, device=dev),
        policy_version=torch.full((B,), int(policy_version), dtype=torch.long, device=dev), batch_id=batch_id,
        logp_old=None if logp_old is None else logp_old.detach(), logp_behavior=logp_behavior, logp_ref=logp_ref,
        rewards=rewards, outcome=dict(outcome or {}), extras=dict(extras or {}),
    ).validate()
    return LossInputs(logp=logp, logp_old=logp.detach() if logp_old is None else logp_old.detach(),
                      logp_behavior=logp_behavior, logp_ref=logp_ref, adv=adv, mask=mask, entropy=entropy, batch=batch)
