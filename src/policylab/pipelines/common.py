"""What the pipelines share: their YAML config (sections with typed defaults; unknown keys
refused with the valid names), prompt encoding, sampling a model on held-out prompts,
saving a model directory, and the run directory rules."""

from __future__ import annotations

import copy
import difflib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from policylab.trainer.config import ConfigError, read_yaml
from policylab.errors import RunDirError


def section(data: dict, name: str, defaults: dict, where: str) -> dict:
    """`data[name]` over `defaults`; unknown keys and wrongly typed values are refused."""
    raw = data.get(name, {}) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: `{name}` must be a mapping")
    out = copy.deepcopy(defaults)
    for k, v in raw.items():
        if k not in defaults:
            near = difflib.get_close_matches(str(k), list(defaults), n=3)
            hint = f" Did you mean: {', '.join(near)}?" if near else f" Valid keys: {', '.join(defaults)}."
            raise ConfigError(f"{where}: unknown key `{name}.{k}`.{hint}")
        d = defaults[k]
        if isinstance(d, bool) != isinstance(v, bool) or (isinstance(d, (int, float)) and not isinstance(v, (int, float))) \
                or (isinstance(d, list) and not isinstance(v, list)) or (isinstance(d, str) and not isinstance(v, str)) \
                or (isinstance(d, int) and not isinstance(d, bool) and isinstance(v, float)):
            raise ConfigError(f"{where}: `{name}.{k}` must be like {d!r}, got {v!r}")
        if isinstance(d, float) and isinstance(v, int):
            v = float(v)
        out[k] = v
    return out


def load_pipeline_config(path: str | Path, overrides=(), *, top: dict, sections: dict, name: str = "") -> dict:
    """The pipeline config: top-level keys (`top` defaults) and sections (`sections`
    defaults; a section default of None is a free-form mapping, e.g. a run config). An
    optional top-level `pipeline: NAME` must be `name`."""
    from policylab.trainer.config import parse_overrides, yaml_load

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    data = read_yaml(p) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    for key, value in parse_overrides(overrides):
        parts = key.split(".")
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml_load(value, f"value of `{key}`")
    allowed = set(top) | set(sections) | {"pipeline"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{p}: unknown key(s) {unknown}; a pipeline config has {', '.join(sorted(allowed))}")
    if name and data.get("pipeline", name) != name:
        raise ConfigError(f"{p} is a config of the {data['pipeline']!r} pipeline, not {name!r}")
    out = {}
    for k, v in top.items():
        value = data.get(k, v)
        if type(value) is not type(v) and not (isinstance(v, float) and isinstance(value, int)):
            raise ConfigError(f"{p}: `{k}` must be like {v!r}, got {value!r}")
        out[k] = value
    for name, defaults in sections.items():
        if defaults is None:
            raw = data.get(name, {}) or {}
            if not isinstance(raw, dict):
                raise ConfigError(f"{p}: `{name}` must be a mapping")
            out[name] = raw
        else:
            out[name] = section(data, name, defaults, str(p))
    return out


def prepare_run_dir(run_dir: Path, stages=(), *, overwrite: bool) -> None:
    """A run directory of its own for a pipeline that writes the directories `stages` into
    it: refused when it holds a previous pipeline's report.json or any of those stage
    directories, unless `overwrite` (then exactly those stage directories are removed)."""
    import shutil

    run_dir = Path(run_dir)
    if run_dir.resolve() == Path.cwd().resolve():
        raise RunDirError("a pipeline's run_dir must be a directory of its own (not the current directory)")
    if (run_dir / "report.json").exists() and not overwrite:
        raise RunDirError(f"{run_dir} already holds a pipeline run (report.json); choose another run_dir or pass "
                          "--overwrite")
    previous = [n for n in stages if (run_dir / n).exists()]
    if previous and not overwrite:
        raise RunDirError(f"{run_dir} already holds pipeline stages ({', '.join(previous)}); choose another run_dir "
                          "or pass --overwrite")
    for n in previous:
        shutil.rmtree(run_dir / n)
    run_dir.mkdir(parents=True, exist_ok=True)


def chat_encoder(tokenizer, system_prompt: str = ""):
    def encode(prompt: str) -> list[int]:
        msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
               [{"role": "user", "content": prompt}]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return encode


def engine_for(model, tokenizer):
    from policylab.engines.fast import FastEngine, UnsupportedModel
    from policylab.engines.hf import HFEngine

    try:
        return FastEngine(model, tokenizer)
    except UnsupportedModel:
        return HFEngine(model, tokenizer)


@dataclass(frozen=True)
class Sampling:
    """How a pipeline samples a model on held-out prompts: replies per prompt, their
    length cap, the seed of the forked RNG, the temperature."""
    samples: int
    max_new_tokens: int
    seed: int
    temperature: float = 1.0


@torch.no_grad()
def sample(model, tokenizer, examples, how: Sampling):
    """(batch, texts) of `how.samples` replies per example at `how.temperature`, under a
    forked RNG seeded with `how.seed`."""
    from policylab.batch import SamplingSettings

    engine = engine_for(model, tokenizer)
    encode = chat_encoder(tokenizer)
    was = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(how.seed)
            b = engine.generate([encode(e.prompt) for e in examples], group_size=how.samples,
                                sampling=SamplingSettings(temperature=how.temperature), max_new_tokens=how.max_new_tokens,
                                policy_version=-1, batch_id="pipeline-eval")
    finally:
        model.train(was)
    return b, engine.decode_responses(b)


def save_model_dir(model, tokenizer, path: Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_progress(run_dir: Path, report: dict) -> None:
    """The report so far (each finished stage's summary) in run_dir/progress.json, written
    after every stage: a pipeline stopped part way keeps the numbers of what it finished."""
    run_dir = Path(run_dir)
    tmp = run_dir / ".progress.json.tmp"
    tmp.write_text(json.dumps(report, indent=2, default=str))
    tmp.replace(run_dir / "progress.json")


def write_report(run_dir: Path, report: dict, markdown: str) -> None:
    run_dir = Path(run_dir)
    tmp = run_dir / ".report.json.tmp"
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(run_dir / "report.json")
    (run_dir / "report.md").write_text(markdown)


def check_run_config(run_cfg: dict):
    """A stage's run config validated as `policylab train` would, and its method's
    parameters against the run's shape (before any stage of the pipeline runs)."""
    from policylab import methods
    from policylab.trainer.config import config_from_dict
    from policylab.trainer.loop import run_shape

    cfg = config_from_dict(run_cfg)
    methods.get(cfg.method).with_params(cfg.method_params, run_shape(cfg))
    return cfg


def train_run(run_cfg: dict, *, quiet: bool = True) -> Path:
    """Train one policylab run from a config dict (the stage of a pipeline); returns its
    latest checkpoint directory."""
    from policylab.trainer.checkpoint import latest_checkpoint
    from policylab.trainer.config import config_from_dict
    from policylab.trainer.run import train

    cfg = config_from_dict(run_cfg)
    console = None
    if quiet:
        from rich.console import Console

        console = Console(quiet=True)
    train(cfg, overwrite=True, console=console)
    ckpt = latest_checkpoint(Path(cfg.run_dir))
    if ckpt is None:
        raise RunDirError(f"{cfg.run_dir}: the stage's run wrote no checkpoint")
    return ckpt
