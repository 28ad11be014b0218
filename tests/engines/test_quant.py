"""policylab.engines.quant and FastEngine(weights="int8" | "int4"): a behavior engine that
samples from weight-quantized copies. Its log-probs are the quantized model's (a model
holding the dequantized weights recomputes them exactly), they differ from the learner's,
more for int4 than int8, and the copy follows weight updates."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

from policylab import SamplingSettings
from policylab.engines.fast import FastEngine
from policylab.engines.quant import fake_quantize, quantize_codes
from policylab.models.logprobs import model_logprobs

PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 300], [1, 40, 41, 42]]


def sharpen(model, factor=20.0):
    with torch.no_grad():
        model.model.norm.weight.mul_(factor)
    return model


def sample(engine, sampling=SamplingSettings(), seed=0, G=3, max_new_tokens=8):
    return engine.generate(PROMPTS, group_size=G, sampling=sampling, max_new_tokens=max_new_tokens,
                           policy_version=0, batch_id="b0", seed=seed)


def recompute(model, batch):
    with torch.no_grad():
        return model_logprobs(model, batch.tokens, batch.attention_mask, batch.prompt_width, sampling=batch.sampling)


def quantized_copy(model, bits, group):
    """The model with every linear, the embedding and the (tied) head replaced by its
    fake-quantized weights, norms untouched: what the engine claims to sample from."""
    q = copy.deepcopy(model)
    with torch.no_grad():
        for name, mod in q.named_modules():
            if isinstance(mod, torch.nn.Linear) and name != "lm_head":
                mod.weight.copy_(fake_quantize(mod.weight, bits, group))
        emb = q.model.embed_tokens.weight
        emb.copy_(fake_quantize(emb, bits, group))  # tied: the head is the same tensor
    assert q.lm_head.weight is q.model.embed_tokens.weight
    return q


def test_fake_quantize_hand_worked():
    # one row, two groups of 4, int4 (q_max = 7)
    w = torch.tensor([[0.7, -0.36, 0.1, 0.0, 2.0, 0.9, -0.5, 0.3]])
    # group 1: s = 0.7 / 7 = 0.1 -> q = round(7, -3.6, 1, 0) = (7, -4, 1, 0)
    #          w_hat = (0.7, -0.4, 0.1, 0.0)
    # group 2: s = 2 / 7 -> q = round(7, 3.15, -1.75, 1.05) = (7, 3, -2, 1); w_hat = q * 2/7
    want = torch.tensor([[0.7, -0.4, 0.1, 0.0, 2.0, 6 / 7, -4 / 7, 2 / 7]])
    assert_close(fake_quantize(w, 4, 4), want)
    q, s = quantize_codes(w, 4, 4)
    assert q.tolist() == [[7, -4, 1, 0, 7, 3, -2, 1]]
    assert_close(s, torch.tensor([[0.1, 2 / 7]]))
    # int8 on the same row, one scale per row: s = 2 / 127; every error <= s / 2
    err = (fake_quantize(w, 8, 0) - w).abs()
    assert float(err.max()) <= (2 / 127) / 2 + 1e-7
    # a group of zeros stays zero (no division by a zero scale)
    assert torch.equal(fake_quantize(torch.zeros(2, 8), 4, 4), torch.zeros(2, 8))


def test_fake_quantize_naive_loop_reference():
    torch.manual_seed(0)
    w = torch.randn(5, 12)
    got = fake_quantize(w, 4, 3)
    want = torch.empty_like(w)
    for i in range(5):
        for g0 in range(0, 12, 3):
            block = w[i, g0:g0 + 3]
            s = float(block.abs().max()) / 7
            for j in range(3):
                qv = max(-7, min(7, round(float(block[j]) / s)))  # python round: half to even, as torch.round
                want[i, g0 + j] = qv * s
    assert_close(got, want)


def test_fake_quantize_bad_input():
    with pytest.raises(ValueError, match="does not divide the input width 12"):
        fake_quantize(torch.randn(2, 12), 4, 5)
    with pytest.raises(ValueError, match="2-D weight"):
        fake_quantize(torch.randn(12), 4, 0)
    with pytest.raises(ValueError, match="bits must be in 2..8"):
        fake_quantize(torch.randn(2, 4), 16, 0)


@pytest.mark.parametrize("weights,bits", [("int8", 8), ("int4", 4)])
def test_quantized_engine_logprobs_are_what_it_sampled_from(tiny_model, tokenizer, weights, bits):
    model = sharpen(tiny_model)
    engine = FastEngine(model, tokenizer, weights=weights, quant_group=32)
    batch = sample(engine)
    assert engine.engine_name == batch.engine == f"fast-{weights}-g32"
    m = batch.loss_mask
    # the quantized model, computed by HF's forward: the engine's log-probs, to float rounding
    assert_close(batch.logp_behavior[m], recompute(quantized_copy(model, bits, 32), batch)[m], atol=2e-5, rtol=0)
    # and not the learner's: a real mismatch
    diff = (batch.logp_behavior - recompute(model, batch))[m].abs()
    assert float(diff.max()) > 1e-3


def test_int4_differs_more_than_int8(tiny_model, tokenizer):
    model = sharpen(tiny_model)
    gaps = {}
    for weights in ("int8", "int4"):
        batch = sample(FastEngine(model, tokenizer, weights=weights), max_new_tokens=12)
        d = (batch.logp_behavior - recompute(model, batch))[batch.loss_mask].abs()
        gaps[weights] = float(d.mean())
    assert 0 < gaps["int8"] < gaps["int4"]


def test_quantized_copy_follows_weight_updates(tiny_model, tokenizer):
    model = sharpen(tiny_model)
    engine = FastEngine(model, tokenizer, weights="int8")
    before = sample(engine)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(3.0)
    after = sample(engine)
    fresh = sample(FastEngine(model, tokenizer, weights="int8"))
    assert torch.equal(after.tokens, fresh.tokens) and torch.equal(after.logp_behavior, fresh.logp_behavior)
    assert not torch.equal(after.logp_behavior, before.logp_behavior)
    # the learner's own weights are never touched by the engine
    assert not torch.equal(model.model.layers[0].mlp.up_proj.weight,
                           fake_quantize(model.model.layers[0].mlp.up_proj.weight, 8, 32))


def test_quantized_engine_bad_settings(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="`weights` must be None or one of int8, int4"):
        FastEngine(tiny_model, tokenizer, weights="int2")
    with pytest.raises(ValueError, match="exclude each other"):
        FastEngine(tiny_model, tokenizer, weights="int8", dtype=torch.bfloat16)
    from policylab.engines.fast import UnsupportedModel

    with pytest.raises(UnsupportedModel, match="quantization group 48 does not divide the input width"):
        FastEngine(tiny_model, tokenizer, weights="int4", quant_group=48)


def test_trainer_samples_with_the_quantized_engine(tiny_model_dir, tmp_path):
    from trainer_utils import tiny_config

    from policylab.errors import ConfigError
    from policylab.trainer.loop import Trainer

    cfg = tiny_config(tiny_model_dir, tmp_path / "r", method="tis", rollout={"engine_dtype": "int4"})
    tr = Trainer(cfg)
    assert tr.engine.engine_name == "fast-int4-g32" and not tr.rollout.same_numerics_as_trainer
    m = tr.train_step()
    # the trainer's fp32 pi_old against the int4 engine's mu: TIS sees a real engine ratio
    assert m["mismatch/old_vs_behavior_abs_dlogp_mean"] > 1e-3
    assert m["correction/tis/kl_k3"] > 0 and m["correction/tis/ratio_max"] > 1.0 > m["correction/tis/ratio_min"]
    with pytest.raises(ConfigError, match="is a FastEngine setting"):
        Trainer(tiny_config(tiny_model_dir, tmp_path / "h", rollout={"engine_dtype": "int8", "engine": "hf"}))
    with pytest.raises(ConfigError, match="rollout.engine_dtype must be one of fp32, bf16, int8, int4"):
        tiny_config(tiny_model_dir, tmp_path / "x", rollout={"engine_dtype": "int3"})
