"""Critic for value-based methods (ppo, vapo): a value head on a copy of the policy's
backbone. V(s_t) is read at the position whose hidden state predicts response token t,
i.e. the state before that token is emitted."""

from __future__ import annotations

import copy

import torch

from policylab.batch import RolloutBatch


def _positions(attention_mask: torch.Tensor) -> torch.Tensor:
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


class ValueModel(torch.nn.Module):
    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.backbone = copy.deepcopy(policy.get_decoder())
        hidden = policy.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.head.to(next(self.backbone.parameters()).dtype)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> torch.Tensor:
        """[B, T] values of the states before each response token."""
        out = self.backbone(
            input_ids=tokens, attention_mask=attention_mask.long(), position_ids=_positions(attention_mask)
        )
        h = out.last_hidden_state[:, prompt_width - 1 : tokens.shape[1] - 1]
        return self.head(h).squeeze(-1).float()

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        with torch.no_grad():
            return self.forward(batch.tokens, batch.attention_mask, batch.prompt_width)


def value_step(critic: ValueModel, optimizer, batch: RolloutBatch, returns: torch.Tensor, *,
               clip_eps: float | None, micro_batch_size: int, grad_clip: float) -> dict[str, float]:
    """One critic optimizer step on the clipped value loss, token-mean over the batch
    (normalizer computed once over the whole batch)."""
    from policylab.kernels.advantages import value_loss

    batch.require("critic", "values")
    n = float(batch.loss_mask.sum())
    if n == 0:
        return {"value/skipped_no_signal": 1.0}
    optimizer.zero_grad(set_to_none=True)
    total, clipfrac = 0.0, 0.0
    for idx in torch.arange(batch.size).split(micro_batch_size):
        mb = batch.select(idx)
        v = critic(mb.tokens, mb.attention_mask, mb.prompt_width)
        loss_mat, metrics = value_loss(v, mb.values, returns[idx], mb.loss_mask, clip_eps=clip_eps)
        loss = torch.where(mb.loss_mask, loss_mat, torch.zeros((), dtype=loss_mat.dtype)).sum() / n
        loss.backward()
        total += float(loss.detach())
        w = float(mb.loss_mask.sum()) / n
        clipfrac += w * float(metrics.get("value/clip_frac", metrics.get("clip_frac", 0.0)))
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(critic.parameters(), grad_clip)
    optimizer.step()
    return {"value/loss": total, "value/clip_frac": clipfrac}
