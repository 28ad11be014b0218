"""How the behavior engine turned logits into the sampled token."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingSettings:
    """How the behavior engine turned logits into the sampled token.

    Log-probs used in ratios must be computed under the same transform (logits / T,
    then renormalized over the top-k / top-p kept set)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k truncation
    # () = the whole vocabulary; otherwise the only token ids the sampler may emit (a menu of
    # single-token labels): logits outside it are -inf before the softmax, in the engines and
    # in every log-prob computed for the batch (`policylab.models.logprobs.restrict_to`)
    allowed_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(
                f"temperature must be > 0, got {self.temperature} (greedy decoding is not a "
                "distribution; use do_sample=False in the engine and no logprob ratios)"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        ids = self.allowed_ids
        if not isinstance(ids, tuple) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise ValueError(f"allowed_ids must be a tuple of token ids >= 0 (() = no restriction), got {ids!r}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"allowed_ids lists a token id twice: {ids}")
        if len(ids) == 1:
            raise ValueError(f"allowed_ids {ids} leaves one token: that is not a distribution to sample from")
        if ids and (self.top_k > 0 or self.top_p < 1.0):
            raise ValueError("allowed_ids (a menu restriction) cannot be combined with top_k / top_p truncation: "
                             "set top_k=0 and top_p=1.0")
