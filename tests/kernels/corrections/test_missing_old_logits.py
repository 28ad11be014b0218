import math

import pytest
import torch

from policylab.kernels.corrections import VersionedLogprobs, decompose, require_exact_old
from policylab.errors import MissingQuantityError

from method_loss import method_loss

F64 = torch.float64


def vl(t, version=3, engine="hf", kind="exact"):
    return VersionedLogprobs(t, policy_version=version, engine=engine, kind=kind)


def rand_roles(seed, B=3, T=5):
    torch.manual_seed(seed)
    lp_old = -torch.rand(B, T, dtype=F64) * 2
    lp_mu = (lp_old + 0.1 * torch.randn(B, T, dtype=F64)).clamp(max=-1e-3)
    lp = lp_old + 0.1 * torch.randn(B, T, dtype=F64)
    mask = torch.rand(B, T) > 0.2
    return lp, lp_old, lp_mu, mask


_ENGINE_PARAMS = {"tis": {"cap": "tis_cap"}, "icepop": {"low": "icepop_low", "high": "icepop_high"},
                  "kpop": {"delta": "kpop_delta", "in_region_weight": "kpop_weight"}}


def decoupled_loss(lp, old, behavior, adv, mask, *, correction, correction_kwargs, eps_low, eps_high):
    """The registered `missing_old_logits` composition (PPO clip on s x the engine
    correction on d), after the exact-old check its round stage makes."""
    require_exact_old(old, behavior)
    names = _ENGINE_PARAMS.get(correction, {})
    params = {"engine_correction": correction, "eps_low": eps_low, "eps_high": eps_high,
              **{names.get(k, k): v for k, v in correction_kwargs.items()}}
    return method_loss("missing_old_logits", params, lp, adv, mask, logp_old=old.tensor, logp_behavior=behavior.tensor)


def naive_decoupled_tis(lp, lp_old, lp_mu, adv, mask, cap, eps_low, eps_high):
    out = torch.zeros_like(lp)
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            if mask[i, t]:
                w = min(math.exp(lp_old[i, t] - lp_mu[i, t]), cap)
                s = math.exp(lp[i, t] - lp_old[i, t])
                a = float(adv[i])
                out[i, t] = -w * min(s * a, min(max(s, 1 - eps_low), 1 + eps_high) * a)
    return out


def test_decomposition_d_times_s_is_total():
    lp, lp_old, lp_mu, mask = rand_roles(10)
    parts = decompose(lp, lp_old, lp_mu, mask)
    d, s = torch.exp(parts["engine_log_ratio"]), torch.exp(parts["staleness_log_ratio"])
    torch.testing.assert_close(d * s, torch.exp(parts["total_log_ratio"]), rtol=1e-12, atol=0)
    assert bool((parts["total_log_ratio"][~mask] == 0).all())


def test_same_version_staleness_is_one_and_engine_change_moves_only_d():
    _, lp_old, lp_mu, mask = rand_roles(11)
    parts = decompose(lp_old.clone(), lp_old, lp_mu, mask)  # v_b = v_now: lp = lp_old in value
    assert bool((parts["staleness_log_ratio"] == 0).all())
    other_engine = lp_mu - 0.3  # same weights, another engine's numerics
    parts2 = decompose(lp_old.clone(), lp_old, other_engine, mask)
    assert torch.equal(parts2["staleness_log_ratio"], parts["staleness_log_ratio"])
    assert not torch.equal(parts2["engine_log_ratio"][mask], parts["engine_log_ratio"][mask])


def test_require_exact_old_refusals():
    t = torch.zeros(1, 2)
    with pytest.raises(MissingQuantityError, match="`logp_old`"):
        require_exact_old(None, vl(t))
    with pytest.raises(MissingQuantityError, match="`logp_behavior`"):
        require_exact_old(vl(t), None)
    with pytest.raises(MissingQuantityError, match="approximation"):
        require_exact_old(vl(t, kind="approx_ewma"), vl(t))
    with pytest.raises(MissingQuantityError, match="tagged version 4 .* version 3"):
        require_exact_old(vl(t, version=4), vl(t, version=3))
    with pytest.raises(ValueError, match="kind"):
        vl(t, kind="approx")
    old, beh = require_exact_old(vl(t, engine="fsdp"), vl(t + 1, engine="vllm"))
    assert torch.equal(old, t) and torch.equal(beh, t + 1)


def test_decoupled_loss_refuses_missing_old_never_substitutes():
    lp, _, lp_mu, mask = rand_roles(12)
    kw = dict(correction="tis", correction_kwargs={"cap": 2.0}, eps_low=0.2, eps_high=0.2)
    with pytest.raises(MissingQuantityError, match="logp_old"):
        decoupled_loss(lp, None, vl(lp_mu), torch.ones(3, dtype=F64), mask, **kw)
    with pytest.raises(MissingQuantityError, match="logp_old"):
        decoupled_loss(lp, vl(lp, kind="approx_ewma"), vl(lp_mu), torch.ones(3, dtype=F64), mask, **kw)
    with pytest.raises(ValueError, match="correction"):
        decoupled_loss(lp, vl(lp), vl(lp_mu), torch.ones(3, dtype=F64), mask,
                       **{**kw, "correction": "ppo"})


def test_decoupled_matches_naive_loop():
    lp, lp_old, lp_mu, mask = rand_roles(13)
    adv = torch.randn(3, dtype=F64)
    loss, m = decoupled_loss(lp, vl(lp_old), vl(lp_mu), adv, mask, correction="tis",
                             correction_kwargs={"cap": 1.05}, eps_low=0.05, eps_high=0.08)
    torch.testing.assert_close(loss, naive_decoupled_tis(lp, lp_old, lp_mu, adv, mask, 1.05, 0.05, 0.08))
    assert "correction/tis/frac_capped" in m


def test_gradient_uses_old_not_live_logp_and_thresholds_are_separate():
    # token 0: k = 1 (lp_old = lp_mu), s = 1.1 (inside clip 0.2): grad = -k·s·A = -1.1·A.
    #   If `logp` were used in place of `logp_old` for d, k would be 1.1 -> -1.21·A: caught.
    # token 1: k = 2 (inside icepop band [0.5, 5]), s = 1.5 > 1.2 with A > 0 -> flat, grad 0
    lp_old = torch.log(torch.tensor([[0.2, 0.2]], dtype=F64))
    lp_mu = lp_old - torch.tensor([[0.0, math.log(2.0)]], dtype=F64)
    lp = (lp_old + torch.log(torch.tensor([[1.1, 1.5]], dtype=F64))).requires_grad_(True)
    adv = torch.tensor([2.0], dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, _ = decoupled_loss(lp, vl(lp_old), vl(lp_mu), adv, mask, correction="icepop",
                             correction_kwargs={"low": 0.5, "high": 5.0}, eps_low=0.2, eps_high=0.2)
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.1 * 2.0, 0.0]], dtype=F64))
    # widen only the staleness clip: token 1 now inside -> grad -k·s·A = -2·1.5·2 = -6;
    # the engine weight (2) did not move with eps
    lp.grad = None
    loss, _ = decoupled_loss(lp, vl(lp_old), vl(lp_mu), adv, mask, correction="icepop",
                             correction_kwargs={"low": 0.5, "high": 5.0}, eps_low=0.2, eps_high=0.6)
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-2.2, -6.0]], dtype=F64))
    # kpop on d with its own delta works through the same path
    loss_k, m = decoupled_loss(lp, vl(lp_old), vl(lp_mu), adv, mask, correction="kpop",
                               correction_kwargs={"delta": 0.01, "in_region_weight": "one"},
                               eps_low=0.2, eps_high=0.2)
    assert "correction/kpop/frac_masked" in m and torch.isfinite(loss_k).all()


def test_logp_old_missing_is_refused_by_the_loss_itself():
    # even without the provenance check, the engine correction reads the recomputed π_old
    # and refuses a batch without one: it never substitutes logp or logp_behavior
    lp, _, lp_mu, mask = rand_roles(14)
    with pytest.raises(MissingQuantityError, match="logp_old"):
        method_loss("missing_old_logits", {}, lp, torch.ones(3, dtype=F64), mask, logp_behavior=lp_mu)
