"""ERPO: typicality over question tokens only, weights from π_ref and the prompt only
(mean 1, positive, never flipping an advantage), the Query-KL of the weights, no KL on
answer tokens, the question span inside the chat template, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from policylab import methods
from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.objectives.erpo import question_typicality, question_weights

F = torch.float64


def test_typicality_counts_question_tokens_only():
    lp = torch.tensor([[0.0, -9.0, -1.0, -2.0, -9.0], [0.0, 0.0, -0.5, -1.5, -9.0]], dtype=F)
    q = torch.tensor([[False, False, True, True, False], [False, False, True, True, False]])
    # row 0: (−1 − 2)/2 = −1.5; row 1: (−0.5 − 1.5)/2 = −1.0 (template tokens at −9 never enter)
    assert_close(question_typicality(lp, q), torch.tensor([-1.5, -1.0], dtype=F))


def test_weights_mean_one_positive_and_the_query_kl():
    # τ = [−1.5, −1.0], λ_Q = 0.5: softmax(τ/0.5) = softmax([−3, −2]) = [0.2689, 0.7311]; ω = 2·that
    w, info = question_weights(torch.tensor([-1.5, -1.0], dtype=F), qkl_coef=0.5)
    assert_close(w, torch.tensor([0.5379, 1.4621], dtype=F), atol=1e-4, rtol=0)
    assert math.isclose(float(w.mean()), 1.0, abs_tol=1e-12) and bool((w > 0).all())
    # Query-KL = mean ω log ω = (0.5379·log 0.5379 + 1.4621·log 1.4621)/2 = (−0.3336 + 0.5556)/2 = 0.1110
    assert math.isclose(info["erpo/query_kl"], 0.1110, abs_tol=1e-4)
    # a large penalty gives ω → 1 and QKL → 0
    w_big, info_big = question_weights(torch.tensor([-1.5, -1.0], dtype=F), qkl_coef=1e6)
    assert_close(w_big, torch.ones(2, dtype=F), atol=1e-6, rtol=0)
    assert info_big["erpo/query_kl"] < 1e-12


def test_weights_match_the_closed_form_of_the_penalized_problem():
    # ω maximizes mean(w·τ) − λ_Q·KL(w/B ‖ U) over positive w with mean 1: any other feasible w scores lower
    tau = torch.tensor([-2.0, -1.2, -0.7, -1.9], dtype=F)
    lam = 0.8
    w, _ = question_weights(tau, qkl_coef=lam)

    def objective(v):
        return float((v * tau).mean() - lam * (v * torch.log(v)).mean())

    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        v = w * torch.exp(0.3 * torch.randn(4, generator=g, dtype=F))
        v = v / v.mean()
        assert objective(v) <= objective(w) + 1e-12


def test_no_answer_kl_and_no_reward_dependence():
    m = methods.get("erpo")
    assert not m.active("addend")  # no KL (or entropy) term on answer tokens by default
    with pytest.raises(PolicylabError, match="question side"):
        m.with_params({"kl_coef": 0.05}, methods.RunShape())


def test_bad_input():
    with pytest.raises(PolicylabError, match="no question token"):
        question_typicality(torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool))
    with pytest.raises(ShapeError):
        question_typicality(torch.zeros(1, 3), torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(PolicylabError, match="must be > 0"):
        question_weights(torch.zeros(2), qkl_coef=0.0)


def test_round_stage_weights_depend_on_the_prompt_and_reference_only(tiny_model_dir, tmp_path):
    from policylab.methods.families import reweighting as more
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "e", method="erpo", method_params={},
                             rollout={"group_size": 2, "prompts_per_step": 3}))
    batch = tr.prepare(tr.collect()[0])
    ctx = tr.context(batch.batch_id)
    # the question span decodes to the example's prompt text exactly
    qm = more._question_mask(batch, ctx)
    texts = {tr.tokenizer.decode(batch.tokens[i, : batch.prompt_width][qm[i]].tolist()) for i in range(batch.size)}
    assert all(t.startswith("What is ") and t.endswith("Reply with only the number.") for t in texts)
    b1, A1, m1 = tr.round_inputs(batch)
    flipped = batch.replace(rewards=1.0 - batch.rewards)
    b2, A2, _ = tr.round_inputs(flipped)
    assert_close(b1.extras["erpo_weight"], b2.extras["erpo_weight"])  # rewards changed, ω did not
    w = b1.extras["erpo_weight"]
    assert math.isclose(float(w.mean()), 1.0, rel_tol=1e-6)
    from policylab.kernels import advantages

    base = advantages.grpo(batch.rewards, batch.group, std="unbiased", eps=1e-6)
    assert_close(A1.adv, base * w)  # scaled, never sign-flipped
    assert "erpo/query_kl" in m1
