"""What a checkpoint was when it was saved, and the checks that it still is: the manifest
(`manifest.json`: every file's size and sha256, each tensor's dtype and shape, the digest of
the configuration the weights depend on), the fields of `state.json`, and the dtypes of the
stored tensors against the model. `verify_manifest` refuses any mismatch, naming the field."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from policylab.errors import CheckpointError
from policylab.trainer import safestate

LEGACY_STATE = "state.pt"  # the pickle format of early runs (converted by trainer.legacy)

# ----------------------------------------------------------------------------- manifest
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "policylab-manifest/1"


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tensor_table(path: Path) -> dict[str, list]:
    """{tensor name: [dtype, shape]} from a safetensors file's header (no tensor is read)."""
    import json
    import struct

    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{path} is truncated (no safetensors header)")
        (n,) = struct.unpack("<Q", head)
        if n > 100 << 20:
            raise CheckpointError(f"{path}: its safetensors header claims {n} bytes")
        try:
            header = json.loads(fh.read(n))
        except ValueError:
            raise CheckpointError(f"{path}: its safetensors header is not valid JSON") from None
    return {k: [v.get("dtype"), v.get("shape")] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def config_digest(config: dict) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def write_manifest(ckpt_dir: Path, step: int, config: dict | None) -> Path:
    """manifest.json of the checkpoint being written in `ckpt_dir`: the step, each file's
    bytes and sha256, each safetensors file's tensors (dtype, shape), the config the
    weights belong to and its sha256."""
    import json

    files = {}
    for f in sorted(ckpt_dir.iterdir()):
        if f.is_file() and f.name not in (MANIFEST_NAME, LEGACY_STATE):  # state.pt is never read again
            files[f.name] = {"bytes": f.stat().st_size, "sha256": _sha256(f)}
            if f.name.endswith(".safetensors"):
                files[f.name]["tensors"] = _tensor_table(f)
    doc = {"format": MANIFEST_FORMAT, "step": int(step), "files": files}
    if config is not None:
        doc["config"] = config
        doc["config_sha256"] = config_digest(config)
    path = ckpt_dir / MANIFEST_NAME
    path.write_text(json.dumps(doc, indent=1, default=str))
    return path


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint directory's name says (step_000012 -> 12)."""
    return int(Path(path).name[len("step_"):])


def verify_manifest(path: Path, config: dict | None = None) -> None:
    """Refuse (CheckpointError naming the field) a checkpoint that is not what was saved:
    a tensor whose dtype or shape differs from the manifest, a file whose size or sha256
    differs, a manifest step other than the directory's, or (given `config`, the settings
    of the run resuming it) a setting other than the one the weights were trained with.
    A checkpoint written before manifests existed is accepted with a warning."""
    import json
    import warnings

    from policylab.errors import PolicylabWarning

    path = Path(path)
    mpath = path / MANIFEST_NAME
    if not mpath.exists():
        warnings.warn(f"{path} has no {MANIFEST_NAME} (written by an older policylab): its files and config cannot be "
                      "checked against what was saved; tensor dtypes are still checked against the model",
                      PolicylabWarning, stacklevel=2)
        return
    from policylab.trainer.run_paths import read_bytes

    try:
        doc = json.loads(read_bytes(mpath).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"{mpath} is not valid JSON (damaged?)") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT or not isinstance(doc.get("files"), dict):
        raise CheckpointError(f"{mpath} is not a policylab checkpoint manifest ({MANIFEST_FORMAT})")
    if doc.get("step") != checkpoint_step(path):
        raise CheckpointError(f"{mpath} records step {doc.get('step')!r}, but the directory is {path.name}")
    for name, rec in doc["files"].items():
        f = path / name
        if not STEP_FILE_RE.fullmatch(str(name)) or not isinstance(rec, dict):
            raise CheckpointError(f"{mpath} lists {name!r}, which is not a checkpoint file")
        if f.is_symlink() or not f.is_file():
            raise CheckpointError(f"{f} is listed in {MANIFEST_NAME} but is missing (or not a plain file)")
        if "tensors" in rec:
            now = _tensor_table(f)
            for t, (dtype, shape) in rec["tensors"].items():
                if t not in now:
                    raise CheckpointError(f"{f}: tensor `{t}` is missing (it was saved)")
                if now[t][0] != dtype:
                    raise CheckpointError(f"{f}: tensor `{t}` is {now[t][0]}, but it was saved as {dtype} (edited "
                                          "after saving?)")
                if list(now[t][1]) != list(shape):
                    raise CheckpointError(f"{f}: tensor `{t}` has shape {now[t][1]}, but it was saved with {shape}")
            extra = sorted(set(now) - set(rec["tensors"]))
            if extra:
                raise CheckpointError(f"{f}: tensor `{extra[0]}` was not in the checkpoint when it was saved")
        size = f.stat().st_size
        if size != rec.get("bytes") or _sha256(f) != rec.get("sha256"):
            if name == safestate.JSON_NAME:  # name the field that changed, when it is one the state must have
                try:
                    check_state(safestate.load_state(path), path)
                except safestate.StateFormatError:
                    pass
        if size != rec.get("bytes"):
            raise CheckpointError(f"{f} is {size} bytes, but it was saved with {rec.get('bytes')} (changed after saving)")
        if _sha256(f) != rec.get("sha256"):
            raise CheckpointError(f"{f}: its sha256 differs from the one saved in {MANIFEST_NAME} (changed after saving)")
    saved = doc.get("config")
    if config is not None and isinstance(saved, dict):
        for key in sorted(set(saved) | set(config)):
            if saved.get(key) != config.get(key):
                raise CheckpointError(
                    f"the run's config.yaml has {key}={config.get(key)!r}, but checkpoint {path.name} was saved by a run "
                    f"with {key}={saved.get(key)!r}: these weights belong to another configuration (config.yaml edited "
                    "after the run?)")


STEP_FILE_RE = re.compile(r"[A-Za-z0-9_]+\.(safetensors|json)")

# the fields every saved training state has, and their types (checked before any is used)
STATE_FIELDS = {"step": int, "policy_version": int, "prompt_counter": int, "optimizer": dict, "scheduler": dict,
                "rng": dict, "task": dict}


def check_state(state, path: Path) -> None:
    """Refuse (CheckpointError naming the field) a training state that lacks a field, has
    one of another type, a negative counter, or a step other than its directory's."""
    path = Path(path)
    where = path / safestate.JSON_NAME
    if not isinstance(state, dict):
        raise CheckpointError(f"{where} does not hold a state mapping")
    for key, typ in STATE_FIELDS.items():
        if key not in state:
            raise CheckpointError(f"{where} has no `{key}` (every checkpoint records it)")
        v = state[key]
        if not isinstance(v, typ) or isinstance(v, bool):
            raise CheckpointError(f"{where}: `{key}` must be {typ.__name__}, got {v!r}"[:300])
        if typ is int and v < 0:
            raise CheckpointError(f"{where}: `{key}` is {v}, a counter cannot be negative")
    if state["step"] != checkpoint_step(path):
        raise CheckpointError(f"{where}: `step` is {state['step']}, but the checkpoint is {path.name}")


def check_tensor_dtypes(f: Path, weights: dict, model: torch.nn.Module) -> None:
    """Every saved tensor has the dtype of the model's tensor it is loaded into (a copy
    would silently convert, e.g. int32 bits read as 1.07e9)."""
    own = model.state_dict()
    for name, t in weights.items():
        if name in own and own[name].dtype != t.dtype:
            raise CheckpointError(f"{f}: tensor `{name}` is {t.dtype}, the model's is {own[name].dtype}; a checkpoint "
                                  "is loaded only in the dtype it was trained in")
