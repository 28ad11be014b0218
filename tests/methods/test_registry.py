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
    assert methods.get("dapo").params["eps_high"] == 0.28
    assert methods.get("gspo").params["eps_high"] < 1e-2  # ~1e-4 scale, not 0.2
    assert methods.get("grpo").kl.estimator == "k3" and methods.get("grpo").kl.placement == "loss"
    assert methods.get("ppo").kl.placement == "reward"


def test_unknown_method_suggests():
    with pytest.raises(UnknownMethodError, match="Did you mean: grpo"):
        methods.get("grp")


def test_with_params_refuses_unknown_and_drops_zero_kl():
    r = methods.get("grpo").with_params({"kl_coef": 0.0, "eps_high": 0.3})
    assert r.kl is None and "logp_ref" not in r.needs and r.params["eps_high"] == 0.3
    with pytest.raises(ValueError, match="no parameter `eps_hgh`.*eps_high"):
        methods.get("grpo").with_params({"eps_hgh": 0.3})


def test_kl_both_placements_impossible():
    from policylab.methods.registry import KLSpec

    with pytest.raises(ValueError, match="placement"):
        KLSpec("k3", 0.1, "both")


def test_table_lists_everything():
    t = table_text()
    for name in ISSUE_2_METHODS:
        assert name in t
