"""reinforce_pp, reinforce_pp_returns, reinforce_pp_baseline, EmaScale (advantages/reinforce_pp.py)."""

import math
import types

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels import kl
from policylab.kernels.advantages import EmaScale, reinforce_pp, reinforce_pp_baseline, reinforce_pp_returns
from policylab.errors import BatchReuseError, NonFiniteError, PolicylabError, ShapeError

F64 = torch.float64
NAN = float("nan")


def hand_inputs():
    # one response, 3 valid tokens + 1 padded column (NaN there must not matter)
    # kl = lp_old − lp_ref = [−1.0 − (−1.1), −1.0 − (−1.2), −1.0 − (−1.3)] = [0.1, 0.2, 0.3]
    lp_old = torch.tensor([[-1.0, -1.0, -1.0, NAN]], dtype=F64)
    lp_ref = torch.tensor([[-1.1, -1.2, -1.3, NAN]], dtype=F64)
    mask = torch.tensor([[True, True, True, False]])
    return torch.tensor([1.0], dtype=F64), lp_old, lp_ref, mask


def naive_returns(rewards, lp_old, lp_ref, mask, beta):
    B, T = lp_old.shape
    out = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                kl_to_go = sum(float(lp_old[b, u] - lp_ref[b, u]) for u in range(t, T) if mask[b, u])
                out[b, t] = float(rewards[b]) - beta * kl_to_go
    return out


def naive_whiten(x, mask, eps):
    vals = x[mask].tolist()
    mean = sum(vals) / len(vals)
    std = (sum((v - mean) ** 2 for v in vals) / len(vals)) ** 0.5
    return torch.where(mask, (x - mean) / (std + eps), torch.zeros((), dtype=x.dtype))


def penalty(lp_old, lp_ref, mask, beta, estimator="k1"):
    """β·k(lp_old, lp_ref) per token, the KL-in-reward penalty the method's round stage writes."""
    return kl.reward_penalty(lp_old, lp_ref, mask, coef=beta, estimator=estimator)


def test_returns_hand_case():
    # A_t = r − β Σ_{u≥t} kl_u, β = 1: [1 − 0.6, 1 − 0.5, 1 − 0.3] = [0.4, 0.5, 0.7]
    r, lp_old, lp_ref, mask = hand_inputs()
    a = reinforce_pp_returns(r, penalty(lp_old, lp_ref, mask, 1.0), mask)
    assert_close(a, torch.tensor([[0.4, 0.5, 0.7, 0.0]], dtype=F64), rtol=0, atol=1e-12)
    # no KL term: every valid token carries the reward
    assert_close(reinforce_pp_returns(r, None, mask), torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=F64))


def test_whitened_hand_case_one_sample_per_prompt():
    # [0.4, 0.5, 0.7]: mean 0.53333, deviations [−0.13333, −0.03333, 0.16667]
    # population var = (0.017778 + 0.001111 + 0.027778)/3 = 0.015556, std 0.124722
    # → [−1.0690, −0.2673, 1.3363]
    r, lp_old, lp_ref, mask = hand_inputs()
    a = reinforce_pp(r, penalty(lp_old, lp_ref, mask, 1.0), mask, eps=0.0)
    assert_close(a, torch.tensor([[-1.0690, -0.2673, 1.3363, 0.0]], dtype=F64), rtol=0, atol=1e-4)


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_naive_reference(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 8
    rewards = torch.randn(B, generator=g, dtype=F64)
    lp_old = -torch.rand(B, T, generator=g, dtype=F64) * 3
    lp_ref = -torch.rand(B, T, generator=g, dtype=F64) * 3
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:, 0] = True
    ret = reinforce_pp_returns(rewards, penalty(lp_old, lp_ref, mask, 0.05), mask)
    assert_close(ret, naive_returns(rewards, lp_old, lp_ref, mask, 0.05))
    assert_close(reinforce_pp(rewards, penalty(lp_old, lp_ref, mask, 0.05), mask), naive_whiten(ret, mask, 1e-8))


def test_k3_estimator_is_used_when_asked():
    # kl_estimator=k3 was once accepted and silently computed with k1. Hand case: d = lp_ref −
    # lp_old = [−0.1, −0.2, −0.3]; k3 = e^d − d − 1 = [0.004837, 0.018731, 0.040818];
    # β = 1, r = 1 → A = [1 − 0.064386, 1 − 0.059549, 1 − 0.040818] = [0.935614, 0.940451, 0.959182]
    r, lp_old, lp_ref, mask = hand_inputs()
    a = reinforce_pp_returns(r, penalty(lp_old, lp_ref, mask, 1.0, "k3"), mask)
    assert_close(a[0, :3], torch.tensor([0.935614, 0.940451, 0.959182], dtype=F64), rtol=0, atol=1e-6)
    # through the method: its KL stage writes the k3 penalty, its advantage stage reads it
    from policylab import methods
    from policylab.methods.stages.rounds import kl_reward_penalty

    m = methods.get("reinforce_pp").with_params({"kl_estimator": "k3", "kl_coef": 1.0})
    stage = m.round[0]
    batch = types.SimpleNamespace(logp_old=lp_old, logp_ref=lp_ref, loss_mask=mask, require=lambda *a: None)
    changes, _ = kl_reward_penalty(batch, types.SimpleNamespace(p=m.view(stage)))
    assert_close(changes["extras"]["kl_penalty"], penalty(lp_old, lp_ref, mask, 1.0, "k3"))


def test_returns_bad_inputs():
    r, lp_old, lp_ref, mask = hand_inputs()
    pen = penalty(lp_old, lp_ref, mask, 1.0)
    with pytest.raises(ShapeError, match=r"row\(s\) \[0\] have no valid token"):
        reinforce_pp_returns(r, pen, torch.zeros_like(mask))
    with pytest.raises(ShapeError, match="`rewards` has 2 entries but `mask` has 1 rows"):
        reinforce_pp_returns(torch.zeros(2, dtype=F64), pen, mask)
    with pytest.raises(ShapeError, match="`kl_penalty` has shape"):
        reinforce_pp_returns(r, pen[:, :3], mask)
    bad = pen.clone()
    bad[0, 1] = NAN
    with pytest.raises(NonFiniteError, match=r"`kl_penalty`.*index \[0, 1\]"):
        reinforce_pp_returns(r, bad, mask)
    with pytest.raises(NonFiniteError, match="`rewards`"):
        reinforce_pp_returns(torch.tensor([NAN], dtype=F64), pen, mask)
    with pytest.raises(ValueError, match="`coef` must be a finite number >= 0"):
        penalty(lp_old, lp_ref, mask, -0.1)


# ----- group-baseline variant -------------------------------------------------------

def baseline_inputs():
    # groups [1, 0] and [0.6, 0.4] with non-contiguous ids, interleaved
    return torch.tensor([1.0, 0.6, 0.0, 0.4], dtype=F64), torch.tensor([31, -2, 31, -2])


def naive_baseline(rewards, group, scale):
    centred = torch.zeros_like(rewards)
    for i in range(len(group)):
        members = [float(rewards[j]) for j in range(len(group)) if group[j] == group[i]]
        centred[i] = float(rewards[i]) - sum(members) / len(members)
    return centred / scale


def test_baseline_hand_case_population_convention():
    # centring: [1,0] → [0.5, −0.5]; [0.6,0.4] → [0.1, −0.1]
    # batch second moment = (0.25 + 0.25 + 0.01 + 0.01)/4 = 0.13, scale √0.13 = 0.36056
    # → [0.5, −0.5, 0.1, −0.1]/0.36056 = [1.387, −1.387, 0.277, −0.277]  (5:1 kept)
    # (unbiased: √(0.52/3) = 0.41633 → ±1.201 / ±0.240, which does not match the hand-worked case)
    r, g = baseline_inputs()
    a = reinforce_pp_baseline(r, g, scale="batch_std", eps=0.0)
    assert_close(a, torch.tensor([1.387, 0.277, -1.387, -0.277], dtype=F64), rtol=0, atol=5e-4)
    assert abs(float(a[2]) + 1.201) > 0.1


@pytest.mark.parametrize("seed", [0, 1])
def test_baseline_matches_naive(seed):
    g = torch.Generator().manual_seed(seed)
    group = torch.tensor([4, 4, 4, 9, 9, 1, 1, 1, 1, 6])[torch.randperm(10, generator=g)]
    r = torch.randn(10, generator=g, dtype=F64)
    centred = naive_baseline(r, group, 1.0)
    scale = math.sqrt(float((centred**2).mean()))
    assert_close(reinforce_pp_baseline(r, group, scale="batch_std", eps=1e-8), naive_baseline(r, group, scale + 1e-8))


def test_ema_advances_once_per_training_batch_never_on_evaluation():
    ema = EmaScale(decay=0.9)
    r, g = baseline_inputs()
    # first training batch: m = 0.13 (the first update sets it), same result as batch_std
    a1 = reinforce_pp_baseline(r, g, scale="ema", ema=ema, update=True, batch_id="b1", eps=0.0)
    assert ema.n_updates == 1 and ema.second_moment == pytest.approx(0.13, abs=1e-12)
    assert_close(a1, reinforce_pp_baseline(r, g, scale="batch_std", eps=0.0))
    # second training batch [1, 0]: batch moment 0.25; m = 0.9·0.13 + 0.1·0.25 = 0.142
    r2, g2 = torch.tensor([1.0, 0.0], dtype=F64), torch.tensor([0, 0])
    a2 = reinforce_pp_baseline(r2, g2, scale="ema", ema=ema, update=True, batch_id="b2", eps=0.0)
    assert ema.second_moment == pytest.approx(0.142, abs=1e-12)
    # 0.5/√0.142 = 1.3269
    assert_close(a2, torch.tensor([1.3269, -1.3269], dtype=F64), rtol=0, atol=1e-4)
    # evaluation: reads the scale, changes nothing — even on a very different batch
    before = ema.state_dict()
    a_eval = reinforce_pp_baseline(torch.tensor([100.0, -100.0], dtype=F64), g2, scale="ema", ema=ema, update=False, eps=0.0)
    assert ema.state_dict() == before
    assert_close(a_eval, torch.tensor([100.0, -100.0], dtype=F64) / math.sqrt(0.142))
    # the same training batch cannot advance it twice in a row
    with pytest.raises(BatchReuseError, match="already advanced on batch 'b2' \\(the last one\\)"):
        reinforce_pp_baseline(r2, g2, scale="ema", ema=ema, update=True, batch_id="b2")
    # ... nor later: b1 came before b2 (A, B, A)
    with pytest.raises(BatchReuseError, match="already advanced on batch 'b1' \\(not the last one: a stale batch\\)"):
        reinforce_pp_baseline(r, g, scale="ema", ema=ema, update=True, batch_id="b1")
    assert ema.n_updates == 2 and ema.second_moment == pytest.approx(0.142, abs=1e-12)


def test_ema_checkpoint_round_trip():
    ema = EmaScale(decay=0.8)
    ema.update(torch.tensor([0.5, -0.5]), batch_id="a")
    ema.update(torch.tensor([0.1, -0.1]), batch_id="b")
    restored = EmaScale(decay=0.8)
    restored.load_state_dict(ema.state_dict())
    assert restored.state_dict() == ema.state_dict()
    assert restored.scale == ema.scale
    with pytest.raises(PolicylabError, match="checkpointed EmaScale has decay 0.8"):
        EmaScale(decay=0.5).load_state_dict(ema.state_dict())
    # the seen ids survive the round trip: a stale batch is still refused after a resume
    with pytest.raises(BatchReuseError, match="'a'"):
        restored.update(torch.tensor([0.3, -0.3]), batch_id="a")
    # a checkpoint from before the ids were all kept (last id only) still loads
    old_state = {k: v for k, v in ema.state_dict().items() if k != "seen_batch_ids"}
    legacy = EmaScale(decay=0.8)
    legacy.load_state_dict(old_state)
    assert legacy.seen_batch_ids == {"b"} and legacy.scale == ema.scale


def test_baseline_and_ema_bad_inputs():
    r, g = baseline_inputs()
    with pytest.raises(PolicylabError, match="no state yet"):
        reinforce_pp_baseline(r, g, scale="ema", ema=EmaScale(0.9), update=False)
    with pytest.raises(PolicylabError, match="needs an explicit `update`"):
        reinforce_pp_baseline(r, g, scale="ema", ema=EmaScale(0.9))
    with pytest.raises(PolicylabError, match="needs `ema`"):
        reinforce_pp_baseline(r, g, scale="ema", update=True)
    with pytest.raises(PolicylabError, match="uses no EmaScale"):
        reinforce_pp_baseline(r, g, scale="batch_std", ema=EmaScale(0.9))
    # `update` is ignored with batch_std (there is no state): same result either way
    assert_close(reinforce_pp_baseline(r, g, scale="batch_std", update=True),
                 reinforce_pp_baseline(r, g, scale="batch_std"), rtol=0, atol=0)
    with pytest.raises(PolicylabError, match="`scale` must be"):
        reinforce_pp_baseline(r, g, scale="group_std")
    with pytest.raises(PolicylabError, match="`decay` must be a number in \\[0, 1\\)"):
        EmaScale(decay=1.0)
    with pytest.raises(NonFiniteError, match=r"index \[1\]"):
        reinforce_pp_baseline(torch.tensor([1.0, NAN, 0.0, 0.0]), g, scale="batch_std")
    with pytest.raises(NonFiniteError, match="`centred`"):
        EmaScale(0.9).update(torch.tensor([NAN]))
