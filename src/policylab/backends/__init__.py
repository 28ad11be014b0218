"""The backend seam: what the trainer needs from a rollout engine and from a policy
worker, as two protocols. `policylab.backends.local` is the implementation on this
process (CPU or one device); a distributed engine (vLLM rollouts, FSDP workers) provides
the same two interfaces.

    RolloutBackend   generate(...) -> RolloutBatch with behavior log-probs recorded as sampled,
                     decode(batch), sync_weights(version); optional: greedy(...)
    PolicyWorker     role_logprobs(role, batch), values(batch), optimizer_step(method,
                     minibatch, adv, old_from_same_forward=..., hooks=...), value_step(...);
                     optional: logprobs_at(batch, ids), vocab_stats(batch, kl_to_reference=...)
                     (full-vocabulary entropy and KL to the reference per position, chunked),
                     prompt_logprobs(role, batch), continuation_logprobs(batch, continuations,
                     scored, strip_token=...)

The optional calls are capabilities: a backend lists the ones it has in `capabilities`
(names from `CAPABILITIES`), a stage lists the ones it calls in `Stage.needs`, and a
method whose stages need one the backends lack is refused when the run is built, naming
the stage and the capability (`missing_capabilities`). A stage reaches only the calls it
declared: the context hands it views of the backends (`policylab.methods.context`).

Versions are explicit: the trainer calls `sync_weights(v)` after the weights changed to
version v, and a rollout backend stamps every batch it samples with the version it
sampled at. A backend whose numerics differ from the trainer's (another dtype, kernel or
quantization) says so with `same_numerics_as_trainer = False`; the trainer then always
recomputes π_old instead of reusing the training forward.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from policylab.batch import RolloutBatch, SamplingSettings
from policylab.errors import PolicylabError
from policylab.methods.spec import CAPABILITIES


@runtime_checkable
class RolloutBackend(Protocol):
    engine_name: str
    same_numerics_as_trainer: bool
    capabilities: frozenset

    def generate(self, prompts: list[list[int]], *, group_size: int, sampling: SamplingSettings,
                 max_new_tokens: int, policy_version: int, batch_id: str, group_ids: list[int] | None = None,
                 record_topk: int = 0) -> RolloutBatch: ...

    def greedy(self, prompts: list[list[int]], *, max_new_tokens: int) -> list[list[int]]: ...

    def decode(self, batch: RolloutBatch) -> list[str]: ...

    def sync_weights(self, version: int) -> None: ...


@runtime_checkable
class PolicyWorker(Protocol):
    capabilities: frozenset

    def role_logprobs(self, role: str, batch: RolloutBatch) -> torch.Tensor: ...

    def values(self, batch: RolloutBatch) -> torch.Tensor: ...

    def logprobs_at(self, batch: RolloutBatch, ids: torch.Tensor) -> torch.Tensor: ...

    def vocab_stats(self, batch: RolloutBatch, *, kl_to_reference: bool = False) -> dict[str, torch.Tensor]: ...

    def prompt_logprobs(self, role: str, batch: RolloutBatch) -> torch.Tensor: ...

    def continuation_logprobs(self, batch: RolloutBatch, continuations: list[list[int]], scored: list[int], *,
                              strip_token: int | None = None) -> torch.Tensor: ...

    def optimizer_step(self, method, minibatch: RolloutBatch, adv: torch.Tensor, *,
                       old_from_same_forward: bool, hooks=None) -> dict: ...

    def value_step(self, batch: RolloutBatch, returns: torch.Tensor, *, clip_eps: float | None) -> dict: ...


def missing_capabilities(method, available) -> list[str]:
    """'stage needs capability' for every active stage of `method` that calls an optional
    backend call not in `available` (empty: the method runs on these backends)."""
    return [f"stage `{s.name}` needs `{c}`" for s in method.stages() if s.is_active(method.p)
            for c in s.needs if c not in available]


def require_capabilities(method, available, backend_name: str) -> None:
    missing = missing_capabilities(method, available)
    if missing:
        raise PolicylabError(f"method `{method.name}` cannot run on {backend_name}: " + "; ".join(missing)
                             + f" (it offers {', '.join(sorted(available)) or 'no optional call'})")


__all__ = ["CAPABILITIES", "PolicyWorker", "RolloutBackend", "missing_capabilities", "require_capabilities"]
