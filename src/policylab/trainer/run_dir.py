"""The run directory: what a run writes there, the refusal of a directory that would lose
a previous run's files, the check that it can be written with room for a checkpoint, and
the clean-up of what an interrupted checkpoint write left."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from policylab.trainer.config import RunConfig
from policylab.errors import RunDirError
from policylab.trainer.checkpoint import checkpoints_root, refuse_link


# files and directories a run writes into its run_dir (a directory holding any of them
# holds a previous run)
RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.jsonl.partial", "report.json", "plots", "tensorboard",
             "checkpoints")


def check_new_run_dir(cfg: RunConfig, *, overwrite: bool = False, config_path: str | Path | None = None) -> list[str]:
    """Refuse a run_dir a fresh run must not write into: the current directory, a file, or
    a directory holding a previous run's files (unless `overwrite`; never the config file
    being trained from). Returns the previous run's entries `overwrite` will remove."""
    run_dir = Path(cfg.run_dir)
    if not str(cfg.run_dir).strip():
        raise RunDirError("run_dir is empty: give the run a directory of its own (--set run_dir=runs/NAME)")
    if run_dir.resolve() == Path.cwd().resolve():
        raise RunDirError(
            f"run_dir {cfg.run_dir!r} is the current directory: a run writes config.yaml, metrics.jsonl, report.json, "
            "plots/ and checkpoints/ into its run_dir; give it a directory of its own (--set run_dir=runs/NAME)"
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run_dir {run_dir} exists and is not a directory")

    def holds(name: str) -> bool:
        p = run_dir / name
        if p.is_dir() and not p.is_symlink():  # an empty directory holds nothing to lose
            return any(q.is_file() or q.is_symlink() for q in p.rglob("*"))
        return p.exists() or p.is_symlink()

    found = [n for n in RUN_FILES if holds(n)]
    if config_path is not None and (run_dir / "config.yaml").exists():
        if Path(config_path).resolve() == (run_dir / "config.yaml").resolve():
            raise RunDirError(
                f"{config_path} is the config file you train from and also the config.yaml of run_dir {run_dir}: "
                "training would overwrite it. Copy it out of the run directory (or choose another run_dir)"
            )
    if found and not overwrite:
        has_ckpt = (run_dir / "checkpoints" / "LATEST").exists()
        cont = f"use `policylab resume {run_dir}` to continue it, " if has_ckpt else ""
        raise RunDirError(
            f"{run_dir} already holds a run ({', '.join(found)}); {cont}choose another run_dir, or pass --overwrite "
            "to replace it (nothing was changed)"
        )
    return found


def remove_previous(run_dir: Path, names: list[str]) -> None:
    import shutil

    for n in names:
        p = run_dir / n
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


# --------------------------------------------------------------------------- housekeeping
def clean_stray(run_dir: Path) -> list[str]:
    """Remove what an interrupted checkpoint write left behind (`.tmp-step_*` directories,
    `.LATEST.tmp`); return the names removed."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    removed = []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".tmp-step_") and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
        elif p.name == ".LATEST.tmp" and p.is_file():
            p.unlink()
            removed.append(p.name)
    return removed


def checkpoint_bytes(models: dict[str, torch.nn.Module], optimizers=()) -> int:
    """Bytes one checkpoint takes: every model's (deduplicated) tensors, plus the optimizer
    state the optimizers will hold (AdamW: two moments per trainable parameter)."""
    total = 0
    for model in models.values():
        seen = set()
        for t in model.state_dict().values():
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                total += 2 * p.numel() * p.element_size() + 8
    return total


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def preflight(run_dir: Path, need_bytes: int | None = None) -> None:
    """Before step 1: the run directory and its checkpoints/ can be written (a probe file is
    created and removed) and, given `need_bytes`, the disk has room for one checkpoint.
    Raises RunDirError with what to change."""
    run_dir = Path(run_dir)
    root = checkpoints_root(run_dir)
    refuse_link(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=root)
        os.close(fd)
        os.unlink(probe)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=run_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise RunDirError(
            f"run directory {run_dir} cannot be written ({why}: {exc.filename or root}); nothing was trained. "
            "Choose a writable run_dir (--set run_dir=...)"
        ) from None
    if need_bytes:
        free = _free_bytes(root)
        if free < need_bytes:
            raise RunDirError(
                f"not enough disk space for a checkpoint in {root}: one needs about {need_bytes / 2**20:.0f} MiB, "
                f"{free / 2**20:.0f} MiB are free; nothing was trained. Free some space or choose another run_dir"
            )
