import math

import pytest
import torch

from policylab.kernels.corrections import sis
from policylab.errors import PolicylabError

from method_loss import method_loss
from policylab.errors import MissingQuantityError, ShapeError

F64 = torch.float64


def gen(seed):
    return torch.Generator().manual_seed(seed)


def case(pi_y, mu_y, pi_k, mu_k, ids, token, T):
    """One position repeated T times: sampled token `token` with π(y), μ(y); top-K ids with
    π and μ at those ids."""
    K = len(ids)
    return dict(
        logp=torch.full((1, T), math.log(pi_y), dtype=F64),
        behavior_topk_ids=torch.tensor(ids).expand(1, T, K).clone(),
        behavior_topk_logp=torch.log(torch.tensor(mu_k, dtype=F64)).expand(1, T, K).clone(),
        current_topk_logp=torch.log(torch.tensor(pi_k, dtype=F64)).expand(1, T, K).clone(),
        tokens=torch.full((1, T), token),
        logp_behavior_token=torch.full((1, T), math.log(mu_y), dtype=F64),
        mask=torch.ones(1, T, dtype=torch.bool),
    )


def naive_accept_prob(c):
    B, T = c["mask"].shape
    out = torch.zeros(B, T, dtype=F64)
    for i in range(B):
        for t in range(T):
            ratios = [math.exp(c["current_topk_logp"][i, t, k] - c["behavior_topk_logp"][i, t, k])
                      for k in range(c["behavior_topk_ids"].shape[-1])]
            r_y = math.exp(c["logp"][i, t] - c["logp_behavior_token"][i, t])
            env = max(1.0, max(ratios), r_y)
            out[i, t] = r_y / env
    return out


def test_identical_policies_accept_everything():
    # π = μ: every ratio is 1 -> M = 1 -> acceptance probability 1 -> all accepted
    c = case(0.3, 0.3, [0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [4, 7, 9], 7, 500)
    acc, m = sis(**c, generator=gen(0))
    assert bool(acc.all()) and m["sis/accept_rate"].item() == 1.0


def test_hand_worked_acceptance_probability():
    # π(y) = 0.3, μ(y) = 0.5 -> ratio 0.6; another top-K id has π/μ = 0.3/0.2 = 1.5 = M
    # acceptance = 0.6 / 1.5 = 0.4
    c = case(0.3, 0.5, [0.3, 0.3], [0.5, 0.2], [11, 12], 11, 40_000)
    acc, m = sis(**c, generator=gen(1))
    assert m["sis/accept_prob_mean"].item() == pytest.approx(0.4, abs=1e-12)
    assert m["sis/log_envelope_mean"].item() == pytest.approx(math.log(1.5), abs=1e-12)
    # empirical rate: std of the mean = sqrt(0.24 / 40000) = 0.0024; 0.01 is ~4 sigma
    assert abs(acc.double().mean().item() - 0.4) < 0.01


def test_envelope_includes_sampled_token_and_is_floored_at_one():
    # y outside the top-K with π(y)/μ(y) = 0.3/0.1 = 3 > top-K max 1.2 -> M = 3, p_acc = 1
    c = case(0.3, 0.1, [0.6], [0.5], [5], 99, 10)
    _, m = sis(**c, generator=gen(2))
    assert m["sis/accept_prob_mean"].item() == pytest.approx(1.0)
    assert m["sis/frac_sampled_outside_topk"].item() == 1.0
    # all ratios below 1 (top-K 0.8, y 0.5): M floored at 1 -> p_acc = 0.5 (not 0.5/0.8)
    c = case(0.1, 0.2, [0.4], [0.5], [5], 5, 10)
    _, m = sis(**c, generator=gen(2))
    assert m["sis/accept_prob_mean"].item() == pytest.approx(0.5)
    assert m["sis/frac_envelope_floored"].item() == 1.0


def test_matches_naive_loop_with_same_uniform_stream():
    torch.manual_seed(7)
    B, T, K, V = 3, 6, 4, 20
    ids = torch.stack([torch.randperm(V)[:K] for _ in range(B * T)]).view(B, T, K)
    c = dict(
        logp=-torch.rand(B, T, dtype=F64) * 3,
        behavior_topk_ids=ids,
        behavior_topk_logp=-torch.rand(B, T, K, dtype=F64) * 3,
        current_topk_logp=-torch.rand(B, T, K, dtype=F64) * 3,
        tokens=torch.randint(0, V, (B, T)),
        logp_behavior_token=-torch.rand(B, T, dtype=F64) * 3,
        mask=torch.rand(B, T) > 0.2,
    )
    acc, _ = sis(**c, generator=gen(3))
    u = torch.rand((B, T), generator=gen(3), dtype=F64)
    expected = (u < naive_accept_prob(c)) & c["mask"]
    assert torch.equal(acc, expected)


def test_same_seed_same_mask():
    c = case(0.3, 0.5, [0.3, 0.3], [0.5, 0.2], [11, 12], 11, 200)
    a1, _ = sis(**c, generator=gen(42))
    a2, _ = sis(**c, generator=gen(42))
    a3, _ = sis(**c, generator=gen(43))
    assert torch.equal(a1, a2) and not torch.equal(a1, a3)


def sis_host_loss(logp, logp_old, accepted, adv=1.0, eps=0.2):
    """The registered `sis` composition: PPO clip whose ratio denominator is sg(logp) on
    accepted tokens and logp_old elsewhere."""
    return method_loss("sis", {"eps_low": eps, "eps_high": eps}, logp, torch.full((logp.shape[0],), adv, dtype=F64),
                       torch.ones(logp.shape, dtype=torch.bool), logp_old=logp_old,
                       extras={"sis_accepted": accepted})[0]


def test_accepted_token_always_has_gradient_rejected_keeps_host_ratio():
    # rho = 1.5, A = +1, eps 0.2: a rejected token is clipped in the flat region -> grad 0
    # and loss -min(1.5, 1.2) = -1.2; the accepted one has ratio value 1 (inside the clip):
    # loss -1, grad -A = -1.
    logp_old = torch.log(torch.tensor([[0.2, 0.2]], dtype=F64))
    logp = (logp_old + math.log(1.5)).requires_grad_(True)
    accepted = torch.tensor([[True, False]])
    loss = sis_host_loss(logp, logp_old, accepted)
    torch.testing.assert_close(loss.detach(), torch.tensor([[-1.0, -1.2]], dtype=F64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, 0.0]], dtype=F64))


def test_accepting_one_position_changes_no_other():
    torch.manual_seed(8)
    logp_old = -torch.rand(2, 5, dtype=F64)
    logp = logp_old + 0.1 * torch.randn(2, 5, dtype=F64)
    a1 = torch.zeros(2, 5, dtype=torch.bool)
    a2 = a1.clone()
    a2[1, 3] = True
    w1 = sis_host_loss(logp, logp_old, a1)
    w2 = sis_host_loss(logp, logp_old, a2)
    other = torch.ones(2, 5, dtype=torch.bool)
    other[1, 3] = False
    assert torch.equal(w1[other], w2[other])
    # rejected tokens are not dropped: they keep their nonzero host loss
    assert bool((w1 != 0).all())


def test_refusals():
    c = case(0.3, 0.5, [0.3], [0.5], [1], 1, 3)
    with pytest.raises(ShapeError, match="behavior_topk_logp"):
        sis(**{**c, "behavior_topk_logp": torch.zeros(1, 3, 2, dtype=F64)}, generator=gen(0))
    with pytest.raises(ShapeError, match="integer"):
        sis(**{**c, "behavior_topk_ids": c["behavior_topk_ids"].double()}, generator=gen(0))
    with pytest.raises(MissingQuantityError, match="logp_behavior_token"):
        sis(**{**c, "logp_behavior_token": None}, generator=gen(0))
    with pytest.raises(TypeError, match="Generator"):
        sis(**c, generator=0)
    with pytest.raises(PolicylabError, match="sis_accepted"):  # the host loss needs the round's acceptance
        method_loss("sis", {}, c["logp"], torch.ones(1, dtype=F64), c["mask"], logp_old=c["logp"])
