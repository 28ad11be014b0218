"""`RolloutBatch`: one batch of sampled sequences with the provenance of every token.

Layout (B sequences, L = P + T positions):

    tokens          [B, L]  long   left-padded prompt (P columns) then the response (T columns)
    attention_mask  [B, L]  bool   True = a real token (prompt or response), False = padding
    loss_mask       [B, T]  bool   True = this response position counts in every loss,
                                   reduction and statistic; the one combined mask
    response positions are tokens[:, P:], P = `prompt_width`

Every `[B, T]` tensor is aligned with the response columns: entry (i, t) is about the
token tokens[i, P + t]. Log-probs are stored by role (docs/conventions.md rule 1):

    logp_behavior   the distribution that actually emitted the token (rollout engine)
    logp_old        the training-side policy at the sampling weights
    logp_ref        the KL anchor
    logp_current    the learner at the start of the update round (detached; for weights
                    that are frozen for the round, e.g. GMC, SIS, GGPO)

A method names the fields it needs (`require`); a batch without one is refused with a
`MissingQuantityError` that says how to produce it. Nothing is ever zero-filled.

Provenance (docs/conventions.md rule 9). Every sequence carries

    source          what kind of producer wrote it: native (the learner's own rollout engine
                    on the deployment prompt), demonstration, gold, guided (an expert prefix
                    continued by the learner), expert, peer:<model>, external, hinted (the
                    learner conditioned on a privileged hint), perturbed (a copy of a learner
                    reply re-scored under a perturbed context, e.g. TASCO's prefix copies: the
                    tokens and their behavior log-probs are the clean reply's)
    producer        the identity of what produced it: "policy" (the learner's weights at
                    `policy_version`), "solver:<task>" (a task's own solver), a peer or
                    external model's identity, "policy+solver:<task>" for guided rows
    behavior_mask   [B, T] bool (None: everywhere): True where `logp_behavior` is the
                    log-prob of the distribution that emitted the token. A deterministic
                    producer (a solver writing its solution) emits its text with probability
                    1, so its rows hold log-prob 0.0 there, exactly. Where the mask is False
                    (a peer whose tokenization differs from the learner's) the value is a
                    0.0 placeholder that `require("logp_behavior")` refuses to hand out.

A native row is produced by "policy" and has a recorded behavior log-prob. Provenance is
never rewritten: `replace` refuses any change of a row's source except native -> another
kind (a sequence that turned out not to come from the deployment context), and no path of
this module turns a non-native row into a native one (`ProvenanceError`).
"""

from policylab.batch.provenance import HOW_TO_PRODUCE, LEARNER, SOURCE_KINDS, ProvenanceError, source_kind
from policylab.batch.rollout import BT_FIELDS, RolloutBatch, concat_batches
from policylab.batch.sampling import SamplingSettings

__all__ = ["BT_FIELDS", "HOW_TO_PRODUCE", "LEARNER", "SOURCE_KINDS", "ProvenanceError", "RolloutBatch",
           "SamplingSettings", "concat_batches", "source_kind"]
