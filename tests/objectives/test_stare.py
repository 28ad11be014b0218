"""STARE: quantile over valid tokens only, the gate and its flip, sign preservation, the
four advantage × surprisal quadrants, a naive loop reference, the round stage's entropy
(full vocabulary) in the trainer, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from policylab.errors import PolicylabError, ShapeError
from policylab.objectives.stare import entropy_gate, stare_reweight, surprisal_quantile

F = torch.float64


def test_quantile_ignores_padding():
    lp = torch.tensor([[-0.1, -0.5, -2.0, 0.0], [-1.0, -3.0, 0.0, 0.0]], dtype=F)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    # σ over valid tokens = [0.1, 0.5, 2.0, 1.0, 3.0]; sorted [0.1, 0.5, 1.0, 2.0, 3.0]; q = 0.5 → 1.0,
    # q = 0.8 → position 0.8·4 = 3.2 → 2.0 + 0.2·(3.0 − 2.0) = 2.2 (linear interpolation)
    assert math.isclose(float(surprisal_quantile(lp, mask, 0.5)), 1.0)
    assert math.isclose(float(surprisal_quantile(lp, mask, 0.8)), 2.2)
    # padded tokens holding lp = −30 do not move it
    lp2 = torch.where(mask, lp, torch.tensor(-30.0, dtype=F))
    assert float(surprisal_quantile(lp2, mask, 0.8)) == float(surprisal_quantile(lp, mask, 0.8))


def test_gate_and_its_flip():
    assert entropy_gate(0.3, 0.5, gate="sign") == 1.0  # entropy below target: favour entropy-raising updates
    assert entropy_gate(0.7, 0.5, gate="sign") == -1.0
    assert entropy_gate(0.5, 0.5, gate="sign") == 0.0
    assert math.isclose(entropy_gate(0.3, 0.5, gate="proportional", gain=2.0), 0.4)  # 2·(0.5 − 0.3)
    assert entropy_gate(0.0, 5.0, gate="proportional", gain=2.0) == 1.0  # clipped


def _quadrants(target):
    # four tokens, all critical (threshold 0): (A > 0, rare), (A > 0, common), (A < 0, rare), (A < 0, common),
    # H = 1.0: σ = 2.0 is rare (σ > H), σ = 0.5 common
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=F)
    lp = torch.tensor([[-2.0, -0.5], [-2.0, -0.5]], dtype=F)
    mask = torch.ones_like(lp, dtype=torch.bool)
    return stare_reweight(adv, lp, mask, entropy=1.0, target=target, threshold=0.0, strength=0.5, gate="sign")[0]


def test_four_quadrants_and_the_flip():
    # H < H*: g = +1. e = sign(A)·sign(σ − H): [+1, −1, −1, +1] → factors 1 ± 0.5
    # A' = [1·1.5, 1·0.5, −1·0.5, −1·1.5]: positive-rare and negative-common (both raise entropy) amplified
    assert_close(_quadrants(2.0), torch.tensor([[1.5, 0.5], [-0.5, -1.5]], dtype=F))
    # H > H*: the gate flips, so do the factors
    assert_close(_quadrants(0.2), torch.tensor([[0.5, 1.5], [-1.5, -0.5]], dtype=F))
    # H = H*: A' = A
    assert_close(_quadrants(1.0), torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=F))


def test_sign_never_flips_even_with_a_large_strength():
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(6, generator=g, dtype=F)
    lp = -torch.rand(6, 7, generator=g, dtype=F) * 4
    mask = torch.rand(6, 7, generator=g) > 0.2
    out, _ = stare_reweight(adv, lp, mask, entropy=1.0, target=3.0, threshold=0.5, strength=10.0, gate="sign")
    a = adv.unsqueeze(-1).expand_as(out)
    assert bool(((out * a) >= 0)[mask].all())
    assert bool((out[~mask] == 0).all())


def _naive(adv, lp, mask, H, target, thr, lam, low):
    g = (target > H) - (target < H)
    out = torch.zeros_like(lp)
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            if not mask[i, t]:
                continue
            s = -float(lp[i, t])
            a = float(adv[i])
            crit = s >= thr or (low is not None and s <= low)
            e = math.copysign(1, a) * ((s > H) - (s < H)) if a != 0 else 0
            out[i, t] = a * max(0.0, 1 + lam * g * e * crit)
    return out


@pytest.mark.parametrize("low", [None, 0.3])
def test_matches_a_naive_loop(low):
    g = torch.Generator().manual_seed(2)
    adv = torch.randn(5, generator=g, dtype=F)
    adv[1] = 0.0
    lp = -torch.rand(5, 6, generator=g, dtype=F) * 3
    mask = torch.rand(5, 6, generator=g) > 0.25
    thr = float(surprisal_quantile(lp, mask, 0.7))
    out, info = stare_reweight(adv, lp, mask, entropy=1.1, target=0.4, threshold=thr, strength=0.6, gate="sign",
                               low_threshold=low)
    assert_close(out, _naive(adv, lp, mask, 1.1, 0.4, thr, 0.6, low))
    assert 0 < info["stare/critical_frac"] < 1


def test_bad_input():
    lp = torch.zeros(2, 3, dtype=F)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(PolicylabError, match="quantile level"):
        surprisal_quantile(lp, mask, 1.5)
    with pytest.raises(PolicylabError, match="no valid token"):
        surprisal_quantile(lp, torch.zeros_like(mask), 0.5)
    with pytest.raises(PolicylabError, match="`gate` must be one of"):
        stare_reweight(torch.ones(2, dtype=F), lp, mask, entropy=1.0, target=0.5, threshold=0.0, strength=0.5,
                       gate="pid")
    with pytest.raises(ShapeError):
        stare_reweight(torch.ones(2, dtype=F), lp[:, :2], mask, entropy=1.0, target=0.5, threshold=0.0,
                       strength=0.5, gate="sign")


def test_round_stage_uses_the_current_full_vocabulary_entropy(tiny_model_dir, tmp_path):
    from policylab._checks import masked_mean
    from policylab.trainer import Trainer
    from trainer_utils import tiny_config

    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "s", method="stare", method_params={},
                             rollout={"group_size": 4}))
    batch = tr.prepare(tr.collect()[0])
    b2, A, metrics = tr.round_inputs(batch)
    want = float(masked_mean(tr.worker.vocab_stats(b2)["entropy"], b2.loss_mask))
    assert math.isclose(float(b2.extras["stare_entropy"]), want, rel_tol=1e-6)
    assert math.isclose(float(b2.extras["stare_threshold"]),
                        float(surprisal_quantile(b2.logp_old, b2.loss_mask, 0.8)), rel_tol=1e-9)
    # a random tiny model has entropy near log V ≈ 10.8 nats, far above the target 0.5: the gate is −1
    assert metrics["adv/stare/gate"] == -1.0 and A.adv.shape == b2.loss_mask.shape
