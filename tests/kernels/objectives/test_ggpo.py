import inspect
import math

import pytest
import torch

from policylab import methods
from policylab.errors import MissingQuantityError, ShapeError
from policylab.kernels.objectives import METRIC_KEYS
from policylab.kernels.objectives.ggpo import ggpo, gibbs_coefficients

F64 = torch.float64


def naive_coefficients(ratio, rewards, group, beta, c):
    kappa, gap = torch.zeros_like(rewards), torch.zeros_like(rewards)
    for g in set(group.tolist()):
        idx = [i for i in range(len(rewards)) if int(group[i]) == g]
        a = [float(rewards[i]) / beta - min(max(float(ratio[i]), -c), c) for i in idx]
        z = sum(math.exp(x) for x in a)
        G = len(idx)
        for j, i in enumerate(idx):
            kappa[i] = math.exp(a[j]) / z - 1 / G
            gap[i] = math.log(z / G) - sum(a) / G
    return kappa, gap


def test_hand_worked():
    # a = [1, 0, 0] (r/beta with beta = 1, reference ratio 0):
    # softmax = [e, 1, 1] / (e + 2) = [0.5761, 0.2119, 0.2119]
    # kappa = softmax - 1/3 = [0.2428, -0.1214, -0.1214]
    # gap = log((e + 2)/3) - 1/3 = 0.4528 - 0.3333 = 0.1195
    kappa, gap, a = gibbs_coefficients(torch.zeros(3, dtype=F64), torch.tensor([1.0, 0.0, 0.0], dtype=F64),
                                       torch.tensor([4, 4, 4]), beta=1.0, coef_clip=5.0)
    torch.testing.assert_close(kappa, torch.tensor([0.2428, -0.1214, -0.1214], dtype=F64), atol=1e-4, rtol=0)
    torch.testing.assert_close(gap, torch.full((3,), 0.1195, dtype=F64), atol=1e-4, rtol=0)
    assert kappa.sum().item() == pytest.approx(0.0, abs=1e-15)


def test_equal_adjusted_rewards_give_zero():
    kappa, gap, _ = gibbs_coefficients(torch.zeros(4, dtype=F64), torch.full((4,), 0.7, dtype=F64),
                                       torch.zeros(4, dtype=torch.long), beta=0.5, coef_clip=1.0)
    assert torch.equal(kappa, torch.zeros(4, dtype=F64)) and bool((gap.abs() < 1e-12).all())


def test_matches_naive_with_arbitrary_group_ids():
    torch.manual_seed(70)
    ratio = 3 * torch.randn(12, dtype=F64)
    rewards = torch.rand(12, dtype=F64)
    group = torch.tensor([9, -2, 9, 40, 40, -2, 9, 40, -2, 9, 7, 7])
    kappa, gap, _ = gibbs_coefficients(ratio, rewards, group, beta=0.3, coef_clip=2.0)
    nk, ng = naive_coefficients(ratio, rewards, group, 0.3, 2.0)
    torch.testing.assert_close(kappa, nk)
    torch.testing.assert_close(gap, ng)
    for g in group.unique():
        assert kappa[group == g].sum().abs().item() < 1e-12


def test_gradient_is_minus_kappa_and_survives_ref_clip():
    # l_r = sum(lp - lp_ref) = [10, 0]; c = 1 clips sequence 0's l_r to 1 inside a only.
    # beta = 0.5, r = [1, 0]: a = [2 - 1, 0 - 0] = [1, 0]
    # softmax [e/(e+1), 1/(e+1)] = [0.7311, 0.2689] -> kappa = [0.2311, -0.2311]
    # loss entries -kappa_i·lp: d/dlp = -kappa_i on every token (nonzero for the clipped one)
    # (without the clip a = [2 - 10, 0] = [-8, 0] would flip the sign of kappa_0)
    lp_ref = torch.full((2, 2), -2.0, dtype=F64)
    lp = torch.tensor([[3.0, 3.0], [-2.0, -2.0]], dtype=F64).requires_grad_(True)
    rewards = torch.tensor([1.0, 0.0], dtype=F64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, m = ggpo(lp, lp_ref, rewards, torch.tensor([0, 0]), mask, beta=0.5, coef_clip=1.0)
    loss.sum().backward()
    k0 = math.e / (math.e + 1) - 0.5
    assert k0 == pytest.approx(0.2311, abs=1e-4)
    torch.testing.assert_close(lp.grad, torch.tensor([[-k0, -k0], [k0, k0]], dtype=F64))
    assert m["ggpo/frac_ref_ratio_clipped"].item() == 0.5
    assert set(METRIC_KEYS) <= set(m)


def test_no_behavior_or_old_policy_reaches_ggpo():
    # the kernel takes no behavior or old log-probs, and the registered method's active
    # stages read none: GGPO's κ comes from the learner and the reference alone, so the
    # trainer runs no old-logprob pass for it
    params = inspect.signature(ggpo).parameters
    assert not any("behavior" in p or p == "logp_old" for p in params)
    m = methods.get("ggpo")
    reads = {f for s in m.stages() if s.is_active(m.p) for f in s.reads}
    assert "logp_ref" in reads and not reads & {"logp_behavior", "logp_old"}
    assert set(m.roles) == {"logp_current", "logp_ref"}


def test_refusals():
    z = torch.zeros(2, 2, dtype=F64)
    m = torch.ones(2, 2, dtype=torch.bool)
    r, g = torch.zeros(2, dtype=F64), torch.tensor([0, 0])
    with pytest.raises(MissingQuantityError, match="logp_ref"):
        ggpo(z, None, r, g, m, beta=1.0, coef_clip=1.0)
    with pytest.raises(ValueError, match="beta"):
        ggpo(z, z, r, g, m, beta=0.0, coef_clip=1.0)
    with pytest.raises(ValueError, match="coef_clip"):
        ggpo(z, z, r, g, m, beta=1.0, coef_clip=-1.0)
    with pytest.raises(ShapeError):
        ggpo(z, z, torch.zeros(3, dtype=F64), g, m, beta=1.0, coef_clip=1.0)
    with pytest.raises(ValueError, match="no valid token"):
        ggpo(z, z, r, g, torch.zeros(2, 2, dtype=torch.bool), beta=1.0, coef_clip=1.0)
