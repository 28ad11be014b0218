"""ConSPO through its own round stage and loss: the aggregate is the mean of ℓ_p over the
positives of eligible groups only (a group with no negative, or whose only "negative" is an
empty row, adds nothing to the loss and nothing to its denominator)."""

from __future__ import annotations

import math

import torch

from policylab import methods
from policylab.batch import SamplingSettings
from policylab.kernels import aggregate as agg
from policylab.methods.context import StageContext
from policylab.methods.loss import policy_loss, tensor_inputs
from policylab.methods.spec import RunShape
from policylab.trainer.rollout import apply_changes

F = torch.float64


def _ctx(method, stage):
    return StageContext(p=method.view(stage), state=method.state_objects(0), run=RunShape(), policy_version=0,
                        sampling=SamplingSettings(), rollout=None, worker=None, score=None, next_train=None,
                        encode=None, new_groups=None, decode=None, task_reward=None)


def _case():
    # 8 rows, 2 positions each (one-token responses; position 1 masked, garbage there):
    #   group 0: row 0 positive (s = −0.5), rows 1, 2 negative (s = −1.0, −2.0)  -> eligible
    #            row 7 a "negative" with no valid token: no score, not in the denominator
    #   group 1: rows 3, 4 positive, no negative                                  -> not eligible
    #   group 2: row 5 positive (s = −0.3), row 6 "negative" with no valid token  -> not eligible
    s = [-0.5, -1.0, -2.0, -0.7, -0.9, -0.3, -4.0, -4.0]
    logp = torch.tensor([[v, 7.0] for v in s], dtype=F).requires_grad_(True)
    mask = torch.tensor([[True, False]] * 6 + [[False, False]] * 2)
    correct = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    group = torch.tensor([0, 0, 0, 1, 1, 2, 2, 0])
    adv = torch.where(correct > 0, 1.0, -1.0).to(F)  # the verdict's polarity
    return logp, mask, correct, group, adv


def test_the_loss_is_the_mean_over_positives_of_eligible_groups_only():
    m = methods.get("conspo").with_params({"conspo_margin_max": 0.0})
    logp, mask, correct, group, adv = _case()
    inp = tensor_inputs(logp, adv, mask, group=group, rewards=correct.to(F), outcome={"correct": correct})
    rnd = next(st for st in m.active("round") if st.name == "conspo_round")
    changes, info = rnd.fn(inp.batch, _ctx(m, rnd))
    batch = apply_changes(inp.batch, changes, rnd)
    # N_seq = 6 rows with a valid token; one trained positive (row 0): row scale 6/1 = 6
    # (counting every positive, 4, gave 6/4; counting the empty row 6 as a negative made
    # group 2 eligible: 2 positives, 6/2)
    assert float(batch.extras["conspo_row_scale"]) == 6.0
    assert info["conspo/eligible_positives"] == 1.0
    loss, _ = policy_loss(m, inp.replace(batch=batch))
    # ℓ_0 = −log[e^−0.5 / (e^−0.5 + e^−1 + e^−2)] = −log(0.606531/(0.606531 + 0.367879 + 0.135335))
    #     = −log(0.606531/1.109745) = −log 0.546549 = 0.604131
    l0 = -math.log(math.exp(-0.5) / (math.exp(-0.5) + math.exp(-1.0) + math.exp(-2.0)))
    assert math.isclose(l0, 0.604131, abs_tol=1e-6)
    assert math.isclose(float(loss[0, 0]), 6.0 * l0, rel_tol=1e-12)
    assert bool((loss[1:] == 0).all()) and float(loss[0, 1]) == 0.0  # every other row, and masked positions
    # seq_mean_token_mean over the N_seq = 6 counted rows: (1/6)·6·ℓ_0 = ℓ_0, the mean over the one eligible positive
    total = agg.aggregate(loss, mask, m.aggregation, normalizer=agg.normalizer(mask, m.aggregation))
    assert math.isclose(float(total), l0, rel_tol=1e-12)
    total.backward()
    # ∂L/∂s_0 = −(1 − σ_0)/τ = −(1 − 0.546549) = −0.453451; no gradient reaches rows 3..6
    assert math.isclose(float(logp.grad[0, 0]), -0.453451, abs_tol=1e-6)
    assert bool((logp.grad[3:] == 0).all()) and bool((logp.grad[:, 1] == 0).all())


def test_ineligible_groups_do_not_shrink_the_loss():
    # the same eligible group alone, or next to the ineligible groups 1 and 2: the same loss
    m = methods.get("conspo").with_params({"conspo_margin_max": 0.0})
    rnd = next(st for st in m.active("round") if st.name == "conspo_round")
    logp, mask, correct, group, adv = _case()
    out = []
    for rows in (slice(0, 3), slice(0, 8)):
        lp = logp.detach()[rows].clone()
        inp = tensor_inputs(lp, adv[rows], mask[rows], group=group[rows], rewards=correct[rows].to(F),
                            outcome={"correct": correct[rows]})
        changes, _ = rnd.fn(inp.batch, _ctx(m, rnd))
        loss, _ = policy_loss(m, inp.replace(batch=apply_changes(inp.batch, changes, rnd)))
        out.append(float(agg.aggregate(loss, mask[rows], m.aggregation)))
    assert math.isclose(out[0], out[1], rel_tol=1e-12)
