"""Rollout engines: sample responses and record the behavior log-probs (`logp_behavior`).

    HFEngine   HF `generate` (default; exact on CPU; optional bf16 autocast)

Imported lazily so that `import policylab.engines` does not pull in transformers.
"""

__all__ = ["HFEngine"]


def __getattr__(name):
    if name == "HFEngine":
        from .hf import HFEngine

        return HFEngine
    raise AttributeError(f"module 'policylab.engines' has no attribute {name!r}")
