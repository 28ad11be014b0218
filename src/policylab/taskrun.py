"""The trainer's view of a task: a resumable train stream, a held-out split and the
verifier. Built from `TaskConfig`; the task modules themselves stay free of trainer code."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from .config import ConfigError, TaskConfig


@dataclass
class TaskSource:
    next_train: Callable[[int], list]  # n -> list[Example]; advances the stream
    heldout: Callable[[int], list]  # n -> list[Example] (fixed, same for every seed)
    reward_fn: Callable[[list[str], list[str]], list[float]]  # gold-based verifier
    state_dict: Callable[[], dict]
    load_state_dict: Callable[[dict], None]
    describe: str


_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def imported_modules(cfg: TaskConfig) -> list[tuple[str, str]]:
    """(module, config entry) for every module the task config makes policylab import:
    `task.reward` and each `task.extra_rewards` entry of the form module:function."""
    out = []
    specs = [("task.reward", cfg.reward)] + [("task.extra_rewards", e.rpartition("=")[0] or e)
                                             for e in cfg.extra_rewards]
    for where, spec in specs:
        if ":" in spec:
            out.append((spec.partition(":")[0], f"{where} = {spec!r}"))
    return out


def trusted_module(name: str) -> bool:
    """Modules a run directory may name without the user's say-so: policylab's own."""
    return name == "policylab" or name.startswith("policylab.")


def check_imports(cfg: TaskConfig, source: str, *, allow: bool, say=None) -> list[str]:
    """Name the modules `cfg` will import before anything is imported (through `say`).

    `source` is the file the config came from. Modules outside policylab are refused
    (UntrustedImportError: importing runs their code) unless `allow` is True, the user's
    explicit permission (the CLI's --allow-imports). Returns the module names."""
    from .errors import UntrustedImportError

    mods = imported_modules(cfg)
    for name, where in mods:
        if not _MODULE_RE.fullmatch(name):
            raise ConfigError(f"{source}: {where}: {name!r} is not a module name")
    outside = [(n, w) for n, w in mods if not trusted_module(n)]
    if outside and not allow:
        listed = "; ".join(f"`{n}` ({w})" for n, w in outside)
        raise UntrustedImportError(
            f"{source} names reward code outside policylab: {listed}; importing it runs that code. Nothing was "
            "imported. Pass --allow-imports if you trust this run directory"
        )
    if mods and say is not None:
        say(f"{source} imports: " + ", ".join(f"{n} ({w})" for n, w in mods))
    return [n for n, _ in mods]


def _reward_fn(name: str):
    """A built-in verifier by name, or any function given as "package.module:function"
    with the signature (responses: list[str], answers: list[str]) -> list[float]."""
    from . import rewards

    if ":" in name:
        import importlib

        mod, _, fn = name.partition(":")
        if not _MODULE_RE.fullmatch(mod) or not fn.isidentifier():
            raise ConfigError(f"reward {name!r} must look like package.module:function")
        try:
            return getattr(importlib.import_module(mod), fn)
        except Exception as exc:  # the module's own code failed too: name it, one line
            raise ConfigError(f"reward {name!r}: cannot import {fn} from {mod}: {type(exc).__name__}: {exc}") from exc
    if name == "exact_numeric":
        return rewards.exact_numeric_reward
    if name == "math_verify":
        return rewards.math_verify_reward
    if name == "confidence_answer":
        from .rewards.calibration import confidence_answer_reward

        return confidence_answer_reward
    if name == "valid_outcome":
        from .rewards.distribution import valid_outcome_reward

        return valid_outcome_reward
    if name == "code_tests":
        raise ConfigError("task.reward code_tests runs the code task's tests: it needs task.name=code")
    raise ConfigError(f"task.reward {name!r} is not one of exact_numeric, math_verify, confidence_answer, "
                      "valid_outcome, code_tests")


# tasks whose replies the numeric verifiers cannot read: the verifier each one needs
_OWN_VERIFIER = {"confidence": "confidence_answer", "distribution": "valid_outcome", "code": "code_tests"}


def sandbox_policy(cfg: TaskConfig):
    """The sandbox limits and opt-outs of `task.sandbox_*` (policylab.sandbox)."""
    from .sandbox import SandboxLimits, SandboxPolicy

    return SandboxPolicy(SandboxLimits(cpu_seconds=cfg.sandbox_cpu_seconds, memory_mb=cfg.sandbox_memory_mb,
                                       wall_seconds=cfg.sandbox_wall_seconds),
                         without_network_isolation=cfg.sandbox_without_network_isolation,
                         without_filesystem_isolation=cfg.sandbox_without_filesystem_isolation)


def _more_tasks(cfg: TaskConfig, seed: int) -> TaskSource:
    """The confidence, distribution and code tasks (policylab.tasks.confidence / distribution / code)."""
    own = _OWN_VERIFIER[cfg.name]
    if cfg.reward in ("exact_numeric", "math_verify"):
        raise ConfigError(f"task.name={cfg.name} needs task.reward={own} (or a module:function verifier): "
                          f"{cfg.reward} cannot read its replies")
    if cfg.name == "code":
        from .tasks.code import CodeTask, CodeVerifier

        t = CodeTask(seed=seed)
        reward = CodeVerifier(sandbox_policy(cfg)) if cfg.reward == "code_tests" else _reward_fn(cfg.reward)
        desc = f"code: {len(t.train_names)} train / {t.heldout_size()} held-out Python functions, sandboxed tests"
    elif cfg.name == "confidence":
        from .tasks.confidence import ConfidenceTask

        t = ConfidenceTask(ops=tuple(cfg.ops), digits=cfg.digits, seed=seed)
        reward = _reward_fn(cfg.reward)
        desc = f"arithmetic {'/'.join(cfg.ops)} with a stated confidence; {t.heldout_size()} held-out problems"
    else:
        from .tasks.distribution import DistributionTask

        t = DistributionTask(seed=seed)
        reward = _reward_fn(cfg.reward)
        desc = f"draws from stated distributions: {len(t.train)} train / {t.heldout_size()} held-out prompts"
    return TaskSource(t.train_prompts, lambda n: t.heldout(n, repeat=True), reward, t.state_dict,
                      t.load_state_dict, desc)


def build_task(cfg: TaskConfig, *, seed: int) -> TaskSource:
    if cfg.name in _OWN_VERIFIER:
        return _more_tasks(cfg, seed)
    reward = _reward_fn(cfg.reward)
    if cfg.name == "arithmetic":
        from .tasks.arithmetic import ArithmeticTask

        t = ArithmeticTask(ops=tuple(cfg.ops), digits=cfg.digits, seed=seed)
        return TaskSource(t.train_prompts, lambda n: t.heldout(n, repeat=True), reward, t.state_dict,
                          t.load_state_dict, f"arithmetic {'/'.join(cfg.ops)}, {cfg.digits} digit(s); "
                          f"{t.heldout_size()} distinct held-out problems")
    if cfg.name == "jsonl":
        return _jsonl_source(cfg, reward, seed)
    if cfg.name == "reasoning_gym":
        raise ConfigError("task.name=reasoning_gym: use the adapter in policylab.tasks.reasoning_gym from Python; "
                          "the trainer config path for it is not wired yet")
    raise ConfigError(f"unknown task {cfg.name!r}")


def _jsonl_source(cfg: TaskConfig, reward, seed: int) -> TaskSource:
    import random

    from .tasks.jsonl import load_jsonl

    if not cfg.path:
        raise ConfigError("task.name=jsonl needs task.path (a file with one {\"prompt\", \"answer\"} per line)")
    train = load_jsonl(cfg.path)
    held = load_jsonl(cfg.heldout_path) if cfg.heldout_path else []
    if not train:
        raise ConfigError(f"{cfg.path} has no examples")
    order = list(range(len(train)))
    state = {"position": 0}

    def next_train(n: int) -> list:
        out = []
        for _ in range(n):
            epoch, i = divmod(state["position"], len(train))
            perm = order[:]
            random.Random(seed * 1_000_003 + epoch).shuffle(perm)
            out.append(train[perm[i]])
            state["position"] += 1
        return out

    def heldout(n: int) -> list:
        if not held:
            raise ConfigError("evaluation needs task.heldout_path for a jsonl task (set eval.n=0 to skip evaluation)")
        return [held[j % len(held)] for j in range(n)]

    return TaskSource(next_train, heldout, reward, lambda: dict(state),
                      lambda s: state.update(position=int(s["position"])), f"jsonl {cfg.path} ({len(train)} train)")


def extra_rewards(specs) -> tuple:
    """(name, fn, weight) triples from "module:function=weight" strings."""
    out = []
    for spec in specs:
        if "=" not in spec:
            raise ConfigError(f"task.extra_rewards entry {spec!r} must look like module:function=weight")
        name, _, w = spec.rpartition("=")
        try:
            weight = float(w)
        except ValueError:
            raise ConfigError(f"task.extra_rewards entry {spec!r}: weight {w!r} is not a number") from None
        out.append((name, _reward_fn(name), weight))
    return tuple(out)
