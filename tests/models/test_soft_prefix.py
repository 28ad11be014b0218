"""TASCO's prefix-injection path: only the prefix learns, the backbone stays bit-identical,
and sampling, scoring and evaluation all go through the prefix."""

from __future__ import annotations

import pytest
import torch

from policylab.models import loading as models
from policylab.batch import SamplingSettings
from policylab.errors import ConfigError
from policylab.engines.hf import HFEngine
from policylab.eval.evaluate import decision_logits
from policylab.models.logprobs import model_logprobs
from policylab.models.prefix import SharedPrefix
from policylab.models.soft_prefix import PrefixedLM, attach_prefix
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config

S = SamplingSettings(temperature=1.0)


@pytest.fixture
def prefixed(tokenizer):
    base = models.tiny_llama(tokenizer).double()
    raw = models.tiny_llama(tokenizer).double()  # an identical backbone without the prefix
    lm = attach_prefix(base, tokenizer, init_text="Think, then answer.", n_perturb=2)
    lm.embedding.redraw(torch.Generator().manual_seed(1), 0.1)
    return lm, raw


def _prompts(tokenizer):
    return [tokenizer("What is 3 + 4?")["input_ids"], tokenizer("Hi")["input_ids"]]


def test_only_the_prefix_requires_grad(prefixed):
    lm, _ = prefixed
    assert [n for n, p in lm.named_parameters() if p.requires_grad] == ["inner.model.embed_tokens.prefix"]
    assert lm.embedding.m == len(lm.embedding.block(0)) and not lm.embedding.xi.requires_grad
    with pytest.raises(Exception, match="already carries a soft prefix"):
        attach_prefix(lm, None, init_text="x", n_perturb=1)


def test_sampling_goes_through_the_prefix(prefixed, tokenizer):
    lm, raw = prefixed
    eng = HFEngine(lm, tokenizer)
    b = eng.generate(_prompts(tokenizer), group_size=2, sampling=S, max_new_tokens=5, policy_version=0,
                     batch_id="x", seed=3)
    # the engine's behavior log-probs are the prefixed model's, not the backbone's
    lp = model_logprobs(lm, b.tokens, b.attention_mask, b.prompt_width, sampling=S, mask=b.loss_mask)
    torch.testing.assert_close(lp.float(), b.logp_behavior, rtol=0, atol=1e-5)
    lp_raw = model_logprobs(raw, b.tokens, b.attention_mask, b.prompt_width, sampling=S, mask=b.loss_mask)
    assert float((lp_raw - b.logp_behavior).abs().max()) > 1e-2
    # moving the prefix moves the sampler's distribution on the same tokens
    with torch.no_grad():
        lm.embedding.prefix.add_(0.5)
    lp2 = model_logprobs(lm, b.tokens, b.attention_mask, b.prompt_width, sampling=S, mask=b.loss_mask)
    assert float((lp2 - lp).abs().max()) > 1e-3


def test_inserted_and_explicit_prefix_and_shared_prompt_paths_agree(prefixed, tokenizer):
    lm, _ = prefixed
    eng = HFEngine(lm, tokenizer)
    blk = lm.embedding.block(0)
    auto = eng.generate(_prompts(tokenizer), group_size=2, sampling=S, max_new_tokens=5, policy_version=0,
                        batch_id="a", seed=3)
    expl = eng.generate([blk + p for p in _prompts(tokenizer)], group_size=2, sampling=S, max_new_tokens=5,
                        policy_version=0, batch_id="e", seed=3)
    P_a, P_e = auto.prompt_width, expl.prompt_width
    assert P_e == P_a + lm.embedding.m
    assert torch.equal(auto.tokens[:, P_a:], expl.tokens[:, P_e:])  # same replies for the same seed
    torch.testing.assert_close(auto.logp_behavior, expl.logp_behavior, rtol=0, atol=1e-6)
    for b in (auto, expl):
        full = model_logprobs(lm, b.tokens, b.attention_mask, b.prompt_width, sampling=S, mask=b.loss_mask)
        sp = SharedPrefix(lm, b.tokens, b.attention_mask, b.prompt_width)
        shared = sp.logprobs(lm, torch.arange(b.size), b.tokens, b.attention_mask, sampling=S, mask=b.loss_mask)
        torch.testing.assert_close(shared, full, rtol=0, atol=1e-10)
    # block k with ξ = 0 scores exactly like the clean prefix
    with torch.no_grad():
        lm.embedding.xi.zero_()
    t = expl.tokens.clone()
    head = t[:, :P_e]
    t[:, :P_e] = torch.where(head >= lm.embedding.vocab, head + 2 * lm.embedding.m, head)
    lp_k = model_logprobs(lm, t, expl.attention_mask, P_e, sampling=S, mask=expl.loss_mask)
    lp_0 = model_logprobs(lm, expl.tokens, expl.attention_mask, P_e, sampling=S, mask=expl.loss_mask)
    torch.testing.assert_close(lp_k, lp_0, rtol=0, atol=1e-12)


def test_evaluation_reads_the_prefix(prefixed, tokenizer):
    lm, raw = prefixed
    prompts = _prompts(tokenizer)
    ids = [tokenizer(d, add_special_tokens=False)["input_ids"][0] for d in "0123456789"]
    z, mass = decision_logits(lm, prompts, ids, pad_id=tokenizer.pad_token_id)
    z_raw, _ = decision_logits(raw, prompts, ids, pad_id=tokenizer.pad_token_id)
    blk = lm.embedding.block(0)
    z_expl, _ = decision_logits(lm, [blk + p for p in prompts], ids, pad_id=tokenizer.pad_token_id)
    torch.testing.assert_close(z, z_expl, rtol=0, atol=1e-10)
    assert float((z - z_raw).abs().max()) > 1e-3
    assert bool(((mass > 0) & (mass < 1)).all())


def test_same_seed_same_perturbations(tokenizer):
    def draw(seed):
        lm = attach_prefix(models.tiny_llama(tokenizer), tokenizer, init_text="Think.", n_perturb=2)
        lm.embedding.redraw(torch.Generator().manual_seed(seed), 0.1)
        return lm.embedding.xi.clone()

    assert torch.equal(draw(4), draw(4)) and not torch.equal(draw(4), draw(5))


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_tasco_run_moves_only_the_prefix_and_the_backbone_is_bit_identical(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "t", method="tasco", method_params={},
                      rollout={"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4}, train={"steps": 2})
    tr = Trainer(cfg)
    assert isinstance(tr.model, PrefixedLM) and tr.engine.engine_name.startswith("hf")
    assert [id(p) for g in tr.optimizer.param_groups for p in g["params"]] == [id(tr.model.embedding.prefix)]
    before = _weights(tr.model)
    for _ in range(2):
        m = tr.train_step()
        assert m["skipped_nonfinite"] == 0.0
    after = _weights(tr.model)
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    # the prefix learned, ξ was redrawn after each step; every backbone tensor is bit-identical
    assert moved == {"inner.model.embed_tokens.prefix", "inner.model.embed_tokens.xi"}
    assert tr.policy_version == 2


def test_fast_engine_is_refused_for_a_prefixed_model(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "f", method="tasco", method_params={}, rollout={"engine": "fast"})
    with pytest.raises(ConfigError, match="rollout.engine 'fast'.*FastEngine runs llama decoders"):
        Trainer(cfg)


def test_tasco_resume_equals_the_uninterrupted_run(tiny_model_dir, tmp_path):
    sections = dict(method="tasco", method_params={}, train={"steps": 2},
                    rollout={"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4})
    full = Trainer(tiny_config(tiny_model_dir, tmp_path / "a", **sections))
    for _ in range(2):
        full.train_step()
    first = Trainer(tiny_config(tiny_model_dir, tmp_path / "b", **sections))
    first.train_step()
    first.save()
    second = Trainer(tiny_config(tiny_model_dir, tmp_path / "b", **sections))
    assert second.restore() and second.step == 1
    second.train_step()
    a, b = _weights(full.model), _weights(second.model)
    for k in ("inner.model.embed_tokens.prefix", "inner.model.embed_tokens.xi"):
        torch.testing.assert_close(b[k], a[k], rtol=1e-6, atol=1e-8)
