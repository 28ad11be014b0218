"""Resuming a run: which settings a resume may change, the settings a checkpoint's weights
depend on, and a received run's config read behind the import trust gate (`resume`
itself, which continues the run, is in `trainer.run`)."""

from __future__ import annotations

from pathlib import Path

from policylab.trainer.config import RunConfig
from policylab.errors import ConfigError
from policylab.trainer.report import print_note
from policylab.trainer.support import load_run_config


# keys `policylab resume --set` may change: none alters the method, the data stream or
# the model (train.micro_batch_size and train.shared_prefix give the same update up to
# float rounding, train.recompute_elementwise bit for bit); every other key is refused
RESUME_CHANGEABLE = ("train.steps", "train.micro_batch_size", "train.shared_prefix", "train.recompute_elementwise",
                     "eval.*", "log.*", "threads", "keep_freed_memory")


def resume_changes(cfg: RunConfig, overrides) -> tuple[RunConfig, dict]:
    """(the config with `overrides` applied, {key: (recorded, new)}) for `policylab resume
    --set`. Only keys in RESUME_CHANGEABLE may differ from what the run recorded; any other
    change (it would alter the method, the data stream or the model) is a ConfigError."""
    import copy

    from policylab.trainer.config import apply_overrides, validate

    new = apply_overrides(copy.deepcopy(cfg), overrides)
    validate(new)
    recorded = copy.deepcopy(cfg)
    validate(recorded)  # both sides with `validate`'s resolutions (train.dtype auto -> the dtype it resolved to)
    old_flat, new_flat = _flatten(recorded.to_dict()), _flatten(new.to_dict())
    changed = {k: (old_flat.get(k), new_flat.get(k)) for k in sorted(set(old_flat) | set(new_flat))
               if old_flat.get(k) != new_flat.get(k)}

    def allowed(key: str) -> bool:
        return any(key == a or (a.endswith(".*") and key.startswith(a[:-1])) for a in RESUME_CHANGEABLE)

    refused = [k for k in changed if not allowed(k)]
    if refused:
        listed = ", ".join(f"{k} ({changed[k][0]!r} -> {changed[k][1]!r})" for k in refused)
        raise ConfigError(
            f"resume cannot change {listed}: the run's config.yaml records another value, and changing it would "
            f"train a different method, data stream or model than the checkpoints hold. Resume accepts changes "
            f"to {', '.join(RESUME_CHANGEABLE)}; for anything else start a new run (`policylab train`)"
        )
    return new, changed


def identity_config(cfg: RunConfig) -> dict:
    """The settings a checkpoint's weights depend on: the flattened config without the keys
    a resume may change (RESUME_CHANGEABLE) and without run_dir (a run may be moved).
    Recorded in every checkpoint's manifest; a resume whose config.yaml differs in any of
    them is refused (`checkpoint.verify_manifest`)."""
    def changeable(key: str) -> bool:
        return key == "run_dir" or any(key == a or (a.endswith(".*") and key.startswith(a[:-1]))
                                       for a in RESUME_CHANGEABLE)

    return {k: v for k, v in _flatten(cfg.to_dict()).items() if not changeable(k)}


def _flatten(tree: dict, prefix: str = "") -> dict:
    """{"train.steps": 20, "method_params.kl_coef": 0.0, ...} of a nested config dict."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_received_run(run_dir: str | Path, *, allow_imports: bool = False) -> RunConfig:
    """The config of a run directory (possibly from someone else): the modules it would
    import are named first, and any outside policylab refused unless `allow_imports`."""
    from policylab.trainer.trust import check_imports

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    check_imports(cfg, str(run_dir / "config.yaml"), allow=allow_imports, say=print_note)
    return cfg
