"""The stages many methods share, one module per kind (sources, rewards, filters, rounds,
advantages, losses, provenance metrics). A stage only one family uses lives in that
family's module (`policylab.methods.families`), beside its registration.

Each stage is a small function plus a `Stage` object that says what it reads, writes,
which parameters it takes and which optional backend calls it needs. Signatures by kind:

    model       fn(model, setup_ctx) -> model      (once, before the optimizer is built)
    source      fn(n_prompts, ctx) -> Sampled
    reward      fn(sampled, ctx) -> (changes: dict of batch fields, info)
    filter      fn(batch, ctx) -> (keep [B] bool, info)
    round       fn(batch, ctx) -> (changes, info)
    advantage   fn(batch, ctx) -> Advantages
    objective   fn(inputs: LossInputs, p) -> (loss [B, T], metrics)
    correction  fn(inputs, p) -> Weighting
    addend      fn(inputs, p) -> (loss [B, T] added to the policy term, metrics)
    term        fn(inputs, p) -> (loss [B, T], metrics), aggregated on its own mask
    grad        fn(model, ctx) -> metrics          (gradients in .grad, before the step)
    poststep    fn(model, ctx) -> metrics          (right after every optimizer step)
    after       fn(batch, ctx) -> info

`changes` may hold `outcome` and `extras` dicts: they are merged into the batch's, never
replace them. A stage that writes a field it did not declare is refused.
"""

from policylab.methods.stages import advantages, filters, losses, rewards, rounds, sources  # noqa: F401
