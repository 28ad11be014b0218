"""The trainer's view of a task: a resumable train stream, a held-out split and the
verifier. Built from `TaskConfig`; the task modules themselves stay free of trainer code."""

from __future__ import annotations

import functools

import re
from dataclasses import dataclass
from typing import Callable

from policylab.errors import ConfigError
from policylab.tasks.config import TaskConfig


@dataclass
class TaskSource:
    next_train: Callable[[int], list]  # n -> list[Example]; advances the stream
    heldout: Callable[[int], list]  # n -> list[Example] (fixed, same for every seed)
    reward_fn: Callable[[list[str], list[str]], list[float]]  # gold-based verifier
    state_dict: Callable[[], dict]
    load_state_dict: Callable[[dict], None]
    describe: str
    # a reply the verifier must accept for an example (a sanity check of the verifier before a
    # comparison measures a base accuracy); None: the gold answer text itself is such a reply
    reference_reply: Callable[[object], str] | None = None
    # the task's own held-out measures: (replies, correct flags) -> {name: number}, logged with
    # the evaluation (eval/<name>); None: accuracy, pass@k and length only
    heldout_metrics: Callable[[list, list], dict] | None = None


MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def task_imports(cfg: TaskConfig) -> list[tuple[str, str]]:
    """(module, config entry) for every module the task config makes policylab import:
    `task.reward` and each `task.extra_rewards` entry of the form module:function."""
    out = []
    specs = [("task.reward", cfg.reward)] + [("task.extra_rewards", e.rpartition("=")[0] or e)
                                             for e in cfg.extra_rewards]
    for where, spec in specs:
        if ":" in spec:
            out.append((spec.partition(":")[0], f"{where} = {spec!r}"))
    return out


def _reward_fn(name: str):
    """A built-in verifier by name, or any function given as "package.module:function"
    with the signature (responses: list[str], answers: list[str]) -> list[float]."""
    from policylab.kernels import rewards

    if ":" in name:
        import importlib

        mod, _, fn = name.partition(":")
        if not MODULE_RE.fullmatch(mod) or not fn.isidentifier():
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
        from policylab.kernels.rewards.calibration import confidence_answer_reward

        return confidence_answer_reward
    if name == "valid_outcome":
        from policylab.kernels.rewards.distribution import valid_outcome_reward

        return valid_outcome_reward
    if name == "code_tests":
        raise ConfigError("task.reward code_tests runs the code task's tests: it needs task.name=code")
    if name == "menu_label":
        from policylab.tasks.menu import menu_label_reward

        return menu_label_reward
    raise ConfigError(f"task.reward {name!r} is not one of auto, exact_numeric, math_verify, menu_label, confidence_answer, "
                      "valid_outcome, code_tests, dataset, module:function")


# the verifier `task.reward: auto` stands for, per task
AUTO_REWARD = {"arithmetic": "exact_numeric", "jsonl": "exact_numeric", "reasoning_gym": "dataset",
               "gsm": "math_verify", "menu_arithmetic": "menu_label", "two_turn_arithmetic": "exact_numeric",
               "confidence": "confidence_answer", "distribution": "valid_outcome", "code": "code_tests",
               "sequence": "exact_numeric", "mixture": "exact_numeric"}
# reasoning-gym's GSM-Symbolic: GSM8K problems as templates whose names and numbers are re-drawn
GSM_DATASET = "gsm_symbolic"


def verifier_name(cfg: TaskConfig) -> str:
    """The verifier a task config scores with (`auto` resolved)."""
    return AUTO_REWARD.get(cfg.name, "exact_numeric") if cfg.reward == "auto" else cfg.reward


# tasks whose replies the numeric verifiers cannot read: the verifier each one needs
_OWN_VERIFIER = {"confidence": "confidence_answer", "distribution": "valid_outcome", "code": "code_tests"}


def sandbox_policy(cfg: TaskConfig):
    """The sandbox limits and opt-outs of `task.sandbox_*` (policylab.sandbox.runner)."""
    from policylab.sandbox.runner import SandboxLimits, SandboxPolicy

    return SandboxPolicy(SandboxLimits(cpu_seconds=cfg.sandbox_cpu_seconds, memory_mb=cfg.sandbox_memory_mb,
                                       wall_seconds=cfg.sandbox_wall_seconds),
                         without_network_isolation=cfg.sandbox_without_network_isolation,
                         without_filesystem_isolation=cfg.sandbox_without_filesystem_isolation)


def _more_tasks(cfg: TaskConfig, reward_name: str, seed: int) -> TaskSource:
    """The confidence, distribution and code tasks (policylab.tasks.confidence / distribution / code)."""
    own = _OWN_VERIFIER[cfg.name]
    if reward_name in ("exact_numeric", "math_verify", "menu_label"):
        raise ConfigError(f"task.name={cfg.name} needs task.reward={own} (or auto, or a module:function verifier): "
                          f"{reward_name} cannot read its replies")
    if cfg.name == "code":
        from policylab.tasks.code import CodeTask, CodeVerifier

        t = CodeTask(seed=seed)
        reward = CodeVerifier(sandbox_policy(cfg)) if reward_name == "code_tests" else _reward_fn(reward_name)
        desc = f"code: {len(t.train_names)} train / {t.heldout_size()} held-out Python functions, sandboxed tests"
    elif cfg.name == "confidence":
        from policylab.tasks.confidence import ConfidenceTask

        t = ConfidenceTask(ops=tuple(cfg.ops), digits=cfg.digits, seed=seed)
        reward = _reward_fn(reward_name)
        desc = f"arithmetic {'/'.join(cfg.ops)} with a stated confidence; {t.heldout_size()} held-out problems"
    else:
        from policylab.tasks.distribution import DistributionTask

        t = DistributionTask(seed=seed, mapper=cfg.class_mapper)
        reward = _reward_fn(reward_name)
        if reward_name == "valid_outcome":
            reward = functools.partial(reward, mapper=cfg.class_mapper)
            reward.__name__ = "valid_outcome"
        desc = (f"draws from stated distributions: {len(t.train)} train / {t.heldout_size()} held-out prompts "
                f"(class mapper {cfg.class_mapper})")
    return TaskSource(t.train_prompts, lambda n: t.heldout(n, repeat=True), reward, t.state_dict,
                      t.load_state_dict, desc, getattr(t, "reference_reply", None), getattr(t, "heldout_metrics", None))


def build_task(cfg: TaskConfig, *, seed: int) -> TaskSource:
    reward_name = verifier_name(cfg)
    if reward_name == "dataset" and cfg.name not in ("reasoning_gym", "gsm"):
        raise ConfigError(f"task.reward=dataset is the scorer of a reasoning-gym dataset; task {cfg.name!r} has none "
                          "(use exact_numeric, math_verify or module:function)")
    if cfg.name in _OWN_VERIFIER:
        return _more_tasks(cfg, reward_name, seed)
    if cfg.name == "arithmetic":
        from policylab.tasks.arithmetic import ArithmeticTask

        reward = _reward_fn(reward_name)
        t = ArithmeticTask(ops=tuple(cfg.ops), digits=cfg.digits, seed=seed, heldout_fraction=cfg.heldout_fraction,
                           split_seed=cfg.split_seed)
        size = t.heldout_size()
        return TaskSource(t.train_prompts, lambda n: t.heldout(n, repeat=True), reward, t.state_dict,
                          t.load_state_dict, f"arithmetic {'/'.join(cfg.ops)}, {cfg.digits} digit(s); "
                          + (f"{size} distinct held-out problems" if size is not None else "held-out problems sampled"))
    if cfg.name == "jsonl":
        return _jsonl_source(cfg, _reward_fn(reward_name), seed, reward_name)
    if cfg.name in ("sequence", "mixture"):
        return _domain_source(cfg, reward_name, seed)
    if cfg.name in ("menu_arithmetic", "two_turn_arithmetic"):
        return _turn_and_menu_source(cfg, reward_name, seed)
    if cfg.name in ("reasoning_gym", "gsm"):
        return _reasoning_gym_source(cfg, reward_name, seed)
    raise ConfigError(f"unknown task {cfg.name!r}")


def _reasoning_gym_source(cfg: TaskConfig, reward_name: str, seed: int) -> TaskSource:
    from policylab.errors import PolicylabError
    from policylab.tasks.reasoning_gym import ReasoningGymTask

    dataset = cfg.dataset
    if cfg.name == "gsm":
        if dataset not in ("", GSM_DATASET):
            raise ConfigError(f"task.name=gsm is reasoning-gym's {GSM_DATASET}; task.dataset={dataset!r} names another "
                              "dataset (use task.name=reasoning_gym for it)")
        dataset = GSM_DATASET
    elif not dataset:
        raise ConfigError("task.name=reasoning_gym needs task.dataset, a reasoning-gym dataset name (e.g. chain_sum, "
                          "basic_arithmetic, leg_counting)")
    try:
        t = ReasoningGymTask(dataset, seed=seed, config=cfg.dataset_config, heldout_fraction=cfg.heldout_fraction,
                             split_seed=cfg.split_seed, prompt_suffix=cfg.prompt_suffix, extract=cfg.extract)
    except PolicylabError as exc:
        raise ConfigError(f"task {cfg.name}: {exc}") from None
    reward = t.score if reward_name == "dataset" else _reward_fn(reward_name)
    label = "reasoning-gym " + dataset + (f" {cfg.dataset_config}" if cfg.dataset_config else "")
    return TaskSource(t.train_prompts, t.heldout, reward, t.state_dict, t.load_state_dict,
                      f"{label}, scored by {reward_name if reward_name != 'dataset' else 'its own scorer'}; "
                      f"held-out: {cfg.heldout_fraction:.0%} of problems by question hash (split seed {cfg.split_seed})")


def _turn_and_menu_source(cfg: TaskConfig, reward_name: str, seed: int) -> TaskSource:
    """The menu task (the answer is an option label: task.reward=menu_label) and the
    two-turn dialogue (examples carry their follow-up turns for a multi-turn source)."""
    if cfg.name == "menu_arithmetic":
        from policylab.tasks.menu import MenuArithmeticTask

        if reward_name in ("exact_numeric", "math_verify"):
            raise ConfigError(f"task.name=menu_arithmetic answers with an option label, which task.reward="
                              f"{reward_name} cannot score: set task.reward=menu_label (or auto)")
        t = MenuArithmeticTask(ops=tuple(cfg.ops), digits=cfg.digits, seed=seed)
        what = f"menu arithmetic {'/'.join(cfg.ops)}, {cfg.digits} digit(s), labels {'/'.join(t.labels)}"
    else:
        from policylab.tasks.dialogue import TwoTurnArithmeticTask

        t = TwoTurnArithmeticTask(digits=cfg.digits, seed=seed)
        what = f"two-turn arithmetic, {cfg.digits} digit(s)"
    reward = _reward_fn(reward_name)
    return TaskSource(t.train_prompts, lambda n: t.heldout(n, repeat=True), reward, t.state_dict, t.load_state_dict,
                      f"{what}; {t.heldout_size()} distinct held-out problems")


def _domain_source(cfg: TaskConfig, reward_name: str, seed: int) -> TaskSource:
    """The number-sequence task and the mixture of task domains (policylab.tasks.sequence /
    mixture): every example carries meta["domain"]; the mixture's held-out split
    alternates the domains' own splits."""
    from policylab.errors import PolicylabError
    from policylab.tasks.mixture import MixtureTask
    from policylab.tasks.sequence import SequenceTask

    reward = _reward_fn(reward_name)
    try:
        if cfg.name == "sequence":
            t = SequenceTask(seed=seed, heldout_fraction=cfg.heldout_fraction, split_seed=cfg.split_seed)
            what = "number sequences (next term of an arithmetic progression)"
        else:
            t = MixtureTask(cfg.domains, cfg.mix, seed=seed, ops=tuple(cfg.ops), digits=cfg.digits,
                            heldout_fraction=cfg.heldout_fraction, split_seed=cfg.split_seed)
            what = "mixture of " + ", ".join(f"{d} {m:g}" for d, m in zip(cfg.domains, cfg.mix))
    except PolicylabError as exc:
        raise ConfigError(f"task {cfg.name}: {exc}") from None
    return TaskSource(t.train_prompts, lambda n: t.heldout(n, repeat=True), reward, t.state_dict, t.load_state_dict,
                      f"{what}; {t.heldout_size()} distinct held-out problems")


def check_golds(examples, reward_name: str, path) -> None:
    """Refuse (ConfigError, naming the file and line) a gold answer the verifier could
    never score fairly, before any training: exact_numeric / confidence_answer need a
    finite number (`verifiers.gold_number`), math_verify a gold math-verify parses and
    that is not undefined (`verifiers.math_gold`: "\\frac{1}{0}" would make the same
    undefined reply correct), menu_label a single capital letter. Other verifiers
    (module:function) judge their own golds."""
    from policylab.errors import PolicylabError
    from policylab.kernels.rewards import verifiers

    def label(a) -> None:
        if not (len(str(a)) == 1 and str(a).isascii() and str(a).isupper()):
            raise PolicylabError(f"gold label {a!r} is not a single capital letter")

    check = {"exact_numeric": verifiers.gold_number, "confidence_answer": verifiers.gold_number,
             "math_verify": verifiers.math_gold, "menu_label": label}.get(reward_name)
    if check is None:
        return
    for e in examples:
        try:
            check(e.answer)
        except PolicylabError as exc:
            line = e.meta.get("jsonl_line", "?") if isinstance(e.meta, dict) else "?"
            raise ConfigError(f"{path}:{line}: answer {str(e.answer)[:60]!r} cannot be scored by task.reward="
                              f"{reward_name}: {exc}") from None


def _jsonl_source(cfg: TaskConfig, reward, seed: int, reward_name: str = "") -> TaskSource:
    import random

    from policylab.tasks.jsonl import load_jsonl

    if not cfg.path:
        raise ConfigError("task.name=jsonl needs task.path (a file with one {\"prompt\", \"answer\"} per line)")
    import dataclasses

    train = load_jsonl(cfg.path)
    held = load_jsonl(cfg.heldout_path) if cfg.heldout_path else []
    if not train:
        raise ConfigError(f"{cfg.path} has no examples")
    check_golds(train, reward_name, cfg.path)
    check_golds(held, reward_name, cfg.heldout_path)
    # splits are tagged, and a train line whose prompt is also held out is marked: the
    # guidance of mixed-policy methods (tasks.guidance) refuses both held-out and marked lines
    held_prompts = {e.prompt for e in held}
    train = [dataclasses.replace(e, meta={**e.meta, "split": "train",
                                          **({"heldout_overlap": True} if e.prompt in held_prompts else {})})
             for e in train]
    held = [dataclasses.replace(e, meta={**e.meta, "split": "heldout"}) for e in held]
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
