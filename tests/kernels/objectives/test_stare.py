"""STARE: quantiles over valid tokens only and per advantage sign, the gates (the recipe's
one-sided 1[H < H*] and the sign gate's flip), sign preservation, the four advantage ×
surprisal quadrants, a naive loop reference, the round stage's entropy (full vocabulary) in
the trainer, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.objectives.stare import critical_tokens, entropy_gate, stare_reweight, surprisal_quantile

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


def test_per_sign_selection_takes_a_quantile_on_each_side():
    # row 0 (A > 0): σ = [0.1, 0.5, 2.0]; row 1 (A < 0): σ = [1.0, 3.0]; row 2 (A = 0): never critical
    adv = torch.tensor([1.0, -1.0, 0.0], dtype=F)
    lp = torch.tensor([[-0.1, -0.5, -2.0], [-1.0, -3.0, 0.0], [-5.0, -6.0, -7.0]], dtype=F)
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, True]])
    A = adv.unsqueeze(-1).expand_as(lp)
    crit, info = critical_tokens(A, lp, mask, 0.5, "per_sign")
    # positive side: median of [0.1, 0.5, 2.0] = 0.5 → tokens 0.5 and 2.0; negative side: median of [1.0, 3.0] = 2.0
    # → token 3.0 only
    assert crit.tolist() == [[False, True, True], [False, True, False], [False, False, False]]
    assert info == {"stare/threshold_pos": 0.5, "stare/threshold_neg": 2.0}
    # one quantile over every valid token (8 σ: [0.1, 0.5, 2.0, 1.0, 3.0, 5, 6, 7] → median 2.5):
    # the A = 0 row's large surprisals push the others out
    crit_b, info_b = critical_tokens(A, lp, mask, 0.5, "batch")
    assert math.isclose(info_b["stare/threshold"], 2.5)
    assert crit_b.tolist() == [[False, False, False], [False, True, False], [True, True, True]]


def test_gates():
    # the recipe's gate: on (1) strictly below the target, off (0) at or above it
    assert entropy_gate(0.2, 0.3, gate="below") == 1.0
    assert entropy_gate(0.3, 0.3, gate="below") == 0.0 and entropy_gate(4.0, 0.3, gate="below") == 0.0
    assert entropy_gate(0.3, 0.5, gate="sign") == 1.0  # entropy below target: favour entropy-raising updates
    assert entropy_gate(0.7, 0.5, gate="sign") == -1.0
    assert entropy_gate(0.5, 0.5, gate="sign") == 0.0
    assert math.isclose(entropy_gate(0.3, 0.5, gate="proportional", gain=2.0), 0.4)  # 2·(0.5 − 0.3)
    assert entropy_gate(0.0, 5.0, gate="proportional", gain=2.0) == 1.0  # clipped


def _quadrants(target, gate="sign", amplify=1.5, attenuate=0.5, direction="first_order"):
    # four tokens, all critical (q = 0 on each side): (A > 0, rare), (A > 0, common), (A < 0, rare), (A < 0, common),
    # H = 1.0: σ = 2.0 is rare (σ > H), σ = 0.5 common
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=F)
    lp = torch.tensor([[-2.0, -0.5], [-2.0, -0.5]], dtype=F)
    mask = torch.ones_like(lp, dtype=torch.bool)
    return stare_reweight(adv, lp, mask, entropy=1.0, target=target, quantile=0.0, gate=gate, amplify=amplify,
                          attenuate=attenuate, direction=direction)[0]


def test_four_quadrants_and_the_flip():
    # "first_order" direction, sign gate, W = 1.5, M = 0.5 (the symmetric λ = 0.5 form). H < H*: g = +1.
    # e = sign(A)·sign(σ − H): [+1, −1, −1, +1] → w = [1.5, 0.5, 0.5, 1.5], factor 1 + (w − 1)
    # A' = [1·1.5, 1·0.5, −1·0.5, −1·1.5]: positive-rare and negative-common (both raise entropy) amplified
    assert_close(_quadrants(2.0), torch.tensor([[1.5, 0.5], [-0.5, -1.5]], dtype=F))
    # H > H*: g = −1, factor 1 − (w − 1) = 2 − w: [0.5, 1.5, 1.5, 0.5]
    assert_close(_quadrants(0.2), torch.tensor([[0.5, 1.5], [-1.5, -0.5]], dtype=F))
    # H = H*: A' = A
    assert_close(_quadrants(1.0), torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=F))


def test_the_recipes_one_sided_and_two_sided_variants():
    # the recipe: gate "below", direction by the sign of A. H = 1 < H* = 2: O1 (W = 1.1, M = 1) amplifies every
    # critical token of the positive side, rare or common, and leaves the negative side
    assert_close(_quadrants(2.0, "below", 1.1, 1.0, "advantage"), torch.tensor([[1.1, 1.1], [-1.0, -1.0]], dtype=F))
    # C2 (W = 1.1, M = 0.9): the negative side's critical tokens get 0.9
    assert_close(_quadrants(2.0, "below", 1.1, 0.9, "advantage"), torch.tensor([[1.1, 1.1], [-0.9, -0.9]], dtype=F))
    # entropy above the target: the recipe's gate is off and A' = A exactly (no reverse push)
    assert_close(_quadrants(0.2, "below", 1.1, 0.9, "advantage"), torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=F))
    # "first_order" differs only on the critical tokens with σ < H (the common ones): W and M swap there
    assert_close(_quadrants(2.0, "below", 1.1, 0.9), torch.tensor([[1.1, 0.9], [-0.9, -1.1]], dtype=F))


def test_sign_never_flips_even_with_extreme_weights():
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(6, generator=g, dtype=F)
    lp = -torch.rand(6, 7, generator=g, dtype=F) * 4
    mask = torch.rand(6, 7, generator=g) > 0.2
    for gate, target in (("sign", 0.1), ("sign", 3.0), ("below", 3.0), ("proportional", -5.0)):
        for direction in ("advantage", "first_order"):
            out, _ = stare_reweight(adv, lp, mask, entropy=1.0, target=target, quantile=0.3, gate=gate,
                                    amplify=11.0, attenuate=0.0, direction=direction)
            a = adv.unsqueeze(-1).expand_as(out)
            assert bool(((out * a) >= 0)[mask].all())
            assert bool((out[~mask] == 0).all())


def _naive(adv, lp, mask, H, target, q, selection, gate, W, M, direction):
    g = {"sign": (target > H) - (target < H), "below": float(H < target)}[gate]
    valid = [(i, t) for i in range(lp.shape[0]) for t in range(lp.shape[1]) if mask[i, t]]

    def quantile(values):  # linear interpolation between order statistics
        v = sorted(values)
        pos = q * (len(v) - 1)
        lo = math.floor(pos)
        return v[lo] + (pos - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo])

    sig = {(i, t): -float(lp[i, t]) for i, t in valid}
    if selection == "batch":
        thr_all = quantile(list(sig.values()))
        thr = {(i, t): thr_all for i, t in valid}
    else:
        thr = {}
        for side in (1, -1):
            keys = [k for k in valid if math.copysign(1, float(adv[k[0]])) == side and float(adv[k[0]]) != 0]
            if keys:
                th = quantile([sig[k] for k in keys])
                thr.update({k: th for k in keys})
    out = torch.zeros_like(lp)
    for i, t in valid:
        a = float(adv[i])
        crit = (i, t) in thr and sig[i, t] >= thr[i, t]
        side = math.copysign(1, a) if a != 0 else 0
        e = side * ((sig[i, t] > H) - (sig[i, t] < H)) if direction == "first_order" else side
        w = W if e > 0 else (M if e < 0 else 1.0)
        out[i, t] = a * max(0.0, 1 + g * (w - 1) * crit)
    return out


@pytest.mark.parametrize("direction", ["advantage", "first_order"])
@pytest.mark.parametrize("selection", ["per_sign", "batch"])
@pytest.mark.parametrize("gate,target", [("sign", 0.4), ("below", 2.0)])
def test_matches_a_naive_loop(selection, gate, target, direction):
    g = torch.Generator().manual_seed(2)
    adv = torch.randn(5, generator=g, dtype=F)
    adv[1] = 0.0
    lp = -torch.rand(5, 6, generator=g, dtype=F) * 3
    mask = torch.rand(5, 6, generator=g) > 0.25
    out, info = stare_reweight(adv, lp, mask, entropy=1.1, target=target, quantile=0.7, selection=selection,
                               gate=gate, amplify=1.6, attenuate=0.7, direction=direction)
    assert_close(out, _naive(adv, lp, mask, 1.1, target, 0.7, selection, gate, 1.6, 0.7, direction))
    assert 0 < info["stare/critical_frac"] < 1


def test_masked_leading_and_trailing_positions_change_nothing():
    g = torch.Generator().manual_seed(4)
    adv = torch.randn(4, generator=g, dtype=F)
    lp = -torch.rand(4, 5, generator=g, dtype=F) * 3
    mask = torch.ones(4, 5, dtype=torch.bool)
    base, _ = stare_reweight(adv, lp, mask, entropy=1.0, target=2.0, quantile=0.6, amplify=1.3, attenuate=0.8)
    # one masked position before and after each row, holding extreme log-probs
    lp_pad = torch.cat([torch.full((4, 1), -40.0, dtype=F), lp, torch.full((4, 1), -0.0, dtype=F)], 1)
    mask_pad = torch.cat([torch.zeros(4, 1, dtype=torch.bool), mask, torch.zeros(4, 1, dtype=torch.bool)], 1)
    out, _ = stare_reweight(adv, lp_pad, mask_pad, entropy=1.0, target=2.0, quantile=0.6, amplify=1.3,
                            attenuate=0.8)
    assert_close(out[:, 1:-1], base)
    assert bool((out[:, 0] == 0).all() and (out[:, -1] == 0).all())


def test_bad_input():
    lp = torch.zeros(2, 3, dtype=F)
    mask = torch.ones(2, 3, dtype=torch.bool)
    one = torch.ones(2, dtype=F)
    with pytest.raises(PolicylabError, match="quantile level"):
        surprisal_quantile(lp, mask, 1.5)
    with pytest.raises(PolicylabError, match="no valid token"):
        surprisal_quantile(lp, torch.zeros_like(mask), 0.5)
    with pytest.raises(PolicylabError, match="`gate` must be one of"):
        stare_reweight(one, lp, mask, entropy=1.0, target=0.5, quantile=0.5, gate="pid")
    with pytest.raises(PolicylabError, match="`selection` must be one of"):
        stare_reweight(one, lp, mask, entropy=1.0, target=0.5, quantile=0.5, selection="tokens")
    with pytest.raises(PolicylabError, match=r"`amplify` \(W\) must be >= 1"):
        stare_reweight(one, lp, mask, entropy=1.0, target=0.5, quantile=0.5, amplify=0.9)
    with pytest.raises(PolicylabError, match=r"`attenuate` \(M\) must be in \[0, 1\]"):
        stare_reweight(one, lp, mask, entropy=1.0, target=0.5, quantile=0.5, attenuate=1.2)
    with pytest.raises(PolicylabError, match="`direction` must be one of"):
        stare_reweight(one, lp, mask, entropy=1.0, target=0.5, quantile=0.5, direction="entropy")
    with pytest.raises(ShapeError):
        stare_reweight(one, lp[:, :2], mask, entropy=1.0, target=0.5, quantile=0.5)


def test_round_stage_uses_the_current_full_vocabulary_entropy(tiny_model_dir, tmp_path):
    from policylab.kernels.checks import masked_mean
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "s", method="stare", method_params={},
                             rollout={"group_size": 4}))
    batch = tr.prepare(tr.collect()[0])
    b2, A, metrics = tr.round_inputs(batch)
    want = float(masked_mean(tr.worker.vocab_stats(b2)["entropy"], b2.loss_mask))
    assert math.isclose(float(b2.extras["stare_entropy"]), want, rel_tol=1e-6)
    # a random tiny model has entropy near log V ≈ 10.8 nats, far above the target 0.3: the recipe's gate is off
    # and the advantages are GRPO's
    assert metrics["adv/stare/gate"] == 0.0 and A.adv.shape == b2.loss_mask.shape
    # with the target above the entropy the gate opens and the per-sign thresholds are logged
    tr2 = Trainer(tiny_config(tiny_model_dir, tmp_path / "s2", method="stare",
                              method_params={"stare_target_entropy": 50.0}, rollout={"group_size": 4}))
    b3, A3, m3 = tr2.round_inputs(tr2.prepare(tr2.collect()[0]))
    assert m3["adv/stare/gate"] == 1.0
    assert any(k.startswith("adv/stare/threshold_") for k in m3)


def test_fp64_weights_are_exact_fp64_values():
    # one positive-advantage row, q = 0.5 per sign: σ = [0.1, 3.0], the median 1.55 → token 1 is critical;
    # gate open (H = 0.1 < H* = 0.3): A' = 1·1.1 exactly in fp64 (an fp32 weight would give 1.100000023841858),
    # and the attenuation M = 0.9 on a negative row is 0.9 exactly (fp32: 0.8999999761581421)
    adv = torch.tensor([1.0, -1.0], dtype=F)
    lp = torch.tensor([[-0.1, -3.0], [-0.1, -3.0]], dtype=F)
    mask = torch.ones(2, 2, dtype=torch.bool)
    out, _ = stare_reweight(adv, lp, mask, entropy=0.1, target=0.3, quantile=0.5, amplify=1.1, attenuate=0.9)
    assert out.dtype == F
    assert out[0].tolist() == [1.0, 1.1]
    assert out[1].tolist() == [-1.0, -0.9]


def test_advantage_stage_takes_the_surprisal_under_pi_old_not_the_behavior():
    # the surprisal source is π_old (surprisal_source = "logp_old", the default): the two roles are set to
    # mirror images, so the critical token of the positive row is token 1 under π_old (σ = [0.1, 3.0]) and
    # would be token 0 under the behavior μ (σ = [3.0, 0.1])
    from types import SimpleNamespace

    from policylab import methods
    from policylab.methods.families import reweighting
    from policylab.methods.loss import tensor_inputs

    lp_old = torch.tensor([[-0.1, -3.0], [-0.1, -3.0]], dtype=F)
    lp_beh = torch.tensor([[-3.0, -0.1], [-3.0, -0.1]], dtype=F)
    mask = torch.ones(2, 2, dtype=torch.bool)
    batch = tensor_inputs(lp_old.clone(), torch.zeros(2, dtype=F), mask, logp_old=lp_old, logp_behavior=lp_beh,
                          group=torch.zeros(2, dtype=torch.long), rewards=torch.tensor([1.0, 0.0], dtype=F),
                          extras={"stare_entropy": torch.tensor(0.1, dtype=F)}).batch
    m = methods.get("stare").with_params({"stare_quantile": 0.5})
    out = reweighting.stare(batch, SimpleNamespace(p=m.view(reweighting.STARE))).adv
    a0 = float(out[0, 0])  # the positive row's GRPO advantage, untouched on its non-critical token
    assert a0 > 0 and out[0].tolist() == [a0, a0 * 1.1]
    # with the behavior declared as the source, the other token is the critical one
    mb = methods.get("stare").with_params({"stare_quantile": 0.5, "surprisal_source": "logp_behavior"})
    outb = reweighting.stare(batch, SimpleNamespace(p=mb.view(reweighting.STARE))).adv
    assert outb[0].tolist() == [a0 * 1.1, a0]
