"""Checkpoints of the older pickle format (state.pt): converted only on the user's word,
since unpickling a file can run any code it contains."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from policylab.errors import CheckpointError
from policylab.trainer import safestate
from policylab.trainer.checkpoint import LEGACY_STATE, MANIFEST_NAME, TRUST_FLAG, checkpoint_step, list_checkpoints, \
    write_manifest


def convert_legacy(run_dir: Path, *, trust: bool) -> list[Path]:
    """Rewrite every old-format checkpoint of the run (state.pt, a pickle) as state.json +
    state.safetensors. Unpickling can run arbitrary code, so this needs `trust=True` (the
    CLI's --i-trust-this-file). The state.pt files are left in place (no longer read)."""
    run_dir = Path(run_dir)
    todo = [p for p in list_checkpoints(run_dir)
            if (p / LEGACY_STATE).is_file() and not (p / safestate.JSON_NAME).exists()]
    if not todo:
        raise CheckpointError(f"{run_dir} has no old-format checkpoint to convert")
    if not trust:
        raise CheckpointError(
            f"converting {', '.join(p.name for p in todo)} unpickles {LEGACY_STATE}, which runs any code the file "
            f"contains; pass {TRUST_FLAG} only if you trust where {run_dir} came from"
        )
    done = []
    for p in todo:
        try:
            state = torch.load(p / LEGACY_STATE, weights_only=False)
        except Exception as exc:  # a damaged pickle: name the file
            raise CheckpointError(f"{p / LEGACY_STATE} cannot be read ({type(exc).__name__}: {exc})") from None
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=p))
        try:
            written = safestate.save_state(state, tmp)
            for f in written:
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            os.replace(tmp / safestate.TENSORS_NAME, p / safestate.TENSORS_NAME)
            os.replace(tmp / safestate.JSON_NAME, p / safestate.JSON_NAME)  # last: marks the step converted
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _rewrite_manifest(p)
        done.append(p)
    return done


def _rewrite_manifest(p: Path) -> None:
    """The converted checkpoint's manifest, over its files as they are now (the user
    trusted them); the config it records, if any, is kept."""
    import json

    config = None
    try:
        old = json.loads((p / MANIFEST_NAME).read_text())
        config = old.get("config") if isinstance(old, dict) else None
    except (OSError, ValueError):
        pass
    write_manifest(p, checkpoint_step(p), config)
