"""A lesson's worked example takes its hyperparameters from the registered method, never
from numbers typed into the lesson: the RLCR, MaD-RL and Range-GRPO pages quote GRPO
with GRPO's own std convention (unbiased by default), and changing a registered
parameter changes what the lesson shows."""

from __future__ import annotations

import math

import pytest

from policylab import methods
from policylab.learn import bank
from policylab.learn.examples import EXAMPLES
from policylab.methods.registry import REGISTRY


def naive_grpo(rewards, ddof, eps=1e-6):
    """(r − mean)/(std + eps) over one group, std with `ddof`, in plain fp64 Python."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - ddof))
    return [(r - mean) / (std + eps) for r in rewards]


def _question(method, qid):
    return next(q for q in bank.build_bank("en", only=[method])[0].questions if q.id == qid)


def test_rlcr_comparison_uses_grpos_unbiased_std():
    q = _question("rlcr", "rlcr-comparison")
    v = q.example.values
    # correct [1, 0, 0, 1], confidence [0.6, 0.1, 1.0, 1.0]: r = c − (q − c)²
    #   1 − 0.16 = 0.84, 0 − 0.01 = −0.01, 0 − 1 = −1, 1 − 0 = 1
    rewards = [0.84, -0.01, -1.0, 1.0]
    # the method's reward stage writes the batch's rewards in float32 (as in training):
    # 0.84 is stored as 0.83999997, so the fp64 comparisons below allow 1e-6
    assert v["rewards"] == pytest.approx(rewards, abs=1e-7)
    # mean 0.2075; Σ dev² = 2.533475; unbiased var 0.8444917, std 0.9189623:
    #   0.6325/0.91896 = 0.6883, −0.2175/… = −0.2367, −1.2075/… = −1.3140, 0.7925/… = 0.8624
    hand = [0.6883, -0.2367, -1.3140, 0.8624]
    assert v["rlcr_advantages"] == pytest.approx(naive_grpo(rewards, ddof=1), abs=1e-6)
    assert [round(x, 4) for x in v["rlcr_advantages"]] == hand
    assert "[0.6883, -0.2367, -1.3140, 0.8624]" in q.example.text["en"]
    assert v["binary_advantages"] == pytest.approx(naive_grpo([1, 0, 0, 1], ddof=1), abs=1e-9)  # ±0.8660


@pytest.fixture
def population_grpo():
    """GRPO, RLCR and MaD-RL registered with std = population for one test."""
    saved = {n: REGISTRY[n] for n in ("grpo", "rlcr", "mad_rl")}
    for n, m in saved.items():
        REGISTRY[n] = m.with_params({"std": "population"})
    try:
        yield
    finally:
        REGISTRY.update(saved)


def test_a_changed_registered_parameter_changes_the_lesson(population_grpo):
    v = EXAMPLES["rlcr_rewards"](correct=[1, 0, 0, 1], confidence=[0.6, 0.1, 1.0, 1.0])
    assert v["std"] == "population"
    assert v["rlcr_advantages"] == pytest.approx(naive_grpo([0.84, -0.01, -1.0, 1.0], ddof=0), abs=1e-6)
    assert round(v["rlcr_advantages"][0], 4) == 0.7948  # what the page used to say with the default
    mid = EXAMPLES["range_vs_grpo"](intervals=[[0.2, 0.9], [0.4, 0.5], [0.45, 0.55]])
    assert mid["grpo_on_midpoints"] == pytest.approx(naive_grpo([0.55, 0.45, 0.5], ddof=0), abs=1e-9)


def test_range_grpo_and_mad_rl_quote_grpo_as_registered():
    assert methods.get("grpo").p["std"] == "unbiased"
    mid = EXAMPLES["range_vs_grpo"](intervals=[[0.2, 0.9], [0.4, 0.5], [0.45, 0.55]])
    # midpoints 0.55, 0.45, 0.5: mean 0.5, unbiased std 0.05 -> ±1 (up to eps), 0
    assert mid["grpo_on_midpoints"] == pytest.approx(naive_grpo([0.55, 0.45, 0.5], ddof=1), abs=1e-9)
    assert mid["grpo_on_midpoints"] == pytest.approx([1.0, -1.0, 0.0], abs=1e-4)
    mad = EXAMPLES["mad_vs_grpo"](classes=["heads", "tails"], replies=["heads", "heads", "heads", "tails"],
                                  target=[0.5, 0.5, 0.0])
    g = EXAMPLES["mad_group"](classes=["heads", "tails"], replies=["heads", "heads", "heads", "tails"],
                              target=[0.5, 0.5, 0.0])
    p = methods.get("mad_rl").p
    assert (g["coef"], g["smoothing"]) == (p["match_coef"], p["target_smoothing"])  # read, not typed
    assert mad["mad_advantages"] == pytest.approx(naive_grpo(g["rewards"], ddof=1), abs=1e-9)
