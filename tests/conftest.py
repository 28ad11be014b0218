"""Shared fixtures: the embedded SmolLM2 tokenizer and tiny random Llamas sized to it.

Cache policy for the test session: if the user's policylab cache (POLICYLAB_CACHE or
~/.cache/policylab) already holds the embedded tokenizer, it is reused read-only (the
tokenizer then loads in well under a second). Otherwise POLICYLAB_CACHE points at a
per-session temporary directory, so tests never write into the user's home; the first
tokenizer load then parses the GGUF once (~5 s). Tests that need their own empty cache
set POLICYLAB_CACHE themselves with monkeypatch.
"""

from __future__ import annotations

import os

import pytest
import torch

from policylab.models import loading as models

# Under pytest-xdist (`make test` runs two workers on a 2-core machine) each worker gets
# its share of the cores for torch's intra-op threads, so the workers do not oversubscribe
# the CPU. No test depends on the thread count (the golden updates are fp64 and hold for
# 1, 2 and 4 threads).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


@pytest.fixture(scope="session", autouse=True)
def policylab_cache(tmp_path_factory):
    """The cache root the test session uses (see the module docstring)."""
    patch = pytest.MonkeyPatch()
    if models.cached_tokenizer_dir() is None:
        patch.setenv("POLICYLAB_CACHE", str(tmp_path_factory.mktemp("policylab-cache")))
    yield models.cache_root()
    patch.undo()


@pytest.fixture(scope="session")
def tokenizer(policylab_cache):
    """SmolLM2-135M-Instruct tokenizer: vocab 49152, pad == eos == <|im_end|> (id 2).
    Shared by the session: do not mutate it."""
    return models.embedded_tokenizer()


@pytest.fixture
def tiny_model(tokenizer):
    """A fresh fp32 random 2-layer Llama (hidden 64) with the tokenizer's vocab, seed 0."""
    return models.tiny_llama(tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A directory with tiny_llama(tokenizer, seed=0) and the tokenizer saved
    (save_pretrained layout), e.g. for `load_policy(dir)` and CLI tests. Read only."""
    path = tmp_path_factory.mktemp("tiny-model")
    models.tiny_llama(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory, tiny_model_dir):
    """Where `exercise_settings(..., model=tiny_model_dir, workdir=prepared_dir)` puts what a
    method needs made first (RFPO's frozen critic): made once per session and reused
    (`exercise._prepare_rfpo` keeps a critic whose critic.json exists). Read only."""
    return tmp_path_factory.mktemp("prepared")
