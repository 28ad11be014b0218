"""policylab inside verl: real verl code (registries, ActorConfig, ppo_loss on a TensorDict,
compute_advantage on a DataProto, Hydra compose of verl's trainer config), fp64.

Runs in the environment `make test` builds with verl's own dependency pins (.venv-verl);
skipped where verl is not installed (see engines.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from engines import require

require("verl")

import numpy as np  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from policylab.kernels import advantages as A  # noqa: E402
from policylab.kernels import aggregate as agg  # noqa: E402
from policylab.errors import PolicylabError  # noqa: E402
from policylab.integrations import hosting  # noqa: E402
from policylab.integrations import verl as PV  # noqa: E402
from policylab.methods import get  # noqa: E402
from policylab.methods.loss import policy_loss, tensor_inputs  # noqa: E402
from policylab.methods.spec import RunShape  # noqa: E402

HOSTABLE = hosting.hostable(PV.ENGINE)
TIGHT = dict(rtol=1e-12, atol=1e-12)


def _batch(B=8, T=7, G=4, seed=0):
    """fp64 roles with ragged masks: leading and trailing masked positions, groups of G."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = torch.arange(T).expand(B, T) < lengths.unsqueeze(-1)
    mask[0, 0] = False  # a masked leading position (e.g. a tool token)
    logp_old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05
    logp = (logp_old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    behavior = (logp_old + 0.25 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    rewards = torch.randint(0, 2, (B,), generator=g).double()
    rewards[:G] = torch.tensor([1.0, 0.0, 0.0, 1.0])[:G]
    rewards[1] = 1.0 - rewards[0]  # the first group always has spread
    group = torch.arange(B) // G
    adv = A.grpo(rewards, group, std="unbiased", eps=1e-6)
    return dict(mask=mask, logp=logp, logp_old=logp_old, behavior=behavior, rewards=rewards, group=group,
                adv=adv.unsqueeze(-1).expand(B, T).clone(), adv_seq=adv)


def _actor(loss_mode="vanilla", agg_mode="token-mean", params=None, **kw):
    pl = PV.PolicylabLossConfig(loss_mode=loss_mode, method_params=params or {}) if loss_mode.startswith("policylab_") \
        else PolicyLossConfig(loss_mode=loss_mode)
    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2, loss_agg_mode=agg_mode,
                       policy_loss=pl, **kw)


def _raw_weights(b):
    """verl's own rollout-correction code with the settings the policylab corrections need:
    token level, threshold above any kept ratio, no batch normalization."""
    w, _ = compute_rollout_correction_weights(b["logp_old"] - b["behavior"], b["mask"].double(), rollout_is="token",
                                              rollout_is_threshold=1e9)
    return w


def _params(name, T):
    return {"L_norm": float(T)} if "L_norm" in get(name).p else {}


def _reference(name, b, params):
    """policylab's own loss on the same tensors: the method with verl's forced parameters
    (KL and entropy are verl's terms), normalizer over the whole batch."""
    # the run shape of _actor's config (rollout_n=4): run-derived parameters resolve from it
    m = get(name).with_params({**params, "kl_coef": 0.0, "entropy_coef": 0.0}, RunShape(group_size=4))
    logp = b["logp"].clone().requires_grad_()
    # policylab's trainer hands outcome advantages per sequence [B]; verl broadcasts them to [B, T]
    mat, _ = policy_loss(m, tensor_inputs(logp, b["adv_seq"], b["mask"], logp_old=b["logp_old"],
                                          logp_behavior=b["behavior"]))
    L = m.p["L_norm"] if "L_norm" in m.p else None
    loss = agg.aggregate(mat, b["mask"], m.aggregation, normalizer=agg.normalizer(b["mask"], m.aggregation, L_norm=L))
    loss.backward()
    return loss.detach(), logp.grad


def _verl(name, b, params, info=None, weights="raw", rows=None):
    cfg = _actor(PV.loss_name(name), params=params)
    cfg.global_batch_info.update(info or {})
    rows = slice(None) if rows is None else rows
    logp = b["logp"][rows].clone().requires_grad_()
    w = _raw_weights(b)[rows] if weights == "raw" else weights
    fn = core_algos.get_policy_loss_fn(PV.loss_name(name))
    loss, metrics = fn(old_log_prob=b["logp_old"][rows], log_prob=logp, advantages=b["adv"][rows],
                       response_mask=b["mask"][rows], loss_agg_mode=cfg.loss_agg_mode, config=cfg,
                       rollout_is_weights=w)
    loss.backward()
    assert all(isinstance(v, float) for v in metrics.values())
    return loss.detach(), logp.grad


# ----------------------------------------------------------------------------- registries


def test_hostability_is_computed_and_refusals_name_the_missing_capability():
    # every registered method is either registered in verl or refused with a reason
    names = set(get.__globals__["REGISTRY"])
    assert set(PV.REGISTERED["policy_losses"]) == {PV.loss_name(n) for n in HOSTABLE}
    for n in names - set(HOSTABLE):
        p = hosting.plan(n, PV.ENGINE)
        assert p.reasons and "verl cannot host" in p.refusal()
    assert "logp_current" in hosting.plan("gmc", PV.ENGINE).refusal()
    assert "values" in hosting.plan("ppo", PV.ENGINE).refusal()
    assert "on_policy_topk" in hosting.plan("sis", PV.ENGINE).refusal()
    with pytest.raises(PolicylabError, match="round stage `gmc_weights`"):
        PV.resolve("gmc")
    with pytest.raises(PolicylabError, match="use_kl_loss=True"):
        PV.resolve("grpo", {"kl_coef": 0.04})


def _fresh_python(code: str, **env) -> dict:
    """`code` in a new interpreter that never imports policylab itself: only verl's
    plug-in loading can register anything."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_NAMES = ("import json, sys, verl\nfrom verl.trainer.ppo import core_algos as c\n"
          "print(json.dumps({'loaded': 'policylab.integrations.verl' in sys.modules,"
          "'losses': sorted(k for k in c.POLICY_LOSS_REGISTRY if k.startswith('policylab_')),"
          "'est': sorted(k for k in c.ADV_ESTIMATOR_REGISTRY if k.startswith('policylab_'))}))")


def test_entry_point_fills_the_registries_on_import_verl():
    got = _fresh_python(_NAMES)
    assert got["loaded"]
    assert got["losses"] == sorted(PV.loss_name(n) for n in HOSTABLE)
    assert got["est"] == sorted(PV.REGISTERED["advantage_estimators"])


def test_external_modules_variable_is_the_fallback():
    # entry points off: only VERL_USE_EXTERNAL_MODULES brings policylab in
    off = _fresh_python(_NAMES, VERL_USE_EXTERNAL_PLUGINS="none", VERL_USE_EXTERNAL_MODULES="")
    assert not off["loaded"] and off["losses"] == []
    on = _fresh_python(_NAMES, VERL_USE_EXTERNAL_PLUGINS="none",
                       VERL_USE_EXTERNAL_MODULES="policylab.integrations.verl")
    assert on["losses"] == sorted(PV.loss_name(n) for n in HOSTABLE)


# ----------------------------------------------------------------------------- losses


def test_get_policy_loss_fn_with_a_real_actor_config_and_backward():
    b = _batch()
    params = {"eps_high": 0.3}
    loss, grad = _verl("cispo", b, params)
    ref_loss, ref_grad = _reference("cispo", b, params)
    torch.testing.assert_close(loss, ref_loss, **TIGHT)
    torch.testing.assert_close(grad, ref_grad, **TIGHT)
    assert float(grad.abs().sum()) > 0


@pytest.mark.parametrize("name", HOSTABLE)
def test_every_hostable_method_equals_policylab(name):
    b = _batch(seed=hash(name) % 1000)
    params = _params(name, b["mask"].shape[1])
    loss, grad = _verl(name, b, params)
    ref_loss, ref_grad = _reference(name, b, params)
    torch.testing.assert_close(loss, ref_loss, **TIGHT)
    torch.testing.assert_close(grad, ref_grad, **TIGHT)
    assert float(grad.abs().sum()) > 0  # the comparison is not between two zeros


def test_corrections_refuse_weights_that_are_not_the_raw_ratio():
    b = _batch()
    icepop_weights, _ = compute_rollout_correction_weights(b["logp_old"] - b["behavior"], b["mask"].double(),
                                                           rollout_is="token", rollout_is_threshold="0.9_1.1")
    with pytest.raises(PolicylabError, match="not the raw engine ratio"):
        _verl("kpop", b, {}, weights=icepop_weights)
    with pytest.raises(PolicylabError, match="rollout_is_threshold=1e9"):
        _verl("tis", b, {}, weights=None)


@pytest.mark.parametrize("name", ["grpo", "dapo", "dr_grpo", "gspo", "tis"])
def test_micro_batches_and_ranks_give_the_whole_batch_update(name):
    b = _batch(B=8)
    mask = b["mask"]
    params = _params(name, mask.shape[1])
    info = {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": int(mask.shape[0])}
    whole, whole_grad = _verl(name, b, params, info)
    # micro-batches of 3, 3, 2 rows on one rank: losses and gradients add up
    parts = [_verl(name, b, params, info, rows=slice(i, i + 3)) for i in (0, 3, 6)]
    torch.testing.assert_close(sum(p[0] for p in parts), whole, **TIGHT)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), whole_grad, **TIGHT)
    # two data-parallel ranks (dp_size 2): the averaged gradient is the whole batch's
    info2 = {**info, "dp_size": 2}
    ranks = [_verl(name, b, params, info2, rows=slice(0, 4)), _verl(name, b, params, info2, rows=slice(4, 8))]
    torch.testing.assert_close((ranks[0][0] + ranks[1][0]) / 2, whole, **TIGHT)
    torch.testing.assert_close(torch.cat([r[1] for r in ranks]) / 2, whole_grad, **TIGHT)
    # without the global counts, verl's data-parallel run is refused rather than misnormalized
    with pytest.raises(PolicylabError, match="global"):
        _verl(name, b, params, {"dp_size": 2}, rows=slice(0, 4))


def _tensordict(b, weights):
    """A TensorDict laid out as verl's FSDP engine hands it to `ppo_loss`: left-padded
    prompts, right-padded responses, the model's log-probs as one flat tensor."""
    B, T = b["mask"].shape
    P = 3
    resp_len = b["mask"].shape[1] - (~b["mask"]).flip(-1).cumprod(-1).sum(-1)  # up to the last counted token
    prompt_len = torch.tensor([1 + i % P for i in range(B)])
    attn = torch.zeros(B, P + T, dtype=torch.long)
    for i in range(B):
        attn[i, P - prompt_len[i]:P] = 1
        attn[i, P:P + resp_len[i]] = 1
    td = TensorDict({"prompts": torch.ones(B, P, dtype=torch.long), "responses": torch.ones(B, T, dtype=torch.long),
                     "attention_mask": attn, "response_mask": b["mask"].long(), "old_log_probs": b["logp_old"],
                     "advantages": b["adv"], "rollout_is_weights": weights}, batch_size=[B])
    return td, prompt_len, resp_len


def test_verl_ppo_loss_on_a_real_tensordict():
    b = _batch()
    B, T = b["mask"].shape
    td, prompt_len, resp_len = _tensordict(b, _raw_weights(b))
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=int(b["mask"].sum()), global_batch_size=B)
    logp = b["logp"].clone().requires_grad_()
    pieces = []
    for i in range(B):  # log-prob of token j+1 sits at flat position j of its sequence
        pieces += [torch.zeros(int(prompt_len[i]) - 1, dtype=torch.float64), logp[i, :int(resp_len[i])],
                   torch.zeros(1, dtype=torch.float64)]
    flat = torch.cat(pieces)
    cfg = _actor("policylab_tis", agg_mode="token-mean")
    loss, metrics = ppo_loss(cfg, {"log_probs": flat}, td)
    loss.backward()
    ref_loss, ref_grad = _reference("tis", b, {})
    torch.testing.assert_close(loss, ref_loss, **TIGHT)
    torch.testing.assert_close(logp.grad, ref_grad, **TIGHT)
    assert "actor/pg_loss" in metrics


# ----------------------------------------------------------------------------- verl's built-ins


def _builtin(loss_mode, b, weights=None, agg_mode="token-mean", **kw):
    cfg = _actor(loss_mode, agg_mode=agg_mode, **kw)
    logp = b["logp"].clone().requires_grad_()
    loss, _ = core_algos.get_policy_loss_fn(loss_mode)(
        old_log_prob=b["logp_old"], log_prob=logp, advantages=b["adv"], response_mask=b["mask"],
        loss_agg_mode=agg_mode, config=cfg, rollout_is_weights=weights)
    loss.backward()
    return loss.detach(), logp.grad


# verl's seq-mean-token-mean divides each sequence by (|y_i| + 1e-8): relative difference <= 1e-8
SEQ = dict(rtol=5e-8, atol=1e-12)


def test_verl_gspo_equals_policylab_gspo():
    b = _batch()
    p = {"eps_low": 0.02, "eps_high": 0.03}
    got = _builtin("gspo", b, agg_mode="seq-mean-token-mean", clip_ratio_low=0.02, clip_ratio_high=0.03)
    ref = _reference("gspo", b, p)
    torch.testing.assert_close(got[0], ref[0], **SEQ)
    torch.testing.assert_close(got[1], ref[1], **SEQ)


def test_verl_cispo_equals_policylab_cispo():
    b = _batch()
    got = _builtin("cispo", b, clip_ratio_low=0.9, clip_ratio_high=0.28)
    ref = _reference("cispo", b, {"eps_low": 0.9, "eps_high": 0.28})
    torch.testing.assert_close(got[0], ref[0], **TIGHT)
    torch.testing.assert_close(got[1], ref[1], **TIGHT)


@pytest.mark.parametrize("name,verl_is,threshold,params", [
    ("dapo", None, None, {"eps_high": 0.28}),  # vanilla PPO clip, no weights
    ("tis", "token", 2.0, {"tis_cap": 2.0}),  # TIS
    ("icepop", "token", "0.5_5.0", {"icepop_low": 0.5, "icepop_high": 5.0}),  # IcePop band
    ("mis", "sequence", "0.5_2.0", {"mis_low": 0.5, "mis_high": 2.0, "mis_kind": "product", "mis_mode": "mask"}),
])
def test_verl_rollout_correction_equals_policylab(name, verl_is, threshold, params):
    # verl's vanilla loss always applies the dual clip c = clip_ratio_c = 3
    b = _batch(seed=3)
    b["behavior"] = (b["logp_old"] + 0.12 * torch.randn(b["logp_old"].shape, dtype=torch.float64,
                                                        generator=torch.Generator().manual_seed(7))).clamp(max=-1e-3)
    w = None
    if verl_is is not None:
        w, _ = compute_rollout_correction_weights(b["logp_old"] - b["behavior"], b["mask"].double(),
                                                  rollout_is=verl_is, rollout_is_threshold=threshold)
    clip = dict(clip_ratio_low=0.2, clip_ratio_high=params.get("eps_high", 0.2))
    got = _builtin("vanilla", b, weights=w, **clip)
    ref = _reference(name, b, {**params, "dual_clip": 3.0})
    torch.testing.assert_close(got[0], ref[0], **TIGHT)
    torch.testing.assert_close(got[1], ref[1], **TIGHT)
    if name != "dapo":  # the correction changed something
        plain = _reference("dapo", b, {"eps_high": 0.2, "dual_clip": 3.0})
        assert not torch.allclose(plain[0], ref[0])


# ----------------------------------------------------------------------------- advantages


def _data(b, tlr=None):
    B, T = b["mask"].shape
    if tlr is None:
        tlr = torch.zeros(B, T, dtype=torch.float64)
        last = b["mask"].shape[1] - 1 - b["mask"].flip(-1).int().argmax(-1)
        tlr[torch.arange(B), last] = b["rewards"]
    uid = np.array([f"prompt-{int(g)}" for g in b["group"]], dtype=object)
    return DataProto.from_dict(tensors={"token_level_rewards": tlr, "response_mask": b["mask"].long()},
                               non_tensors={"uid": uid})


def _adv(name, data, **kw):
    from omegaconf import OmegaConf

    out = compute_advantage(data, adv_estimator=name, config=OmegaConf.create(kw.pop("config", {})), **kw)
    return out.batch["advantages"], out.batch["returns"]


def test_compute_advantage_on_a_real_dataproto_with_policylab_estimators():
    b = _batch(B=12, G=4)
    mask = b["mask"]
    adv, ret = _adv("policylab_grpo", _data(b), config={"policylab": {"std": "population"}})
    want = A.grpo(b["rewards"], b["group"], std="population", eps=1e-6).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, want, **TIGHT)
    torch.testing.assert_close(ret, adv, **TIGHT)
    with pytest.raises(PolicylabError, match="takes std, eps"):
        _adv("policylab_grpo", _data(b), config={"policylab": {"sdt": "population"}})
    with pytest.raises(PolicylabError, match="per-run state `ema_scale`"):
        _adv("policylab_reinforce_pp_baseline", _data(b), config={"policylab": {"scale": "ema"}})


@pytest.mark.parametrize("ours,theirs,kw", [
    ("policylab_grpo", "grpo", {}),  # unbiased std, eps 1e-6 on both sides
    ("policylab_dr_grpo", "grpo", {"norm_adv_by_std_in_grpo": False}),
    ("policylab_rloo", "rloo", {}),
])
def test_policylab_estimators_equal_verl_builtins(ours, theirs, kw):
    b = _batch(B=12, G=4, seed=5)
    a_ours, _ = _adv(ours, _data(b))
    a_theirs, _ = _adv(theirs, _data(b), **kw)
    torch.testing.assert_close(a_ours, a_theirs.to(a_ours.dtype), rtol=1e-6, atol=1e-7)
    assert float(a_ours.abs().sum()) > 0


def test_reinforce_pp_reads_token_rewards_as_a_return_to_go():
    # verl puts the KL-in-reward penalty on every token and the score at the last one:
    # the return-to-go Σ_{u>=t} r_u (then whitened) is what policylab's REINFORCE++ computes
    b = _batch(B=6, T=5, G=2, seed=9)
    mask = b["mask"]
    tlr = torch.where(mask, -0.01 * torch.rand(mask.shape, dtype=torch.float64), torch.zeros(()))
    last = mask.shape[1] - 1 - mask.flip(-1).int().argmax(-1)
    tlr[torch.arange(6), last] += b["rewards"]
    adv, _ = _adv("policylab_reinforce_pp", _data(b, tlr))
    rtg = torch.zeros_like(tlr)
    for i in range(6):  # naive loop
        for t in range(5):
            rtg[i, t] = tlr[i, t:].sum() if mask[i, t] else 0.0
    torch.testing.assert_close(adv, A.whiten(rtg, mask, eps=1e-8, std="population"), **TIGHT)


# ----------------------------------------------------------------------------- Hydra


def _compose(overrides):
    import verl.trainer.config as cfg_pkg
    from hydra import compose, initialize_config_dir

    config_dir = os.path.dirname(cfg_pkg.__file__)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


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
    assert "policylab_cispo" in text and "gmc: verl cannot host policylab method `gmc`" in text
    # the three groups add up to the registry, and the registered losses are the hostable ones
    groups = hosting.by_status(PV.ENGINE)
    n_host, n_req, n_ref = (len(groups[k]) for k in ("hostable", "hostable with a requirement", "refused"))
    assert n_host + n_req + n_ref == len(get.__globals__["REGISTRY"])
    assert f"{n_host + n_req} hostable ({n_host} as they are, {n_req} with a requirement), {n_ref} refused" in text
    assert f"policy losses registered by `import verl` ({n_host + n_req})" in text
    assert set(groups["hostable with a requirement"]) == {"tis", "icepop", "kpop", "mis", "minirl"}
    assert "tis: requires the raw engine ratio as rollout_is_weights" in text or \
        "mis, tis: requires the raw engine ratio as rollout_is_weights" in text
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")  # verl skips every entry point
    text, ok = report()
    assert not ok and "PLUG-IN PROBLEM" in text and "expected but not registered: policylab_cispo" in text


# ----------------------------------------------------------------------------- the reward path


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
