"""ppo_rlhf: the reward model's pairwise loss, the procedural preference set, and the
shaped reward of the PPO stage through the method's own stages (InstructGPT, arXiv
2203.02155, Eqs. 1 and 2)."""

from __future__ import annotations

import math

import pytest
import torch

from policylab.kernels import kl
from policylab import methods
from policylab.kernels.advantages import gae as gae_kernel
from policylab.errors import PolicylabError, ShapeError
from policylab.learn.figures.common import stage_context
from policylab.methods.loss import policy_loss, tensor_inputs
from policylab.methods.stages.advantages import token_rewards
from policylab.tasks import preferences
from policylab.models.reward_model import pairwise_loss
from policylab.trainer.rollout import apply_changes
from policylab.tasks.arithmetic import ArithmeticTask
from policylab.tasks.guidance import GuidanceError

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


# ----------------------------------------------------------------------------- pairwise loss


def test_equal_scores_give_log_2_for_every_pair():
    # σ(0) = 1/2, −log(1/2) = log 2 = 0.693147 for each of the C(4, 2) = 6 pairs
    loss, m = pairwise_loss(t([[0.3, 0.3, 0.3, 0.3]]), t([[3.0, 2.0, 1.0, 0.0]]))
    assert loss.item() == pytest.approx(math.log(2), abs=1e-12)
    assert round(loss.item(), 4) == 0.6931
    assert m["pairs"] == 6 and m["pair_accuracy"] == 0.5  # ties count one half


def test_swapping_winner_and_loser_flips_the_margin():
    # s_w − s_l = 2.0 − 0.5 = 1.5: −log σ(1.5) = log(1 + e^−1.5) = 0.201413;
    # swapped: −log σ(−1.5) = log(1 + e^1.5) = 1.701413 (the two differ by exactly the margin)
    s = t([[2.0, 0.5]])
    right, m_right = pairwise_loss(s, t([[1.0, 0.0]]))
    wrong, m_wrong = pairwise_loss(s, t([[0.0, 1.0]]))
    assert right.item() == pytest.approx(math.log1p(math.exp(-1.5)), abs=1e-12)
    assert wrong.item() == pytest.approx(math.log1p(math.exp(1.5)), abs=1e-12)
    assert wrong.item() - right.item() == pytest.approx(1.5, abs=1e-12)
    assert m_right["pair_accuracy"] == 1.0 and m_wrong["pair_accuracy"] == 0.0
    # the gradient pushes the winner up and the loser down, by σ(−margin) each
    leaf = s.clone().requires_grad_(True)
    pairwise_loss(leaf, t([[1.0, 0.0]]))[0].backward()
    sig = 1 / (1 + math.exp(1.5))
    torch.testing.assert_close(leaf.grad, t([[-sig, sig]]))


def test_pairwise_loss_matches_a_naive_loop():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 4, generator=g, dtype=F64)
    ranks = t([[3, 2, 1, 0], [0, 1, 2, 3], [2, 2, 1, 0]])  # a tie in the last prompt: 5 pairs, not 6
    loss, m = pairwise_loss(scores, ranks)
    per_prompt = []
    for p in range(3):
        terms = [-math.log(1 / (1 + math.exp(-(scores[p, i] - scores[p, j]).item())))
                 for i in range(4) for j in range(4) if ranks[p, i] > ranks[p, j]]
        per_prompt.append(sum(terms) / len(terms))
    assert m["pairs"] == 6 + 6 + 5
    torch.testing.assert_close(loss, torch.tensor(sum(per_prompt) / 3, dtype=F64))


def test_pairwise_loss_refuses_bad_input():
    with pytest.raises(ShapeError, match="must both be \\[P, K\\]"):
        pairwise_loss(t([[0.0, 1.0]]), t([[1.0, 0.0, 2.0]]))
    with pytest.raises(ShapeError, match="K >= 2"):
        pairwise_loss(t([[0.0]]), t([[1.0]]))
    with pytest.raises(PolicylabError, match="no ordered pair"):
        pairwise_loss(t([[0.0, 1.0]]), t([[1.0, 1.0]]))
    with pytest.raises(PolicylabError, match="finite"):
        pairwise_loss(t([[float("nan"), 1.0]]), t([[1.0, 0.0]]))


# ----------------------------------------------------------------------------- preferences


def test_the_known_preference_ranks_the_four_candidates():
    task = ArithmeticTask(seed=0)
    for ex in task.train_prompts(20):
        replies, scores = preferences.ranked(ex)
        assert scores == [3.0, 2.0, 1.0, 0.0], (ex.prompt, replies)
    ex = task.train_prompts(1)[0]
    assert preferences.true_score(ex, ex.answer) == 3.0
    assert preferences.true_score(ex, f"It is {ex.answer}") == 2.0
    assert preferences.true_score(ex, "no idea") == 0.0


def test_candidates_for_training_come_from_the_train_split_only():
    task = ArithmeticTask(seed=0)
    held = task.heldout(3)
    with pytest.raises(GuidanceError, match="train split only"):
        preferences.candidates(held[0])
    # held-out candidates exist only to measure on, and only for held-out examples
    assert preferences.ranked(held[0], heldout=True)[1] == [3.0, 2.0, 1.0, 0.0]
    with pytest.raises(PolicylabError, match="for held-out examples"):
        preferences.heldout_candidates(task.train_prompts(1)[0])


def test_true_score_refuses_a_task_without_the_known_preference():
    from policylab.tasks.example import Example

    with pytest.raises(PolicylabError, match="arithmetic problems only"):
        preferences.true_score(Example("What comes next: 1, 2, 3?", "4", {"split": "train"}), "4")


# ----------------------------------------------------------------------------- the shaped reward


def _method(**over):
    return methods.get("ppo_rlhf").with_params({"reward_model": "untrained", **over})


def _batch(rm_scores, logp_old, logp_ref, mask, *, logp_current=None, values=None):
    inp = tensor_inputs(torch.zeros_like(logp_old), torch.zeros(len(rm_scores), dtype=F64), mask,
                        rewards=t(rm_scores))
    fields = dict(logp_old=logp_old, logp_ref=logp_ref)
    if logp_current is not None:
        fields["logp_current"] = logp_current
    if values is not None:
        fields["values"] = values
    return inp.batch.replace(**fields).validate()


def _round(method, batch):
    """The method's active round stages (the KL-in-reward penalty), as the trainer runs them."""
    for stage in method.active("round"):
        changes, _ = stage.fn(batch, stage_context(method, stage))
        batch = apply_changes(batch, changes, stage)
    return batch


# row 0 has a masked leading and a masked trailing position, row 1 counts all but the last
MASK = torch.tensor([[False, True, True, True, False], [True, True, True, True, False]])
LP_OLD = t([[9.0, -1.0, -2.0, -0.5, 9.0], [-0.3, -0.3, -0.3, -0.3, 9.0]])
LP_REF = t([[-7.0, -1.5, -1.0, -0.5, -7.0], [-0.1, -0.6, -0.3, -0.3, -7.0]])


def test_the_rm_score_is_added_once_at_the_last_counted_token():
    m = _method()  # β = 0.02, k1
    b = _round(m, _batch([1.5, -0.5], LP_OLD, LP_REF, MASK))
    r = token_rewards(b, "ppo_rlhf")
    # row 0: k1 = lp_old − lp_ref = [0.5, −1, 0] on the counted positions 1..3, penalty β·k1 =
    # [0.01, −0.02, 0]; r = −penalty, plus 1.5 at position 3 (the last counted one):
    # [0, −0.01, 0.02, 1.5, 0]. row 1: k1 = [−0.2, 0.3, 0, 0] -> r = [0.004, −0.006, 0, −0.5, 0]
    torch.testing.assert_close(r, t([[0.0, -0.01, 0.02, 1.5, 0.0], [0.004, -0.006, 0.0, -0.5, 0.0]]))
    # naive reference: the score once per row at its last True, minus β(lp_old − lp_ref) where counted
    ref = torch.zeros_like(r)
    for i in range(2):
        last = max(j for j in range(5) if MASK[i, j])
        for j in range(5):
            if MASK[i, j]:
                ref[i, j] = -0.02 * (LP_OLD[i, j] - LP_REF[i, j])
        ref[i, last] += [1.5, -0.5][i]
    torch.testing.assert_close(r, ref)
    # exactly once: the sum over the response is the score minus the summed penalty
    torch.testing.assert_close(r.sum(-1), t([1.5, -0.5]) - b.extras["kl_penalty"].sum(-1))
    # through GAE with γ = λ = 1 and zero values the first counted advantage is that sum
    m1 = m.with_params({**m.p, "lam": 1.0})
    a = m1.advantage.fn(b.replace(values=torch.zeros_like(LP_OLD)).validate(), stage_context(m1, m1.advantage)).adv
    assert a[0, 1].item() == pytest.approx(1.5 - 0.01 + 0.02, abs=1e-12)
    assert a[1, 0].item() == pytest.approx(-0.5 + 0.004 - 0.006, abs=1e-12)
    assert a[0, 0].item() == 0.0 and a[0, 4].item() == 0.0  # masked positions


def test_the_kl_shaping_reads_the_samplers_logp_old_not_the_learner():
    m = _method()
    b1 = _round(m, _batch([1.0, 0.0], LP_OLD, LP_REF, MASK, logp_current=LP_OLD.clone()))
    b2 = _round(m, _batch([1.0, 0.0], LP_OLD, LP_REF, MASK, logp_current=LP_OLD - 3.0))
    torch.testing.assert_close(token_rewards(b1, "x"), token_rewards(b2, "x"))  # the learner's lp is not read
    b3 = _round(m, _batch([1.0, 0.0], LP_OLD - 0.5, LP_REF, MASK))
    assert not torch.equal(token_rewards(b3, "x"), token_rewards(b1, "x"))  # the sampler's lp_old is
    with pytest.raises(ValueError, match="requires grad"):
        kl.reward_penalty(LP_OLD.clone().requires_grad_(True), LP_REF, MASK, coef=0.02)


def _advantages(m, batch):
    b = _round(m, batch.replace(values=torch.zeros_like(batch.logp_old)).validate())
    return m.advantage.fn(b, stage_context(m, m.advantage)).adv


def test_replacing_pi_ref_changes_only_the_shaped_reward_and_the_learner_only_the_ratios():
    m = _method()
    lp = t([[0.0, -0.9, -2.3, -0.4, 0.0], [-0.35, -0.2, -0.3, -0.1, 0.0]])  # the learner, moved from π_old
    a1 = _advantages(m, _batch([1.0, 0.0], LP_OLD, LP_REF, MASK))
    a2 = _advantages(m, _batch([1.0, 0.0], LP_OLD, LP_REF + t([[0.0, -0.7, 0.2, -0.4, 0.0]] * 2), MASK))
    assert not torch.allclose(a1, a2)  # another reference: another shaped reward, other advantages
    # ... but with the advantages fixed, the loss does not read π_ref at all (KL is in the reward only)
    l1, met1 = policy_loss(m, tensor_inputs(lp, a1, MASK, logp_old=LP_OLD, logp_ref=LP_REF))
    l2, met2 = policy_loss(m, tensor_inputs(lp, a1, MASK, logp_old=LP_OLD, logp_ref=LP_REF - 5.0))
    torch.testing.assert_close(l1, l2)
    assert met1 == met2
    # the learner's lp enters only the ratio: the advantages do not depend on it ...
    a3 = _advantages(m, _batch([1.0, 0.0], LP_OLD, LP_REF, MASK, logp_current=lp))
    torch.testing.assert_close(a1, a3)
    # ... and the loss equals PPO's clipped surrogate with ρ = exp(lp − lp_old) (naive loop)
    ref = torch.zeros_like(l1)
    for i in range(2):
        for j in range(5):
            if MASK[i, j]:
                rho = math.exp(lp[i, j] - LP_OLD[i, j])
                A = a1[i, j].item()
                ref[i, j] = -min(rho * A, min(max(rho, 0.8), 1.2) * A)
    torch.testing.assert_close(l1, ref)
    # π_old is the ratio's denominator: another π_old with the same advantages changes the ratios
    l4, _ = policy_loss(m, tensor_inputs(lp, a1, MASK, logp_old=LP_OLD - 0.3, logp_ref=LP_REF))
    assert not torch.allclose(l1, l4)


def test_gae_kernel_hand_case_used_by_ppo_rlhf():
    # the spec's hand case for the GAE estimator ppo_rlhf uses: r = [0, 0, 1], V = [0.5, 0.6, 0.7],
    # γ = 1, λ = 0.8: δ = [0.1, 0.1, 0.3], Â = [0.372, 0.34, 0.3]
    a, ret = gae_kernel(t([[0.0, 0.0, 1.0]]), t([[0.5, 0.6, 0.7]]), torch.ones(1, 3, dtype=torch.bool), gamma=1.0,
                        lam=0.8)
    torch.testing.assert_close(a, t([[0.372, 0.34, 0.3]]))
    torch.testing.assert_close(ret, t([[0.872, 0.94, 1.0]]))


