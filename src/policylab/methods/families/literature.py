"""Literature-only entries: methods policylab records on a card but does not implement,
because what they need does not exist on this library's models or machine. Each is a
`Card` in `registry.LITERATURE`; `methods.get(name)`, a run config naming it, and every
other execution path raise `LiteratureOnlyError` quoting the card, so no run, metric or
log line can ever carry its id.
"""

from __future__ import annotations

from policylab.methods.registry import register_literature
from policylab.methods.spec import Card

register_literature("orl", Card(
    title="On-Policy Residual Learning for Diffusion Language Models", arxiv="",
    family="pipeline (literature-only entry)",
    samples="a diffusion language model's own earlier denoising predictions (online residual-context collection)",
    learns="the diffusion language model, on residual contexts replayed exactly",
    reference="none recorded",
    summary="train a diffusion LM on the residual contexts its own denoising predictions induce: online collection, "
            "exact replay, entropy contraction",
    not_established="everything: policylab trains autoregressive policies; it has no diffusion language model, no "
                    "denoising trajectory and no residual-trace collection or replay. A generic diffusion loss, an "
                    "output-smoothing step or this registry key would not implement the method",
    unconfirmed=("arXiv id (not found)", "every detail of the objective: nothing is implemented"),
    confirmed="",
))
