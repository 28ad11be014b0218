"""RLCR: R = c − (q − c)², the strict confidence parser and its penalty path, the
multi-class Brier kernel."""

import pytest
import torch

from policylab.errors import NonFiniteError, ShapeError
from policylab.kernels.rewards import calibration as cal


def naive_rlcr(c, q, valid, penalty):
    return [ci - (qi - ci) ** 2 if v else ci - penalty for ci, qi, v in zip(c, q, valid)]


def test_hand_cases():
    # c = 1, q = 0.9: 1 − (0.9 − 1)² = 1 − 0.01 = 0.99
    # c = 1, q = 0.5: 1 − 0.25 = 0.75
    # c = 0, q = 0.9: 0 − 0.81 = −0.81
    # c = 0, q = 0.0: 0 − 0 = 0 (an honest "I am wrong")
    r = cal.rlcr_rewards(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0.9, 0.5, 0.9, 0.0], dtype=torch.float64),
                         torch.tensor([True] * 4), invalid_penalty=1.0)
    torch.testing.assert_close(r, torch.tensor([0.99, 0.75, -0.81, 0.0], dtype=torch.float64), rtol=0, atol=1e-12)


def test_penalty_path_for_an_unparsed_confidence():
    # invalid rows: c − penalty: correct 1 − 1 = 0, wrong 0 − 1 = −1; the NaN placeholder is never read
    r = cal.rlcr_rewards(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([float("nan"), float("nan"), 1.0]),
                         torch.tensor([False, False, True]), invalid_penalty=1.0)
    torch.testing.assert_close(r, torch.tensor([0.0, -1.0, 1.0]))
    # penalty 1.0 is the worst Brier term a parsed q can get: stating any q never scores below omitting it
    for c in (0.0, 1.0):
        for q in torch.linspace(0, 1, 11).tolist():
            stated = cal.rlcr_rewards(torch.tensor([c]), torch.tensor([q]), torch.tensor([True]), invalid_penalty=1.0)
            omitted = cal.rlcr_rewards(torch.tensor([c]), torch.tensor([0.0]), torch.tensor([False]),
                                       invalid_penalty=1.0)
            assert float(stated) >= float(omitted)


def test_matches_naive_loop():
    g = torch.Generator().manual_seed(0)
    c = torch.randint(0, 2, (64,), generator=g).double()
    q = torch.rand(64, generator=g, dtype=torch.float64)
    valid = torch.rand(64, generator=g) > 0.3
    got = cal.rlcr_rewards(c, q, valid, invalid_penalty=0.7)
    want = torch.tensor(naive_rlcr(c.tolist(), q.tolist(), valid.tolist(), 0.7), dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_expected_reward_is_maximized_at_the_true_probability():
    # E[R](q) = p − p(1 − q)² − (1 − p)q²; dE/dq = 2p(1 − q) − 2(1 − p)q = 2(p − q): zero at q = p
    grid = torch.linspace(0, 1, 1001, dtype=torch.float64)
    for p in (0.0, 0.13, 0.5, 0.8, 1.0):
        best = float(grid[torch.argmax(cal.expected_reward(p, grid))])
        assert abs(best - p) <= 1e-3
    # p = 0.8, q = 0.8: 0.8 − 0.8·0.04 − 0.2·0.64 = 0.8 − 0.032 − 0.128 = 0.64
    assert abs(float(cal.expected_reward(0.8, 0.8)) - 0.64) < 1e-12


@pytest.mark.parametrize("reply,answer,q,status", [
    ("56\nConfidence: 0.8", "56\n", 0.8, "ok"),
    ("It is 56. confidence: .25  ", "It is 56. ", 0.25, "ok"),
    ("56\nCONFIDENCE: 80%", "56\n", 0.8, "ok"),
    ("56\nConfidence: 1", "56\n", 1.0, "ok"),
    ("56", "56", None, "missing"),
    ("56\nConfidence: 1.5", "56\n", None, "out_of_range"),
    ("56\nConfidence: 120%", "56\n", None, "out_of_range"),
    ("56\nConfidence: high", "56\n", None, "malformed"),
    ("56\nConfidence: 0.8 because", "56\n", None, "malformed"),
    ("56\nConfidence: -0.2", "56\n", None, "malformed"),
    ("56 Confidence: 0.8 confidence: 0.9", "56 ", None, "ambiguous"),
])
def test_parse_is_strict(reply, answer, q, status):
    p = cal.parse_confidence(reply)
    assert (p.answer, p.status) == (answer, status)
    assert (p.q is None and q is None) or abs(p.q - q) < 1e-12


def test_the_verifier_never_reads_the_confidence_as_the_answer():
    # "7\nConfidence: 1": the last number of the whole reply is 1, of the answer part 7
    assert cal.confidence_answer_reward(["7\nConfidence: 1", "3\nConfidence: 7"], ["7", "7"]) == [1.0, 0.0]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="outside"):
        cal.rlcr_rewards(torch.tensor([1.0]), torch.tensor([1.2]), torch.tensor([True]), invalid_penalty=1.0)
    with pytest.raises(NonFiniteError):
        cal.rlcr_rewards(torch.tensor([1.0]), torch.tensor([float("nan")]), torch.tensor([True]), invalid_penalty=1.0)
    with pytest.raises(ValueError, match="0 or 1"):
        cal.rlcr_rewards(torch.tensor([0.5]), torch.tensor([0.5]), torch.tensor([True]), invalid_penalty=1.0)
    with pytest.raises(ShapeError, match="bool"):
        cal.rlcr_rewards(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([1]), invalid_penalty=1.0)
    with pytest.raises(ShapeError):
        cal.rlcr_rewards(torch.tensor([1.0, 0.0]), torch.tensor([0.5]), torch.tensor([True]), invalid_penalty=1.0)
    with pytest.raises(ValueError, match="invalid_penalty"):
        cal.rlcr_rewards(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([True]), invalid_penalty=-1.0)
    with pytest.raises(TypeError):
        cal.parse_confidence(None)


def test_multiclass_brier_hand_case_and_gradient():
    # p = [0.7, 0.2, 0.1], target 0: (0.7 − 1)² + 0.2² + 0.1² = 0.09 + 0.04 + 0.01 = 0.14
    # ∂/∂p_k = 2(p_k − y_k) = [−0.6, 0.4, 0.2]: every class gets gradient
    p = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64, requires_grad=True)
    b = cal.brier_score(p, torch.tensor([0]))
    torch.testing.assert_close(b, torch.tensor([0.14], dtype=torch.float64), rtol=0, atol=1e-12)
    b.sum().backward()
    torch.testing.assert_close(p.grad, torch.tensor([[-0.6, 0.4, 0.2]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_hybrid_is_brier_plus_weighted_cross_entropy_and_matches_a_loop():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 4, generator=g, dtype=torch.float64)
    target = torch.tensor([0, 3, 1, 1, 2])
    got = cal.brier_ce(logits, target, ce_weight=0.5)
    want = []
    for row, t in zip(logits.tolist(), target.tolist()):
        z = torch.tensor(row, dtype=torch.float64)
        probs = torch.softmax(z, 0)
        brier = sum((float(probs[k]) - (1.0 if k == t else 0.0)) ** 2 for k in range(4))
        want.append(brier - 0.5 * float(torch.log_softmax(z, 0)[t]))
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)


def test_brier_refuses_a_row_off_the_simplex():
    with pytest.raises(ValueError, match="sum to 1"):
        cal.brier_score(torch.tensor([[0.5, 0.2]]), torch.tensor([0]))
    with pytest.raises(ShapeError, match="class ids"):
        cal.brier_score(torch.tensor([[0.5, 0.5]]), torch.tensor([2]))


def test_accuracy_and_calibration_are_reported_apart():
    # 3 of 4 correct; parsed: rows 0, 1, 3 with q 0.9, 0.6, 0.2 and c 1, 1, 0
    # Brier = ((0.9 − 1)² + (0.6 − 1)² + 0.2²) / 3 = (0.01 + 0.16 + 0.04) / 3 = 0.07
    s = cal.calibration_summary(torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([0.9, 0.6, 0.0, 0.2], dtype=torch.float64),
                                torch.tensor([True, True, False, True]))
    assert s["accuracy"] == 0.75 and s["parsed_frac"] == 0.75
    assert abs(s["brier"] - 0.07) < 1e-12


def test_rlcr_logged_ece_bins_every_decimal_edge_where_it_belongs():
    # the confidences RLCR logs arrive as float32 (0.7 -> 0.699999988, 0.9 -> 0.899999976);
    # q = 0.0, 0.1, ..., 1.0, correct iff q >= 0.7, all parsed: ECE = 2.7/11 = 0.24545...
    # (bins 0..6: |0 − q| summing to 2.1; 0.7 and 0.8 alone: 0.3 and 0.2; {0.9, 1.0}: 2 × 0.05).
    # floor(10·q) on the float32 values put 0.7 with 0.6 and 0.9 with 0.8: 2.1/11 = 0.1909
    q = torch.tensor([k / 10 for k in range(11)], dtype=torch.float32)
    c = torch.tensor([float(k >= 7) for k in range(11)])
    s = cal.calibration_summary(c, q, torch.ones(11, dtype=torch.bool))
    assert s["ece"] == pytest.approx(2.7 / 11, abs=1e-7)
    # only the parsed replies enter it: the same 11 plus one unparsed reply give the same ECE
    s2 = cal.calibration_summary(torch.cat([c, torch.ones(1)]), torch.cat([q, torch.zeros(1)]),
                                 torch.tensor([True] * 11 + [False]))
    assert s2["ece"] == s["ece"] and s2["parsed_frac"] == pytest.approx(11 / 12)
