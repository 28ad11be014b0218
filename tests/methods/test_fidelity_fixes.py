"""Fidelity fixes found in review, one test each (each failed on the code before its fix).

LUSPO's masked first position and REINFORCE++'s k3 estimator have their tests with their
kernels (tests/objectives/test_masked_positions.py, tests/advantages/test_reinforce_pp.py);
GGPO's and GMC's per-micro-batch group statistics are covered by the micro-batch
invariance of every method (tests/methods/test_same_update.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from policylab import methods
from policylab.errors import NonFiniteError, PolicylabError
from policylab.methods.spec import RunShape
from policylab.methods.stages import rewards as reward_stages
from policylab.methods.stages.rewards import overlong_cache
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config


def test_reinforce_pp_baseline_ema_decay_is_a_parameter_that_reaches_the_state():
    # the decay used to be a hidden 0.99 in the trainer
    m = methods.get("reinforce_pp_baseline").with_params({"scale": "ema", "ema_decay": 0.5})
    ema = m.state_objects(seed=0)["ema_scale"]
    assert ema.decay == 0.5
    assert methods.get("reinforce_pp_baseline").state_objects(seed=0)["ema_scale"].decay == 0.99


def test_dapo_overlong_cache_follows_the_papers_relation_by_default():
    # the paper pairs L_cache = 4096 with L_max = 20480; the default was L_max / 4
    p = methods.get("dapo").with_params({}, RunShape(max_new_tokens=20480)).p
    assert p.overlong_max == 20480 and overlong_cache(p) == 4096
    p16 = methods.get("dapo").with_params({}, RunShape(max_new_tokens=16)).p
    assert overlong_cache(p16) == 3  # floor(0.2 · 16)
    assert overlong_cache(methods.get("dapo").with_params({"overlong_cache_frac": 0.25}, RunShape(max_new_tokens=16)).p) == 4


def test_vapo_pretrains_its_critic_by_default_and_refuses_to_skip_it_silently():
    assert methods.get("vapo").p.value_pretrain_steps >= 1
    with pytest.raises(PolicylabError, match="value pretraining is the method's defining first stage"):
        methods.get("vapo").with_params({"value_pretrain_steps": 0}, RunShape())
    m = methods.get("vapo").with_params({"value_pretrain_steps": 0, "allow_untrained_critic": True}, RunShape())
    assert m.p.value_pretrain_steps == 0


def test_grpo_process_has_grpos_kl_term():
    m = methods.get("grpo_process")
    assert (m.p.kl_coef, m.p.kl_estimator, m.p.kl_placement) == (0.04, "k3", "loss")
    assert "logp_ref" in m.roles and [s.name for s in m.active("addend")] == ["kl_loss"]


@pytest.mark.parametrize("name", ["rloo", "remax"])
@pytest.mark.parametrize("setting", [{"epochs": 2}, {"minibatches": 2}, {"staleness": 1}])
def test_reinforce_methods_refuse_reuse_they_cannot_correct(name, setting):
    run = RunShape(group_size=4, **setting)
    with pytest.raises(PolicylabError, match=f"{name} is plain REINFORCE.*epochs=1, train.minibatches=1"):
        methods.get(name).with_params({}, run)
    methods.get(name).with_params({}, RunShape(group_size=4))  # one update per batch: fine


def test_remax_scores_its_greedy_baseline_with_the_same_reward_protocol(small_model_dir, tmp_path):
    # with a shaping function configured, the greedy reply gets it too (it used to be scored
    # by the verifier alone while the samples got verifier + shaping)
    cfg = tiny_config(small_model_dir, tmp_path / "r", method="remax", method_params={},
                      task={"reward": "trainer_utils:parity_reward", "extra_rewards": ["trainer_utils:short_bonus=0.5"]})
    tr = Trainer(cfg)
    batch, _ = tr.collect()
    G = cfg.rollout.group_size
    prompts = [batch.tokens[i, : batch.prompt_width][batch.attention_mask[i, : batch.prompt_width]].tolist()
               for i in range(0, batch.size, G)]
    texts = [tr.tokenizer.decode(ids, skip_special_tokens=True)
             for ids in tr.rollout.greedy(prompts, max_new_tokens=cfg.rollout.max_new_tokens)]
    from policylab.tasks.example import Example

    fake = [Example(prompt="", answer="0") for _ in texts]
    total, per_fn, gold = tr.score(texts, fake)
    assert torch.equal(batch.greedy_rewards[::G], total.float())
    assert not torch.equal(total, gold)  # the shaping term is really part of it


def test_ttrl_ineligible_groups_stay_nan_until_the_eligibility_filter():
    from policylab.batch import RolloutBatch
    from policylab.methods.context import Sampled

    texts = ["7", "7", "3", "9"]  # group 0: majority 7; group 1: tie 3 vs 9 -> no label
    group = torch.tensor([0, 0, 1, 1])
    B = 4
    batch = RolloutBatch(tokens=torch.zeros(B, 2, dtype=torch.long), attention_mask=torch.ones(B, 2, dtype=torch.bool),
                         loss_mask=torch.ones(B, 1, dtype=torch.bool), prompt_width=1, group=group,
                         policy_version=torch.zeros(B, dtype=torch.long), batch_id="t")
    ctx = type("Ctx", (), {"task_reward": staticmethod(lambda texts, answers: [1.0] * len(texts))})()
    changes, info = reward_stages.majority_vote(Sampled(batch, texts, [type("E", (), {"answer": "7"})()] * B,
                                                        [], []), ctx)
    r = changes["rewards"]
    assert r[:2].tolist() == [1.0, 1.0] and all(math.isnan(v) for v in r[2:].tolist())
    assert changes["outcome"]["eligible"].tolist() == [True, True, False, False]
    scored = batch.replace(rewards=r, outcome=changes["outcome"]).validate()  # NaN allowed where not eligible
    # without the filter, the advantage stage fails loudly on the NaN instead of training on a 0
    from policylab.kernels import advantages

    with pytest.raises(NonFiniteError, match="rewards"):
        advantages.grpo(scored.rewards, scored.group, std="unbiased")
    # NaN where the eligibility mask says eligible is refused by the batch itself
    with pytest.raises(NonFiniteError, match="rewards"):
        batch.replace(rewards=torch.tensor([float("nan"), 1.0, 0.0, 0.0]), outcome=changes["outcome"]).validate()
    # and the registered method removes the ineligible rows with its filter
    assert [s.name for s in methods.get("ttrl").filters] == ["eligible"]
