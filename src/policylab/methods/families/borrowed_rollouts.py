"""Learning from whole rollouts of another model: GRAFT (a peer model's group imported when
the receiver's own group all fails, weighted by the sequence-level compatibility) and
ERILS (k rollouts per group from an external model, length-capped, advantages normalized
per source). Both build their second model as a frozen `FrozenModel` in a model stage
(`policylab.methods.peers`); the learner's numerator is always its own log-prob of the
batch's tokens on the deployment prompt; kernels in `policylab.kernels.mixed`.
"""

from __future__ import annotations

import torch

from policylab.batch import RolloutBatch
from policylab.errors import PolicylabError
from policylab.kernels import mixed as K
from policylab.methods.context import Sampled, StageContext
from policylab.methods.params import DEPLOYMENT_LEARNER as _LEARNS
from policylab.methods.params import (
    clip,
    fewer_than_group,
    group_std,
    max_new_tokens,
    policy_gradient_method,
)
from policylab.methods.peers import FrozenModel
from policylab.methods.registry import register
from policylab.methods.rows import (
    assemble,
    build_rows,
    response_ids,
)
from policylab.methods.spec import (
    Advantages,
    Card,
    LossInputs,
    Param,
    RunShape,
    Stage,
    StateSpec,
    Weighting,
    non_negative,
    positive,
)
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses
from policylab.methods.stages.advantages import scalar_rewards
from policylab.methods.stages.provenance import SOURCE_METRICS
from policylab.methods.stages.sources import (
    NATIVE_WRITES,
    draw_prompts,
    generate_groups,
    pad_id,
    repeat_each,
)

# ----------------------------------------------------------------------------- frozen second models


def build_frozen(name: str):
    """A `model` stage that builds the method's frozen model `ctx.state[name]` (a peer, an
    external sampler, a teacher) from its spec, next to the policy; the policy is returned
    unchanged."""
    def build(model, setup):
        setup.state[name].build(model, setup.tokenizer)
        return model
    build.__name__ = f"build_{name}"
    build.__doc__ = f"Build the frozen `{name}` model (mixedpolicy.state.FrozenModel) before the optimizer exists."
    return build


def _retokenized(ctx: StageContext, other, ob: RolloutBatch, texts: list[str]):
    """The learner's tokenization of another model's responses: (ids, behavior log-probs,
    known mask) per row. The producer's per-token log-probs carry over only where the two
    tokenizations are the same ids; elsewhere they are unknown (behavior_mask False)."""
    ids, lpb, known = [], [], []
    for r, t in enumerate(texts):
        m = ob.loss_mask[r]
        own = ob.response_tokens[r][m].tolist()
        done = not bool(ob.extras["truncated"][r])
        mine = response_ids(ctx.tokenizer, t) if done else ctx.tokenizer(t, add_special_tokens=False)["input_ids"]
        if not mine:
            mine = [int(ctx.tokenizer.eos_token_id)]
        same = other.tokenizer is ctx.tokenizer or own == mine
        ids.append(mine)
        lpb.append(ob.logp_behavior[r][m].tolist() if same and len(own) == len(mine) else [0.0] * len(mine))
        known.append([bool(same and len(own) == len(mine))] * len(mine))
    return ids, lpb, known


def _other_generate(ctx: StageContext, other, prompt_text: str, n: int, max_new_tokens: int) -> RolloutBatch:
    return other.engine.generate([other.encode(prompt_text)], group_size=n, sampling=ctx.sampling,
                                 max_new_tokens=max_new_tokens, policy_version=0, batch_id=ctx.batch_tag)


# ----------------------------------------------------------------------------- GRAFT


def peer_exchange(n_prompts: int, ctx: StageContext) -> Sampled:
    """G receiver samples per prompt; for a prompt whose receiver group all fails, the peer
    samples G on the same prompt, and if its group has at least one success and one
    failure the WHOLE group is imported (new group id, advantages inside it), re-tokenized
    for the receiver and re-scored by the verifier. Each imported row gets the sequence
    compatibility c_i (receiver vs peer mean log-prob, each in its own tokenization) and a
    keep weight 1[c_i >= graft_min_compat]."""
    G = ctx.run.group_size
    peer = ctx.state["peer"].require()
    examples, prompts, groups = draw_prompts(n_prompts, ctx)
    nat = generate_groups(ctx, prompts, groups, G)
    texts = ctx.rollout.decode(nat)
    rows_ex = repeat_each(examples, G)
    _, _, correct = ctx.score(texts, rows_ex)
    tag = {"graft_compat": torch.ones(nat.size), "graft_keep": torch.ones(nat.size)}
    parts = [(nat.replace(extras={**nat.extras, **tag}), texts, rows_ex)]
    order, all_prompts, all_ex = list(groups), list(prompts), list(examples)
    for i, e in enumerate(examples):
        if bool(correct[i * G:(i + 1) * G].any()):
            continue
        pb = _other_generate(ctx, peer, e.prompt, G, ctx.run.max_new_tokens)
        ptexts = peer.engine.decode_responses(pb)
        _, _, pcorr = ctx.score(ptexts, [e] * G)
        if not K.graft_should_borrow(correct[i * G:(i + 1) * G], pcorr):
            continue
        g = ctx.new_groups(1)[0]
        ids, lpb, known = _retokenized(ctx, peer, pb, ptexts)
        rb = build_rows([prompts[i]] * G, ids, group=[g] * G, source=[f"peer:{peer.name}"] * G,
                        producer=[peer.name] * G, policy_version=ctx.policy_version, batch_id=ctx.batch_tag,
                        sampling=ctx.sampling, engine=peer.engine.engine_name, pad_id=pad_id(ctx),
                        logp_behavior=lpb, behavior_known=known, prompt_index=[i] * G)
        lp_recv = ctx.worker.role_logprobs("logp_current", rb)
        c = K.graft_compatibility(lp_recv, rb.loss_mask, pb.logp_behavior, pb.loss_mask).float()
        keep = (c >= ctx.p.graft_min_compat).float()
        parts.append((rb.replace(extras={**rb.extras, "graft_compat": c, "graft_keep": keep}), ptexts, [e] * G))
        order.append(g), all_prompts.append(prompts[i]), all_ex.append(e)
    return assemble(parts, batch_id=ctx.batch_tag, group_order=order, prompt_ids=all_prompts, group_examples=all_ex)


def compat_weight(inp: LossInputs, p) -> Weighting:
    """The weight of each row's clipped surrogate (`mixed.graft_row_weight`): a borrowed
    row weighs min(c_i, graft_compat_cap) — its compatibility, a truncated importance weight
    of the receiver against the peer that sampled it — and 0 below graft_min_compat (it
    stays in its group's advantage and in the normalizer); a native row weighs 1."""
    compat = inp.batch.extras.get("graft_compat")
    if compat is None:
        raise PolicylabError("graft needs extras['graft_compat'] (written by its peer-exchange source)")
    w = K.graft_row_weight(compat.double(), inp.batch.source_rows("peer"), min_compat=p.graft_min_compat,
                           cap=p.graft_compat_cap)
    return Weighting(weight=w.to(inp.logp.dtype))


def graft_round(batch: RolloutBatch, ctx: StageContext):
    peer = batch.source_rows("peer")
    c = batch.extras["graft_compat"][peer]
    w = K.graft_row_weight(batch.extras["graft_compat"].double(), peer, min_compat=ctx.p.graft_min_compat,
                           cap=ctx.p.graft_compat_cap)[peer]
    return {}, {"graft/borrowed_groups": float(torch.unique(batch.group[peer]).numel()),
                "graft/compat_mean": float(c.mean()) if c.numel() else 1.0,
                "graft/borrowed_weight_mean": float(w.mean()) if w.numel() else 1.0,
                "graft/dropped_rows": float((batch.extras["graft_keep"][peer] == 0).sum())}


PEER_EXCHANGE = Stage("source", peer_exchange, kernels=(K.graft_should_borrow, K.graft_compatibility),
                      params=("graft_min_compat",),
                      writes=NATIVE_WRITES + ("extras.graft_compat", "extras.graft_keep"))
COMPAT_WEIGHT = Stage("correction", compat_weight, kernels=(K.graft_row_weight,),
                      params=("graft_min_compat", "graft_compat_cap"),
                      reads=("source", "extras.graft_compat"))
GRAFT_ROUND = Stage("round", graft_round, kernels=(K.graft_row_weight,), params=("graft_min_compat", "graft_compat_cap"),
                    reads=("source", "extras.graft_compat"))


# ----------------------------------------------------------------------------- ERILS


def external(n_prompts: int, ctx: StageContext) -> Sampled:
    """Per prompt: G − k native rollouts and k rollouts of the external model (up to
    `external_max_new_tokens` tokens), re-tokenized for the learner; external rows longer
    than the cap L_ext (learner tokens) are rejected before anything else sees them, and
    counted (extras["erils_rejected"]: per row, the rejections of its group)."""
    G, k = ctx.run.group_size, int(ctx.p.external_per_group)
    other = ctx.state["external"].require()
    examples, prompts, groups = draw_prompts(n_prompts, ctx)
    nat = generate_groups(ctx, prompts, groups, G - k)
    parts = [(nat, ctx.rollout.decode(nat), repeat_each(examples, G - k))]
    rejected = {}
    for i, e in enumerate(examples):
        ob = _other_generate(ctx, other, e.prompt, k, int(ctx.p.external_max_new_tokens))
        otexts = other.engine.decode_responses(ob)
        ids, lpb, known = _retokenized(ctx, other, ob, otexts)
        keep = K.erils_length_keep(torch.tensor([len(x) for x in ids]), torch.ones(len(ids), dtype=torch.bool),
                                   int(ctx.p.external_cap)).tolist()
        rejected[groups[i]] = float(len(ids) - sum(keep))
        sel = [r for r in range(len(ids)) if keep[r]]
        if not sel:
            continue
        rb = build_rows([prompts[i]] * len(sel), [ids[r] for r in sel], group=[groups[i]] * len(sel),
                        source=["external"] * len(sel), producer=[other.name] * len(sel),
                        policy_version=ctx.policy_version, batch_id=ctx.batch_tag, sampling=ctx.sampling,
                        engine=other.engine.engine_name, pad_id=pad_id(ctx), logp_behavior=[lpb[r] for r in sel],
                        behavior_known=[known[r] for r in sel], prompt_index=[i] * len(sel))
        parts.append((rb, [otexts[r] for r in sel], [e] * len(sel)))
    s = assemble(parts, batch_id=ctx.batch_tag, group_order=groups, prompt_ids=prompts, group_examples=list(examples))
    rej = torch.tensor([rejected[g] for g in s.batch.group.tolist()])
    s.batch = s.batch.replace(extras={**s.batch.extras, "erils_rejected": rej}).validate()
    return s


def erils(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """Advantages normalized within each (prompt group, source) pair."""
    r = scalar_rewards(batch, "erils advantages")
    ext = batch.source_rows("external")
    a = K.erils_advantages(r, batch.group, ext, std=ctx.p.std, eps=ctx.p.eps, per_source=True)
    pooled = K.erils_advantages(r, batch.group, ext, std=ctx.p.std, eps=ctx.p.eps, per_source=False)
    info = {"erils/native_adv_mean_per_source": a[~ext].mean() if bool((~ext).any()) else torch.zeros(()),
            "erils/native_adv_mean_pooled": pooled[~ext].mean() if bool((~ext).any()) else torch.zeros(())}
    return Advantages(a, info=info)


def erils_round(batch: RolloutBatch, ctx: StageContext):
    rej = batch.extras["erils_rejected"]
    per_group = {int(g): float(x) for g, x in zip(batch.group.tolist(), rej.tolist())}
    return {}, {"erils/external_rejected": float(sum(per_group.values()))}


EXTERNAL = Stage("source", external, kernels=(K.erils_length_keep,),
                 params=("external_per_group", "external_cap", "external_max_new_tokens"),
                 writes=NATIVE_WRITES + ("extras.erils_rejected",))
ERILS = Stage("advantage", erils, kernels=(K.erils_advantages,), params=("std", "eps"),
              reads=("rewards", "group", "source"))
ERILS_ROUND = Stage("round", erils_round, reads=("extras.erils_rejected",))


# ----------------------------------------------------------------------------- registration

def _half_group(run: RunShape) -> int:
    return max(1, run.group_size // 2)


def _twice_budget(run: RunShape) -> int:
    return 2 * run.max_new_tokens


def _frozen(name: str, param: str, role: str):
    """The state spec and model stage of a frozen second model named by `param`."""
    spec = StateSpec(name, lambda p, seed: FrozenModel(getattr(p, param), role), params=(param,),
                     doc=f"the {role} model, rebuilt from `{param}` (never stored in checkpoints)")
    return spec, Stage("model", build_frozen(name), name=f"build_{name}")


def _model_param(name: str, role: str) -> Param:
    return Param(name, str, "", f"the {role} model: a save_pretrained directory or a policylab checkpoint directory "
                 "(run_dir/checkpoints/step_N); '' = a frozen copy of the run's initial policy")


_PEER_STATE, _PEER_MODEL = _frozen("peer", "peer_model", "peer")


register(policy_gradient_method(
    "graft",
    Card(
        title="Learning Beyond What You Sample: Off-Policy-Aware Cross-Model Trajectory Exchange for RLVR", arxiv="",
        family="mixed-policy (peer groups)",
        samples="the receiver's rollouts; when its group on a prompt all fails, a peer model's whole group on that "
                "prompt (source peer:<model>), re-tokenized for the receiver and re-scored",
        learns="the receiver π_θ", reference="none",
        summary="import a whole mixed-outcome peer group when the receiver group all fails; advantages inside the "
                "imported group; sequence compatibility c = exp(mean lp_recv − mean lp_peer) (the peer is the "
                "behavior μ of borrowed rows); a borrowed row's clipped surrogate is weighted min(c, cap), 0 below a "
                "threshold, so a less compatible row moves the policy less; receiver-side clipped ratios π_θ/π_old",
        not_established="that borrowed groups help beyond what the peer already knows; compatibility weighting does not "
                        "make the two policies the same",
        unconfirmed=("title and id (not found)", "compatibility threshold graft_min_compat",
                     "how the paper bounds a borrowed row's update: here the decoupled form −min(c, cap)·clipped "
                     "surrogate of π_θ/π_old, c the per-token geometric mean of π_old/μ over the row, cap "
                     "graft_compat_cap = 1 (library decision; the reasons are in kernels.mixed.graft_row_weight)",
                     "dropped rows weighted 0 and kept in the normalizer (library decision)"),
        confirmed="borrowing only when the receiver group all fails and the peer group is mixed; the whole group is "
                  "imported (no API takes one success alone); means in each model's own tokenization, position-wise "
                  "subtraction across tokenizations of different lengths raises (tested); a kept borrowed row of "
                  "compatibility 0.5 gets half the gradient of one of compatibility 1, and the clip acts on borrowed "
                  "rows as on native ones (hand-worked, tested; until issue 24 every kept row weighed 1, so the "
                  "peer's log-probs never entered the loss)",
    ),
    source=PEER_EXCHANGE, round_=(GRAFT_ROUND, SOURCE_METRICS), corrections=(COMPAT_WEIGHT,),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("graft_min_compat", float, 0.1, "threshold on the sequence compatibility c_i (inclusive: c >= it is kept)",
              check=non_negative),
        Param("graft_compat_cap", float, 1.0, "cap on a kept borrowed row's weight min(c_i, cap) (1: a borrowed row "
              "never weighs more than a native one)", check=positive),
        _model_param("peer_model", "peer")),
    model=(_PEER_MODEL,), state=(_PEER_STATE,), kl=(0.0, "k3", "loss"), min_group_size=2,
))


_EXT_STATE, _EXT_MODEL = _frozen("external", "external_model", "external")


register(policy_gradient_method(
    "erils",
    Card(
        title="ERILS: external rollouts for diffusion-LM RL (title unconfirmed)", arxiv="",
        family="mixed-policy (external rollouts)",
        samples="G − k rollouts of the current weights and k of an external autoregressive model (source external), "
                "re-tokenized for the learner; external rows longer than L_ext are rejected",
        learns=_LEARNS, reference="none",
        summary="per-source normalization within each prompt group (external rows do not shift the native baseline); "
                "the external length cap enforced before anything sees the rows",
        not_established="the paper's setting is a diffusion LM learner, which is outside this machine: here the learner "
                        "is the autoregressive policy and the external source a second autoregressive model; "
                        "per-source normalization does not remove off-policy bias",
        unconfirmed=("title and id", "exact normalization form", "reject vs truncate at the cap (reject here, counted)",
                     "the objective on external rows (receiver-side PPO clip: library decision)"),
        confirmed="native [0.2, 0.4] with external [0.9, 1.0]: pooled normalization gives native [−1.271, −0.673], "
                  "per-source [−1, 1] (tested); over-length external rows never reach the loss (tested)",
    ),
    source=EXTERNAL, round_=(ERILS_ROUND, SOURCE_METRICS), advantage=ERILS,
    objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.2) + group_std(std="population") + (
        Param("external_per_group", int, None, "external rows sampled per prompt (None: half the group)", optional=True,
              resolve=_half_group),
        Param("external_cap", int, None, "L_ext: external rows with more learner tokens are rejected (None: "
              "rollout.max_new_tokens)", optional=True, check=positive, resolve=max_new_tokens),
        Param("external_max_new_tokens", int, None, "generation budget of the external model (None: twice "
              "rollout.max_new_tokens)", optional=True, check=positive, resolve=_twice_budget),
        _model_param("external_model", "external")),
    model=(_EXT_MODEL,), state=(_EXT_STATE,), kl=(0.0, "k3", "loss"), kl_placements=("loss",), min_group_size=2,
    checks=(fewer_than_group("external_per_group", "erils"),),
))
