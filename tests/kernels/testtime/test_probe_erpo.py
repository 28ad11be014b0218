"""Probe-ERPO kernels: candidate ranks, probe consistency and branches, the advantages of
each branch, the entropy term, and the arithmetic sub-quantity probes."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.testtime import entropy_bonus, probe_branch, probe_erpo_advantages, rank_candidates
from policylab.tasks.probes import arithmetic_subquantity, probe_consistency


def test_hand_worked_ranks():
    # one prompt, answers 5, 5, 7, none: votes 2, 2, 1, 0; mean log-probs −0.5, −0.2, −0.1, −0.3
    # order: row 1 (2 votes, −0.2), row 0 (2 votes, −0.5), row 2 (1 vote), row 3 (no answer)
    ranks = rank_candidates(torch.tensor([2, 2, 1, 0]), torch.tensor([-0.5, -0.2, -0.1, -0.3]),
                            torch.tensor([4, 4, 4, 4]))
    assert ranks.tolist() == [1, 0, 2, 3]


def _naive_ranks(votes, score, group):
    out = [0] * len(votes)
    for i in range(len(votes)):
        out[i] = sum(1 for j in range(len(votes)) if group[j] == group[i] and
                     (votes[j], score[j], -j) > (votes[i], score[i], -i))
    return out


def test_ranks_match_a_naive_loop_with_interleaved_groups_and_ties():
    g = torch.Generator().manual_seed(5)
    B = 40
    votes = torch.randint(0, 4, (B,), generator=g)
    score = torch.randint(0, 3, (B,), generator=g).double() * -0.5  # many exact ties: index breaks them
    group = torch.randint(0, 5, (B,), generator=g) * 7 + 3  # arbitrary, interleaved ids
    ranks = rank_candidates(votes, score, group)
    assert ranks.tolist() == _naive_ranks(votes.tolist(), score.tolist(), group.tolist())


def test_branch_is_inclusive_at_tau():
    # PCR 0.5 with τ = 0.5 is high (PCR >= τ); 0.0 is low
    assert probe_branch(torch.tensor([0.5, 0.5, 0.0, 1.0]), tau=0.5).tolist() == [False, False, True, False]


def test_hand_worked_advantages_per_branch():
    # group 0 (high): ranks 0..3, top_k 1 -> [+1, 0, 0, 0]
    # group 1 (low): G = 4, f = 0.5 -> ceil(2) = 2 lowest ranks (2, 3) get −1: no positive target
    ranks = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0])
    low = torch.tensor([False] * 4 + [True] * 4)
    group = torch.tensor([0] * 4 + [1] * 4)
    a, info = probe_erpo_advantages(ranks, low, group, top_k=1, suppress_frac=0.5, pos_coef=1.0, neg_coef=1.0)
    assert a.tolist() == [1.0, 0.0, 0.0, 0.0, -1.0, -1.0, 0.0, 0.0]
    assert int(info["reinforced"]) == 1 and int(info["suppressed"]) == 2 and int(info["low_groups"]) == 1
    # a group of 3 with f = 0.5: ceil(1.5) = 2 suppressed
    a, _ = probe_erpo_advantages(torch.tensor([0, 1, 2]), torch.ones(3, dtype=torch.bool), torch.zeros(3, dtype=torch.long),
                                 top_k=1, suppress_frac=0.5, pos_coef=1.0, neg_coef=2.0)
    assert a.tolist() == [0.0, -2.0, -2.0]


def test_the_low_branch_never_has_a_positive_advantage():
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        G, n = int(torch.randint(2, 7, (1,), generator=g)), 3
        group = torch.arange(n).repeat_interleave(G)
        ranks = torch.cat([torch.randperm(G, generator=g) for _ in range(n)])
        low_g = torch.rand(n, generator=g) < 0.5
        low = low_g.repeat_interleave(G)
        a, _ = probe_erpo_advantages(ranks, low, group, top_k=int(torch.randint(1, G + 1, (1,), generator=g)),
                                     suppress_frac=float(torch.rand(1, generator=g)) * 0.9 + 0.1, pos_coef=1.0,
                                     neg_coef=1.0)
        assert bool((a[low] <= 0).all()) and bool((a[~low] >= 0).all())


def test_entropy_term_increases_entropy():
    # −c·H on the low branch's tokens: one gradient step on it raises the entropy there
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11, dtype=torch.float64) * 3
    z = logits.clone().requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)

    def entropy(x):
        lp = torch.log_softmax(x, -1)
        return -(lp.exp() * lp).sum(-1)

    h0 = entropy(z)[mask].sum().item()
    loss = entropy_bonus(entropy(z), mask, coef=0.1).sum()
    loss.backward()
    with torch.no_grad():
        z2 = z - 0.5 * z.grad
    assert entropy(z2)[mask].sum().item() > h0
    assert z.grad[0, 2].abs().max() == 0 and z.grad[1, 1:].abs().max() == 0  # masked positions untouched


def test_entropy_term_ignores_garbage_outside_the_mask():
    h = torch.tensor([[0.5, float("nan")]], dtype=torch.float64, requires_grad=True)
    out = entropy_bonus(h, torch.tensor([[True, False]]), coef=0.2)
    out.sum().backward()
    assert out.tolist() == [[-0.1, 0.0]] and h.grad.tolist() == [[-0.2, 0.0]]


def test_arithmetic_probes_re_ask_sub_quantities_and_imply_the_answer():
    probes = arithmetic_subquantity("What is 7 × 8? Reply with only the number.")
    assert [p.question for p in probes] == ["What is 7 × 7? Reply with only the number.",
                                            "What is 6 × 8? Reply with only the number."]
    # 7 × 7 = 49 implies 49 + 7 = 56; 6 × 8 = 48 implies 48 + 8 = 56
    assert [p.implied(q) for p, q in zip(probes, (49, 48))] == [56, 56]
    assert probe_consistency("56", ["49", "48"], probes) == [True, True]
    assert probe_consistency("54", ["49", "48"], probes) == [False, False]
    assert probe_consistency("56", ["49", None], probes) == [True, False]  # unparseable: no evidence
    assert probe_consistency(None, ["49", "48"], probes) == [False, False]
    # a zero operand moves up: 0 + 5 -> 1 + 5 = 6 implies 6 − 1 = 5
    p0 = arithmetic_subquantity("What is 0 + 5?")
    assert p0[1].question == "What is 1 + 5?" and p0[1].implied(6) == 5
    assert arithmetic_subquantity("Name a colour.") is None


@pytest.mark.parametrize("op", ["+", "-", "×", "*"])
def test_every_single_digit_problem_the_true_sub_answers_imply_the_true_answer(op):
    # checks the consistency identities themselves (the test computes the arithmetic; the method never does)
    import re

    f = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "×": lambda a, b: a * b, "*": lambda a, b: a * b}[op]
    for a in range(10):
        for b in range(10):
            for probe in arithmetic_subquantity(f"What is {a} {op} {b}?"):
                x, y = map(int, re.search(r"What is (\d+) \S (\d+)\?", probe.question).groups())
                assert probe.implied(f(x, y)) == f(a, b)


def test_no_gold_argument_anywhere():
    gold_like = {"gold", "answer", "answers", "label", "labels", "truth", "target"}
    for fn in (rank_candidates, probe_branch, probe_erpo_advantages, entropy_bonus, probe_consistency,
               arithmetic_subquantity):
        assert not gold_like & set(inspect.signature(fn).parameters), fn.__name__


def test_bad_input_is_refused():
    ranks, group = torch.tensor([0, 1]), torch.tensor([0, 0])
    with pytest.raises(PolicylabError, match="`low` must be the same for every row of a group"):
        probe_erpo_advantages(ranks, torch.tensor([True, False]), group, top_k=1, suppress_frac=0.5, pos_coef=1.0,
                              neg_coef=1.0)
    with pytest.raises(PolicylabError, match="`ranks` must lie in"):
        probe_erpo_advantages(torch.tensor([0, 2]), torch.tensor([True, True]), group, top_k=1, suppress_frac=0.5,
                              pos_coef=1.0, neg_coef=1.0)
    with pytest.raises(PolicylabError, match="`top_k` must be an int >= 1"):
        probe_erpo_advantages(ranks, torch.tensor([True, True]), group, top_k=0, suppress_frac=0.5, pos_coef=1.0,
                              neg_coef=1.0)
    with pytest.raises(PolicylabError, match="`suppress_frac` must be in"):
        probe_erpo_advantages(ranks, torch.tensor([True, True]), group, top_k=1, suppress_frac=0.0, pos_coef=1.0,
                              neg_coef=1.0)
    with pytest.raises(PolicylabError, match="`pcr` must lie in"):
        probe_branch(torch.tensor([1.5]), tau=0.5)
    with pytest.raises(ShapeError, match="`score` must be \\[B\\]"):
        rank_candidates(torch.tensor([1, 2]), torch.tensor([0.1]), group)
    with pytest.raises(PolicylabError, match="2 probe answers for 1 probes"):
        probe_consistency("5", ["1", "2"], arithmetic_subquantity("What is 2 + 3?")[:1])
    assert math.isfinite(float(entropy_bonus(torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), coef=0.0)))
