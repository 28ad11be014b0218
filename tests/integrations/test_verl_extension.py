"""The round extension in verl: for every method verl hosts through it (round stages,
batch-level fields, external rows, verl's critic / reference / greedy baseline), the
driver step (`policylab.integrations.verl.rounds.compute_advantage` on a real DataProto)
and verl's own `ppo_loss` per micro-batch (through `rounds.loss_fn`, on TensorDict
micro-batches laid out as verl's engine hands them) give the loss and gradient of
policylab's own trainer (`Trainer.round_inputs` + the step's normalizers) on the batch
that trainer collected, fp64."""

from __future__ import annotations

import pytest
import torch
from engines import require

require("verl")

import numpy as np  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from extension_batches import reference, trainer_and_batch, user_columns  # noqa: E402
from policylab.errors import PolicylabError  # noqa: E402
from policylab.integrations import hosting  # noqa: E402
from policylab.integrations import verl as PV  # noqa: E402
from policylab.integrations.verl import rounds as VR  # noqa: E402

EXTENSION = sorted(n for n, p in hosting.plans(PV.ENGINE).items() if p.hostable and p.extension)
TIGHT = dict(rtol=1e-10, atol=1e-12)
PREFIX_ENTROPY = "policylab.extras.worker_entropy"
MODES = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean",
         "seq_mean_token_sum": "seq-mean-token-sum", "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}


def _dataproto(tr, batch):
    """The engine's batch: what verl's rollout, reward and role passes put in a DataProto,
    plus the user's rows' policylab columns."""
    P = batch.prompt_width
    mask = batch.loss_mask
    B, T = mask.shape
    last = (torch.arange(T).expand(B, T) * mask).argmax(-1)
    scores = torch.zeros(B, T, dtype=batch.rewards.dtype)
    scores[torch.arange(B), last] = batch.rewards
    t = {"prompts": batch.tokens[:, :P], "responses": batch.tokens[:, P:], "attention_mask": batch.attention_mask.long(),
         "response_mask": mask.long(), "token_level_scores": scores}
    if batch.logp_old is not None:
        t["old_log_probs"] = batch.logp_old
    for role, key in (("logp_ref", "ref_log_prob"), ("logp_behavior", "rollout_log_probs"), ("values", "values")):
        if getattr(batch, role) is not None:
            t[key] = getattr(batch, role)
    if batch.greedy_rewards is not None:
        t["reward_baselines"] = batch.greedy_rewards
    t.update(user_columns(tr.method, batch))
    if any("worker.vocab_stats" in s.needs for s in tr.method.active("round")):
        # verl's old-logprob pass computes the full-vocabulary entropy at the round's weights
        # (its `entropys`, kept by keep_entropy): here the same quantity from policylab's worker
        ent = tr.backends.worker.vocab_stats(batch)["entropy"]
        old = DataProto.from_dict(tensors={"old_log_probs": batch.logp_old if batch.logp_old is not None
                                           else torch.zeros_like(ent), "entropys": ent})
        t[PREFIX_ENTROPY] = VR.keep_entropy(old).batch[PREFIX_ENTROPY]
    return DataProto.from_dict(tensors=t, non_tensors={"uid": np.array([f"g{int(g)}" for g in batch.group],
                                                                        dtype=object)})


def _flat(x, attn, P):
    """verl's no-padding layout of a response-aligned [B, T] tensor (the log-prob of token
    j + 1 at flat position j of its sequence)."""
    pieces = []
    for i in range(x.shape[0]):
        pl, rl = int(attn[i, :P].sum()), int(attn[i, P:].sum())
        pieces += [torch.zeros(pl - 1, dtype=x.dtype), x[i, :rl], torch.zeros(1, dtype=x.dtype)]
    return torch.cat(pieces)


@pytest.mark.parametrize("name", EXTENSION)
def test_extension_loss_equals_policylab_trainer(name, tiny_model_dir, tmp_path):
    tr, batch = trainer_and_batch(name, tiny_model_dir, tmp_path)
    ref_loss, ref_grad, logp0, rb, A, state = reference(tr, batch)
    m = tr.method
    params = {q.name: m.p[q.name] for q in m.params if m.p[q.name] is not None}
    data = _dataproto(tr, batch)
    if "old_log_probs" not in data.batch.keys():  # a single on-policy update: verl's old pass equals logp's value
        data.batch["old_log_probs"] = logp0.clone() if rb.logp_current is None else rb.logp_current.clone()
    G = tr.shape.group_size
    VR.compute_advantage(data, name, params, rollout_n=G, state=state)
    adv = data.batch["advantages"]
    want = A.adv.unsqueeze(-1).expand_as(rb.loss_mask) if A.adv.dim() == 1 else A.adv
    torch.testing.assert_close(adv[rb.loss_mask], want[rb.loss_mask].to(adv.dtype), **TIGHT)
    needs_entropy = any("entropy" in s.reads for k in ("objective", "correction", "term") for s in m.active(k))
    pl = PV.PolicylabLossConfig(loss_mode=f"policylab_{name}", method_params=params)
    cfg = ActorConfig(strategy="fsdp", rollout_n=G, ppo_micro_batch_size_per_gpu=G, loss_agg_mode=MODES[m.aggregation],
                      policy_loss=pl, use_kl_loss=False, entropy_coeff=0.0, calculate_entropy=needs_entropy)
    logp = logp0.clone().requires_grad_()
    B = batch.size
    P = batch.prompt_width
    total = None
    for g in dict.fromkeys(batch.group.tolist()):  # whole groups per micro-batch (actor.shuffle=False)
        rows = (batch.group == g).nonzero().squeeze(-1)
        td = data.batch[rows]
        tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=int(rb.loss_mask.sum()), global_batch_size=B)
        out = {"log_probs": _flat(logp[rows], td["attention_mask"], P)}
        if needs_entropy:
            out["entropy"] = _flat(0.5 + logp[rows].abs(), td["attention_mask"], P)
        loss, _ = VR.loss_fn(cfg, out, td)
        total = loss if total is None else total + loss
    grad, = torch.autograd.grad(total, logp)
    torch.testing.assert_close(total.detach(), ref_loss, **TIGHT)
    torch.testing.assert_close(grad, ref_grad, **TIGHT)


def test_an_extension_loss_without_the_extension_is_refused():
    cfg = ActorConfig(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=2,
                      policy_loss=PV.PolicylabLossConfig(loss_mode="policylab_gmc"))
    fn = PV.make_loss("gmc")
    z = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(PolicylabError, match="round extension"):
        fn(old_log_prob=z, log_prob=z, advantages=z, response_mask=torch.ones(2, 3, dtype=torch.bool), config=cfg)


def test_verl_batch_reward_manager_runs_a_group_coupled_reward_stage(tiny_model_dir):
    """verl's batch reward manager, loaded from verl's config as its trainer loads it, runs
    TTRL's majority vote over each group of rollout_n consecutive responses."""
    import os
    from collections import Counter

    from hydra import compose, initialize_config_dir
    from transformers import AutoTokenizer

    import verl.trainer.config as cfg_pkg
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.workers.reward_manager.batch import BatchRewardManager

    with initialize_config_dir(config_dir=os.path.dirname(cfg_pkg.__file__), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[
            "reward.reward_manager.name=batch",
            "reward.custom_reward_function.path=pkg://policylab.integrations.rewards",
            "reward.custom_reward_function.name=compute_score_batch",
            "+reward.custom_reward_function.reward_kwargs.method=ttrl",
            "+reward.custom_reward_function.reward_kwargs.rollout_n=4"])
    from verl.workers.reward_manager import get_reward_manager_cls

    assert get_reward_manager_cls(cfg.reward.reward_manager.name) is BatchRewardManager  # verl's registry
    fn = get_custom_reward_fn(cfg)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    replies = ["3", "3", "4", "3", "7", "8", "8", "9"]
    ids = [tok(r, add_special_tokens=False)["input_ids"] for r in replies]
    T, P, B = max(map(len, ids)), 2, len(replies)
    resp = torch.zeros(B, T, dtype=torch.long)
    attn = torch.zeros(B, P + T, dtype=torch.long)
    attn[:, :P] = 1
    for i, x in enumerate(ids):
        resp[i, :len(x)] = torch.tensor(x)
        attn[i, P:P + len(x)] = 1
    data = DataProto.from_dict(tensors={"prompts": torch.ones(B, P, dtype=torch.long), "responses": resp,
                                        "attention_mask": attn},
                               non_tensors={"data_source": np.array(["arith"] * B, dtype=object),
                                            "reward_model": np.array([{"ground_truth": "0"}] * B, dtype=object),
                                            "extra_info": np.array([{} for _ in range(B)], dtype=object)})
    out = BatchRewardManager(tok, 0, compute_score=fn, **dict(cfg.reward.custom_reward_function.reward_kwargs))(data)
    last = torch.tensor([len(x) - 1 for x in ids])
    got = out[torch.arange(B), last].double()
    # hand-worked: group 1 votes 3 (three of four), group 2 votes 8 (two of four); the gold is never read
    torch.testing.assert_close(got, torch.tensor([1.0, 1, 0, 1, 0, 1, 1, 0], dtype=torch.float64), rtol=0, atol=0)
    naive = [float(r == Counter(replies[i // 4 * 4:i // 4 * 4 + 4]).most_common(1)[0][0]) for i, r in enumerate(replies)]
    assert got.tolist() == naive
    with pytest.raises(PolicylabError, match="rollout_n"):
        fn(["arith"], ["3"], ["3"], [{}], method="ttrl")


def test_verl_kl_in_the_reward_is_refused_by_the_extension():
    """verl's use_kl_in_reward rewrites token_level_rewards; the extension reads the scores,
    so a batch where the two differ is refused instead of losing the KL silently."""
    B, P, T = 4, 2, 3
    scores = torch.zeros(B, T)
    scores[:, -1] = torch.tensor([1.0, 0, 1, 0])
    data = DataProto.from_dict(
        tensors={"prompts": torch.ones(B, P, dtype=torch.long), "responses": torch.ones(B, T, dtype=torch.long),
                 "attention_mask": torch.ones(B, P + T, dtype=torch.long), "response_mask": torch.ones(B, T),
                 "old_log_probs": -torch.ones(B, T), "rollout_log_probs": -torch.ones(B, T),
                 "token_level_scores": scores, "token_level_rewards": scores - 0.01},
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)})
    with pytest.raises(PolicylabError, match="use_kl_in_reward"):
        VR.compute_advantage(data, "gmc", rollout_n=2)
    data.batch["token_level_rewards"] = scores.clone()  # no KL in the reward: runs
    VR.compute_advantage(data, "gmc", rollout_n=2)
    assert "policylab.extras.gmc_weight" in data.batch.keys()


def test_the_docs_count_the_extension_methods():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "integrations.md").read_text()
    plain = [n for n, p in hosting.plans(PV.ENGINE).items() if p.hostable and not p.extension]
    assert f"for each of the {len(EXTENSION)} methods" in text
    assert f"The {len(plain)} hosted by verl's own hooks" in text and f"the {len(EXTENSION)} hosted through" in text
    assert f"{len(EXTENSION)} (verl) and" in (docs / "running-at-scale.md").read_text()
