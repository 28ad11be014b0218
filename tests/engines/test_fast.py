"""policylab.engines.fast: FastEngine keeps HFEngine's contract (behavior log-probs equal
to a fresh forward, masks through the first eos with pad == eos, layout, extras, seeds)
and, consuming the RNG as HF's sampling loop does, draws the same tokens as HFEngine."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from policylab import SamplingSettings
from policylab.engines.fast import FastEngine
from policylab.engines.hf import HFEngine
from policylab.errors import ShapeError
from policylab.models.logprobs import model_logprobs

EOS = 2  # SmolLM2: <|im_end|> is both eos and pad
PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 300], [1, 40, 41, 42]]
SETTINGS = [
    SamplingSettings(temperature=1.0),
    SamplingSettings(temperature=0.7, top_k=20),
    SamplingSettings(temperature=1.0, top_p=0.8),
    SamplingSettings(temperature=0.9, top_k=50, top_p=0.9),
]
IDS = ["t1", "t0.7-topk20", "topp0.8", "t0.9-topk50-topp0.9"]


def sharpen(model, factor=20.0):
    """Logit std ~3 instead of ~0.15 (peaked distributions: top-k / top-p cut where it matters)."""
    with torch.no_grad():
        model.model.norm.weight.mul_(factor)
    return model


def eos_prone(model, alpha=0.8):
    """<|im_end|> gets p ~ 0.1-0.5 per step (a shared embedding offset, extra on the tied eos row)."""
    sharpen(model)
    with torch.no_grad():
        E = model.model.embed_tokens.weight
        E[:, 0] += 0.2
        E[EOS, 0] += alpha * 0.2
    return model


def sample(engine, sampling, seed=0, G=3, max_new_tokens=8, prompts=PROMPTS, **kw):
    return engine.generate(prompts, group_size=G, sampling=sampling, max_new_tokens=max_new_tokens,
                           policy_version=7, batch_id="b0", seed=seed, **kw)


def recompute(model, batch, sampling=None):
    with torch.no_grad():
        return model_logprobs(model, batch.tokens, batch.attention_mask, batch.prompt_width,
                              sampling=sampling or batch.sampling)


@pytest.mark.parametrize("sampling", SETTINGS, ids=IDS)
def test_same_tokens_as_hf_engine(tiny_model, tokenizer, sampling):
    """Same seed -> the same draws as HFEngine: both take argmax(p / E) with E ~ Exp(1)
    drawn for every row of the batch at every step (torch.multinomial's rule)."""
    model = eos_prone(tiny_model, alpha=0.6)
    hf, fast = HFEngine(model, tokenizer), FastEngine(model, tokenizer, sampler="hf")
    for seed in (0, 1, 2):
        a = sample(hf, sampling, seed=seed, G=4, max_new_tokens=10, record_topk=3)
        b = sample(fast, sampling, seed=seed, G=4, max_new_tokens=10, record_topk=3)
        assert torch.equal(a.tokens, b.tokens)
        assert torch.equal(a.attention_mask, b.attention_mask) and torch.equal(a.loss_mask, b.loss_mask)
        # the prefill runs once per prompt here, once per row in HF, and a matmul over 3 rows
        # may round differently from one over 12; the rounding of a log-prob grows with its
        # size (the sharpened model's log-probs reach ~-10): 2e-5 plus 1e-5 relative (an
        # AVX2 host measured 3.8e-5 on a log-prob of ~-10, 3.7e-6 relative at most)
        assert_close(b.logp_behavior, a.logp_behavior, rtol=1e-5, atol=2e-5)
        m = a.loss_mask
        assert torch.equal(b.extras["behavior_topk_ids"][m], a.extras["behavior_topk_ids"][m])
        fin = torch.isfinite(a.extras["behavior_topk_logp"][m])
        assert torch.equal(fin, torch.isfinite(b.extras["behavior_topk_logp"][m]))
        assert_close(b.extras["behavior_topk_logp"][m][fin], a.extras["behavior_topk_logp"][m][fin],
                     rtol=1e-5, atol=2e-5)
        for key in ("truncated", "prompt_lengths", "prompt_index"):
            assert torch.equal(a.extras[key], b.extras[key]), key
        assert a.extras["seed"] == b.extras["seed"] == seed
    # the comparison can fail: another seed gives other tokens
    assert not torch.equal(sample(hf, sampling, seed=0, G=4).tokens, sample(fast, sampling, seed=5, G=4).tokens)


def test_compaction_does_not_change_the_result(tiny_model, tokenizer):
    """Dropping finished rows from the cache (every time one finishes, or never) changes
    neither the tokens nor, beyond float rounding, the log-probs."""
    model = eos_prone(tiny_model)
    s = SamplingSettings(temperature=0.9, top_k=50)
    eager = sample(FastEngine(model, tokenizer, compact_min=1e-9), s, seed=2, G=4, max_new_tokens=12)
    never = sample(FastEngine(model, tokenizer, compact_min=1.0), s, seed=2, G=4, max_new_tokens=12)
    assert eager.loss_mask.sum(1).unique().numel() >= 3  # rows end at different steps
    assert torch.equal(eager.tokens, never.tokens)
    assert_close(eager.logp_behavior, never.logp_behavior, rtol=0, atol=1e-5)


@pytest.mark.parametrize("compact_min", [1.0, 0.125])
def test_finished_rows_leave_the_output_head_and_the_sampler(tiny_model, tokenizer, compact_min):
    """After step t the head (and the sampling math) runs only on the rows still
    generating: #{rows whose response is longer than t + 1}, read off the output, whether
    or not the cache was compacted yet (compact_min=1.0: never before all are done)."""
    model = eos_prone(tiny_model)
    s = SamplingSettings(temperature=0.9, top_k=50)
    eng = FastEngine(model, tokenizer, compact_min=compact_min)
    seen = []
    head = eng._net.logits
    eng._net.logits = lambda hidden, keep_fp64=False: (seen.append(hidden.shape[0]), head(hidden, keep_fp64))[1]
    b = sample(eng, s, seed=2, G=4, max_new_tokens=12)
    lengths = b.loss_mask.sum(1)
    assert lengths.unique().numel() >= 3  # rows end at different steps
    T = b.loss_mask.shape[1]
    assert seen[0] == len(PROMPTS)  # the prefill: one row per distinct prompt
    assert seen[1:] == [int((lengths > k).sum()) for k in range(1, T)]
    ref = sample(FastEngine(model, tokenizer, compact_min=1.0), s, seed=2, G=4, max_new_tokens=12)
    assert torch.equal(b.tokens, ref.tokens)
    assert_close(b.logp_behavior, ref.logp_behavior, rtol=0, atol=1e-5)
    assert_close(b.logp_behavior, torch.where(b.loss_mask, recompute(model, b), 0.0), rtol=0, atol=1e-5)


def test_compaction_is_in_place_in_one_contiguous_buffer(tiny_model, tokenizer):
    """Compaction moves the live rows to the front of the buffer the decode started with
    (no second cache is allocated), equal to gathering them (naive reference)."""
    model = eos_prone(tiny_model)
    eng = FastEngine(model, tokenizer, compact_min=1e-9)
    net = eng._net
    cache = torch.randn(2, 3, 6, 2, 10, 4)
    keep = torch.tensor([1, 2, 4])
    ref = cache[:, :, keep, :, :7].clone()
    base = cache.untyped_storage().data_ptr()
    out = net.compact(cache, keep, 7)
    assert out.untyped_storage().data_ptr() == base and out.shape == (2, 3, 3, 2, 10, 4)
    assert torch.equal(out[..., :7, :], ref)
    assert net.compact(out, torch.arange(3), 7) is out  # nothing finished: unchanged
    # in a decode: every compaction returns a view of the first cache's storage
    ptrs = []
    compact = net.compact
    new_cache = net.new_cache
    net.new_cache = lambda *a: (lambda c: (ptrs.append(c.untyped_storage().data_ptr()), c)[1])(new_cache(*a))
    net.compact = lambda c, k, f: (lambda r: (ptrs.append(r.untyped_storage().data_ptr()), r)[1])(compact(c, k, f))
    b = sample(eng, SamplingSettings(temperature=0.9, top_k=50), seed=2, G=4, max_new_tokens=12)
    assert len(ptrs) >= 3 and len(set(ptrs)) == 1  # compacted at least twice, always in the same buffer
    ref = sample(FastEngine(model, tokenizer, compact_min=1.0), SamplingSettings(temperature=0.9, top_k=50), seed=2,
                 G=4, max_new_tokens=12)
    assert torch.equal(b.tokens, ref.tokens)
    assert_close(b.logp_behavior, ref.logp_behavior, rtol=0, atol=1e-5)


def test_all_rows_stop_early(tiny_model, tokenizer):
    """When every row has its eos, the loop stops: T is the longest response, as in HF."""
    model = eos_prone(tiny_model, alpha=3.0)
    a = sample(HFEngine(model, tokenizer), SamplingSettings(), seed=1, max_new_tokens=30)
    b = sample(FastEngine(model, tokenizer), SamplingSettings(), seed=1, max_new_tokens=30)
    assert b.loss_mask.shape[1] < 30 and not b.extras["truncated"].any()
    assert b.loss_mask.shape == a.loss_mask.shape and torch.equal(a.tokens, b.tokens)


def test_seeds_generators_and_global_rng(tiny_model, tokenizer):
    engine = FastEngine(sharpen(tiny_model), tokenizer)
    s = SamplingSettings(temperature=1.0)
    state = torch.get_rng_state()
    a, b, c = sample(engine, s, seed=11), sample(engine, s, seed=11), sample(engine, s, seed=12)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logp_behavior, b.logp_behavior)
    assert not torch.equal(a.tokens, c.tokens)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    x1, x2 = sample(engine, s, seed=g1), sample(engine, s, seed=g2)
    assert torch.equal(x1.tokens, x2.tokens) and x1.extras["seed"] == x2.extras["seed"]
    assert sample(engine, s, seed=g1).extras["seed"] != x1.extras["seed"]
    # seed=None uses and advances the global RNG: reproducible from a global seed
    torch.manual_seed(3)
    y1, after1 = sample(engine, s, seed=None), torch.get_rng_state()
    torch.manual_seed(3)
    y2 = sample(engine, s, seed=None)
    assert y1.extras["seed"] is None and torch.equal(y1.tokens, y2.tokens)
    assert not torch.equal(after1, state)
    # ... and with sampler="hf" exactly as HFEngine does (same tokens, same RNG state after)
    hf, fast_hf = HFEngine(engine.model, tokenizer), FastEngine(engine.model, tokenizer, sampler="hf")
    torch.manual_seed(3)
    y_hf, after_hf = sample(hf, s, seed=None), torch.get_rng_state()
    torch.manual_seed(3)
    y_fast, after_fast = sample(fast_hf, s, seed=None), torch.get_rng_state()
    assert torch.equal(y_hf.tokens, y_fast.tokens) and torch.equal(after_hf, after_fast)


def test_greedy_matches_hf_greedy(tiny_model, tokenizer):
    model = eos_prone(tiny_model, alpha=0.7)
    state = torch.get_rng_state()
    got = FastEngine(model, tokenizer).greedy(PROMPTS, max_new_tokens=6)
    assert torch.equal(torch.get_rng_state(), state)  # no randomness consumed
    assert got == HFEngine(model, tokenizer).greedy(PROMPTS, max_new_tokens=6)
    assert any(r[-1] == EOS and len(r) < 6 for r in got) or all(len(r) == 6 for r in got)


def test_bf16_engine_is_a_different_engine_and_follows_weight_updates(tiny_model, tokenizer):
    model = sharpen(tiny_model)
    s = SamplingSettings(temperature=1.0)
    engine = FastEngine(model, tokenizer, dtype=torch.bfloat16)
    batch = sample(engine, s)
    assert engine.engine_name == batch.engine == "fast-bf16"
    diff = (batch.logp_behavior - recompute(model, batch))[batch.loss_mask].abs()
    assert 0 < diff.max() < 1.0  # bf16 numerics: a real, bounded mismatch
    # an in-place update of the shared weights (as an optimizer step does) is picked up
    with torch.no_grad():
        model.lm_head.weight.mul_(0.5)  # tied with the embedding
    after = sample(engine, s)
    fresh = sample(FastEngine(model, tokenizer, dtype=torch.bfloat16), s)
    assert torch.equal(after.tokens, fresh.tokens) and torch.equal(after.logp_behavior, fresh.logp_behavior)
    assert not torch.equal(after.logp_behavior, batch.logp_behavior)


def test_bf16_copy_follows_a_fused_optimizer_step(tiny_model, tokenizer):
    # fused AdamW writes the parameters without bumping their version counters: the copy
    # must still be the current weights after the step (a stale copy once sampled from
    # old weights in the trainer and the measured mismatch grew step after step)
    model = sharpen(tiny_model)
    engine = FastEngine(model, tokenizer, dtype=torch.bfloat16)
    sample(engine, SamplingSettings())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    versions = [p._version for p in model.parameters()]
    opt.step()
    assert [p._version for p in model.parameters()] == versions  # the trap: nothing says they changed
    used = {}
    release = engine._net.release

    def snapshot():  # the copy the decode loop used, just before it is dropped
        used.update(engine._net._w)
        release()

    engine._net.release = snapshot
    sample(engine, SamplingSettings())
    assert engine._net._w is None  # dropped after the call: the trainer gets that memory back
    w = used
    assert torch.equal(w["embed"], model.model.embed_tokens.weight.detach().to(torch.bfloat16))
    q = model.model.layers[1].self_attn.q_proj.weight.detach().to(torch.bfloat16)
    assert torch.equal(w["layers"][1]["q"][0], q)


def test_bad_inputs(tiny_model, tokenizer):
    engine = FastEngine(tiny_model, tokenizer)
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
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.greedy([[1]], max_new_tokens=0)
    with pytest.raises(ValueError, match="`dtype` must be None .* or torch.bfloat16"):
        FastEngine(tiny_model, tokenizer, dtype=torch.float16)
    with pytest.raises(ValueError, match="`sampler` must be 'cdf' or 'hf'"):
        FastEngine(tiny_model, tokenizer, sampler="multinomial")


def test_unsupported_architecture_is_refused(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="FastEngine runs llama decoders.*Use HFEngine"):
        FastEngine(gpt2, tokenizer)


def test_cdf_sampler_draws_from_the_kept_distribution():
    """The default sampler's frequencies match softmax(z) (within 5 binomial standard
    errors over 200k draws), and a token outside the kept set (-inf) is never drawn."""
    from policylab.engines.fast import _draw_cdf

    z = torch.tensor([[0.0, 1.0, -1.0, float("-inf"), 2.0, -3.0]]).repeat(200_000, 1)
    gen_state = torch.get_rng_state()
    torch.manual_seed(0)
    tok = _draw_cdf(z)  # only rows still generating reach the sampler
    torch.set_rng_state(gen_state)
    assert tok.shape == (200_000,) and _draw_cdf(z[:0]).shape == (0,)
    counts = torch.bincount(tok, minlength=6).double()
    n = counts.sum()
    p = torch.softmax(z[0].double(), -1)
    se = (p * (1 - p) / n).sqrt()
    assert counts[3] == 0
    assert bool(((counts / n - p).abs() <= 5 * se + 1e-12).all()), (counts / n, p)


def test_lora_wrapped_model_in_fp32(tiny_model, tokenizer):
    """Projections are called as modules: a PEFT LoRA model samples exactly like HFEngine
    (adapters included); the bf16 weight copy refuses wrapped projections."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(sharpen(tiny_model), peft.LoraConfig(r=4, lora_alpha=16, target_modules="all-linear",
                                                                      lora_dropout=0.0))
    gen = torch.Generator().manual_seed(0)  # not the global RNG: its state depends on the tests run before
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=gen)  # a non-trivial adapter
    s = SamplingSettings()
    a = sample(HFEngine(model, tokenizer), s, seed=1)
    b = sample(FastEngine(model, tokenizer, sampler="hf"), s, seed=1)
    assert torch.equal(a.tokens, b.tokens)
    # two fp32 summation orders of the same forward: the error grows with |log p| (up to ~10 here)
    assert_close(b.logp_behavior[b.loss_mask], recompute(model, b)[b.loss_mask], rtol=1e-5, atol=2e-5)
    with pytest.raises(ValueError, match="needs plain torch.nn.Linear projections.*peft"):
        FastEngine(model, tokenizer, dtype=torch.bfloat16)


def test_fp64_model_runs_in_fp64(tiny_model, tokenizer):
    """train.dtype=fp64 loads the policy in fp64: the engine computes in the model's dtype
    ("fast-fp64"); like HFEngine it records fp32 log-probs (the sampler works on fp32 scores)."""
    model = sharpen(tiny_model).double()
    s = SamplingSettings(temperature=0.8)
    batch = sample(FastEngine(model, tokenizer, sampler="hf"), s)
    assert batch.engine == "fast-fp64" and batch.logp_behavior.dtype == torch.float32
    assert torch.equal(batch.tokens, sample(HFEngine(model, tokenizer), s).tokens)
    m = batch.loss_mask
    # fp32 rounding of scores up to ~25 in magnitude: relative, not absolute, precision
    # (measured: up to 1.8e-5 absolute on an AVX2-only host; a bf16 path would be off by ~1e-2)
    assert_close(batch.logp_behavior[m].double(), recompute(model, batch)[m], rtol=1e-5, atol=4e-5)


def _naive_attention(q, keys, vals, key_ok, scale):
    """Per row, per query head: repeat its kv head, softmax over the allowed keys, in fp64."""
    R, nh, _, D = q.shape
    g = nh // keys.shape[1]
    out = torch.zeros(R, nh, 1, D, dtype=torch.float64)
    for r in range(R):
        for h in range(nh):
            ok = key_ok[r, 0]
            s = (keys[r, h // g, ok].double() @ q[r, h, 0].double()) * scale
            out[r, h, 0] = torch.softmax(s, 0) @ vals[r, h // g, ok].double()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_one_query_per_row(tiny_model, tokenizer, dtype):
    """The decode step's attention (one query per row over the cache, grouped kv heads,
    masked keys) against a hand-worked case and a per-head loop in fp64."""
    dec = FastEngine(tiny_model, tokenizer)._net
    # hand-worked: 2 query heads on 1 kv head, D = 1, keys 0 and 1 allowed, key 2 masked.
    # head 0 (q=1): scores 0, ln 3 -> weights 1/4, 3/4 -> 0.25*2 + 0.75*6 = 5.0
    # head 1 (q=0): scores 0, 0 -> weights 1/2, 1/2 -> 4.0 (the masked key's 100 never enters)
    q = torch.tensor([1.0, 0.0]).view(1, 2, 1, 1)
    keys = torch.tensor([0.0, float(torch.log(torch.tensor(3.0))), 50.0]).view(1, 1, 3, 1)
    vals = torch.tensor([2.0, 6.0, 100.0]).view(1, 1, 3, 1)
    ok = torch.tensor([[[True, True, False]]])
    dec.scale = 1.0
    assert_close(dec._decode_attention(q, keys, vals, ok).flatten(), torch.tensor([5.0, 4.0]))
    # random shapes of the embedded model's kind (9 query heads on 3 kv heads), ragged masks
    gen = torch.Generator().manual_seed(0)
    R, nh, nkv, S, D = 5, 9, 3, 11, 8
    q, keys, vals = (torch.randn(*shape, generator=gen).to(dtype)
                     for shape in ((R, nh, 1, D), (R, nkv, S, D), (R, nkv, S, D)))
    ok = torch.rand(R, 1, S, generator=gen) > 0.4
    ok[:, :, -1] = True  # the row's own new key is always allowed
    dec.scale = D ** -0.5
    got = dec._decode_attention(q, keys, vals, ok)
    assert got.dtype == dtype and got.shape == (R, nh, 1, D)
    ref = _naive_attention(q, keys, vals, ok, dec.scale)
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]  # bf16: the output's rounding, ~3 digits
    assert_close(got.double(), ref, rtol=tol, atol=tol)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, keys, vals, attn_mask=ok[:, None], scale=dec.scale,
                                                            enable_gqa=True)
    assert (got.double() - ref).abs().max() <= (sdpa.double() - ref).abs().max() + tol / 10
