import pytest

from policylab import methods
from policylab.methods.cards import card_text, table_text
from policylab.methods.registry import UnknownMethodError

ISSUE_2_METHODS = ["ppo", "grpo", "grpo_process", "dr_grpo", "dapo", "rloo", "remax", "reinforce_pp",
                   "reinforce_pp_baseline", "vapo", "gspo", "cispo", "gppo", "ttrl"]


def test_required_methods_registered_with_cards():
    for name in ISSUE_2_METHODS:
        r = methods.get(name)
        assert r.card.title and r.card.status and r.card.not_established
        assert r.card.samples and r.card.learns
        text = card_text(r)
        assert name in text and "status" in text


def test_paper_defaults_on_cards():
    assert methods.get("dapo").p.eps_high == 0.28
    assert methods.get("gspo").p.eps_high < 1e-2  # ~1e-4 scale, not 0.2
    grpo = methods.get("grpo").p
    assert (grpo.kl_estimator, grpo.kl_placement, grpo.kl_coef) == ("k3", "loss", 0.04)
    assert methods.get("ppo").p.kl_placement == "reward"
    assert methods.get("vapo").p.value_pretrain_steps >= 1  # the defining stage is on by default
    assert methods.get("dapo").p.overlong_cache_frac == 0.2  # the paper's 4096 / 20480


def test_unknown_method_suggests():
    with pytest.raises(UnknownMethodError, match="Did you mean: grpo"):
        methods.get("grp")
    with pytest.raises(UnknownMethodError, match="non-empty string, got None"):
        methods.get(None)


def test_with_params_refuses_unknown_and_drops_zero_kl():
    m = methods.get("grpo").with_params({"kl_coef": 0.0, "eps_high": 0.3})
    assert "logp_ref" not in m.roles and m.p.eps_high == 0.3
    assert "logp_ref" in methods.get("grpo").roles
    with pytest.raises(ValueError, match="no parameter `eps_hgh`.*eps_high"):
        methods.get("grpo").with_params({"eps_hgh": 0.3})


def test_kl_one_placement_only():
    with pytest.raises(ValueError, match="kl_placement.*one of loss, reward"):
        methods.get("grpo").with_params({"kl_placement": "both"})
    # an advantage that cannot subtract a reward penalty does not offer the reward placement
    with pytest.raises(ValueError, match="kl_placement.*one of loss"):
        methods.get("grpo_process").with_params({"kl_placement": "reward"})


def test_table_lists_everything():
    t = table_text()
    for name in ISSUE_2_METHODS:
        assert name in t
