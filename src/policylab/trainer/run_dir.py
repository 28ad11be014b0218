"""The run directory of a fresh run: what a run writes there, and the refusal of a
directory that would lose a previous run's files."""

from __future__ import annotations

from pathlib import Path

from policylab.trainer.config import RunConfig
from policylab.errors import RunDirError


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
