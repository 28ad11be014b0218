"""Kernels: the math of every method as pure functions over tensors.

No model, optimizer, configuration object or distributed call enters a kernel: tensors
(and plain scalars) in, tensors and a dict of detached diagnostics out. Grouped by kind:

    advantages/   advantage estimators ([B] or [B, T], detached)
    objectives/   per-token loss matrices [B, T] of the learner's log-probs
    corrections/  detached importance weights between roles (engine mismatch, staleness)
    rewards/      verifiers, shaping, self-labels and scoring rules over reply text
    geometry/     gradient and weight operations between backward and the optimizer step
    testtime/     label-free test-time adaptation objectives
    mixed.py      learning from tokens another policy produced (demonstrations, peers)
    kl.py         KL estimators between the learner and the reference
    aggregate.py  loss matrix -> scalar with an explicit, caller-owned normalizer
    filters.py    which groups carry a learning signal
    metrics.py    pass@k, calibration error, Brier score
    checks.py     the input checks every kernel shares

Layering: kernels import only `policylab.errors`, `policylab.batch` and each other.
"""
