"""Fixed-budget coverage and the sharpening tax."""

from __future__ import annotations

import math

import pytest
import torch

from policylab.eval.coverage import coverage_at_k, difficulty_temperature, pool_counts, sharpening_tax
from policylab.errors import PolicylabError


def test_hand_worked_pass_at_k_and_coverage():
    # n = 4, c = 1, K = 2: 1 − C(3, 2)/C(4, 2) = 1 − 3/6 = 0.5
    cov = coverage_at_k(["a"], [4], [1], 2)
    assert math.isclose(cov.value, 0.5, abs_tol=1e-12)
    # two tasks: (4, 1) -> 0.5 and (4, 0) -> 0: coverage 0.25
    assert math.isclose(coverage_at_k(["a", "b"], [4, 4], [1, 0], 2).value, 0.25, abs_tol=1e-12)


def _naive_cov(n, c, k):
    return sum(1 - math.comb(ni - ci, k) / math.comb(ni, k) for ni, ci in zip(n, c)) / len(n)


def test_coverage_matches_binomials_with_per_task_n():
    g = torch.Generator().manual_seed(0)
    n = torch.randint(4, 12, (30,), generator=g)
    c = (torch.rand(30, generator=g) * (n + 1)).floor().long().clamp(max=n)
    for k in (1, 2, 4):
        assert math.isclose(coverage_at_k(list(range(30)), n, c, k).value, _naive_cov(n.tolist(), c.tolist(), k),
                            rel_tol=1e-12)


def test_tax_is_signed():
    base = coverage_at_k(["a", "b"], [4, 4], [1, 0], 2)  # 0.25
    post = coverage_at_k(["b", "a"], [4, 4], [0, 4], 2)  # a: 1.0, b: 0 -> 0.5 (order differs: aligned by id)
    t = sharpening_tax(base, post)
    assert math.isclose(t["tax"], -0.25, abs_tol=1e-12)  # coverage gained: a negative tax, never |·|
    assert t["tasks_gained"] == 1 and t["tasks_lost"] == 0 and t["tasks_never"] == 1
    t = sharpening_tax(post, base)
    assert math.isclose(t["tax"], 0.25, abs_tol=1e-12) and t["tasks_lost"] == 1


def test_pooling_merges_repeated_tasks():
    ids, n, c = pool_counts(["x", "y", "x"], [2, 2, 2], [1, 0, 2])
    assert ids == ("x", "y") and n.tolist() == [4, 2] and c.tolist() == [3, 0]


def test_refusals():
    with pytest.raises(PolicylabError, match="n >= k"):
        coverage_at_k(["a"], [1], [0], 2)  # n < K
    base = coverage_at_k(["a"], [4], [1], 2)
    with pytest.raises(PolicylabError, match="different K"):
        sharpening_tax(base, coverage_at_k(["a"], [4], [1], 3))
    with pytest.raises(PolicylabError, match="different tasks"):
        sharpening_tax(base, coverage_at_k(["b"], [4], [1], 2))
    with pytest.raises(PolicylabError, match="task ids repeat"):
        coverage_at_k(["a", "a"], [4, 4], [1, 1], 2)
    with pytest.raises(PolicylabError, match="0 <= c <= n"):
        coverage_at_k(["a"], [4], [5], 2)


def test_difficulty_temperature_needs_h_and_checks_it():
    p = torch.tensor([0.0, 0.5, 1.0])
    t = difficulty_temperature(p, h=lambda x: 0.5 + (1 - x))
    assert t.tolist() == [1.5, 1.0, 0.5]
    with pytest.raises(PolicylabError, match="finite temperature > 0"):
        difficulty_temperature(p, h=lambda x: x - 0.5)
    with pytest.raises(PolicylabError, match="lie in \\[0, 1\\]"):
        difficulty_temperature(torch.tensor([1.5]), h=lambda x: x)
    with pytest.raises(TypeError):
        difficulty_temperature(p)  # no default h
