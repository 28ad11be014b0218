"""RLCPR: the strict gates, the relative length penalty and the prompt-entropy CDF."""

import pytest
import torch

from policylab.kernels.rewards import length_gate as lg

KW = dict(length_threshold=10.0, posterior_range=0.2, coef=0.5, eps=0.0)


def naive(rewards, lengths, post, group, L_thr, tau, coef, eps):
    out = []
    for i, g in enumerate(group):
        m = [j for j, h in enumerate(group) if h == g]
        lmin, lmax = min(lengths[j] for j in m), max(lengths[j] for j in m)
        prange = max(post[j] for j in m) - min(post[j] for j in m)
        if lmin > L_thr and prange < tau:
            out.append(rewards[i] - coef * (lengths[i] - lmin) / (lmax - lmin + eps))
        else:
            out.append(rewards[i])
    return out


def _run(lengths, post, rewards=None, **kw):
    n = len(lengths)
    r = torch.tensor(rewards if rewards is not None else [1.0] * n, dtype=torch.float64)
    return lg.rlcpr_shaping(r, torch.tensor(lengths, dtype=torch.float64), torch.tensor(post, dtype=torch.float64),
                            torch.zeros(n, dtype=torch.long), **{**KW, **kw})


def test_hand_case_gate_open():
    # lengths [12, 16, 20], min 12 > 10; posteriors [0.5, 0.55, 0.6], range 0.1 < 0.2: gated
    # penalty 0.5·(len − 12)/(20 − 12) = [0, 0.25, 0.5] -> rewards [1, 0.75, 0.5]
    shaped, gate, _ = _run([12, 16, 20], [0.5, 0.55, 0.6])
    torch.testing.assert_close(shaped, torch.tensor([1.0, 0.75, 0.5], dtype=torch.float64))
    assert bool(gate.all())


def test_minimum_length_exactly_at_threshold_gives_no_penalty():
    # min len = 10 = L_thr: the gate needs min len > L_thr (strict)
    shaped, gate, _ = _run([10, 16, 20], [0.5, 0.5, 0.5])
    torch.testing.assert_close(shaped, torch.ones(3, dtype=torch.float64))
    assert not bool(gate.any())


def test_posterior_range_exactly_at_tau_gives_no_penalty():
    # range 0.75 − 0.25 = 0.5 = τ (binary fractions, exact): the gate needs range < τ (strict)
    shaped, gate, _ = _run([12, 16, 20], [0.25, 0.5, 0.75], posterior_range=0.5)
    torch.testing.assert_close(shaped, torch.ones(3, dtype=torch.float64))
    assert not bool(gate.any())


def test_one_short_reply_disables_the_penalty_for_the_whole_group():
    shaped, gate, _ = _run([3, 40, 50], [0.5, 0.5, 0.5])
    torch.testing.assert_close(shaped, torch.ones(3, dtype=torch.float64))


def test_shortest_never_penalized_and_equal_lengths_unchanged():
    shaped, _, _ = _run([15, 30, 15], [0.4, 0.41, 0.42], rewards=[0.0, 1.0, 1.0])
    assert float(shaped[0]) == 0.0 and float(shaped[2]) == 1.0 and float(shaped[1]) == 0.5
    shaped, gate, _ = _run([20, 20, 20], [0.4, 0.4, 0.4], eps=1e-6)
    assert bool(gate.all())
    torch.testing.assert_close(shaped, torch.ones(3, dtype=torch.float64))


def test_matches_naive_loop_across_groups():
    g = torch.Generator().manual_seed(0)
    group = torch.tensor([3, 3, 3, 3, 8, 8, 8, 8, 1, 1, 1, 1])
    lengths = torch.randint(5, 30, (12,), generator=g).double()
    post = (0.5 + 0.1 * torch.rand(12, generator=g, dtype=torch.float64))
    post[8:] = torch.tensor([0.1, 0.9, 0.5, 0.5], dtype=torch.float64)  # one group with spread posteriors
    r = torch.randint(0, 2, (12,), generator=g).double()
    got, _, _ = lg.rlcpr_shaping(r, lengths, post, group, length_threshold=6.0, posterior_range=0.2, coef=0.3,
                                 eps=1e-6)
    want = naive(r.tolist(), lengths.tolist(), post.tolist(), group.tolist(), 6.0, 0.2, 0.3, 1e-6)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)


def test_entropy_cdf_is_strict():
    # [1, 1, 2]: #{h_j < 1} = 0, #{h_j < 2} = 2 -> [0, 0, 2/3]
    torch.testing.assert_close(lg.entropy_cdf(torch.tensor([1.0, 1.0, 2.0])),
                               torch.tensor([0.0, 0.0, 2 / 3], dtype=torch.float64))


def test_answer_posteriors():
    lp = torch.tensor([-0.5, -2.0], dtype=torch.float64)
    torch.testing.assert_close(lg.answer_posteriors(lp, torch.tensor([1, 2]), form="joint"), lp.exp())
    torch.testing.assert_close(lg.answer_posteriors(lp, torch.tensor([1, 2]), form="token_geomean"),
                               torch.tensor([-0.5, -1.0], dtype=torch.float64).exp())


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="probabilities"):
        _run([12, 13], [0.5, 1.5])
    with pytest.raises(ValueError, match="lengths"):
        _run([-1, 13], [0.5, 0.5])
    with pytest.raises(ValueError, match="coef"):
        _run([12, 13], [0.5, 0.5], coef=-1.0)
    with pytest.raises(lg.ShapeError):
        lg.rlcpr_shaping(torch.ones(2), torch.ones(3), torch.ones(2), torch.zeros(2, dtype=torch.long), **KW)
    with pytest.raises(ValueError, match="form"):
        lg.answer_posteriors(torch.zeros(1), torch.ones(1), form="mean")
