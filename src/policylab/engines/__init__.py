"""Rollout engines: sample responses and record the behavior log-probs (`logp_behavior`).

    HFEngine    HF `generate` (any causal LM; exact on CPU; optional bf16 autocast)
    FastEngine  its own decode loop for Llama-architecture models (same contract, ~1.5x
                the tokens/s of HFEngine here; optional bf16 weight copy)

Imported lazily so that `import policylab.engines` does not pull in transformers.
"""

__all__ = ["FastEngine", "HFEngine"]


def __getattr__(name):
    if name == "HFEngine":
        from policylab.engines.hf import HFEngine

        return HFEngine
    if name == "FastEngine":
        from policylab.engines.fast import FastEngine

        return FastEngine
    raise AttributeError(f"module 'policylab.engines' has no attribute {name!r}")
