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


# the values every pipeline's top level has, checked like a run config's (trainer.config)
TOP_RULES = {"seed": None, "threads": None}  # the run config's own rules (FIELD_RULES)


def load_pipeline_config(path: str | Path, overrides=(), *, top: dict, sections: dict, name: str = "",
                         rules: dict | None = None) -> dict:
    """The pipeline config: top-level keys (`top` defaults) and sections (`sections`
    defaults; a section default of None is a free-form mapping, e.g. a run config). An
    optional top-level `pipeline: NAME` must be `name`.

    Every value is checked here, before any stage runs and before anything is deleted:
    every number finite; `seed` and `threads` as a run config checks them; `rules`
    ({"section.key": trainer.config.Range}) for the pipeline's own numbers; `run_dir` with
    `~` expanded and the filesystem root, the home directory and over-long names refused."""
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
    check_values(out, rules or {}, str(p))
    return out


def check_values(cfg: dict, rules: dict, where: str) -> None:
    """Finite numbers everywhere, `rules` and the run config's seed/threads rules, run_dir
    (expanded in place). The first problem is a ConfigError naming `where` and the key."""
    from policylab.trainer.config import FIELD_RULES, check_path_value, non_finite

    bad = non_finite(cfg)
    if bad:
        raise ConfigError(f"{where}: `{bad[0]}` is {bad[1]}: every number in a config must be finite")
    every = {**{k: FIELD_RULES[k] for k in TOP_RULES if k in cfg}, **rules}
    for key, rule in every.items():
        node = cfg
        for part in key.split("."):
            node = node[part]
        problem = rule.problem(key, node)
        if problem:
            raise ConfigError(f"{where}: {problem}")
    if "run_dir" in cfg:
        try:
            cfg["run_dir"] = check_path_value("run_dir", cfg["run_dir"])
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


MARKER = ".policylab-pipeline.json"
REPORT_FILES = ("report.json", "report.md", "progress.json")


def _read_marker(run_dir: Path) -> dict | None:
    from policylab.trainer.run_paths import guard, read_bytes

    p = guard(run_dir, MARKER)
    if not p.exists():
        return None
    try:
        doc = json.loads(read_bytes(p).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise RunDirError(f"{p} is damaged (not JSON): it cannot say what the previous pipeline wrote; remove the "
                          "previous run's folders yourself or choose another run_dir (nothing was changed)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), dict):
        raise RunDirError(f"{p} is not a policylab pipeline marker; nothing was changed")
    return doc


def _write_marker(run_dir: Path, doc: dict) -> None:
    from policylab.trainer.run_paths import guard, replace_file

    replace_file(guard(run_dir, MARKER), json.dumps(doc, indent=1))


def _files_under(d: Path) -> list[str]:
    return sorted(str(q.relative_to(d)) for q in d.rglob("*") if q.is_file() or q.is_symlink())


def prepare_run_dir(run_dir: Path, stages=(), *, overwrite: bool, pipeline: str = "") -> list[str]:
    """A run directory of its own for a pipeline that writes the directories `stages` and
    report.json, report.md, progress.json into it. Called after every value is checked and
    before anything is written; nothing is deleted unless every check passes.

    The pipeline records what it writes in run_dir/.policylab-pipeline.json (the marker).
    Refused (RunDirError, nothing changed): the current directory; a stage path or report
    that is a link, a special file, or of the wrong kind; any of those entries when the
    marker does not list it (it is not this pipeline's: a foreign report.md is never
    replaced, a foreign folder never deleted); a previous pipeline run without
    `overwrite`; a marked stage folder holding a file the pipeline did not write. With
    `overwrite`, exactly the marked entries are removed. Returns the entries removed."""
    import shutil

    from policylab.trainer.run_paths import guard

    run_dir = Path(run_dir)
    if run_dir.resolve() == Path.cwd().resolve():
        raise RunDirError("a pipeline's run_dir must be a directory of its own (not the current directory)")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir} exists and is not a directory")
    for n in stages:
        guard(run_dir, n, want="dir")
    for n in REPORT_FILES:
        guard(run_dir, n)
    marker = _read_marker(run_dir) if run_dir.is_dir() else None
    marked = marker["entries"] if marker else {}
    present = [n for n in (*stages, *REPORT_FILES) if (run_dir / n).exists()]
    foreign = [n for n in present if n not in marked]
    if foreign:
        raise RunDirError(
            f"{run_dir} holds {', '.join(foreign)}, which no policylab pipeline wrote there (no record in {MARKER}); "
            "policylab will not replace or delete them. Choose another run_dir, or move them away yourself "
            "(nothing was changed)")
    if present and not overwrite:
        raise RunDirError(f"{run_dir} already holds a pipeline run ({', '.join(present)}); choose another run_dir or "
                          "pass --overwrite to replace it (nothing was changed)")
    for n in present:
        files = marked[n].get("files") if isinstance(marked[n], dict) else None
        if files is not None and (run_dir / n).is_dir():
            extra = sorted(set(_files_under(run_dir / n)) - set(files))
            if extra:
                raise RunDirError(f"{run_dir / n} holds {extra[0]}, which the pipeline did not write: policylab will "
                                  "not delete it; move it away (nothing was changed)")
    for n in present:
        p = run_dir / n
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_marker(run_dir, {"pipeline": pipeline, "entries": {n: {} for n in (*stages, *REPORT_FILES)}})
    return present


def stage_finished(run_dir: Path, stage: str) -> None:
    """Record the files the stage `stage` wrote (a later --overwrite deletes only them)."""
    run_dir = Path(run_dir)
    doc = _read_marker(run_dir) or {"pipeline": "", "entries": {}}
    d = run_dir / stage
    doc["entries"][stage] = {"files": _files_under(d)} if d.is_dir() else {}
    _write_marker(run_dir, doc)


def check_model(model: str, where: str) -> None:
    """The pipeline's base model checked before any stage runs (trainer.config.check_model_value)."""
    from policylab.trainer.config import check_model_value

    try:
        check_model_value("model", model)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def stale_note(run_dir: Path, record: dict) -> str:
    from policylab.trainer.run_paths import stale_note as note

    return note(run_dir, record)


def locked(run_dir: Path):
    """The pipeline's run directory locked for this process (one run per directory)."""
    from policylab.trainer.run_paths import RunLock

    Path(run_dir).mkdir(parents=True, exist_ok=True)
    return RunLock(run_dir, what="pipeline")


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
    """save_pretrained of model and tokenizer into the stage folder `path` (a link or a
    file in its place is refused, not written through)."""
    from policylab.trainer.run_paths import guard_dir

    path = guard_dir(Path(path).parent, Path(path).name)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_progress(run_dir: Path, report: dict) -> None:
    """The report so far (each finished stage's summary) in run_dir/progress.json, written
    after every stage: a pipeline stopped part way keeps the numbers of what it finished."""
    from policylab.trainer.run_paths import guard, replace_file

    replace_file(guard(run_dir, "progress.json"), json.dumps(report, indent=2, default=str))


def write_report(run_dir: Path, report: dict, markdown: str) -> None:
    """report.json and report.md, each replaced as a whole (never written through a link)."""
    from policylab.trainer.run_paths import guard, replace_file

    replace_file(guard(run_dir, "report.json"), json.dumps(report, indent=2))
    replace_file(guard(run_dir, "report.md"), markdown)


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
