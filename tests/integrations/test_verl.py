"""policylab inside verl: real verl code (registries, ActorConfig, ppo_loss on a TensorDict,
compute_advantage on a DataProto, Hydra compose of verl's trainer config), fp64.

Runs in the environment `make test` builds with verl's own dependency pins (.venv-verl);
skipped where verl is not installed (see engines.py)."""

from __future__ import annotations

import json
import zlib
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
# hosted by verl's own hooks (the round-extension methods: test_verl_extension.py)
PLAIN = [n for n, p in hosting.plans(PV.ENGINE).items() if p.hostable and not p.extension]
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
    # GMC and PPO run through the round extension (test_verl_extension.py); SIS and ZCPO need
    # policylab worker passes verl does not make
    assert hosting.plan("gmc", PV.ENGINE).extension and hosting.plan("gmc", PV.ENGINE).hostable
    assert any("critic" in r for r in hosting.plan("ppo", PV.ENGINE).requires)
    assert "on_policy_topk" in hosting.plan("sis", PV.ENGINE).refusal()
    assert "worker.logprobs_at" in hosting.plan("sis", PV.ENGINE).refusal()
    with pytest.raises(PolicylabError, match="round stage `zcpo_drift` needs the full-vocabulary KL to the reference"):
        PV.resolve("zcpo")
    # STARE's entropy is verl's old-logprob pass's (a worker pass verl makes); ZCPO's KL is not
    stare = hosting.plan("stare", PV.ENGINE)
    assert stare.hostable and stare.extension and any("keep_entropy" in r for r in stare.requires)
    tlm = hosting.plan("tlm_dre", PV.ENGINE)
    assert tlm.hostable and any("policylab.extras.turn_ids" in r for r in tlm.requires)
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


@pytest.mark.parametrize("name", PLAIN)
def test_every_hostable_method_equals_policylab(name):
    b = _batch(seed=zlib.crc32(name.encode()) % 1000)  # str hash() changes per process (PYTHONHASHSEED)
    params = _params(name, b["mask"].shape[1])
    loss, grad = _verl(name, b, params)
    ref_loss, ref_grad = _reference(name, b, params)
    torch.testing.assert_close(loss, ref_loss, **TIGHT)
    torch.testing.assert_close(grad, ref_grad, **TIGHT)
    assert float(grad.abs().sum()) > 0  # the comparison is not between two zeros


@pytest.mark.parametrize("name", ["grpo", "cispo"])
def test_token_level_advantages_reach_the_loss_unchanged(name):
    # verl hands [bs, T] advantages; when they differ along a row (a token-level
    # estimator) each token keeps its own: the hosted loss equals policylab's loss on the
    # same token-level advantages, and differs from the loss on the row's first value
    b = _batch(seed=3)
    B, T = b["mask"].shape
    ramp = 1.0 + torch.arange(T, dtype=torch.float64) / T  # 1, 8/7, ..., 13/7 along each row
    b["adv"] = b["adv_seq"].unsqueeze(-1) * ramp
    assert bool((b["adv_seq"] != 0).any())
    loss, grad = _verl(name, b, {})
    m = get(name).with_params({"kl_coef": 0.0, "entropy_coef": 0.0}, RunShape(group_size=4))
    for adv, same in ((b["adv"], True), (b["adv_seq"], False)):
        logp = b["logp"].clone().requires_grad_()
        mat, _ = policy_loss(m, tensor_inputs(logp, adv, b["mask"], logp_old=b["logp_old"]))
        ref = agg.aggregate(mat, b["mask"], m.aggregation, normalizer=agg.normalizer(b["mask"], m.aggregation))
        ref.backward()
        if same:
            torch.testing.assert_close(loss, ref.detach(), **TIGHT)
            torch.testing.assert_close(grad, logp.grad, **TIGHT)
        else:
            assert not torch.allclose(grad, logp.grad, rtol=1e-3, atol=1e-6)


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
