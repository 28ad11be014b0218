"""The value rules of a run configuration: one typed range per number (`FIELD_RULES`,
checked by `check_ranges` before any work and before any deletion), and the checks of the
values that name things on this machine: a run directory (`check_path_value`), a device
(`check_device`) and a model (`check_model_value`, which never unpickles weights). Each
refusal is one `ConfigError` naming the key and the value."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from policylab.errors import ConfigError

INT64_MAX = 2**63 - 1

SEED_MAX = 2**32 - 1  # numpy's seed range (the run seeds python, numpy and torch with one value)


@dataclass(frozen=True)
class Range:
    """The values a number of a config accepts: `lo` / `hi` bounds (None: unbounded; every
    integer is also bounded by the int64 range), each inclusive unless `lo_open` /
    `hi_open`; `integer` refuses a non-integer; for a list-valued key every element is
    checked and `length` fixes the number of elements. `why` says what the key means."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False
    length: int | None = None
    why: str = ""

    def describe(self) -> str:
        def f(x):
            return str(int(x)) if float(x).is_integer() else f"{x:g}"

        lo = None if self.lo is None else (f"> {f(self.lo)}" if self.lo_open else f">= {f(self.lo)}")
        hi = None if self.hi is None else (f"< {f(self.hi)}" if self.hi_open else f"<= {f(self.hi)}")
        if lo and hi:
            return f"in {'(' if self.lo_open else '['}{f(self.lo)}, {f(self.hi)}{')' if self.hi_open else ']'}"
        return lo or hi or "a number"

    def problem(self, key: str, value) -> str | None:
        """None when `value` is accepted, else the one-line reason naming `key` and `value`."""
        what = f" ({self.why})" if self.why else ""
        if self.length is not None or isinstance(value, (list, tuple)):
            items = list(value) if isinstance(value, (list, tuple)) else [value]
            if self.length is not None and len(items) != self.length:
                return f"{key} must be {self.length} numbers{what}, got {value!r}"
            for i, x in enumerate(items):
                bad = self.problem_one(key, x)
                if bad:
                    return f"{key} = {list(items)!r}: element {i} {bad}{what}"
            return None
        bad = self.problem_one(key, value)
        return f"{key} {bad}{what}" if bad else None

    def problem_one(self, key: str, x) -> str | None:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return f"must be a number, got {x!r}"
        if not math.isfinite(x):
            return f"is {x}: every number in a config must be finite"
        if self.integer and not (isinstance(x, int) or float(x).is_integer()):
            return f"must be an integer, got {x!r}"
        lo_bad = self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo)
        hi_bad = self.hi is not None and (x >= self.hi if self.hi_open else x > self.hi)
        if lo_bad or hi_bad:
            return f"must be {self.describe()}, got {x!r}"
        if self.integer and abs(int(x)) > INT64_MAX:
            return f"is {x}, beyond the 64-bit integer range"
        return None


def _int(lo=0, hi=None, why=""):
    return Range(lo=lo, hi=hi, integer=True, why=why)


def _pos(why=""):
    return Range(lo=0, lo_open=True, why=why)


def _nonneg(why=""):
    return Range(lo=0, why=why)


# every number of a run config and its accepted values; `validate` checks them all before
# anything else happens (tests/trainer/test_validation.py: every numeric field has a rule)
FIELD_RULES: dict[str, Range] = {
    "seed": _int(0, SEED_MAX, "seeds python, numpy and torch; numpy takes 0 .. 2**32-1"),
    "threads": _int(0, 4096, "torch intra-op threads; 0 = POLICYLAB_THREADS, else the cores available"),
    "rollout.prompts_per_step": _int(1), "rollout.group_size": _int(1), "rollout.max_new_tokens": _int(1),
    "rollout.temperature": _pos("log-prob ratios need a sampling distribution"),
    "rollout.top_p": Range(lo=0, hi=1, lo_open=True), "rollout.top_k": _int(0, why="0 = off"),
    "rollout.engine_quant_group": _int(0, why="0 = one scale per output row"),
    "rollout.max_refill_rounds": _int(0), "rollout.staleness": _int(0),
    "train.steps": _int(0), "train.lr": _nonneg("AdamW learning rate"),
    "train.weight_decay": _nonneg("AdamW weight decay"),
    "train.betas": Range(lo=0, hi=1, hi_open=True, length=2, why="AdamW (beta1, beta2), each in [0, 1)"),
    "train.warmup_steps": _int(0, why="linear warmup in optimizer steps"),
    "train.grad_clip": _nonneg("0 = off"), "train.epochs": _int(1), "train.minibatches": _int(1),
    "train.micro_batch_size": _int(1), "train.lora_rank": _int(0, why="0 = train all weights, > 0 = LoRA rank"),
    "train.lora_alpha": _pos("LoRA scaling numerator"), "train.critic_lr": _nonneg(),
    "train.budget_seconds": _nonneg("0 = no time budget"), "train.budget_tokens": _int(0, why="0 = no token budget"),
    "eval.n": _int(0, why="held-out prompts; 0 = no evaluation"), "eval.samples": _int(1),
    "eval.k": _int(1, why="pass@k budgets"), "eval.temperature": _pos("evaluation samples at this temperature"),
    "eval.max_new_tokens": _int(1), "eval.batch_size": _int(1, why="prompts per generate call"),
    "eval.every": _int(0, why="0 = off"),
    "log.checkpoint_every": _int(0, why="0 = only at the end"), "log.keep_checkpoints": _int(0, why="0 = keep all"),
    "log.plot_every": _int(0, why="0 = only at the end"),
    "task.digits": _int(1, 18), "task.heldout_fraction": Range(lo=0, hi=1, lo_open=True, hi_open=True),
    "task.split_seed": _int(0, SEED_MAX), "task.sandbox_cpu_seconds": _pos(), "task.sandbox_wall_seconds": _pos(),
    "task.sandbox_memory_mb": _int(64), "task.mix": _nonneg("proportions"),
}


def _get(cfg, key: str):
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def check_ranges(cfg) -> None:
    """Every FIELD_RULES value of `cfg` (a `trainer.config.RunConfig`) in its range; the first one that is not is a
    ConfigError naming the key, the value and what is accepted."""
    for key, rule in FIELD_RULES.items():
        bad = rule.problem(key, _get(cfg, key))
        if bad:
            raise ConfigError(bad)


NAME_MAX, PATH_MAX = 255, 4096


def check_path_value(key: str, value: str, *, what: str = "directory") -> str:
    """A directory a config names (run_dir, a pipeline's run_dir): `~` expanded, refused when
    empty, the filesystem root, the home directory itself, or longer than the filesystem
    takes (a component over 255 bytes, the path over 4096). Returns the expanded path."""
    import os

    text = str(value)
    if not text.strip():
        raise ConfigError(f"{key} is empty: give the {what} the run writes to (e.g. --set {key}=runs/my-run)")
    if "\0" in text:
        raise ConfigError(f"{key} {text!r} contains a NUL byte")
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        raise ConfigError(f"{key} {text!r}: the user {expanded.split('/')[0]!r} does not exist (write the path out)")
    p = Path(expanded)
    resolved = p.resolve()
    if resolved == Path(resolved.anchor):
        raise ConfigError(f"{key} {text!r} is the filesystem root: give the run a {what} of its own "
                          f"(e.g. --set {key}=runs/my-run)")
    if resolved == Path.home().resolve():
        raise ConfigError(f"{key} {text!r} is your home directory: give the run a {what} of its own "
                          f"(e.g. {key}=~/runs/my-run)")
    long = [c for c in p.parts if len(c.encode()) > NAME_MAX]
    if long or len(str(resolved).encode()) > PATH_MAX:
        what_long = (f"its component {long[0][:40]!r}... is {len(long[0].encode())} bytes (the limit is {NAME_MAX})"
                     if long else f"it is {len(str(resolved).encode())} bytes (the limit is {PATH_MAX})")
        raise ConfigError(f"{key} is too long for the filesystem: {what_long}")
    return expanded


def check_device(key: str, name: str) -> None:
    """A torch device this install can compute on: cpu, or cuda / mps / xpu when available
    (with an index below the device count); `meta` and unknown names refused."""
    import torch

    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"{key} {name!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if dev.type == "cpu":
        return
    if dev.type == "meta":
        raise ConfigError(f"{key} 'meta' is a device without data (shapes only); training needs cpu or cuda")
    backend = getattr(torch, dev.type, None)
    available = bool(backend is not None and hasattr(backend, "is_available") and backend.is_available())
    if not available:
        build = "CPU only" if not torch.cuda.is_available() else "without it"
        raise ConfigError(f"{key} {name!r}: this torch install ({torch.__version__}, {build}) has no usable "
                          f"{dev.type} device; use {key}=cpu")
    count = backend.device_count() if hasattr(backend, "device_count") else 1
    if dev.index is not None and dev.index >= count:
        raise ConfigError(f"{key} {name!r}: only {count} {dev.type} device(s) are visible")


def check_model_value(key: str, model: str) -> None:
    """The model a config names, checked before anything is loaded or deleted: "embedded",
    a save_pretrained directory (`models.loading.check_model_dir` says what one lacks), or a
    name for the local Hugging Face cache. A path that does not exist, or is a file, is
    refused; so are pickle weights (pytorch_model*.bin, read only when no safetensors file
    is there) that name anything but tensors: the pickle is scanned, never run."""
    import os

    if model == "embedded":
        return
    p = Path(os.path.expanduser(str(model)))
    if p.is_dir():
        from policylab.models.loading import check_model_dir

        check_model_dir(p)
        names = [q.name for q in p.iterdir()]
        if not any(n.endswith(".safetensors") for n in names):
            for n in sorted(n for n in names if n.endswith(".bin") and n.startswith("pytorch_model")):
                _check_pickle_weights(key, p / n)
        return
    if p.exists():
        raise ConfigError(f"{key} {str(model)!r} is a file; give a model directory (written by save_pretrained) "
                          "or 'embedded'")
    if str(model).startswith((".", "~", os.sep)) or str(model).count(os.sep) > 1:
        raise ConfigError(f"{key} {str(model)!r} does not exist; give a model directory (written by save_pretrained) "
                          "or 'embedded'")


def _check_pickle_weights(key: str, f: Path) -> None:
    import torch.serialization as ts

    try:
        unsafe = ts.get_unsafe_globals_in_checkpoint(str(f))
    except Exception as exc:  # not a torch zip archive (old format or damaged): it cannot be scanned
        raise ConfigError(f"{key}: {f} cannot be checked without unpickling it ({type(exc).__name__}); policylab "
                          "loads it only as a torch zip archive of tensors. Save the model with safetensors "
                          "(save_pretrained(..., safe_serialization=True))") from None
    if unsafe:
        raise ConfigError(f"{key}: {f} is a pickle that names code ({', '.join(sorted(unsafe)[:4])}), not only "
                          "tensors; it was not loaded and nothing in it ran. Use a model saved with safetensors")
