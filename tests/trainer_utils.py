"""Shared helpers for trainer tests: a tiny config that runs in seconds."""

from policylab.trainer.config import config_from_dict


def tiny_config(model_dir, run_dir, **sections):
    base = {
        "method": "grpo",
        "model": str(model_dir),
        "run_dir": str(run_dir),
        "seed": 3,
        "task": {"reward": "trainer_utils:parity_reward"},
        "method_params": {"kl_coef": 0.0},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "train": {"steps": 2, "lr": 1e-3, "micro_batch_size": 2},
        "eval": {"n": 4, "before": False, "after": False, "max_new_tokens": 4},
        "log": {"tensorboard": False, "progress": False, "plot_every": 0},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict) and key != "method_params":
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return config_from_dict(base)


def parity_reward(responses, answers, **context):
    """A toy verifier with mixed outcomes on a random model: 1 if the response has an even
    number of characters. Lets filters and group statistics see both outcomes."""
    return [float(len(r) % 2 == 0) for r in responses]


def raising_reward(responses, answers, **context):
    for r in responses:
        if len(r) % 2:
            raise RuntimeError("boom")
    return [0.0] * len(responses)


def nan_reward(responses, answers, **context):
    return [float("nan")] + [0.0] * (len(responses) - 1)


def short_bonus(responses, answers, **context):
    """A shaping term that does not apply to empty responses (None = not applicable)."""
    return [None if not r else 1.0 / (1 + len(r)) for r in responses]


# verifiers named by import path in run configs of the tests ("trainer_utils:gold_or_even")
def gold_or_even(responses, answers, **context):
    """A verifier for a random model: the reference answer scores 1 (so the base accuracy
    is measurable), and so does any reply of even length (mixed outcomes: learning signal)."""
    return [1.0 if r.strip() == str(a) or len(r) % 2 == 0 else 0.0 for r, a in zip(responses, answers)]


def zero_reward(responses, answers, **context):
    return [0.0] * len(responses)
