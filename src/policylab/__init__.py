"""policylab: role-explicit RL post-training for language models.

For every token in a loss, policylab records which policy sampled it (`logp_behavior`),
which policy it is compared against (`logp_old`, `logp_ref`) and which policy learns
(`logp`). The math lives in small pure functions over tensors:

    from policylab import RolloutBatch
    from policylab import advantages, objectives, corrections, kl, aggregate, methods
"""

from policylab.errors import (
    BatchReuseError,
    GroupError,
    MissingQuantityError,
    NonFiniteError,
    PolicylabError,
    ShapeError,
)

__version__ = "0.1.0"

__all__ = [
    "RolloutBatch",
    "SamplingSettings",
    "PolicylabError",
    "MissingQuantityError",
    "ShapeError",
    "NonFiniteError",
    "GroupError",
    "BatchReuseError",
]


# The batch types and the public API's module names (`from policylab import RolloutBatch,
# advantages, kl, ...`), resolved lazily: `import policylab` alone imports no torch, so a
# command that needs none (the first question of `policylab quiz`) starts at once.
_LAZY = {"RolloutBatch": "policylab.batch", "SamplingSettings": "policylab.batch"}
_PUBLIC_MODULES = {
    "advantages": "policylab.kernels.advantages",
    "objectives": "policylab.kernels.objectives",
    "corrections": "policylab.kernels.corrections",
    "kl": "policylab.kernels.kl",
    "aggregate": "policylab.kernels.aggregate",
    "filters": "policylab.kernels.filters",
    "rewards": "policylab.kernels.rewards",
    "metrics": "policylab.kernels.metrics",
    "logprobs": "policylab.models.logprobs",
    "methods": "policylab.methods",
    "tasks": "policylab.tasks",
}


def __getattr__(name):
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _PUBLIC_MODULES:
        return importlib.import_module(_PUBLIC_MODULES[name])
    if not name.startswith("_"):  # a subpackage (`policylab.batch`), as when the batch was imported eagerly
        import importlib.util

        if importlib.util.find_spec(f"policylab.{name}") is not None:
            return importlib.import_module(f"policylab.{name}")
    raise AttributeError(f"module 'policylab' has no attribute {name!r}")
