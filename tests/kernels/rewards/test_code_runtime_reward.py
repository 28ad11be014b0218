"""code_opt: the correctness gate, the runtime statistic, the calibrated noise band and the
speed score forms."""

import math
import statistics

import pytest
import torch

from policylab.kernels.rewards import runtime as rt

KW = dict(form="percentile", alpha=0.1, min_rel_band=0.05, n_min=3, speedup_cap=4.0, provenance="synthetic")
REF = [100.0, 101.0, 99.0, 102.0, 98.0, 100.5, 99.5, 103.0, 97.0, 100.0]  # median 100


def test_incorrect_code_never_gets_speed_reward():
    # a wrong program that is 10x faster still scores incorrect_reward
    r, scores = rt.code_opt_rewards([False, True], [[10.0] * 5, [10.0] * 5], [REF, REF], timed_out=[False, False],
                                    speed_weight=0.5, incorrect_reward=-0.5, **KW)
    assert float(r[0]) == -0.5 and scores[0] is None
    assert float(r[1]) == 1.5  # correct and faster than every reference run: 1 + 0.5·1


def test_a_single_timing_raises():
    with pytest.raises(rt.TimingError, match="at least 3"):
        rt.runtime_statistic([1.0], n_min=3)
    with pytest.raises(rt.TimingError, match="n_min"):
        rt.runtime_statistic([1.0, 2.0], n_min=1)
    with pytest.raises(rt.TimingError, match="> 0"):
        rt.runtime_statistic([1.0, 0.0, 2.0], n_min=2)


def test_median_statistic():
    assert rt.runtime_statistic([3.0, 1.0, 2.0], n_min=3) == 2.0
    assert rt.runtime_statistic([4.0, 1.0, 2.0, 3.0], n_min=3) == 2.5


def test_noise_band_hand_case():
    # REF sorted: 97 98 99 99.5 100 100 100.5 101 102 103; linear quantiles at 0.1 and 0.9:
    # position 0.9 -> 97 + 0.9·1 = 97.9; position 8.1 -> 102 + 0.1·1 = 102.1
    # widened to at least 100·(1 ± 0.05) = [95, 105]
    lo, hi = rt.noise_band(REF, alpha=0.1, min_rel_band=0.05, n_min=3)
    assert (lo, hi) == (95.0, 105.0)
    lo, hi = rt.noise_band(REF, alpha=0.1, min_rel_band=0.0, n_min=3)
    assert abs(lo - 97.9) < 1e-9 and abs(hi - 102.1) < 1e-9


def test_improvement_inside_the_noise_band_scores_zero():
    # a candidate 3% faster (median 97) is inside [95, 105]: no improvement
    s = rt.speed_score([97.0, 96.9, 97.1], REF, **KW)
    assert s.speed == 0.0 and s.band == (95.0, 105.0)
    s = rt.speed_score([104.0] * 3, REF, **KW)
    assert s.speed == 0.0


def test_percentile_form_hand_cases():
    # median 90 < every reference run: P = 10/10 = 1 > 0.9 -> (1 − 0.9)/0.1 = 1
    assert rt.speed_score([90.0] * 3, REF, **KW).speed == pytest.approx(1.0)
    # median 200 > every run: P = 0 < 0.1 -> −(0.1 − 0)/0.1 = −1
    assert rt.speed_score([200.0] * 3, REF, **KW).speed == pytest.approx(-1.0)
    # with no minimum band, median 97.5 is below 9 of 10 runs (only 97 is faster): P = 0.9, not > 0.9 -> 0
    s = rt.speed_score([97.5] * 3, REF, **{**KW, "min_rel_band": 0.0})
    assert s.percentile == pytest.approx(0.9) and s.speed == 0.0


def test_log_speedup_form():
    # 2x faster with cap 4: log 2 / log 4 = 0.5; 8x faster saturates at 1; 2x slower −0.5
    kw = {**KW, "form": "log_speedup"}
    assert rt.speed_score([50.0] * 3, REF, **kw).speed == pytest.approx(0.5)
    assert rt.speed_score([12.5] * 3, REF, **kw).speed == pytest.approx(1.0)
    assert rt.speed_score([200.0] * 3, REF, **kw).speed == pytest.approx(-0.5)


def naive_reward(correct, cand, ref, timed_out, w, bad):
    if not correct:
        return bad
    if timed_out:
        return 1 - w
    c, m = statistics.median(cand), statistics.median(ref)
    rs = sorted(ref)

    def q(a):
        pos = a * (len(rs) - 1)
        i = int(math.floor(pos))
        return rs[i] + (pos - i) * (rs[min(i + 1, len(rs) - 1)] - rs[i])

    lo, hi = min(q(0.1), m * 0.95), max(q(0.9), m * 1.05)
    if lo <= c <= hi:
        return 1.0
    P = sum(r > c for r in ref) / len(ref)
    s = (P - 0.9) / 0.1 if P > 0.9 else -(0.1 - P) / 0.1 if P < 0.1 else 0.0
    return 1 + w * s


def test_matches_naive_loop():
    g = torch.Generator().manual_seed(0)
    correct, cand, ref, to = [], [], [], []
    for i in range(40):
        correct.append(bool(i % 3))
        to.append(i % 7 == 0)
        base = 50 + 100 * float(torch.rand(1, generator=g))
        ref.append([base * (1 + 0.02 * float(x)) for x in torch.randn(9, generator=g)])
        cand.append([base * float(0.3 + 1.5 * torch.rand(1, generator=g)) * (1 + 0.01 * float(x))
                     for x in torch.randn(5, generator=g)])
    got, _ = rt.code_opt_rewards(correct, cand, ref, timed_out=to, speed_weight=0.5, incorrect_reward=0.0, **KW)
    want = [naive_reward(*a, 0.5, 0.0) for a in zip(correct, cand, ref, to)]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32), rtol=0, atol=1e-6)


def test_scores_carry_their_provenance():
    s = rt.speed_score([90.0] * 3, REF, **KW)
    assert s.provenance == "synthetic"
    assert rt.speed_score([90.0] * 3, REF, **{**KW, "provenance": "measured"}).provenance == "measured"
    with pytest.raises(ValueError, match="provenance"):
        rt.speed_score([90.0] * 3, REF, **{**KW, "provenance": "guessed"})


def test_a_correct_candidate_that_ran_out_of_time_while_timing_is_the_slowest():
    r, _ = rt.code_opt_rewards([True], [()], [()], timed_out=[True], speed_weight=0.5, incorrect_reward=0.0, **KW)
    assert float(r[0]) == 0.5


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="alpha"):
        rt.noise_band(REF, alpha=0.5, min_rel_band=0.0, n_min=3)
    with pytest.raises(ValueError, match="form"):
        rt.speed_score([1.0] * 3, REF, **{**KW, "form": "ratio"})
    with pytest.raises(ValueError, match="one entry per candidate"):
        rt.code_opt_rewards([True], [], [REF], timed_out=[False], speed_weight=0.5, incorrect_reward=0.0, **KW)
    with pytest.raises(rt.TimingError, match="speed score"):
        rt.code_opt_reward(True, None, speed_weight=0.5, incorrect_reward=0.0)
