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

# OpenMP threads that wait at the end of a parallel region sleep instead of spinning
# (read by libgomp when torch is first imported, i.e. below: no pytest plugin imports it
# earlier; inherited by the CLI and trainer subprocesses). A spinning waiter takes a core
# that another xdist worker needs: the golden cases (2 threads per worker, see below)
# -n 2 took 40 CPU s and 21 s with the default, 23 CPU s and 13 s with PASSIVE. The
# numbers computed do not change, only how idle threads wait.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

from policylab.models import loading as models  # noqa: E402

# Under pytest-xdist (`make test` runs two workers on a 2-core machine) each worker gets
# its share of the cores for torch's intra-op threads, so the workers do not oversubscribe
# the CPU. No test depends on the thread count (the golden updates are fp64 and hold for
# 1, 2 and 4 threads).
# The trainer sets its own thread count when a run starts (`runtime.configure_threads`:
# the available cores, unless POLICYLAB_THREADS says otherwise), and so do the `policylab`
# subprocesses CLI tests start; without POLICYLAB_THREADS each worker's runs took both cores
# again, and two workers' OpenMP barriers spun against each other (a 2-step compare run
# took several times as long as alone). So the worker's share goes into POLICYLAB_THREADS
# too (inherited by the subprocesses), unless the user set it.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _WORKERS > 1:
    _SHARE = max(1, (os.cpu_count() or 1) // _WORKERS)
    torch.set_num_threads(_SHARE)
    if "POLICYLAB_THREADS" not in os.environ:
        os.environ["POLICYLAB_THREADS"] = str(_SHARE)
        os.environ["POLICYLAB_TEST_THREADS"] = str(_SHARE)  # says it was set here (seen by subprocesses)

# ...except for the golden updates: their recorded `grad_norm` came from runs at the
# trainer's own choice (2 threads on the 2-core hosts they were recorded on) and differs
# at ~2e-8 relative with 1 thread (measured: the grpo case fails at 1 thread, passes at 2),
# so those cases keep the trainer's own choice, as when they were recorded.
_THREAD_SENSITIVE = ("test_same_update.py",)


@pytest.fixture(autouse=True)
def _trainer_threads_as_recorded(request, monkeypatch):
    if request.node.path.name in _THREAD_SENSITIVE and \
            os.environ.get("POLICYLAB_TEST_THREADS") == os.environ.get("POLICYLAB_THREADS"):
        monkeypatch.delenv("POLICYLAB_THREADS", raising=False)
    yield


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test (and its function fixtures' teardown): collect that test's cyclic
    garbage, then move everything still alive to the garbage collector's permanent
    generation (`gc.freeze`). What is alive between tests (torch, transformers and the other
    imports, the collected items, session fixtures, caches) is then not walked again by
    every later collection: each `Trainer` starts with a full `gc.collect()`
    (`runtime.reset_peak_memory`, ~0.1-0.3 s over a worker's heap, hundreds of trainers per
    worker) and the collector's own full passes walk the whole heap too. The whole suite:
    1059 -> 773 CPU s. A test's own objects are collected as before; what a module or
    session fixture holds, once frozen, is freed by reference counting only (a cycle among
    such objects stays until the worker ends)."""
    import gc

    gc.collect()
    gc.freeze()


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


# The small-vocabulary tokenizer: SmolLM2's byte-level BPE cut to its first SMALL_VOCAB ids
# (the 17 special tokens, the 256 byte symbols, then the earliest merges, which BPE ranks by
# frequency), with every merge whose parts and result stay in the vocabulary. It encodes any
# text (a byte is always a token), keeps the chat template and pad == eos == <|im_end|> (2),
# and decodes what it encodes. A tiny Llama sized to it has ~0.14 M parameters instead of
# ~3.2 M (the 49,152-row embedding, tied to the output layer, is 97.7% of those), so its
# forward and backward cost ~1/20 per token (prompts come out ~1.6x longer in tokens).
# For tests where the real vocabulary is not the point: a comparison's runs, a benchmark's
# smoke run, a pipeline's plumbing. The golden updates keep the real tokenizer.
SMALL_VOCAB = 1024


@pytest.fixture(scope="session")
def small_tokenizer(tmp_path_factory, tokenizer):
    """`tokenizer` cut to its first SMALL_VOCAB ids (see above). Shared: do not mutate it."""
    import json

    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("small-tokenizer")
    tokenizer.save_pretrained(path)
    spec = json.loads((path / "tokenizer.json").read_text())
    vocab = {s: i for s, i in spec["model"]["vocab"].items() if i < SMALL_VOCAB}
    spec["model"]["vocab"] = vocab
    spec["model"]["merges"] = [m for m in spec["model"]["merges"]
                               if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    (path / "tokenizer.json").write_text(json.dumps(spec))
    small = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    assert len(small) == SMALL_VOCAB and small.pad_token_id == small.eos_token_id == tokenizer.eos_token_id
    return small


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory, small_tokenizer):
    """Like `tiny_model_dir`, with the small-vocabulary tokenizer and a tiny Llama sized to
    it (seed 0). Read only."""
    path = tmp_path_factory.mktemp("small-model")
    models.tiny_llama(small_tokenizer).save_pretrained(path)
    small_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def small_prepared_dir(tmp_path_factory, small_model_dir):
    """Where `exercise_settings(..., model=small_model_dir, workdir=small_prepared_dir)` puts
    what a method needs made first (RFPO's frozen critic): made once per session and reused
    (`exercise._prepare_rfpo` keeps a critic whose critic.json exists, whatever model it was
    trained for: so one such directory per model). Read only."""
    return tmp_path_factory.mktemp("small-prepared")
