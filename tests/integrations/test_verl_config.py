"""verl's configuration (a Hydra compose of its trainer config naming policylab), the
`policylab integrations` report, verl's reward path with policylab rewards, and the
documentation of every name the plug-in registers. Runs in the verl venv (engines.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from engines import require

require("verl")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

from policylab.errors import PolicylabError  # noqa: E402
from policylab.integrations import hosting  # noqa: E402
from policylab.integrations import verl as PV  # noqa: E402
from policylab.methods import get  # noqa: E402


def _compose(overrides):
    import verl.trainer.config as cfg_pkg
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.dirname(cfg_pkg.__file__), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)



# ----------------------------------------------------------------------------- Hydra


OVERRIDES = ["actor_rollout_ref.actor.policy_loss.loss_mode=policylab_cispo",
             "actor_rollout_ref.actor.policy_loss._target_=policylab.integrations.verl.PolicylabLossConfig",
             "+actor_rollout_ref.actor.policy_loss.method_params.eps_high=0.3",
             "algorithm.adv_estimator=policylab_grpo",
             "+algorithm.policylab.std=population",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
             "actor_rollout_ref.rollout.n=4"]


def test_hydra_compose_of_verl_trainer_config_names_policylab():
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _compose(OVERRIDES)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, PV.PolicylabLossConfig)
    assert actor.policy_loss.method_params == {"eps_high": 0.3}
    assert core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode) is core_algos.POLICY_LOSS_REGISTRY[
        "policylab_cispo"]
    assert cfg.algorithm.policylab.std == "population"
    core_algos.get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    # policylab's validation when verl builds the config
    bad = _compose([o.replace("eps_high=0.3", "eps_hi=0.3") for o in OVERRIDES])
    with pytest.raises(Exception, match="has no parameter `eps_hi`"):
        omega_conf_to_dataclass(bad.actor_rollout_ref.actor)


# ----------------------------------------------------------------------------- policylab integrations


def test_integrations_command_reports_verl_and_a_plug_in_that_did_not_load(monkeypatch):
    from policylab.integrations.status import report

    text, ok = report()
    assert ok and "verl 0.9.1" in text and "policylab = policylab.integrations.verl" in text
    assert "policylab_cispo" in text and "zcpo: verl cannot host policylab method `zcpo`" in text
    # the three groups add up to the registry, and the registered losses are the hostable ones
    groups = hosting.by_status(PV.ENGINE)
    n_host, n_req, n_ref = (len(groups[k]) for k in ("hostable", "hostable with a requirement", "refused"))
    assert n_host + n_req + n_ref == len(get.__globals__["REGISTRY"])
    assert f"{n_host + n_req} hostable ({n_host} as they are, {n_req} with a requirement), {n_ref} refused" in text
    assert f"policy losses registered by `import verl` ({n_host + n_req})" in text
    # the raw-ratio requirement is the engine-mismatch corrections' (through verl's own hooks); the
    # round-extension methods' requirements name their engine pass, rows or columns
    plain = {n for n, p in groups["hostable with a requirement"].items() if not p.extension and not p.step}
    assert plain == {"tis", "icepop", "kpop", "mis", "minirl"}
    # the step extension's: the condition its stage declares (cord's examples, gcpo's adapter)
    stepped = {n: p.requires for n, p in groups["hostable with a requirement"].items() if p.step}
    assert set(stepped) == {"cord", "gcpo"} and "iso" in groups["hostable"]
    assert "train_examples" in stepped["cord"][0] and "lora_rank" in stepped["gcpo"][0]
    assert "tis: requires the raw engine ratio as rollout_is_weights" in text or \
        "mis, tis: requires the raw engine ratio as rollout_is_weights" in text
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")  # verl skips every entry point
    text, ok = report()
    assert not ok and "PLUG-IN PROBLEM" in text and "expected but not registered: policylab_cispo" in text


def test_verl_reward_manager_runs_policylab_rlcr_reward(tiny_model_dir):
    """verl's reward path as its trainer loads it: `reward.custom_reward_function` in the
    Hydra config -> `get_custom_reward_fn` -> verl's NaiveRewardManager decoding each
    response and calling policylab's compute_score, which runs RLCR's own reward stage."""
    from transformers import AutoTokenizer
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.workers.reward_manager.naive import NaiveRewardManager

    cfg = _compose(["reward.custom_reward_function.path=pkg://policylab.integrations.rewards",
                    "reward.custom_reward_function.name=compute_score",
                    "+reward.custom_reward_function.reward_kwargs.method=rlcr",
                    "+reward.custom_reward_function.reward_kwargs.verifier=exact_numeric"])
    fn = get_custom_reward_fn(cfg)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    replies = ["42 Confidence: 0.8", "41 Confidence: 0.9", "42", "7 Confidence: 120%"]
    gold = ["42", "42", "42", "7"]
    ids = [tok(r, add_special_tokens=False)["input_ids"] for r in replies]
    T, P = max(map(len, ids)), 2
    resp = torch.zeros(4, T, dtype=torch.long)
    attn = torch.zeros(4, P + T, dtype=torch.long)
    attn[:, :P] = 1
    for i, x in enumerate(ids):
        resp[i, :len(x)] = torch.tensor(x)
        attn[i, P:P + len(x)] = 1
    data = DataProto.from_dict(tensors={"prompts": torch.ones(4, P, dtype=torch.long), "responses": resp,
                                        "attention_mask": attn},
                               non_tensors={"data_source": np.array(["arith"] * 4, dtype=object),
                                            "reward_model": np.array([{"ground_truth": g} for g in gold],
                                                                     dtype=object)})
    out = NaiveRewardManager(tok, 0, compute_score=fn)(data)
    last = torch.tensor([len(x) - 1 for x in ids])
    got = out[torch.arange(4), last].double()
    # hand-worked R = c - (q - c)^2, c - 1 (RLCR's invalid_confidence_penalty) when q does not parse:
    # 1 - 0.2^2 = 0.96; 0 - 0.9^2 = -0.81; no confidence: 1 - 1 = 0; 120% is out of range: 1 - 1 = 0
    torch.testing.assert_close(got, torch.tensor([0.96, -0.81, 0.0, 0.0], dtype=torch.float64), rtol=0, atol=1e-6)
    assert float(out.sum() - got.sum()) == 0.0  # nothing but the last token of each response
    # a group-coupled reward stage is refused by the per-response hook, naming it
    from policylab.integrations.rewards import compute_score

    with pytest.raises(PolicylabError, match="majority_vote score a reply against its group"):
        compute_score("arith", "3", "3", method="ttrl")


def test_every_registered_name_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    names = PV.REGISTERED["policy_losses"] + PV.REGISTERED["advantage_estimators"]
    missing = [n for n in names if f"`{n}`" not in doc]
    assert not missing, f"registered in verl but not in docs/integrations.md: {missing}"
    assert f"The {len(PV.REGISTERED['policy_losses'])} policy\nlosses:" in doc
