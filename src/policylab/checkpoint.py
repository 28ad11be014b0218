"""Checkpoints: safetensors weights + the full training state, written atomically.

Layout of a run directory's checkpoints:

    checkpoints/step_000010/model.safetensors   policy weights (and critic.safetensors)
    checkpoints/step_000010/state.pt            optimizer, scheduler, every RNG, data position,
                                                controllers, policy version, step
    checkpoints/LATEST                          name of the newest complete checkpoint

A checkpoint is written into a temporary directory, flushed, then renamed into place;
LATEST is replaced atomically only after that. An interrupted write (kill -9, full disk)
therefore leaves at most a stray `.tmp-*` directory, never a corrupt latest checkpoint.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file


def rng_state() -> dict:
    """Every global RNG the run touches: python, numpy, torch CPU."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _state_dict_for_save(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # tied weights (lm_head = embed_tokens) share storage: safetensors refuses shared
    # tensors, so store each storage once and let load_state_dict(strict=False) re-tie.
    seen: dict[int, str] = {}
    out = {}
    for name, t in model.state_dict().items():
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen[key] = name
        out[name] = t.detach().contiguous().clone()
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Path, step: int, models: dict[str, torch.nn.Module], state: dict, keep: int = 2) -> Path:
    """Write checkpoint `step` atomically and point LATEST at it; prune to `keep` newest."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = root / name
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
    try:
        for key, model in models.items():
            save_file(_state_dict_for_save(model), str(tmp / f"{key}.safetensors"))
        torch.save(state, tmp / "state.pt")
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        latest_tmp = root / ".LATEST.tmp"
        latest_tmp.write_text(name + "\n")
        with open(latest_tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(latest_tmp, root / "LATEST")
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    ckpts = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
    for old in ckpts[:-keep] if keep > 0 else []:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None. Stray temporary directories are ignored."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "LATEST"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    if not (path / "state.pt").is_file():
        raise FileNotFoundError(f"{pointer} names {path.name}, which is incomplete or missing")
    return path


def load_checkpoint(path: Path, models: dict[str, torch.nn.Module]) -> dict:
    """Load weights into `models` (in place) and return the saved training state."""
    for key, model in models.items():
        f = Path(path) / f"{key}.safetensors"
        if not f.is_file():
            raise FileNotFoundError(f"checkpoint {path} has no {f.name}")
        missing, unexpected = model.load_state_dict(load_file(str(f)), strict=False)
        tied = {n for n in missing if "lm_head" in n}
        if set(missing) - tied or unexpected:
            raise RuntimeError(f"checkpoint {f} does not match the model: missing {missing}, unexpected {unexpected}")
        if tied and hasattr(model, "tie_weights"):
            model.tie_weights()
    return torch.load(Path(path) / "state.pt", weights_only=False)
