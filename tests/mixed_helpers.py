"""Verifiers for the mixed-policy tests (task.reward = "mixed_helpers:NAME")."""

from policylab.kernels.rewards.verifiers import exact_numeric_reward


def odd_answers_only(responses, answers, **context):
    """Problems with an even answer count every reply as right; problems with an odd answer
    need the exact number (a random model never writes it, the gold answer does)."""
    exact = exact_numeric_reward(responses, answers)
    return [1.0 if int(a) % 2 == 0 else e for a, e in zip(answers, exact)]


def always_right(responses, answers, **context):
    return [1.0] * len(responses)


def never_right(responses, answers, **context):
    return [0.0] * len(responses)
