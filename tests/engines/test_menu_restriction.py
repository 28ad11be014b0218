"""A menu restriction (`SamplingSettings.allowed_ids`): both engines sample only menu ids,
and the log-probs the trainer computes for the batch equal what the engine sampled from
(docs/conventions.md rule 9), through every log-prob path (full forward, response-only
head, shared prefix, the candidate-id path)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from policylab import SamplingSettings
from policylab.engines.fast import FastEngine
from policylab.engines.hf import HFEngine
from policylab.errors import NonFiniteError, ShapeError
from policylab.models.logprobs import model_logprobs, restrict_to, token_logprobs
from policylab.models.vocab import model_logprobs_at
from policylab.models.prefix import shared_prefix_or_none

MENU = (32, 33, 34, 35)  # four arbitrary ids of the tiny model's vocabulary
PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 300], [1, 40, 41, 42]]


def _engine(kind, model, tokenizer):
    return FastEngine(model, tokenizer) if kind == "fast" else HFEngine(model, tokenizer)


@pytest.mark.parametrize("kind", ["fast", "hf"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engines_sample_only_menu_ids_and_log_probs_match_the_trainer(kind, temperature, tiny_model, tokenizer):
    s = SamplingSettings(temperature=temperature, allowed_ids=MENU)
    eng = _engine(kind, tiny_model, tokenizer)
    b = eng.generate(PROMPTS, group_size=4, sampling=s, max_new_tokens=3, policy_version=0, batch_id="m", seed=1)
    assert bool(torch.isin(b.response_tokens[b.loss_mask], torch.tensor(MENU)).all())
    with torch.no_grad():
        lp = model_logprobs(tiny_model, b.tokens, b.attention_mask, b.prompt_width, sampling=b.sampling,
                            mask=b.loss_mask)
        lp_full = model_logprobs(tiny_model, b.tokens, b.attention_mask, b.prompt_width, sampling=b.sampling,
                                 mask=b.loss_mask, response_only_logits=False)
    assert_close(lp, b.logp_behavior, rtol=1e-5, atol=1e-5)
    assert_close(lp_full, b.logp_behavior, rtol=1e-5, atol=1e-5)
    # over a menu of 4 the sampled label has probability >= that of a uniform draw sometimes,
    # and never the unrestricted (49k-way) tiny value: log-probs are of the menu distribution
    assert float(b.logp_behavior[b.loss_mask].min()) > -4.0


def test_shared_prefix_and_candidate_paths_use_the_same_menu(tiny_model, tokenizer):
    s = SamplingSettings(allowed_ids=MENU)
    b = FastEngine(tiny_model, tokenizer).generate([PROMPTS[0]], group_size=4, sampling=s, max_new_tokens=2,
                                                   policy_version=0, batch_id="m", seed=2)
    with torch.no_grad():
        prefix = shared_prefix_or_none(tiny_model, b.tokens, b.attention_mask, b.prompt_width)
        assert prefix is not None
        lp = prefix.logprobs(tiny_model, torch.arange(b.size), b.tokens, b.attention_mask, sampling=s)
    assert_close(torch.where(b.loss_mask, lp, 0.0), b.logp_behavior, rtol=1e-5, atol=1e-5)
    ids = torch.tensor(MENU).expand(b.size, b.loss_mask.shape[1], len(MENU)).contiguous()
    at = model_logprobs_at(tiny_model, b.tokens, b.attention_mask, b.prompt_width, ids, sampling=s)
    # the menu's log-probs sum to probability 1 at every position, and the sampled one matches
    assert_close(at.exp().sum(-1), torch.ones(at.shape[:2]), rtol=1e-5, atol=1e-5)
    chosen = (ids == b.response_tokens.unsqueeze(-1)).float().argmax(-1, keepdim=True)
    assert_close(torch.where(b.loss_mask, at.gather(-1, chosen).squeeze(-1), 0.0), b.logp_behavior,
                 rtol=1e-5, atol=1e-5)


def test_restriction_is_a_renormalized_softmax_over_the_menu():
    # logits [1, 1, 6], menu {1, 4}: z_1 = 2, z_4 = 0 -> p = e^2/(e^2 + 1) = 0.8808, 0.1192
    z = torch.tensor([[[5.0, 2.0, 9.0, -1.0, 0.0, 3.0]]])
    lp = token_logprobs(z, torch.tensor([[1]]), allowed_ids=(1, 4))
    assert_close(lp.exp(), torch.tensor([[0.8808]]), atol=1e-4, rtol=0)
    assert torch.isinf(restrict_to(z, (1, 4))[0, 0, [0, 2, 3, 5]]).all()
    with pytest.raises(NonFiniteError, match="outside the sampler's kept set.*allowed_ids=\\(1, 4\\)"):
        token_logprobs(z, torch.tensor([[2]]), allowed_ids=(1, 4))
    with pytest.raises(ShapeError, match="outside the vocabulary"):
        restrict_to(z, (1, 6))


@pytest.mark.parametrize("kw, match", [
    ({"allowed_ids": (3, 3)}, "twice"),
    ({"allowed_ids": (3,)}, "one token"),
    ({"allowed_ids": [3, 4]}, "tuple"),
    ({"allowed_ids": (3, 4), "top_k": 2}, "cannot be combined with top_k"),
    ({"allowed_ids": (3, 4), "top_p": 0.9}, "cannot be combined"),
])
def test_bad_menu_settings_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingSettings(**kw)
