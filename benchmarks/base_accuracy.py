"""Base held-out accuracy of a model on candidate tasks, sampled at T = 1: which tasks leave
headroom for RL (the comparison wants a start between about 3% and 30%).

    .venv/bin/python benchmarks/base_accuracy.py [--n 200] [--only NAME ...] [--model embedded]

Every candidate goes through the trainer's own evaluator (`Trainer.evaluate`: the task's
held-out split, chat template, the task's verifier, one sample per prompt at T = 1, the
seed fixed), so the numbers are the ones a `policylab train` / `policylab compare` run
reports as its base. Writes benchmarks/results/base_accuracy.{json,md} (merged with
earlier results when --only is given).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
_NUM = " Reply with only the number."

# name: (task section, max new tokens for sampling). Each is a config a compare run can use as is.
CANDIDATES: dict[str, tuple[dict, int]] = {
    "arith1_add_mul": ({"name": "arithmetic", "ops": ["+", "*"], "digits": 1}, 16),
    "arith2_add_mul": ({"name": "arithmetic", "ops": ["+", "*"], "digits": 2}, 16),
    "arith2_add": ({"name": "arithmetic", "ops": ["+"], "digits": 2}, 16),
    "arith2_sub": ({"name": "arithmetic", "ops": ["-"], "digits": 2}, 16),
    "arith2_mul": ({"name": "arithmetic", "ops": ["*"], "digits": 2}, 16),
    "gsm": ({"name": "gsm"}, 192),
    "chain_sum_3x1": ({"name": "reasoning_gym", "dataset": "chain_sum", "extract": "last_number", "prompt_suffix": _NUM,
                       "dataset_config": {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}}, 16),
    "chain_sum_2to3x2": ({"name": "reasoning_gym", "dataset": "chain_sum", "extract": "last_number",
                          "prompt_suffix": _NUM,
                          "dataset_config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}}, 16),
    "basic_arith_2to3x1": ({"name": "reasoning_gym", "dataset": "basic_arithmetic", "extract": "last_number",
                            "prompt_suffix": _NUM,
                            "dataset_config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1,
                                               "operators": ["+", "-", "*"], "allow_parentheses": False,
                                               "allow_negation": False}}, 16),
    "leg_counting_2to3": ({"name": "reasoning_gym", "dataset": "leg_counting", "extract": "last_number",
                           "prompt_suffix": _NUM,
                           "dataset_config": {"min_animals": 2, "max_animals": 3, "max_instances": 3}}, 32),
    "letter_counting": ({"name": "reasoning_gym", "dataset": "letter_counting", "extract": "last_number",
                         "prompt_suffix": _NUM, "dataset_config": {"min_words": 3, "max_words": 5}}, 16),
}


def measure(name: str, n: int, model: str, seed: int) -> dict:
    from policylab.trainer.config import config_from_dict
    from policylab.tasks.source import verifier_name
    from policylab.trainer.loop import Trainer

    task, max_new = CANDIDATES[name]
    with tempfile.TemporaryDirectory() as d:
        cfg = config_from_dict({
            "model": model, "run_dir": d, "seed": seed, "method_params": {"kl_coef": 0.0},
            "task": task, "rollout": {"max_new_tokens": max_new},
            "eval": {"n": n, "temperature": 1.0, "max_new_tokens": max_new, "batch_size": 50},
            "log": {"tensorboard": False, "progress": False},
        })
        load = os.getloadavg()[0]
        tr = Trainer(cfg)
        t0 = time.perf_counter()
        res = tr.evaluate("base")
        seconds = time.perf_counter() - t0
        example = tr.task.heldout(1)[0]
        distinct = len({e.prompt for e in tr.task.heldout(n)})
    return {"task": task, "max_new_tokens": max_new, "verifier": verifier_name(cfg.task), "describe": tr.task.describe,
            "n_prompts": res["n_prompts"], "distinct_prompts": distinct, "accuracy": res["accuracy"],
            "accuracy_stderr": res["accuracy_stderr"], "mean_reward": res.get("mean_reward"),
            "mean_length": res["mean_length"],
            "seconds": round(seconds, 1), "load_before": round(load, 2), "example_prompt": example.prompt,
            "example_answer": str(example.answer), "seed": seed, "model": model}


def to_markdown(results: dict, command: str) -> str:
    lines = ["# Base held-out accuracy, sampled at T = 1", "",
             f"Command: `{command}`. The trainer's evaluator (one sample per held-out prompt at T = 1, seed fixed); "
             "each row's task section is in base_accuracy.json and can be pasted into a config. The machine was "
             "shared while measuring (the load average is given): accuracies are unaffected, seconds are not "
             "comparable. Accuracy counts full credit only; the mean score includes a verifier's partial credit "
             "(reasoning-gym scorers give some for a near miss).", "",
             "| candidate | task | verifier | new tokens | held-out prompts (distinct) | accuracy ± s.e. | mean score | "
             "mean length | in 3-30%? | seconds (load) |",
             "|---|---|---|---:|---:|---:|---:|---:|:---:|---:|"]
    for name, r in results.items():
        t = r["task"]
        label = t["name"] + (f" {t.get('dataset')}" if t.get("dataset") else "") + (
            f" digits={t['digits']} ops={''.join(t['ops'])}" if t["name"] == "arithmetic" else "") + (
            f" {t['dataset_config']}" if t.get("dataset_config") else "")
        ok = "yes" if 0.03 <= r["accuracy"] <= 0.30 else "no"
        lines.append(f"| {name} | {label} | {r['verifier']} | {r['max_new_tokens']} | {r['n_prompts']} "
                     f"({r['distinct_prompts']}) | {100 * r['accuracy']:.1f}% ± {100 * r['accuracy_stderr']:.1f} | "
                     + ("-" if r.get("mean_reward") is None else f"{r['mean_reward']:.3f}") + f" | "
                     f"{r['mean_length']:.1f} | {ok} | {r['seconds']} ({r['load_before']}) |")
    lines += ["", "Example prompts:", ""]
    for name, r in results.items():
        lines.append(f"- {name}: {r['example_prompt']!r} -> {r['example_answer']!r}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", help="candidate names (default: all)")
    ap.add_argument("--out", default=str(RESULTS / "base_accuracy"), help="results path without suffix ('' = none)")
    a = ap.parse_args(argv)
    names = a.only or list(CANDIDATES)
    bad = [x for x in names if x not in CANDIDATES]
    if bad:
        raise SystemExit(f"unknown candidate(s) {bad}; choose from {', '.join(CANDIDATES)}")
    out = Path(a.out) if a.out else None
    old = json.loads(out.with_suffix(".json").read_text()) if out and out.with_suffix(".json").exists() else {}
    results = old.get("results", {}) if a.only else {}
    command = "python benchmarks/base_accuracy.py" + (f" --n {a.n}" if a.n != 200 else "")
    for name in names:
        print(f"== {name}", flush=True)
        results[name] = measure(name, a.n, a.model, a.seed)
        r = results[name]
        print(f"{name}: accuracy {r['accuracy']:.3f} ± {r['accuracy_stderr']:.3f}, mean length {r['mean_length']:.1f}, "
              f"{r['seconds']} s", flush=True)
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.with_suffix(".json").write_text(json.dumps({"command": command, "results": results}, indent=2))
            out.with_suffix(".md").write_text(to_markdown(results, command))
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
