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


def _is_worked_solution(response: str, answer) -> bool:
    parts = response.strip().split(" = ")
    return len(parts) > 1 and parts[-1].strip() == str(answer).strip()


def solutions_only(responses, answers, **context):
    """Right iff the reply is a worked solution ("a + b = ... = answer"): the expert traces
    verify, a random model's continuation never does."""
    return [1.0 if _is_worked_solution(r, a) else 0.0 for r, a in zip(responses, answers)]


def solutions_of_even_answers(responses, answers, **context):
    """As `solutions_only`, but a problem with an odd answer has no right reply at all: its
    worked solution stands for a dataset trace whose final answer is wrong."""
    return [1.0 if int(a) % 2 == 0 and _is_worked_solution(r, a) else 0.0 for r, a in zip(responses, answers)]
