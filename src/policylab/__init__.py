"""policylab: role-explicit RL post-training for language models.

For every token in a loss, policylab records which policy sampled it (`logp_behavior`),
which policy it is compared against (`logp_old`, `logp_ref`) and which policy learns
(`logp`). The math lives in small pure functions over tensors:

    from policylab import RolloutBatch
    from policylab import advantages, objectives, corrections, kl, aggregate, methods
"""

from .batch import RolloutBatch, SamplingSettings
from .errors import (
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


def __getattr__(name):  # lazy submodules: `policylab.advantages` etc. need only torch
    import importlib

    if name in {"advantages", "objectives", "corrections", "kl", "aggregate", "methods",
                "logprobs", "rewards", "filters", "tasks", "metrics"}:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'policylab' has no attribute {name!r}")
