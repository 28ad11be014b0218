"""policylab.engines.hf: HFEngine sampling, behavior log-probs, masks, RNG."""

from __future__ import annotations

import pytest
import torch

from policylab import SamplingSettings
from policylab.engines import HFEngine
from policylab.errors import ShapeError
from policylab.models.logprobs import model_logprobs

EOS = 2  # SmolLM2: <|im_end|> is both eos and pad
PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 300], [1, 40, 41, 42]]


def sharpen(model, factor=20.0):
    """Scale the final norm so logits have a std of ~3 instead of ~0.15: the random
    model then has a peaked distribution (entropy ~2 nats, top-p 0.9 keeps a few
    hundred tokens), so top-k / top-p cut where it matters."""
    with torch.no_grad():
        model.model.norm.weight.mul_(factor)
    return model


def eos_prone(model, alpha=0.8):
    """Make <|im_end|> likely (p ~ 0.1-0.5 per step): every token embedding gets a shared
    offset along dimension 0, and the (tied) eos row an extra alpha times it, so the eos
    logit rises with the shared component of the final hidden state."""
    sharpen(model)
    with torch.no_grad():
        E = model.model.embed_tokens.weight
        E[:, 0] += 0.2
        E[EOS, 0] += alpha * 0.2
    return model


def sample(engine, sampling, seed=0, G=3, max_new_tokens=8, **kw):
    return engine.generate(PROMPTS, group_size=G, sampling=sampling, max_new_tokens=max_new_tokens,
                           policy_version=7, batch_id="b0", seed=seed, **kw)


def test_bf16_autocast_engine(tiny_model, tokenizer):
    model = sharpen(tiny_model)
    s = SamplingSettings(temperature=1.0)
    engine = HFEngine(model, tokenizer, autocast_dtype=torch.bfloat16)
    batch = sample(engine, s)
    assert engine.engine_name == batch.engine == "hf-bf16"
    with torch.no_grad():
        lp = model_logprobs(model, batch.tokens, batch.attention_mask, batch.prompt_width, sampling=s)
    diff = (batch.logp_behavior - lp)[batch.loss_mask].abs()
    assert 0 < diff.max() < 1.0  # a different behavior engine, but the same model


def test_bad_inputs(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    s = SamplingSettings()
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1], []], group_size=2, sampling=s, max_new_tokens=2, policy_version=0, batch_id="x")
    with pytest.raises(ValueError, match="`prompts` is empty"):
        engine.generate([], group_size=2, sampling=s, max_new_tokens=2, policy_version=0, batch_id="x")
    with pytest.raises(ShapeError, match="group_ids"):
        engine.generate([[1]], group_size=2, sampling=s, max_new_tokens=2, policy_version=0, batch_id="x",
                        group_ids=[1, 2])
    with pytest.raises(ValueError, match="group_size"):
        engine.generate([[1]], group_size=0, sampling=s, max_new_tokens=2, policy_version=0, batch_id="x")
    with pytest.raises(TypeError, match="SamplingSettings"):
        engine.generate([[1]], group_size=1, sampling=dict(temperature=1.0), max_new_tokens=2,
                        policy_version=0, batch_id="x")


def test_tokenizer_without_pad_token_is_refused(tiny_model, tokenizer):
    class NoPad:
        pad_token_id = None
        eos_token_id = EOS

    with pytest.raises(ValueError, match="no pad token.*tokenizer.pad_token = tokenizer.eos_token"):
        HFEngine(tiny_model, NoPad())
