"""Stages of the mixed-policy methods: sources of sequences the learner did not sample
from the deployment prompt, and the round, advantage and loss stages that read their
provenance.

Sources (each returns one `Sampled` whose groups mix native rows with rows of another
provenance; every row keeps its `source` and `producer`, `policylab.batch`):

    DEMONSTRATIONS  LUFFY: G − k native samples + k solver demonstrations per prompt
    HINTED          Off-Context GRPO: sample on prompt ⊕ hint, rebuild on the prompt alone
    GOLD_INJECTION  GRIN: native samples; gold answers replace failed samples of all-fail groups
    EXPERT_PREFIX   MOER: G − k native + k guided rows (expert prefix, learner continuation),
                    rolled back to the full expert trace when the continuation fails
    PEER_EXCHANGE   GRAFT: a peer model's whole group imported when the receiver's group all fails
    EXTERNAL        ERILS: G − k native + k rollouts of an external model, length-capped

Guidance (hints, demonstrations, gold, expert traces) comes from `policylab.tasks.guidance`,
train split only. The learner's own numerator is always computed by the trainer on the
batch's tokens: the deployment prompt and the response.
"""

from __future__ import annotations

import math

import torch

from policylab.batch import LEARNER, RolloutBatch
from policylab.errors import PolicylabError
from policylab.kernels import mixed as K
from policylab.methods.rows import assemble, build_rows, real_prompts, response_ids, with_prompts
from policylab.tasks import guidance
from policylab.methods.context import Sampled, StageContext
from policylab.methods.spec import Advantages, LossInputs, Stage, Weighting
from policylab.methods.stages.advantages import scalar_rewards

_NATIVE_WRITES = ("tokens", "loss_mask", "logp_behavior", "behavior_mask", "group", "policy_version", "source",
                  "producer")


def _draw(n: int, ctx: StageContext):
    examples = ctx.next_train(n)
    return examples, [ctx.encode(e.prompt) for e in examples], ctx.new_groups(n)


def _generate(ctx: StageContext, prompts: list[list[int]], groups: list[int], per_prompt: int) -> RolloutBatch:
    return ctx.rollout.generate(prompts, group_size=per_prompt, sampling=ctx.sampling,
                                max_new_tokens=ctx.run.max_new_tokens, policy_version=ctx.policy_version,
                                batch_id=ctx.batch_tag, group_ids=groups)


def _pad_id(ctx: StageContext) -> int:
    return int(ctx.tokenizer.pad_token_id)


def _rep(xs: list, k: int) -> list:
    return [x for x in xs for _ in range(k)]


def _solver_rows(ctx: StageContext, examples, prompts, groups, texts, source: str, k: int) -> RolloutBatch:
    """k rows per prompt of solver-written text (a deterministic producer: μ = 1)."""
    ids = [response_ids(ctx.tokenizer, t) for t in texts]
    return build_rows(_rep(prompts, k), _rep(ids, k), group=_rep(groups, k), source=[source] * (k * len(prompts)),
                      producer=_rep([guidance.solver_id(e) for e in examples], k), policy_version=ctx.policy_version,
                      batch_id=ctx.batch_tag, sampling=ctx.sampling, engine="solver", pad_id=_pad_id(ctx),
                      prompt_index=_rep(list(range(len(prompts))), k))


# ----------------------------------------------------------------------------- LUFFY


def demonstrations(n_prompts: int, ctx: StageContext) -> Sampled:
    """Per prompt: G − k rollouts of the current weights and k demonstrations written by
    the task's solver (`guidance.demonstration`, train split), in one group."""
    G, k = ctx.run.group_size, int(ctx.p.demos_per_group)
    examples, prompts, groups = _draw(n_prompts, ctx)
    nat = _generate(ctx, prompts, groups, G - k)
    demo_texts = [guidance.demonstration(e, ctx.p.demonstration_style) for e in examples]
    demo = _solver_rows(ctx, examples, prompts, groups, demo_texts, "demonstration", k)
    return assemble([(nat, ctx.rollout.decode(nat), _rep(examples, G - k)), (demo, _rep(demo_texts, k), _rep(examples, k))],
                    batch_id=ctx.batch_tag, group_order=groups, prompt_ids=prompts, group_examples=list(examples))


def luffy(inp: LossInputs, p):
    """LUFFY's loss: clipped ratio on native rows, shaped weight π/(π+γ) on demonstration rows."""
    off = inp.batch.source_rows("demonstration")
    return K.luffy_loss(inp.logp, inp.logp_old, inp.adv, inp.mask, off, gamma=p.luffy_gamma, eps_low=p.eps_low,
                        eps_high=p.eps_high)


DEMONSTRATIONS = Stage("source", demonstrations, kernels=(guidance.demonstration,),
                       params=("demos_per_group", "demonstration_style"), writes=_NATIVE_WRITES)
LUFFY = Stage("objective", luffy, kernels=(K.luffy_loss, K.luffy_shaped_weight),
              params=("luffy_gamma", "eps_low", "eps_high"), reads=("logp", "logp_old", "source"),
              inert_at_zero_adv=True)


# ----------------------------------------------------------------------------- Off-Context GRPO


def with_hint(prompt: str, hint_text: str) -> str:
    """The privileged context x ⊕ h: the hint on its own line after the prompt."""
    return f"{prompt}\n{hint_text}" if hint_text else prompt


def hinted(n_prompts: int, ctx: StageContext) -> Sampled:
    """Sample G responses per prompt on x ⊕ h (the hint from the train split), then rebuild
    every row on x alone: the learner's numerator is computed without the hint, while
    `logp_behavior` stays what the hinted sampler produced. Rows of an empty hint are
    native (sampled from the deployment context itself)."""
    G = ctx.run.group_size
    examples, prompts, groups = _draw(n_prompts, ctx)
    hints = [guidance.hint(e, ctx.p.hint_kind) for e in examples]
    behavior_prompts = [ctx.encode(with_hint(e.prompt, h)) if h else prompts[i]
                        for i, (e, h) in enumerate(zip(examples, hints))]
    hint_ids = [ctx.tokenizer(h, add_special_tokens=False)["input_ids"] if h else [] for h in hints]
    K.check_context_separation(prompts, behavior_prompts, hint_ids, [bool(h) for h in hints])
    b = _generate(ctx, behavior_prompts, groups, G)
    texts = ctx.rollout.decode(b)
    rows = _rep(list(range(n_prompts)), G)
    learner = with_prompts(b, [prompts[i] for i in rows], pad_id=_pad_id(ctx),
                           source=["hinted" if hints[i] else "native" for i in rows], producer=[LEARNER] * b.size)
    extras = {**learner.extras,
              "behavior_prompt_hash": torch.tensor([K.fingerprint(behavior_prompts[i]) for i in rows]),
              "hint_hash": torch.tensor([K.fingerprint(hint_ids[i]) for i in rows]),
              "hint_len": torch.tensor([len(hint_ids[i]) for i in rows])}
    return Sampled(learner.replace(extras=extras), texts, _rep(examples, G), prompts, list(examples))


def context_check(batch: RolloutBatch, ctx: StageContext):
    """Refuse a hinted row whose numerator and denominator saw the same context (both
    with the hint or both without) or whose learner prompt contains the hint."""
    hinted_rows = batch.source_rows("hinted")
    if bool(hinted_rows.any()):
        for key in ("behavior_prompt_hash", "hint_hash", "hint_len"):
            if key not in batch.extras:
                raise K.ContextError(f"hinted rows without extras[{key!r}]: the hinted source records it")
        K.check_context_fingerprints(real_prompts(batch), batch.extras["behavior_prompt_hash"].tolist(),
                                     batch.extras["hint_hash"].tolist(), batch.extras["hint_len"].tolist(),
                                     hinted_rows.tolist())
    return {}, {"offctx/hinted_fraction": float(hinted_rows.float().mean())}


def hinted_denominator(inp: LossInputs, p) -> Weighting:
    """π_θ(y|x) / μ(y|x ⊕ h) on hinted rows (the hinted sampler's log-probs replace the
    ratio's denominator), π_θ/π_old on native rows."""
    rows = inp.batch.source_rows("hinted")
    if not bool(rows.any()):
        return Weighting()
    inp.batch.require("off_context_grpo", "logp_behavior")
    denom = K.behavior_denominator(inp.logp_old, inp.batch.logp_behavior, rows)
    d = (inp.logp.detach() - denom)[inp.mask & rows.unsqueeze(-1)]
    return Weighting(logp_old=denom, metrics={"offctx/log_ratio_hinted_mean": d.mean() if d.numel() else d.sum()})


HINTED = Stage("source", hinted, kernels=(guidance.hint, K.check_context_separation), params=("hint_kind",),
               writes=_NATIVE_WRITES + ("extras.behavior_prompt_hash", "extras.hint_hash", "extras.hint_len"))
CONTEXT_CHECK = Stage("round", context_check, kernels=(K.check_context_fingerprints,),
                      reads=("tokens", "source", "extras.behavior_prompt_hash"))
HINTED_DENOMINATOR = Stage("correction", hinted_denominator, kernels=(K.behavior_denominator,),
                           reads=("logp_old", "logp_behavior", "source"))


# ----------------------------------------------------------------------------- GRIN


def gold_count(p, ema: float, G: int) -> int:
    """Gold rows injected into an all-fail group: round(α_eff·G), α_eff = α (constant) or
    α·(1 − EMA of the native success rate) ("success_decay"), at most G − 1."""
    a = float(p.grin_alpha) * (1.0 - ema if p.grin_schedule == "success_decay" else 1.0)
    return max(0, min(G - 1, int(math.floor(a * G + 0.5))))


def gold_injection(n_prompts: int, ctx: StageContext) -> Sampled:
    """G native samples per prompt; a group whose samples all fail the verifier gets its
    last n failed samples replaced by the verified gold answer (train split), n from the
    injection schedule. Writes each row's real mixture weight α_g = n/G
    (extras["grin_alpha"]) and where it follows the gold text (extras["grin_gold_match"])."""
    G = ctx.run.group_size
    examples, prompts, groups = _draw(n_prompts, ctx)
    nat = _generate(ctx, prompts, groups, G)
    texts = ctx.rollout.decode(nat)
    rows_ex = _rep(examples, G)
    _, _, correct = ctx.score(texts, rows_ex)
    ema = ctx.state["grin_success"]
    n_gold = gold_count(ctx.p, ema.value, G)
    ema.update(float(correct.float().mean()))
    fails = [not bool(correct[i * G:(i + 1) * G].any()) for i in range(n_prompts)]
    inject = [i for i in range(n_prompts) if fails[i] and n_gold > 0]
    keep = torch.ones(nat.size, dtype=torch.bool)
    for i in inject:
        keep[(i + 1) * G - n_gold:(i + 1) * G] = False
    parts = [(nat.select(keep), [t for t, k in zip(texts, keep.tolist()) if k],
              [e for e, k in zip(rows_ex, keep.tolist()) if k])]
    golds = {i: guidance.gold_answer(examples[i]) for i in inject}
    if inject:  # only verified gold is injected: a gold answer the verifier refuses is skipped (and counted)
        _, _, ok = ctx.score([golds[i] for i in inject], [examples[i] for i in inject])
        unverified = [i for i, v in zip(inject, ok.tolist()) if not v]
        inject = [i for i, v in zip(inject, ok.tolist()) if v]
        keep[:] = True
        for i in inject:
            keep[(i + 1) * G - n_gold:(i + 1) * G] = False
        parts = [(nat.select(keep), [t for t, k in zip(texts, keep.tolist()) if k],
                  [e for e, k in zip(rows_ex, keep.tolist()) if k])]
    else:
        unverified = []
    if inject:
        ex_i = [examples[i] for i in inject]
        gtexts = [golds[i] for i in inject]
        gb = _solver_rows(ctx, ex_i, [prompts[i] for i in inject], [groups[i] for i in inject], gtexts, "gold", n_gold)
        parts.append((gb, _rep(gtexts, n_gold), _rep(ex_i, n_gold)))
    s = assemble(parts, batch_id=ctx.batch_tag, group_order=groups, prompt_ids=prompts, group_examples=list(examples))
    b = s.batch
    alpha = torch.zeros(b.size)
    match = torch.zeros(b.loss_mask.shape)
    gold_ids = {groups[i]: response_ids(ctx.tokenizer, golds[i]) for i in inject}
    resp = b.response_tokens
    for r, g in enumerate(b.group.tolist()):
        if g not in gold_ids:
            continue
        alpha[r] = n_gold / G
        ref = gold_ids[g]
        for t in range(int(b.loss_mask[r].sum())):  # q_gold(y_t) = 1 while y_<=t follows the gold text
            if t >= len(ref) or int(resp[r, t]) != ref[t]:
                break
            match[r, t] = 1.0
    s.batch = b.replace(extras={**b.extras, "grin_alpha": alpha, "grin_gold_match": match,
                                "grin_unverified": torch.full((b.size,), float(len(unverified)))}).validate()
    return s


def mixture_denominator(inp: LossInputs, p) -> Weighting:
    """The ratio's denominator is the sampling mixture q_mix = (1 − α)·π_old + α·q_gold of
    the row's group (π_old alone where nothing was injected), never the reference."""
    ex = inp.batch.extras
    for key in ("grin_alpha", "grin_gold_match"):
        if key not in ex:
            raise PolicylabError(f"grin needs extras[{key!r}] (written by its gold-injection source)")
    denom = K.grin_mixture_logp(inp.logp_old, ex["grin_alpha"].to(inp.logp_old.dtype), ex["grin_gold_match"] > 0.5,
                                inp.mask)
    return Weighting(logp_old=denom)


def grin_round(batch: RolloutBatch, ctx: StageContext):
    gold = batch.source_rows("gold")
    return {}, {"grin/injected_groups": float(torch.unique(batch.group[gold]).numel()),
                "grin/alpha_mean": float(batch.extras["grin_alpha"].mean()),
                "grin/native_success_ema": float(ctx.state["grin_success"].value),
                "grin/unverified_gold_skipped": float(batch.extras["grin_unverified"][0]) if batch.size else 0.0}


GOLD_INJECTION = Stage("source", gold_injection, kernels=(guidance.gold_answer,),
                       params=("grin_alpha", "grin_schedule"),
                       writes=_NATIVE_WRITES + ("extras.grin_alpha", "extras.grin_gold_match", "extras.grin_unverified"))
MIXTURE_DENOMINATOR = Stage("correction", mixture_denominator, kernels=(K.grin_mixture_logp,),
                            reads=("logp_old", "extras.grin_alpha", "extras.grin_gold_match"))
GRIN_ROUND = Stage("round", grin_round, reads=("source", "extras.grin_alpha"))


# ----------------------------------------------------------------------------- MOER


def prefix_fraction(step: int, p) -> float:
    """Fraction of the expert trace given as prefix at `step`: prefix_frac·max(0, 1 −
    step/prefix_decay_steps) (constant when prefix_decay_steps is 0). Non-increasing."""
    f = float(p.prefix_frac)
    if int(p.prefix_decay_steps) > 0:
        f *= max(0.0, 1.0 - step / int(p.prefix_decay_steps))
    return f


def expert_prefix(n_prompts: int, ctx: StageContext) -> Sampled:
    """Per prompt: G − k native rollouts, and k guided rows: the first ⌊f·(L − 1)⌋ tokens
    of the expert trace (the worked solution, L tokens with its eos; f from the schedule),
    continued by the learner. A guided row whose text fails the verifier is rolled back to
    the full expert trace (source "expert"). Guided rows stay "guided" whatever fraction
    of their tokens the learner wrote; the prefix tokens are context (in the loss only with
    train_prefix)."""
    G, k = ctx.run.group_size, int(ctx.p.guided_per_group)
    examples, prompts, groups = _draw(n_prompts, ctx)
    nat = _generate(ctx, prompts, groups, G - k)
    parts = [(nat, ctx.rollout.decode(nat), _rep(examples, G - k))]
    traces = [response_ids(ctx.tokenizer, guidance.worked_solution(e)) for e in examples]
    frac = prefix_fraction(ctx.step, ctx.p)
    plen = [int(math.floor(frac * (len(t) - 1))) for t in traces]
    guided = _generate(ctx, [p + t[:n] for p, t, n in zip(prompts, traces, plen)], groups, k)
    pad = _pad_id(ctx)
    resp, lpb, counted, src, prod, texts, ex_rows, prm, grp, idx = [], [], [], [], [], [], [], [], [], []
    g_texts = ctx.rollout.decode(guided)
    for r in range(guided.size):
        i = r // k
        m = guided.loss_mask[r]
        cont = guided.response_tokens[r][m].tolist()
        full = traces[i][:plen[i]] + cont
        resp.append(full)
        lpb.append([0.0] * plen[i] + guided.logp_behavior[r][m].tolist())
        counted.append(0 if ctx.p.train_prefix else plen[i])
        src.append("guided" if plen[i] > 0 else "native")
        prod.append(f"{LEARNER}+{guidance.solver_id(examples[i])}" if plen[i] > 0 else LEARNER)
        texts.append(ctx.decode(full) if plen[i] > 0 else g_texts[r])
        ex_rows.append(examples[i]), prm.append(prompts[i]), grp.append(groups[i]), idx.append(i)
    _, _, ok = ctx.score(texts, ex_rows)
    for r in range(len(resp)):  # selective rollback: only a failed guided continuation
        if src[r] == "guided" and not bool(ok[r]):
            i = idx[r]
            resp[r], lpb[r], counted[r], src[r] = traces[i], [0.0] * len(traces[i]), 0, "expert"
            prod[r] = guidance.solver_id(examples[i])
            texts[r] = guidance.worked_solution(examples[i])
    gb = build_rows(prm, resp, group=grp, source=src, producer=prod, policy_version=ctx.policy_version,
                    batch_id=ctx.batch_tag, sampling=ctx.sampling, engine=nat.engine, pad_id=pad,
                    counted_from=counted, logp_behavior=lpb, prompt_index=idx)
    gb = gb.replace(extras={**gb.extras, "truncated": guided.extras["truncated"].clone()})
    parts.append((gb, texts, ex_rows))
    s = assemble(parts, batch_id=ctx.batch_tag, group_order=groups, prompt_ids=prompts, group_examples=list(examples))
    s.batch = s.batch.replace(extras={**s.batch.extras, "moer_prefix_frac": torch.full((s.batch.size,), frac)})
    return s


def unit_ratio(inp: LossInputs, p) -> Weighting:
    """Guided and expert rows: the ratio π_θ/sg(π_θ) (value 1, gradient ∇lp); native rows
    keep the host's π_θ/π_old."""
    rows = inp.batch.source_rows("guided", "expert")
    if not bool(rows.any()):
        return Weighting()
    return Weighting(logp_old=K.unit_ratio_denominator(inp.logp, inp.logp_old, rows))


def moer_round(batch: RolloutBatch, ctx: StageContext):
    return {}, {"moer/prefix_frac": float(batch.extras["moer_prefix_frac"][0]) if batch.size else 0.0,
                "moer/rollback_rows": float(batch.source_rows("expert").sum()),
                "moer/guided_rows": float(batch.source_rows("guided").sum())}


EXPERT_PREFIX = Stage("source", expert_prefix, kernels=(guidance.worked_solution,),
                      params=("guided_per_group", "prefix_frac", "prefix_decay_steps", "train_prefix"),
                      writes=_NATIVE_WRITES + ("extras.moer_prefix_frac",))
UNIT_RATIO = Stage("correction", unit_ratio, kernels=(K.unit_ratio_denominator,), reads=("logp", "source"))
MOER_ROUND = Stage("round", moer_round, reads=("source", "extras.moer_prefix_frac"))


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
    examples, prompts, groups = _draw(n_prompts, ctx)
    nat = _generate(ctx, prompts, groups, G)
    texts = ctx.rollout.decode(nat)
    rows_ex = _rep(examples, G)
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
                        sampling=ctx.sampling, engine=peer.engine.engine_name, pad_id=_pad_id(ctx),
                        logp_behavior=lpb, behavior_known=known, prompt_index=[i] * G)
        lp_recv = ctx.worker.role_logprobs("logp_current", rb)
        c = K.graft_compatibility(lp_recv, rb.loss_mask, pb.logp_behavior, pb.loss_mask).float()
        keep = (c >= ctx.p.graft_min_compat).float()
        parts.append((rb.replace(extras={**rb.extras, "graft_compat": c, "graft_keep": keep}), ptexts, [e] * G))
        order.append(g), all_prompts.append(prompts[i]), all_ex.append(e)
    return assemble(parts, batch_id=ctx.batch_tag, group_order=order, prompt_ids=all_prompts, group_examples=all_ex)


def compat_weight(inp: LossInputs, p) -> Weighting:
    """Imported rows below the compatibility threshold get weight 0 (they stay in their
    group's advantage and in the normalizer); every other row weight 1."""
    keep = inp.batch.extras.get("graft_keep")
    if keep is None:
        raise PolicylabError("graft needs extras['graft_keep'] (written by its peer-exchange source)")
    return Weighting(weight=keep.to(inp.logp.dtype))


def graft_round(batch: RolloutBatch, ctx: StageContext):
    peer = batch.source_rows("peer")
    c = batch.extras["graft_compat"][peer]
    return {}, {"graft/borrowed_groups": float(torch.unique(batch.group[peer]).numel()),
                "graft/compat_mean": float(c.mean()) if c.numel() else 1.0,
                "graft/dropped_rows": float((batch.extras["graft_keep"][peer] == 0).sum())}


PEER_EXCHANGE = Stage("source", peer_exchange, kernels=(K.graft_should_borrow, K.graft_compatibility),
                      params=("graft_min_compat",),
                      writes=_NATIVE_WRITES + ("extras.graft_compat", "extras.graft_keep"))
COMPAT_WEIGHT = Stage("correction", compat_weight, reads=("extras.graft_keep",))
GRAFT_ROUND = Stage("round", graft_round, reads=("source", "extras.graft_compat"))


# ----------------------------------------------------------------------------- ERILS


def external(n_prompts: int, ctx: StageContext) -> Sampled:
    """Per prompt: G − k native rollouts and k rollouts of the external model (up to
    `external_max_new_tokens` tokens), re-tokenized for the learner; external rows longer
    than the cap L_ext (learner tokens) are rejected before anything else sees them, and
    counted (extras["erils_rejected"]: per row, the rejections of its group)."""
    G, k = ctx.run.group_size, int(ctx.p.external_per_group)
    other = ctx.state["external"].require()
    examples, prompts, groups = _draw(n_prompts, ctx)
    nat = _generate(ctx, prompts, groups, G - k)
    parts = [(nat, ctx.rollout.decode(nat), _rep(examples, G - k))]
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
                        engine=other.engine.engine_name, pad_id=_pad_id(ctx), logp_behavior=[lpb[r] for r in sel],
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
                 writes=_NATIVE_WRITES + ("extras.erils_rejected",))
ERILS = Stage("advantage", erils, kernels=(K.erils_advantages,), params=("std", "eps"),
              reads=("rewards", "group", "source"))
ERILS_ROUND = Stage("round", erils_round, reads=("extras.erils_rejected",))
