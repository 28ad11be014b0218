"""RLiD: the label-marginal regularizer's hand-worked values, episode weights, the menu
compiler's refusals (multi-token labels, duplicates), the menu-mismatch refusal, the
policy loss against a naive loop, gradient regions, and the trainer's route: the sampled
estimator's expectation equals ∇R, the menu source samples only labels and the trainer's
log-probs are over the menu."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from policylab import methods
from policylab.errors import PolicylabError
from policylab.kernels.objectives.rlid import (
    MenuError,
    check_same_menu,
    compile_menu,
    episode_weights,
    label_marginal_kl,
    marginal_coefficients,
    rlid_loss,
)

F = torch.float64


def test_label_marginal_hand_worked():
    # rows [0.9, 0.1] and [0.1, 0.9]: m̄ = [0.5, 0.5] = U, R = 0 although each row is confident
    g2 = torch.zeros(2, dtype=torch.long)
    assert abs(float(label_marginal_kl(torch.log(torch.tensor([[0.9, 0.1], [0.1, 0.9]], dtype=F)), g2))) < 1e-15
    # m̄ = [0.8, 0.2]: R = ½·log(0.5/0.8) + ½·log(0.5/0.2) = ½(−0.4700) + ½(0.9163) = 0.2231
    R = label_marginal_kl(torch.log(torch.tensor([[0.8, 0.2]], dtype=F)), torch.zeros(1, dtype=torch.long))
    assert math.isclose(float(R), 0.2231, abs_tol=1e-4)


def test_episode_weights_hand_worked():
    # episodes of lengths 2 and 1: L̄ = 1.5, per-step weights 1.5/2 = 0.75 and 1.5/1 = 1.5; totals 1.5 and 1.5
    w = episode_weights(torch.tensor([0, 0, 1]), torch.tensor([2, 2, 1]))
    assert_close(w, torch.tensor([0.75, 0.75, 1.5], dtype=F))
    assert math.isclose(float(w[:2].sum()), float(w[2]))
    with pytest.raises(PolicylabError, match="different episode lengths"):
        episode_weights(torch.tensor([0, 0]), torch.tensor([2, 1]))


def test_menu_compiler_refuses_multi_token_and_duplicate_labels(tokenizer):
    assert compile_menu(tokenizer, ["A", "B", "C", "D"]) == tuple(tokenizer.encode(x, add_special_tokens=False)[0]
                                                                  for x in "ABCD")
    with pytest.raises(MenuError, match="label 'Option A' is 2 tokens.*exactly one token"):
        compile_menu(tokenizer, ["Option A", "B"])
    with pytest.raises(MenuError, match="at least 2 labels"):
        compile_menu(tokenizer, ["A"])


def test_old_log_probs_over_another_menu_are_refused():
    a = torch.tensor([[49, 50, 51, 52]])
    check_same_menu(a, a.clone())
    with pytest.raises(MenuError, match="another menu.*decision 0"):
        check_same_menu(a, torch.tensor([[49, 50, 51, 53]]))
    z = torch.zeros(1, 4, dtype=F, requires_grad=True)
    with pytest.raises(MenuError, match="another menu"):
        rlid_loss(z, torch.tensor([0]), torch.tensor([math.log(0.25)], dtype=F), torch.ones(1, dtype=F),
                  episode_id=torch.tensor([0]), episode_len=torch.tensor([1]), menu_group=torch.tensor([0]),
                  eps_low=0.2, eps_high=0.2, reg_coef=0.1, menu_ids=a, old_menu_ids=torch.tensor([[49, 50, 51]]))


def _naive_policy(z, chosen, lp_old, adv, ep, L, eps):
    N = z.shape[0]
    Lbar = sum(L[ep.tolist().index(e)] for e in sorted(set(ep.tolist()))) / len(set(ep.tolist()))
    tot = 0.0
    for d in range(N):
        lse = math.log(sum(math.exp(float(v)) for v in z[d]))
        rho = math.exp(float(z[d, chosen[d]]) - lse - float(lp_old[d]))
        a = float(adv[d])
        tot += (Lbar / float(L[d])) * -min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a)
    return tot / N


def test_policy_loss_matches_a_naive_loop_and_gradient_regions():
    g = torch.Generator().manual_seed(7)
    N, K = 6, 4
    z = torch.randn(N, K, generator=g, dtype=F, requires_grad=True)
    chosen = torch.tensor([0, 1, 3, 2, 2, 0])
    lp_old = torch.log_softmax(z.detach() + 0.3 * torch.randn(N, K, generator=g, dtype=F), -1).gather(
        1, chosen.unsqueeze(-1)).squeeze(-1)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -2.0], dtype=F)
    ep, L = torch.tensor([0, 0, 1, 2, 2, 2]), torch.tensor([2, 2, 1, 3, 3, 3])
    kw = dict(episode_id=ep, episode_len=L, menu_group=torch.zeros(N, dtype=torch.long), eps_low=0.2, eps_high=0.2)
    loss, m = rlid_loss(z, chosen, lp_old, adv, reg_coef=0.0, **kw)
    assert math.isclose(float(loss), _naive_policy(z.detach(), chosen, lp_old, adv, ep, L.tolist(), 0.2),
                        rel_tol=1e-10)
    loss.backward()
    # inside the clip, A > 0 raises the chosen label's logit (negative gradient), A < 0 lowers it
    rho = torch.exp(torch.log_softmax(z.detach(), -1).gather(1, chosen.unsqueeze(-1)).squeeze(-1) - lp_old)
    inside = (rho > 0.8) & (rho < 1.2)
    gz = z.grad.gather(1, chosen.unsqueeze(-1)).squeeze(-1)
    assert bool(inside.any())
    assert bool((gz[inside & (adv > 0)] < 0).all()) and bool((gz[inside & (adv < 0)] > 0).all())
    # outside the clip on the side it binds (A > 0, ρ > 1 + ε): no gradient from the policy term
    z2 = torch.zeros(1, 2, dtype=F, requires_grad=True)
    out, _ = rlid_loss(z2, torch.tensor([0]), torch.tensor([math.log(0.2)], dtype=F), torch.ones(1, dtype=F),
                       episode_id=torch.tensor([0]), episode_len=torch.tensor([1]), menu_group=torch.tensor([0]),
                       eps_low=0.2, eps_high=0.2, reg_coef=0.0)
    out.backward()  # ρ = 0.5/0.2 = 2.5 > 1.2
    assert float(z2.grad.abs().sum()) == 0.0


def test_the_sampled_estimator_has_the_gradient_of_R_in_expectation():
    # Σ_a π_d(a)·∇[(c_da − b_d)·ρ_d(a)]/N summed over decisions equals ∇R exactly
    g = torch.Generator().manual_seed(0)
    z = torch.randn(5, 3, generator=g, dtype=F, requires_grad=True)
    grp = torch.tensor([0, 0, 1, 1, 1])
    lsm = torch.log_softmax(z, -1)
    (want,) = torch.autograd.grad(label_marginal_kl(lsm, grp), z, retain_graph=True)
    p = lsm.exp().detach()
    got = torch.zeros_like(z)
    for a in range(3):
        coef, R = marginal_coefficients(lsm.detach(), torch.full((5,), a), grp)
        lpa = lsm[:, a]
        (ga,) = torch.autograd.grad((p[:, a] * coef * torch.exp(lpa - lpa.detach())).sum() / 5, z, retain_graph=True)
        got += ga
    assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert float(want.abs().max()) > 1e-3


def test_menu_source_samples_labels_and_the_trainer_scores_over_the_menu(tiny_model_dir, tmp_path):
    from policylab.models.logprobs import model_logprobs
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    cfg = tiny_config(tiny_model_dir, tmp_path / "r", method="rlid", method_params={},
                      task={"name": "menu_arithmetic", "reward": "menu_label"}, rollout={"group_size": 4})
    tr = Trainer(cfg)
    batch, _ = tr.collect()
    menu = compile_menu(tr.tokenizer, ["A", "B", "C", "D"])
    assert batch.sampling.allowed_ids == menu and batch.loss_mask.shape[1] == 1
    assert set(batch.response_tokens[:, 0].tolist()) <= set(menu)
    with torch.no_grad():
        lp = model_logprobs(tr.model, batch.tokens, batch.attention_mask, batch.prompt_width,
                            sampling=batch.sampling)
    assert_close(lp, batch.logp_behavior, rtol=1e-5, atol=1e-5)  # the engine's and the trainer's menu log-probs
    b, A, metrics = tr.round_inputs(tr.prepare(batch))
    assert "rlid/label_marginal_kl" in metrics and b.extras["rlid_marginal_coef"].shape == (b.size,)
    m = tr.train_step()
    assert m.get("skipped_nonfinite", 0.0) == 0.0 and tr.policy_version == 1


def test_menu_mismatch_in_the_trainer_is_refused(tiny_model_dir, tmp_path):
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "mm", method="rlid", method_params={},
                             task={"name": "menu_arithmetic", "reward": "menu_label"}, rollout={"group_size": 2}))
    batch = tr.prepare(tr.collect()[0])
    other = batch.extras["menu_ids"].clone()
    other[:, -1] += 1  # the decisions claim a menu the log-probs were not computed over
    with pytest.raises(MenuError, match="another menu"):
        tr.round_inputs(batch.replace(extras={**batch.extras, "menu_ids": other}))


def test_marginal_term_is_off_at_zero_and_documented():
    m = methods.get("rlid")
    assert [s.name for s in m.active("addend")] == ["rlid_marginal"]
    assert not methods.get("rlid").with_params({"marginal_coef": 0.0}).active("addend")
