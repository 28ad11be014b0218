"""The task section of a run configuration (`task:` in a run's YAML): which task, its
data, its verifier and its sandbox limits. Validated with the rest of the run
configuration (`policylab.trainer.config.validate`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


TASK_NAMES = ("arithmetic", "jsonl", "reasoning_gym", "gsm", "menu_arithmetic", "two_turn_arithmetic", "confidence",
              "distribution", "code", "sequence", "mixture")


@dataclass
class TaskConfig:
    # arithmetic | jsonl | reasoning_gym | gsm (reasoning-gym's GSM-Symbolic word problems) | menu_arithmetic
    # (pick the option label; scored by menu_label) | two_turn_arithmetic (a two-turn dialogue for methods with a
    # multi-turn source) | confidence (answer with a stated confidence) | distribution (draws from a
    # stated distribution) | code (short Python functions, tested in the sandbox) | sequence (next term of an
    # arithmetic progression) | mixture (train prompts pooled from task.domains in proportions task.mix, every
    # example tagged with its domain; held-out reports per domain)
    name: str = "arithmetic"
    ops: tuple[str, ...] = ("+", "*")  # arithmetic, menu_arithmetic: operations to draw from
    digits: int = 1  # arithmetic, menu_arithmetic, two_turn_arithmetic: digits per operand
    path: str = ""  # jsonl: file with one {"prompt", "answer"} object per line
    heldout_path: str = ""  # jsonl: held-out file (default: the last `eval.n` lines are not split off)
    dataset: str = ""  # reasoning_gym: the dataset name (reasoning_gym.factory.DATASETS, e.g. chain_sum)
    dataset_config: dict[str, Any] = field(default_factory=dict)  # reasoning_gym / gsm: keyword arguments of the dataset's config
    extract: str = "answer_tag"  # reasoning_gym: what of the reply the dataset's scorer reads: answer_tag (last <answer> tag, else the reply) | last_number
    prompt_suffix: str = ""  # reasoning_gym / gsm: text appended to every question (e.g. " Reply with only the number.")
    heldout_fraction: float = 0.5  # arithmetic / reasoning_gym / gsm: share of problems held out (split by a hash of the problem)
    split_seed: int = 0  # arithmetic / reasoning_gym / gsm: seed of the split (keep it to compare runs on one held-out set)
    reward: str = "auto"  # the verifier (outcome = correctness): auto (the task's own: exact_numeric; reasoning_gym: dataset; gsm: math_verify; menu_arithmetic: menu_label; confidence: confidence_answer; distribution: valid_outcome; code: code_tests) | exact_numeric | math_verify | menu_label | confidence_answer | valid_outcome | code_tests | dataset (reasoning-gym's score_answer) | module:function
    extra_rewards: tuple[str, ...] = ()  # shaping terms "module:function=weight", added to the verifier's reward (weight 1)
    system_prompt: str = ""  # prepended as a system message when non-empty
    class_mapper: str = "exact"  # distribution: how a reply maps to an outcome: exact (the whole reply is one outcome name) | single_mention (exactly one distinct outcome named as a word)
    sandbox_cpu_seconds: float = 2.0  # code: CPU time of one candidate's process (policylab.sandbox.runner)
    sandbox_memory_mb: int = 512  # code: address-space limit of one candidate's process
    sandbox_wall_seconds: float = 10.0  # code: wall-clock limit of one candidate's process
    sandbox_without_network_isolation: bool = False  # code: run model-written code with this machine's network when no network namespace can be made (refused otherwise)
    sandbox_without_filesystem_isolation: bool = False  # code: let model-written code write wherever its user may when Landlock is unavailable (refused otherwise)
    domains: tuple[str, ...] = ("arithmetic", "sequence")  # mixture: the pooled task domains (tasks.mixture.DOMAINS; arithmetic uses ops and digits)
    mix: tuple[float, ...] = (0.5, 0.5)  # mixture: the proportion of each domain in the train stream (one per domain, >= 0, normalized)
