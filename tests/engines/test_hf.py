"""policylab.engines.hf: HFEngine sampling, behavior log-probs, masks, RNG."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

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


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingSettings(temperature=1.0),
        SamplingSettings(temperature=0.7, top_k=20),
        SamplingSettings(temperature=1.0, top_p=0.8),
        SamplingSettings(temperature=0.9, top_k=50, top_p=0.9),
    ],
    ids=["t1", "t0.7-topk20", "topp0.8", "t0.9-topk50-topp0.9"],
)
def test_behavior_logprobs_equal_recomputation(tiny_model, tokenizer, sampling):
    model = sharpen(tiny_model)
    batch = sample(HFEngine(model, tokenizer), sampling)
    with torch.no_grad():
        lp = model_logprobs(model, batch.tokens, batch.attention_mask, batch.prompt_width, sampling=sampling)
    m = batch.loss_mask
    assert m.sum() >= 20
    assert_close(batch.logp_behavior[m], lp[m], rtol=0, atol=1e-5)
    assert bool((batch.logp_behavior[~m] == 0).all())
    # the tolerance can fail: scoring without the truncation (or at another temperature)
    # is visibly different on the same tokens
    if sampling != SamplingSettings():
        with torch.no_grad():
            plain = model_logprobs(model, batch.tokens, batch.attention_mask, batch.prompt_width,
                                   sampling=SamplingSettings())
        assert (plain - lp)[m].abs().max() > 1e-2


def test_pad_equal_to_eos_masks_by_first_eos(tiny_model, tokenizer):
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == EOS
    model = eos_prone(tiny_model)
    batch = sample(HFEngine(model, tokenizer), SamplingSettings(), seed=3, G=4, max_new_tokens=6)
    resp, mask = batch.response_tokens, batch.loss_mask
    T = resp.shape[1]
    early = 0
    for i in range(batch.size):
        row = resp[i].tolist()
        if EOS in row:
            e = row.index(EOS)
            # through the first eos inclusive, then padding (whose ids are also eos)
            assert mask[i].tolist() == [True] * (e + 1) + [False] * (T - e - 1)
            assert all(t == EOS for t in row[e + 1 :])
            assert not batch.extras["truncated"][i]
            early += e + 1 < T and EOS in row[e + 1 :]
        else:
            assert mask[i].all() and batch.extras["truncated"][i]
    # the seed gives both kinds of rows, including ones whose padding repeats the eos id
    assert early >= 2 and batch.extras["truncated"].any()
    assert torch.equal(batch.attention_mask[:, batch.prompt_width :], mask)
    # recomputation agrees on every counted token, eos included
    with torch.no_grad():
        lp = model_logprobs(model, batch.tokens, batch.attention_mask, batch.prompt_width,
                            sampling=SamplingSettings())
    assert_close(batch.logp_behavior[mask], lp[mask], rtol=0, atol=1e-5)


def test_left_padding_layout_groups_and_extras(tiny_model, tokenizer):
    batch = sample(HFEngine(sharpen(tiny_model), tokenizer), SamplingSettings(top_k=10), G=2,
                   group_ids=[40, 7, 99])
    P = batch.prompt_width
    assert P == 6 and batch.size == 6
    for i in range(6):
        prompt = PROMPTS[i // 2]
        n = len(prompt)
        assert batch.tokens[i, P - n : P].tolist() == prompt
        assert batch.attention_mask[i, :P].tolist() == [False] * (P - n) + [True] * n
    assert batch.group.tolist() == [40, 40, 7, 7, 99, 99]
    assert batch.extras["prompt_index"].tolist() == [0, 0, 1, 1, 2, 2]
    assert batch.extras["prompt_lengths"].tolist() == [6, 6, 2, 2, 4, 4]
    assert batch.extras["seed"] == 0
    assert batch.policy_version.tolist() == [7] * 6
    assert batch.batch_id == "b0" and batch.engine == "hf-fp32"
    assert batch.source == ("native",) * 6
    assert batch.sampling == SamplingSettings(top_k=10)


def test_same_seed_same_samples_and_global_rng_untouched(tiny_model, tokenizer):
    engine = HFEngine(sharpen(tiny_model), tokenizer)
    s = SamplingSettings(temperature=1.0)
    state = torch.get_rng_state()
    a, b, c = sample(engine, s, seed=11), sample(engine, s, seed=11), sample(engine, s, seed=12)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logp_behavior, b.logp_behavior)
    assert not torch.equal(a.tokens, c.tokens)
    # a generator gives a reproducible stream of seeds and advances
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    x1, x2 = sample(engine, s, seed=g1), sample(engine, s, seed=g2)
    assert torch.equal(x1.tokens, x2.tokens) and x1.extras["seed"] == x2.extras["seed"]
    assert sample(engine, s, seed=g1).extras["seed"] != x1.extras["seed"]


def test_model_generation_config_is_ignored_and_restored(tiny_model, tokenizer):
    model = sharpen(tiny_model)
    model.generation_config.repetition_penalty = 3.0
    model.generation_config.top_k = 5
    model.train()
    s = SamplingSettings(temperature=1.0)
    batch = sample(HFEngine(model, tokenizer), s)
    assert model.generation_config.repetition_penalty == 3.0 and model.training
    with torch.no_grad():
        lp = model_logprobs(model.eval(), batch.tokens, batch.attention_mask, batch.prompt_width, sampling=s)
    m = batch.loss_mask
    assert_close(batch.logp_behavior[m], lp[m], rtol=0, atol=1e-5)


def test_greedy_matches_argmax_loop(tiny_model, tokenizer):
    model = eos_prone(tiny_model, alpha=0.7)
    out = HFEngine(model, tokenizer).greedy(PROMPTS, max_new_tokens=6)
    for prompt, got in zip(PROMPTS, out):
        ids, ref = list(prompt), []
        with torch.no_grad():
            for _ in range(6):
                nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
                ids.append(nxt)
                ref.append(nxt)
                if nxt == EOS:
                    break
        assert got == ref


def test_decode_responses_skips_special_tokens(tiny_model, tokenizer):
    engine = HFEngine(eos_prone(tiny_model), tokenizer)
    batch = sample(engine, SamplingSettings(), seed=3, G=4, max_new_tokens=6)
    texts = engine.decode_responses(batch)
    assert len(texts) == batch.size
    for i, text in enumerate(texts):
        ids = batch.response_tokens[i][batch.loss_mask[i]].tolist()
        assert text == tokenizer.decode(ids, skip_special_tokens=True)
        assert "<|im_end|>" not in text


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
