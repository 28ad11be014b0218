"""Checkpoints: safetensors weights + the full training state, written atomically, read
without running code.

Layout of a run directory's checkpoints:

    checkpoints/step_000010/model.safetensors   policy weights (and critic.safetensors)
    checkpoints/step_000010/state.json          optimizer, scheduler, every RNG, data position,
    checkpoints/step_000010/state.safetensors   controllers, stale batches, policy version, step
                                                (policylab.trainer.safestate: JSON + tensors, no pickle)
    checkpoints/LATEST                          name of the newest complete checkpoint

A checkpoint is written into a temporary directory, flushed, then renamed into place;
LATEST is replaced atomically only after that. An interrupted write (kill -9, Ctrl-C, full
disk) therefore leaves at most a stray `.tmp-*` directory (removed by `clean_stray` at the
next start), never a corrupt latest checkpoint. Weights that are not finite are never
written: `save_checkpoint` refuses them and the previous checkpoint stays the latest.

Reading is confined to the run: LATEST must name a `step_N` directory directly inside the
run's own `checkpoints/` (no absolute path, no `..`, no symlink out of it). A checkpoint
of the older pickle format (`state.pt`) is refused with the command that converts it
(`policylab convert-checkpoint RUN_DIR --i-trust-this-file`, `convert_legacy`), since
unpickling a file can run arbitrary code. A damaged file (truncated safetensors, broken
JSON) is named in the error together with the newest intact earlier checkpoint, which
`policylab resume RUN_DIR --from step_N` can continue from.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from policylab.errors import CheckpointError, NonFiniteError
from policylab.trainer import safestate
from policylab.trainer.manifest import (  # noqa: F401  (re-exported: a checkpoint's manifest and state checks)
    LEGACY_STATE,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    STATE_FIELDS,
    STEP_FILE_RE,
    check_state,
    check_tensor_dtypes,
    checkpoint_step,
    config_digest,
    verify_manifest,
    write_manifest,
)

STEP_RE = re.compile(r"step_[0-9]{1,12}")
TRUST_FLAG = "--i-trust-this-file"


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


def step_name(step: int) -> str:
    return f"step_{step:06d}"


def _no_space(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text


def _not_writable(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        return True
    text = str(exc)
    return "Permission denied" in text or "Read-only file system" in text


def first_nonfinite_weight(models: dict[str, torch.nn.Module]) -> str | None:
    """`key weight name` of the first tensor holding NaN or +-inf, or None."""
    for key, model in models.items():
        for name, t in model.state_dict().items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"{key} weight `{name}`"
    return None


DIVERGED_ADVICE = "the updates diverged: lower train.lr, keep train.grad_clip > 0 and train.skip_nonfinite on"


def check_finite_weights(models: dict[str, torch.nn.Module], what: str) -> None:
    """Raise NonFiniteError naming the first parameter that holds NaN or +-inf."""
    bad = first_nonfinite_weight(models)
    if bad:
        raise NonFiniteError(f"refusing to write {what}: {bad} holds NaN or inf ({DIVERGED_ADVICE})")


def save_checkpoint(run_dir: Path, step: int, models: dict[str, torch.nn.Module], state: dict, keep: int = 2,
                    config: dict | None = None) -> Path:
    """Write checkpoint `step` atomically and point LATEST at it; prune to `keep` newest.
    Its manifest.json records every file's size and sha256, every tensor's dtype and
    shape, and `config` (the settings the weights depend on; see `verify_manifest`).

    Refused (CheckpointError / NonFiniteError, LATEST unchanged, no stray directory): weights
    with NaN or inf, a full disk, a directory that cannot be written."""
    root = Path(run_dir) / "checkpoints"
    refuse_link(root)
    name = step_name(step)
    previous = latest_name_or_none(run_dir)
    kept = f"the previous checkpoint {previous} is intact (LATEST unchanged)" if previous else "no earlier checkpoint exists"
    try:
        check_finite_weights(models, f"checkpoint {name} in {root}")
    except NonFiniteError as exc:
        raise NonFiniteError(f"{exc}; {kept}") from None
    tmp = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        final = root / name
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
        for key, model in models.items():
            from safetensors.torch import save_file

            save_file(_state_dict_for_save(model), str(tmp / f"{key}.safetensors"))
        safestate.save_state(state, tmp)
        write_manifest(tmp, step, config)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        from policylab.trainer.run_paths import replace_file

        replace_file(root / "LATEST", name + "\n")  # a fresh temporary file renamed over LATEST
        _fsync_dir(root)
    except BaseException as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception) and _no_space(exc):
            raise CheckpointError(
                f"no space left on device while writing checkpoint {name} in {root}; {kept}. "
                f"Free some space, then `policylab resume {run_dir}`"
            ) from exc
        if isinstance(exc, Exception) and _not_writable(exc):
            raise CheckpointError(f"cannot write checkpoint {name} in {root} ({exc}); {kept}") from exc
        raise
    ckpts = sorted(p for p in root.iterdir() if p.is_dir() and STEP_RE.fullmatch(p.name))
    for old in ckpts[:-keep] if keep > 0 else []:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


# ------------------------------------------------------------------------------ reading
def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _inside(root: Path, name: str) -> Path:
    """root/name if `name` is a step directory directly inside `root`, else CheckpointError."""
    if not STEP_RE.fullmatch(name):
        raise CheckpointError(
            f"{root / 'LATEST'} names {name!r}, which is not a checkpoint of this run (only a step_N "
            f"directory inside {root} is ever followed)"
        )
    path = root / name
    if path.is_symlink() or (path.exists() and path.resolve().parent != root.resolve()):
        raise CheckpointError(f"{path} is a link out of {root}; a checkpoint must be a directory inside the run")
    return path


def refuse_link(root: Path) -> None:
    if root.is_symlink():
        raise CheckpointError(f"{root} is a link; a run's checkpoints/ must be a directory inside the run")


def latest_name_or_none(run_dir: Path) -> str | None:
    pointer = checkpoints_root(run_dir) / "LATEST"
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if STEP_RE.fullmatch(name) else None


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run's step directories (by name, oldest first); links out of the run are left out."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if STEP_RE.fullmatch(p.name) and p.is_dir() and not p.is_symlink())


def _legacy_error(run_dir: Path, path: Path) -> CheckpointError:
    return CheckpointError(
        f"{path} holds {LEGACY_STATE}, the older pickle-based checkpoint format, which can run arbitrary code when "
        f"loaded; policylab no longer reads it. If you trust where this run came from, convert it once with "
        f"`policylab convert-checkpoint {run_dir} {TRUST_FLAG}`"
    )


def verify_checkpoint(path: Path, model_keys=("model",)) -> None:
    """Check that every file of the checkpoint `path` is present and readable (safetensors
    headers cover their files, state.json parses); raise CheckpointError naming the file."""
    path = Path(path)
    from safetensors import SafetensorError, safe_open

    if not (path / safestate.JSON_NAME).exists() and (path / LEGACY_STATE).exists():
        raise CheckpointError(f"{path / LEGACY_STATE}: old pickle format")
    names = [f"{k}.safetensors" for k in model_keys] + [safestate.TENSORS_NAME]
    for n in names + [safestate.JSON_NAME]:
        f = path / n
        if f.is_symlink():
            raise CheckpointError(f"{f} is a link; a checkpoint file must be a plain file")
        if not f.is_file():
            raise CheckpointError(f"{f} is missing")
    for n in names:
        try:
            with safe_open(str(path / n), "pt"):
                pass
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path / n} is truncated or damaged ({exc})") from None
    try:
        safestate.read_document(path / safestate.JSON_NAME)
    except safestate.StateFormatError as exc:
        raise CheckpointError(str(exc)) from None


def _intact_before(run_dir: Path, path: Path, model_keys) -> str | None:
    for p in reversed(list_checkpoints(run_dir)):
        if p.name >= path.name:
            continue
        try:
            verify_checkpoint(p, model_keys)
            return p.name
        except CheckpointError:
            continue
    return None


def damaged(run_dir: Path, path: Path, problem: str, model_keys=("model",)) -> CheckpointError:
    """The error for a damaged checkpoint: the problem, and the intact one to fall back to."""
    prev = _intact_before(run_dir, path, model_keys)
    offer = (f"the previous checkpoint {prev} is intact: `policylab resume {run_dir} --from {prev}` continues from it "
             f"(`policylab eval {run_dir} --from {prev}` evaluates it)") if prev else "no earlier intact checkpoint exists"
    return CheckpointError(f"checkpoint {path.name} is damaged: {problem}; {offer}")


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None when the run has none. Stray temporary
    directories are ignored. LATEST must name a step directory inside the run's
    `checkpoints/`; an old-format checkpoint raises CheckpointError with the command that
    converts it."""
    root = checkpoints_root(run_dir)
    refuse_link(root)
    pointer = root / "LATEST"
    if not pointer.is_file():
        return None
    try:
        name = pointer.read_text().strip()
    except UnicodeDecodeError:
        raise CheckpointError(f"{pointer} is not a checkpoint name (not text)") from None
    path = _inside(root, name)
    if not path.is_dir():
        raise damaged(run_dir, path, f"{pointer} names {name}, which is missing")
    if not (path / safestate.JSON_NAME).exists() and (path / LEGACY_STATE).is_file():
        raise _legacy_error(run_dir, path)
    return path


def checkpoint_from(run_dir: Path, spec: str) -> Path:
    """The checkpoint `--from SPEC` names: step_000004, step_4 or 4 (inside the run only)."""
    root = checkpoints_root(run_dir)
    s = str(spec).strip()
    digits = s[5:] if s.startswith("step_") else s
    if not digits.isdigit() or len(digits) > 12:
        raise CheckpointError(f"--from {spec!r}: give a checkpoint as step_N or N (e.g. --from step_000004)")
    path = _inside(root, step_name(int(digits)))
    if not path.is_dir():
        have = ", ".join(p.name for p in list_checkpoints(run_dir)) or "none"
        raise CheckpointError(f"--from {spec}: {path} does not exist (checkpoints of this run: {have})")
    if not (path / safestate.JSON_NAME).exists() and (path / LEGACY_STATE).is_file():
        raise _legacy_error(run_dir, path)
    return path


def load_checkpoint(path: Path, models: dict[str, torch.nn.Module], run_dir: Path | None = None) -> dict:
    """Load weights into `models` (in place) and return the saved training state. Every
    file is checked before anything is loaded; a damaged one raises CheckpointError naming
    it (and, given `run_dir`, the intact earlier checkpoint)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    run_dir = Path(run_dir) if run_dir is not None else path.parent.parent
    keys = tuple(models)
    try:
        verify_checkpoint(path, keys)
    except CheckpointError as exc:
        if (path / LEGACY_STATE).exists() and not (path / safestate.JSON_NAME).exists():
            raise _legacy_error(run_dir, path) from None
        raise damaged(run_dir, path, str(exc), keys) from None
    try:
        state = safestate.load_state(path)
        check_state(state, path)
    except (safestate.StateFormatError, CheckpointError) as exc:
        raise damaged(run_dir, path, str(exc), keys) from None
    for key, model in models.items():
        f = path / f"{key}.safetensors"
        try:
            weights = load_file(str(f))
        except (SafetensorError, OSError) as exc:
            raise damaged(run_dir, path, f"{f} is truncated or damaged ({exc})", keys) from None
        try:
            check_tensor_dtypes(f, weights, model)
        except CheckpointError as exc:
            raise damaged(run_dir, path, str(exc), keys) from None
        try:
            missing, unexpected = model.load_state_dict(weights, strict=False)
        except RuntimeError as exc:  # shapes differ
            raise CheckpointError(f"checkpoint {f} does not match the model: {str(exc).splitlines()[0]}") from None
        tied = {n for n in missing if "lm_head" in n}
        if set(missing) - tied or unexpected:
            raise CheckpointError(f"checkpoint {f} does not match the model: missing {missing}, unexpected {unexpected}")
        if tied and hasattr(model, "tie_weights"):
            model.tie_weights()
    if not isinstance(state, dict):
        raise damaged(run_dir, path, f"{path / safestate.JSON_NAME} does not hold a state mapping", keys)
    return state
