"""Stages of conspo, zcpo, stare, reco, erpo, tlm_dre and rlid (registered in
`methods.objectives_more`), by kind: two sources (a multi-turn dialogue, a menu of
single-token labels), round stages (the per-round statistics these methods freeze for the
whole round, over whole groups and the whole batch), advantages, objectives, corrections
and an addend. Kernels live in `policylab.kernels.objectives.<name>`."""

from __future__ import annotations

import torch

from policylab.kernels import advantages as A
from policylab.kernels.checks import masked_mean
from policylab.kernels.advantages.verdict import verdict_polarity
from policylab.batch import RolloutBatch, SamplingSettings
from policylab.errors import MissingQuantityError, PolicylabError
from policylab.kernels.objectives import conspo as conspo_k
from policylab.kernels.objectives import erpo as erpo_k
from policylab.kernels.objectives import reco as reco_k
from policylab.kernels.objectives import rlid as rlid_k
from policylab.kernels.objectives import stare as stare_k
from policylab.kernels.objectives import tlm_dre as tlm_k
from policylab.kernels.objectives import zcpo as zcpo_k
from policylab.kernels.objectives.common import unit_carrier
from policylab.methods.context import Sampled, StageContext
from policylab.methods.spec import Advantages, LossInputs, Stage, Weighting
from policylab.methods.stages.advantages import scalar_rewards
from policylab.methods.stages.sources import SOURCE_WRITES

# ============================================================================ sources


def _follow_up_ids(tokenizer, text: str) -> list[int]:
    """The chat template's tokens between the end of an assistant reply and the start of
    the next assistant reply: the reply's closing, the user message `text`, the assistant
    header. Found by rendering [user, assistant MARK, user text] and cutting after MARK."""
    mark = "QQQ"
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": mark},
            {"role": "user", "content": text}]
    ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    ids = list(ids)
    m = tokenizer.encode(mark, add_special_tokens=False)
    for i in range(len(ids) - len(m) + 1):  # the first occurrence: the assistant's (the user's is "x")
        if ids[i: i + len(m)] == m:
            return ids[i + len(m):]
    raise PolicylabError("the chat template does not place an assistant message verbatim: the multi-turn source "
                         "cannot find where a reply ends")


def multi_turn(n_prompts: int, ctx: StageContext) -> Sampled:
    """A dialogue per sample: the first user message (the example's prompt), a reply, then
    each follow-up user message of `example.meta["turns"]` and a reply to it. Every reply
    is sampled by the rollout engine at the current weights with the run's settings, its
    prompt being everything before it (the sampled replies' own tokens, not re-tokenized
    text). The rows hold prompt | reply 1 | inserted user turn | reply 2 ...: only reply
    tokens count in the loss (`loss_mask`); inserted tokens are attended to but never
    trained on, and carry turn id -1 in extras["turn_ids"] [B, T] (0, 1, ... on replies).
    The texts the reward stages score are the last replies."""
    examples = ctx.next_train(n_prompts)
    turns = [e.meta.get("turns") if isinstance(e.meta, dict) else None for e in examples]
    if any(not t for t in turns):
        raise PolicylabError("the multi-turn source needs examples whose meta['turns'] lists the follow-up user "
                             "messages (task.name=two_turn_arithmetic); this task's examples have none")
    if len({len(t) for t in turns}) != 1:
        raise PolicylabError("the examples of one batch must have the same number of turns")
    s = ctx.sampling
    if s.top_k > 0 or s.top_p < 1.0:
        raise PolicylabError("the multi-turn source scores the inserted user turns as context under the sampling "
                             "transform; with top_k / top_p truncation they can fall outside the kept set: use "
                             "top_k=0 and top_p=1.0")
    G, budget = ctx.run.group_size, ctx.run.max_new_tokens
    prompts = [ctx.encode(e.prompt) for e in examples]
    groups = ctx.new_groups(n_prompts)
    b = ctx.rollout.generate(prompts, group_size=G, sampling=s, max_new_tokens=budget, policy_version=ctx.policy_version,
                             batch_id=f"{ctx.batch_tag}-t0", group_ids=groups)
    B = b.size
    row_prompt = [prompts[i // G] for i in range(B)]
    resp: list[list[int]] = [[] for _ in range(B)]
    lp: list[list[float]] = [[] for _ in range(B)]
    tid: list[list[int]] = [[] for _ in range(B)]
    texts: list[list[str]] = [[] for _ in range(B)]

    def take(batch, k: int) -> None:
        toks, m, beh = batch.response_tokens, batch.loss_mask, batch.logp_behavior
        for i in range(B):
            r = toks[i][m[i]].tolist()
            resp[i] += r
            lp[i] += beh[i][m[i]].tolist()
            tid[i] += [k] * len(r)
            texts[i].append(ctx.decode(r))

    take(b, 0)
    truncated = b.extras["truncated"]
    row_group = b.group.tolist()
    for k in range(len(turns[0])):
        nxt = []
        for i in range(B):
            ins = _follow_up_ids(ctx.tokenizer, turns[i // G][k])
            if not bool(truncated[i]) and resp[i] and ins and resp[i][-1] == ins[0]:
                ins = ins[1:]  # the reply's own end-of-turn token closes it already
            resp[i] += ins
            lp[i] += [0.0] * len(ins)
            tid[i] += [-1] * len(ins)
            nxt.append(row_prompt[i] + resp[i])
        b = ctx.rollout.generate(nxt, group_size=1, sampling=s, max_new_tokens=budget, policy_version=ctx.policy_version,
                                 batch_id=f"{ctx.batch_tag}-t{k + 1}", group_ids=row_group)
        take(b, k + 1)
        truncated = b.extras["truncated"]
    batch = _stitch(row_prompt, resp, lp, tid, b, ctx, truncated)
    rows_ex = [e for e in examples for _ in range(G)]
    return Sampled(batch, [t[-1] for t in texts], rows_ex, prompts, list(examples))


def _stitch(row_prompt, resp, lp, tid, last: RolloutBatch, ctx: StageContext, truncated) -> RolloutBatch:
    B = len(resp)
    P, T = max(len(p) for p in row_prompt), max(len(r) for r in resp)
    pad = int(ctx.tokenizer.pad_token_id if ctx.tokenizer.pad_token_id is not None else 0)
    tokens = torch.full((B, P + T), pad, dtype=torch.long)
    att = torch.zeros((B, P + T), dtype=torch.bool)
    loss_mask = torch.zeros((B, T), dtype=torch.bool)
    logp = torch.zeros((B, T), dtype=torch.float32)
    turn_ids = torch.full((B, T), -1, dtype=torch.long)
    for i in range(B):
        p, r = row_prompt[i], resp[i]
        tokens[i, P - len(p): P] = torch.tensor(p)
        att[i, P - len(p): P] = True
        tokens[i, P: P + len(r)] = torch.tensor(r, dtype=torch.long)
        att[i, P: P + len(r)] = True
        t = torch.tensor(tid[i], dtype=torch.long)
        turn_ids[i, : len(r)] = t
        loss_mask[i, : len(r)] = t >= 0
        logp[i, : len(r)] = torch.tensor(lp[i])
    return RolloutBatch(
        tokens=tokens, attention_mask=att, loss_mask=loss_mask, prompt_width=P, group=last.group.clone(),
        policy_version=last.policy_version.clone(), batch_id=ctx.batch_tag, source=("native",) * B,
        engine=last.engine, sampling=last.sampling, logp_behavior=logp,
        extras={"turn_ids": turn_ids, "truncated": truncated, "prompt_lengths": att[:, :P].sum(1),
                "prompt_index": torch.arange(B) // ctx.run.group_size, "seed": None},
    ).validate()


def menu(n_prompts: int, ctx: StageContext) -> Sampled:
    """One decision per sample: the rollout engine draws ONE token from the policy
    restricted to the menu's labels (`SamplingSettings.allowed_ids`, the run's temperature),
    so the behavior log-probs, and every log-prob the trainer computes for the batch, are
    over the menu only. Labels come from `example.meta["menu"]` and must be single tokens
    (`objectives.rlid.compile_menu`); one batch has one menu. Extras: menu_ids [B, K],
    menu_group [B] (one group per menu), episode_id [B] and episode_len [B] (each decision
    is an episode of length 1 in a one-step menu task)."""
    examples = ctx.next_train(n_prompts)
    menus = [tuple(e.meta.get("menu") or ()) if isinstance(e.meta, dict) else () for e in examples]
    if any(not m for m in menus):
        raise rlid_k.MenuError("the menu source needs examples with meta['menu'] (the option labels), e.g. "
                               "task.name=menu_arithmetic")
    if len(set(menus)) != 1:
        raise rlid_k.MenuError(f"one batch samples under one menu restriction, but its examples have the menus "
                               f"{sorted(set(menus))}")
    ids = rlid_k.compile_menu(ctx.tokenizer, menus[0])
    try:
        sampling = SamplingSettings(temperature=ctx.sampling.temperature, allowed_ids=ids)
    except ValueError as exc:
        raise rlid_k.MenuError(f"menu sampling: {exc}") from None
    G = ctx.run.group_size
    prompts = [ctx.encode(e.prompt) for e in examples]
    b = ctx.rollout.generate(prompts, group_size=G, sampling=sampling, max_new_tokens=1,
                             policy_version=ctx.policy_version, batch_id=ctx.batch_tag,
                             group_ids=ctx.new_groups(n_prompts))
    B = b.size
    extras = {**b.extras, "menu_ids": torch.tensor(ids, dtype=torch.long).expand(B, len(ids)).clone(),
              "menu_group": torch.zeros(B, dtype=torch.long), "episode_id": torch.arange(B),
              "episode_len": torch.ones(B, dtype=torch.long)}
    b = b.replace(extras=extras).validate()
    return Sampled(b, ctx.rollout.decode(b), [e for e in examples for _ in range(G)], prompts, list(examples))


MULTI_TURN = Stage("source", multi_turn, writes=SOURCE_WRITES + ("extras.turn_ids",))
MENU = Stage("source", menu, kernels=(rlid_k.compile_menu,),
             writes=SOURCE_WRITES + ("extras.menu_ids", "extras.menu_group", "extras.episode_id", "extras.episode_len"))

# ============================================================================ round stages


def conspo_round(batch: RolloutBatch, ctx: StageContext):
    """The margin of this step (`conspo.margin_at(ctx.step)`) and the row scale N_seq/N_pos
    of the round (so the aggregate is the mean over the positives), as 0-dim extras."""
    p = ctx.p
    margin = conspo_k.margin_at(ctx.step, margin_max=p.conspo_margin_max, ramp_steps=p.conspo_margin_ramp_steps)
    pos = _verdict(batch, p.verdict_threshold) & batch.loss_mask.any(-1)
    n_seq = int(batch.loss_mask.any(-1).sum())
    scale = n_seq / max(int(pos.sum()), 1)
    return ({"extras": {"conspo_margin": torch.tensor(margin), "conspo_row_scale": torch.tensor(float(scale))}},
            {"conspo/margin": margin, "conspo/positive_frac": float(pos.double().mean())})


def _verdict(batch: RolloutBatch, threshold: float) -> torch.Tensor:
    batch.require("verdicts", "outcome.correct")
    return verdict_polarity(batch.outcome["correct"], threshold) > 0


def zcpo_drift(batch: RolloutBatch, ctx: StageContext):
    """κ [B, T]: the exact full-vocabulary KL(π_θ‖π_ref) per position at the round's start
    (`LocalWorker.vocab_stats`, chunked over positions and vocabulary), detached."""
    batch.require("zcpo", "logp_ref")
    kl = ctx.worker.vocab_stats(batch, kl_to_reference=True)["kl"]
    sampled = (batch.logp_current if batch.logp_current is not None else batch.logp_behavior) - batch.logp_ref
    return ({"extras": {"zcpo_kl": kl}},
            {"zcpo/kl_full_token_mean": float(masked_mean(kl, batch.loss_mask)),
             "zcpo/sampled_log_ratio_mean": float(masked_mean(sampled, batch.loss_mask))})


def _stare_round(batch: RolloutBatch, ctx: StageContext):
    ent = ctx.worker.vocab_stats(batch)["entropy"]
    H = float(masked_mean(ent, batch.loss_mask))
    return {"extras": {"stare_entropy": torch.tensor(H)}}, {"stare/entropy": H,
                                                            "stare/target": ctx.p.stare_target_entropy}


def stare_round_old(batch: RolloutBatch, ctx: StageContext):
    """STARE with surprisal under π_old: the current mean entropy H (full vocabulary, the
    whole batch's valid tokens), frozen for the round (the surprisal quantiles are taken by
    the advantage stage, which sees the whole batch and the advantages' signs)."""
    batch.require("stare", "logp_old")
    return _stare_round(batch, ctx)


def stare_round_behavior(batch: RolloutBatch, ctx: StageContext):
    """As `stare_round_old`, with surprisal under the behavior μ (the rollout engine)."""
    batch.require("stare", "logp_behavior")
    return _stare_round(batch, ctx)


def _question_mask(batch: RolloutBatch, ctx: StageContext) -> torch.Tensor:
    """[B, P] bool: the question's own tokens inside each templated prompt (the chat
    template's fixed prefix and suffix around the user content, found by encoding a
    marker, are excluded, as is padding)."""
    mark = "QQQ"
    ids = ctx.encode(mark)
    m = ctx.tokenizer.encode(mark, add_special_tokens=False)
    at = [i for i in range(len(ids) - len(m) + 1) if ids[i: i + len(m)] == m]
    if not at:
        raise PolicylabError("erpo: the chat template does not place the user message verbatim")
    pre, suf = ids[: at[-1]], ids[at[-1] + len(m):]
    P = batch.prompt_width
    out = torch.zeros((batch.size, P), dtype=torch.bool)
    for i in range(batch.size):
        real = batch.tokens[i, :P][batch.attention_mask[i, :P]].tolist()
        start = P - len(real)
        if real[: len(pre)] != pre or real[len(real) - len(suf):] != suf or len(real) <= len(pre) + len(suf):
            raise PolicylabError(f"erpo: prompt {i} is not the chat template around a user message; the question's "
                                 "tokens cannot be told apart from the template's")
        out[i, start + len(pre): start + len(real) - len(suf)] = True
    return out


def erpo_round(batch: RolloutBatch, ctx: StageContext):
    """ω [B]: question weights from the frozen reference's length-normalized likelihood of
    each question (`LocalWorker.prompt_logprobs("logp_ref", ...)` over the question's own
    tokens), exponentially tilted under the Query-KL penalty (`objectives.erpo`)."""
    lp = ctx.worker.prompt_logprobs("logp_ref", batch)
    tau = erpo_k.question_typicality(lp, _question_mask(batch, ctx))
    w, info = erpo_k.question_weights(tau, qkl_coef=ctx.p.qkl_coef)
    return {"extras": {"erpo_weight": w}}, info


def rlid_round(batch: RolloutBatch, ctx: StageContext):
    """Checks that every decision's menu is the one its log-probs were computed over (the
    batch's sampling restriction), then freezes for the round: the episode weights
    L̄/L_e and the label-marginal coefficients from the policy's menu distribution at the
    round's start (`LocalWorker.logprobs_at` on the menu ids)."""
    ex = batch.extras
    for key in ("menu_ids", "menu_group", "episode_id", "episode_len"):
        if key not in ex:
            raise MissingQuantityError("rlid", f"extras.{key}", "Sample with the menu source (a task whose examples "
                                       "carry meta['menu'], e.g. task.name=menu_arithmetic)")
    menu_ids = ex["menu_ids"]
    allowed = torch.tensor(batch.sampling.allowed_ids, dtype=torch.long)
    rlid_k.check_same_menu(menu_ids, allowed.expand_as(menu_ids) if allowed.numel() == menu_ids.shape[1]
                           else allowed.unsqueeze(0))
    if batch.loss_mask.shape[1] != 1 or not bool(batch.loss_mask.all()):
        raise rlid_k.MenuError("rlid decisions are one token each: every row must have exactly one counted position")
    chosen_tok = batch.response_tokens[:, 0]
    hit = menu_ids == chosen_tok.unsqueeze(-1)
    if not bool(hit.any(-1).all()):
        raise rlid_k.MenuError("a sampled decision is not one of its menu's labels")
    chosen = hit.float().argmax(-1)
    cur = ctx.worker.logprobs_at(batch, menu_ids.unsqueeze(1))[:, 0, :]
    coef, R = rlid_k.marginal_coefficients(cur, chosen, ex["menu_group"])
    w = rlid_k.episode_weights(ex["episode_id"], ex["episode_len"])
    mbar = cur.exp().mean(0)
    return ({"extras": {"rlid_marginal_coef": coef.float(), "rlid_episode_weight": w.float()}},
            {"rlid/label_marginal_kl": float(R), "rlid/label_marginal_max": float(mbar.max())})


CONSPO_ROUND = Stage("round", conspo_round, kernels=(conspo_k.margin_at,),
                     params=("conspo_margin_max", "conspo_margin_ramp_steps", "verdict_threshold"),
                     reads=("outcome.correct",), writes=("extras.conspo_margin", "extras.conspo_row_scale"))
ZCPO_DRIFT = Stage("round", zcpo_drift, needs=("worker.vocab_stats",), kernels=(zcpo_k.full_vocab_kl,), reads=("logp_ref",),
                   writes=("extras.zcpo_kl",))
_STARE_P = ("stare_target_entropy",)
_STARE_W = ("extras.stare_entropy",)
STARE_ROUND_OLD = Stage("round", stare_round_old, needs=("worker.vocab_stats",),
                        params=_STARE_P + ("surprisal_source",), reads=("logp_old",), writes=_STARE_W,
                        active=lambda p: p.surprisal_source == "logp_old")
STARE_ROUND_BEHAVIOR = Stage("round", stare_round_behavior, needs=("worker.vocab_stats",),
                             params=_STARE_P + ("surprisal_source",), reads=("logp_behavior",), writes=_STARE_W,
                             active=lambda p: p.surprisal_source == "logp_behavior")
ERPO_ROUND = Stage("round", erpo_round, needs=("worker.prompt_logprobs",), kernels=(erpo_k.question_typicality, erpo_k.question_weights),
                   params=("qkl_coef",), reads=("logp_ref",), writes=("extras.erpo_weight",))
RLID_ROUND = Stage("round", rlid_round, needs=("worker.logprobs_at",), kernels=(rlid_k.marginal_coefficients, rlid_k.episode_weights),
                   reads=("extras.menu_ids", "extras.episode_id"),
                   writes=("extras.rlid_marginal_coef", "extras.rlid_episode_weight"))

# ============================================================================ advantages


def verdict(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """±1 per response from the verifier's raw outcome: +1 iff outcome["correct"] >=
    `verdict_threshold` (inclusive). ConSPO reads positives from it, tlm-DRE polarities."""
    batch.require("verdicts", "outcome.correct")
    adv = verdict_polarity(batch.outcome["correct"], ctx.p.verdict_threshold)
    return Advantages(adv, info={"positive_frac": float((adv > 0).double().mean())})


def zcpo(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """c_i from rewards and the round's full-vocabulary drift (extras["zcpo_kl"])."""
    if "zcpo_kl" not in batch.extras:
        raise PolicylabError("zcpo needs extras['zcpo_kl'] (the full-vocabulary KL, written by the ZCPO_DRIFT round "
                             "stage)")
    r = scalar_rewards(batch, "zcpo")
    c, info = zcpo_k.zcpo_coefficients(r, batch.group, zcpo_k.from_worker(batch.extras["zcpo_kl"]), batch.loss_mask,
                                       beta=ctx.p.drift_coef, std=ctx.p.std)
    return Advantages(c, info=info)


def stare(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """GRPO advantages reweighted per token by STARE's gate (`objectives.stare`), over the
    whole round batch (the critical sets are batch quantiles per advantage sign)."""
    p, ex = ctx.p, batch.extras
    if "stare_entropy" not in ex:
        raise PolicylabError("stare needs the round's current entropy (extras['stare_entropy'], the STARE round "
                             "stage)")
    r = scalar_rewards(batch, "stare")
    a = A.grpo(r, batch.group, std=p.std, eps=p.eps)
    src = batch.logp_old if p.surprisal_source == "logp_old" else batch.logp_behavior
    out, info = stare_k.stare_reweight(a, src, batch.loss_mask, entropy=float(ex["stare_entropy"]),
                                       target=p.stare_target_entropy, quantile=p.stare_quantile,
                                       selection=p.stare_selection, gate=p.stare_gate, amplify=p.stare_amplify,
                                       attenuate=p.stare_attenuate, gain=p.stare_gain,
                                       direction=p.stare_direction)
    return Advantages(out, info={**A.group_stats(r, batch.group), **info})


def erpo(batch: RolloutBatch, ctx: StageContext) -> Advantages:
    """GRPO advantages scaled by the question weight ω of their prompt."""
    if "erpo_weight" not in batch.extras:
        raise PolicylabError("erpo needs extras['erpo_weight'] (written by the ERPO round stage)")
    r = scalar_rewards(batch, "erpo")
    a = A.grpo(r, batch.group, std=ctx.p.std, eps=ctx.p.eps)
    return Advantages(a * batch.extras["erpo_weight"].to(a.dtype), info=A.group_stats(r, batch.group))


VERDICT = Stage("advantage", verdict, kernels=(verdict_polarity,), params=("verdict_threshold",),
                reads=("outcome.correct",))
ZCPO = Stage("advantage", zcpo, kernels=(zcpo_k.zcpo_coefficients,), params=("drift_coef", "std"),
             reads=("rewards", "group", "extras.zcpo_kl"))
STARE = Stage("advantage", stare, kernels=(A.grpo, stare_k.critical_tokens, stare_k.stare_reweight),
              params=("std", "eps", "surprisal_source", "stare_target_entropy", "stare_quantile", "stare_selection",
                      "stare_gate", "stare_amplify", "stare_attenuate", "stare_gain", "stare_direction"),
              reads=("rewards", "group", "extras.stare_entropy"))
ERPO = Stage("advantage", erpo, kernels=(A.grpo,), params=("std", "eps"),
             reads=("rewards", "group", "extras.erpo_weight"))

# ============================================================================ objectives, corrections, addends


def conspo(inp: LossInputs, p):
    ex = inp.batch.extras
    if "conspo_margin" not in ex:
        raise PolicylabError("conspo needs the round's margin (extras['conspo_margin'], the CONSPO round stage)")
    positive = (torch.where(inp.mask, inp.adv if inp.adv.dim() == 2 else inp.adv.unsqueeze(-1), 0.0) > 0).any(-1)
    scale = torch.full((inp.mask.shape[0],), float(ex["conspo_row_scale"]), dtype=inp.logp.dtype)
    return conspo_k.conspo(inp.logp, inp.mask, inp.batch.group, positive, tau=p.conspo_tau,
                           margin=float(ex["conspo_margin"]), row_scale=scale)


def tlm_dre(inp: LossInputs, p):
    inp.batch.require("tlm_dre", "logp_ref")
    turn_ids = inp.batch.extras.get("turn_ids")
    return tlm_k.tlm_dre(inp.logp, inp.logp_ref, inp.adv, turn_ids, inp.mask, tau=p.turn_tau,
                         kappa_pos=p.kappa_pos, kappa_neg=p.kappa_neg)


def reco(inp: LossInputs, p) -> Weighting:
    """ReCo's detached weight w_i·g(v_t) on the host loss: v compares the live learner
    (sg(logp)) with the host's ratio denominator π_old (`inp.logp_old`)."""
    w, m = reco_k.reco_weights(inp.logp, inp.logp_old, inp.mask, group_size=int(p.reco_group_size),
                               eps_v=p.reco_eps_v, g_min=p.reco_g_min, g_max=p.reco_g_max)
    return Weighting(weight=w, metrics=m)


def rlid_episode_weight(inp: LossInputs, p) -> Weighting:
    ex = inp.batch.extras
    if "rlid_episode_weight" not in ex:
        raise PolicylabError("rlid needs the round's episode weights (the RLID round stage)")
    return Weighting(weight=ex["rlid_episode_weight"].to(inp.logp.dtype))


def rlid_marginal(inp: LossInputs, p):
    """β_R·(c_a − b)·ρ on each decision: its gradient estimates β_R·∇R (see
    `objectives.rlid`), ρ = exp(lp − lp_old) (value 1 on the first update)."""
    coef = inp.batch.extras["rlid_marginal_coef"].to(inp.logp.dtype).unsqueeze(-1)
    rho = torch.exp(inp.logp - inp.logp_old.detach()) if inp.logp_old is not None else unit_carrier(inp.logp)
    term = p.marginal_coef * coef * rho
    return torch.where(inp.mask, term, torch.zeros((), dtype=term.dtype)), {}


CONSPO = Stage("objective", conspo, kernels=(conspo_k.conspo,), params=("conspo_tau",),
               reads=("logp", "group", "extras.conspo_margin"), row_coupling="group")
TLM_DRE = Stage("objective", tlm_dre, kernels=(tlm_k.tlm_dre, tlm_k.turn_weights),
                params=("turn_tau", "kappa_pos", "kappa_neg"), reads=("logp", "logp_ref", "extras.turn_ids"),
                inert_at_zero_adv=True)
RECO = Stage("correction", reco, kernels=(reco_k.reco_weights,),
             params=("reco_group_size", "reco_eps_v", "reco_g_min", "reco_g_max"), reads=("logp",))
RLID_EPISODE_WEIGHT = Stage("correction", rlid_episode_weight, kernels=(rlid_k.episode_weights,),
                            reads=("extras.rlid_episode_weight",))
RLID_MARGINAL = Stage("addend", rlid_marginal, kernels=(rlid_k.marginal_coefficients,), params=("marginal_coef",),
                      reads=("logp", "extras.rlid_marginal_coef"), active=lambda p: p.marginal_coef > 0)
