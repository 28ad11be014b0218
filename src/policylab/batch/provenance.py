"""Provenance of a batch's rows: the kinds of producer a row can come from, the learner's
producer id, and how to produce each role's log-probs when a method needs them (the
messages of `RolloutBatch.require`)."""

from __future__ import annotations

from policylab.errors import PolicylabError


SOURCE_KINDS = ("native", "demonstration", "gold", "guided", "expert", "peer", "external", "hinted", "perturbed")


LEARNER = "policy"  # the producer id of the learner's own weights


class ProvenanceError(PolicylabError):
    """A source label that is not a known kind, a producer that does not fit its source,
    or an attempt to rewrite the provenance of collected sequences (in particular to
    relabel a non-native sequence as native)."""


def source_kind(label: str) -> str:
    """The kind of a source label: "peer:<model>" -> "peer"; refuses unknown labels."""
    if not isinstance(label, str):
        raise ProvenanceError(f"a source label must be a string, got {type(label).__name__}")
    kind, sep, model = label.partition(":")
    if kind == "peer":
        if not sep or not model:
            raise ProvenanceError(f"source {label!r}: a peer source names its model, e.g. 'peer:checkpoint-7'")
        return "peer"
    if sep or kind not in SOURCE_KINDS:
        kinds = ", ".join("peer:<model>" if k == "peer" else k for k in SOURCE_KINDS)
        raise ProvenanceError(f"unknown source {label!r}; sources are {kinds}")
    return kind


# How to produce each optional quantity, quoted by MissingQuantityError.
HOW_TO_PRODUCE = {
    "logp_behavior": "Record it in the rollout engine at sampling time (policylab.engines.hf "
    "does, under the sampler's temperature/top-k/top-p); it cannot be rebuilt later unless "
    "the exact behavior engine and weights are kept.",
    "logp_old": "Recompute it with the training forward at the sampling weights "
    "(policylab.models.logprobs.token_logprobs) before the first update; never pass `logp` or "
    "`logp_behavior` in its place.",
    "logp_ref": "Run the reference model's forward over the batch (the trainer loads a "
    "reference model when a KL term is configured).",
    "logp_current": "Run the learner's forward (no grad) at the start of the update round; "
    "the trainer does so for methods that declare it.",
    "values": "Run the critic over the batch at rollout time (methods `ppo` and `vapo` "
    "train a value head).",
    "rewards": "Score the responses with a reward function (policylab.kernels.rewards).",
    "token_rewards": "Build per-token rewards, e.g. the outcome reward at the last valid "
    "token plus any per-token KL shaping.",
    "reward_vectors": "Score each response with D reward functions and stack them [B, D].",
    "reward_intervals": "Have the judge emit a [low, high] interval per response.",
    "greedy_rewards": "Decode each prompt greedily with the current weights and score it "
    "with the same reward function (ReMax).",
}
