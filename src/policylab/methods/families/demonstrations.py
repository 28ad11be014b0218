"""Learning from solver-written tokens in the learner's own groups: LUFFY (k solver
demonstrations per group, shaped so low-probability demonstration tokens keep their
gradient) and MoER (k guided rows: an expert prefix continued by the learner, rolled back
to the full expert trace when the continuation fails). Every row keeps its `source` and
`producer` (`policylab.batch`); the solutions come from `policylab.tasks.guidance`, train
split only; kernels in `policylab.kernels.mixed`.
"""

from __future__ import annotations

import math

import torch

from policylab.batch import LEARNER, RolloutBatch
from policylab.kernels import mixed as K
from policylab.methods.context import Sampled, StageContext
from policylab.methods.params import DEPLOYMENT_LEARNER as _LEARNS
from policylab.methods.params import (
    clip,
    fewer_than_group,
    group_std,
    policy_gradient_method,
)
from policylab.methods.registry import register
from policylab.methods.rows import (
    assemble,
    build_rows,
    response_ids,
)
from policylab.methods.spec import (
    Card,
    LossInputs,
    Param,
    Stage,
    Weighting,
    non_negative,
    positive,
)
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses
from policylab.methods.stages.provenance import SOURCE_METRICS
from policylab.methods.stages.sources import (
    NATIVE_WRITES,
    draw_prompts,
    generate_groups,
    pad_id,
    repeat_each,
    solver_rows,
)
from policylab.tasks import guidance
from policylab.tasks.guidance import DEMONSTRATION_STYLES


def demonstrations(n_prompts: int, ctx: StageContext) -> Sampled:
    """Per prompt: G − k rollouts of the current weights and k demonstrations written by
    the task's solver (`guidance.demonstration`, train split), in one group."""
    G, k = ctx.run.group_size, int(ctx.p.demos_per_group)
    examples, prompts, groups = draw_prompts(n_prompts, ctx)
    nat = generate_groups(ctx, prompts, groups, G - k)
    demo_texts = [guidance.demonstration(e, ctx.p.demonstration_style) for e in examples]
    demo = solver_rows(ctx, examples, prompts, groups, demo_texts, "demonstration", k)
    return assemble([(nat, ctx.rollout.decode(nat), repeat_each(examples, G - k)), (demo, repeat_each(demo_texts, k), repeat_each(examples, k))],
                    batch_id=ctx.batch_tag, group_order=groups, prompt_ids=prompts, group_examples=list(examples))


def luffy(inp: LossInputs, p):
    """LUFFY's loss: clipped ratio on native rows, shaped weight π/(π+γ) on demonstration rows."""
    off = inp.batch.source_rows("demonstration")
    return K.luffy_loss(inp.logp, inp.logp_old, inp.adv, inp.mask, off, gamma=p.luffy_gamma, eps_low=p.eps_low,
                        eps_high=p.eps_high)


DEMONSTRATIONS = Stage("source", demonstrations, kernels=(guidance.demonstration,),
                       params=("demos_per_group", "demonstration_style"), writes=NATIVE_WRITES)


LUFFY = Stage("objective", luffy, kernels=(K.luffy_loss, K.luffy_shaped_weight),
              params=("luffy_gamma", "eps_low", "eps_high"), reads=("logp", "logp_old", "source"),
              inert_at_zero_adv=True)


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
    train_prefix).

    Only a verified expert trace is used: every trace is scored by the verifier first, and a
    prompt whose trace fails it (a dataset solution with a wrong final answer) gets neither
    a prefix nor a rollback: its k rows are plain rollouts (source native). The refusals
    are counted per batch (extras["moer_unverified"], metric moer/unverified_traces)."""
    G, k = ctx.run.group_size, int(ctx.p.guided_per_group)
    examples, prompts, groups = draw_prompts(n_prompts, ctx)
    nat = generate_groups(ctx, prompts, groups, G - k)
    parts = [(nat, ctx.rollout.decode(nat), repeat_each(examples, G - k))]
    solutions = [guidance.worked_solution(e) for e in examples]
    _, _, verified = ctx.score(solutions, list(examples))
    verified = [bool(v) for v in verified.tolist()]
    traces = [response_ids(ctx.tokenizer, t) for t in solutions]
    frac = prefix_fraction(ctx.step, ctx.p)
    plen = [int(math.floor(frac * (len(t) - 1))) if ok else 0 for t, ok in zip(traces, verified)]
    guided = generate_groups(ctx, [p + t[:n] for p, t, n in zip(prompts, traces, plen)], groups, k)
    pad = pad_id(ctx)
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
    for r in range(len(resp)):  # selective rollback: only a failed guided continuation, to a verified trace
        if src[r] == "guided" and not bool(ok[r]) and verified[idx[r]]:
            i = idx[r]
            resp[r], lpb[r], counted[r], src[r] = traces[i], [0.0] * len(traces[i]), 0, "expert"
            prod[r] = guidance.solver_id(examples[i])
            texts[r] = solutions[i]
    gb = build_rows(prm, resp, group=grp, source=src, producer=prod, policy_version=ctx.policy_version,
                    batch_id=ctx.batch_tag, sampling=ctx.sampling, engine=nat.engine, pad_id=pad,
                    counted_from=counted, logp_behavior=lpb, prompt_index=idx)
    gb = gb.replace(extras={**gb.extras, "truncated": guided.extras["truncated"].clone()})
    parts.append((gb, texts, ex_rows))
    s = assemble(parts, batch_id=ctx.batch_tag, group_order=groups, prompt_ids=prompts, group_examples=list(examples))
    unverified = float(sum(not v for v in verified))
    s.batch = s.batch.replace(extras={**s.batch.extras, "moer_prefix_frac": torch.full((s.batch.size,), frac),
                                      "moer_unverified": torch.full((s.batch.size,), unverified)})
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
                "moer/guided_rows": float(batch.source_rows("guided").sum()),
                "moer/unverified_traces": float(batch.extras["moer_unverified"][0]) if batch.size else 0.0}


EXPERT_PREFIX = Stage("source", expert_prefix, kernels=(guidance.worked_solution,),
                      params=("guided_per_group", "prefix_frac", "prefix_decay_steps", "train_prefix"),
                      writes=NATIVE_WRITES + ("extras.moer_prefix_frac", "extras.moer_unverified"))


UNIT_RATIO = Stage("correction", unit_ratio, kernels=(K.unit_ratio_denominator,), reads=("logp", "source"))


MOER_ROUND = Stage("round", moer_round, reads=("source", "extras.moer_prefix_frac", "extras.moer_unverified"))


register(policy_gradient_method(
    "luffy",
    Card(
        title="Learning to Reason under Off-Policy Guidance", arxiv="2504.14945", family="mixed-policy (demonstrations)",
        samples="mixture: G − k rollouts of the current weights (native) and k demonstrations written by the task's "
                "solver (source demonstration; μ = 1 for their tokens: a deterministic producer)",
        learns=_LEARNS, reference="none (no KL in the paper's setting; kl_coef adds one)",
        summary="demonstrations mixed into the group; GRPO advantages over the mixed group; on demonstration tokens "
                "the shaped weight π/(π+γ) replaces the ratio (no clip); native tokens keep the PPO clip",
        not_established="that shaping avoids rigid imitation at this scale; demonstrations here are solver answers, "
                        "not a stronger model's reasoning traces",
        unconfirmed=("the aggregation (token_mean over native and demonstration tokens: library decision)",
                     "demonstrations per group (1 here)"),
        confirmed="mixed-group advantage normalization over on- and off-policy rewards, the shaping f(π) = π/(π+γ) "
                  "with γ = 0.1, and the demonstration's behavior probability taken as 1 (exact for a "
                  "deterministic solver); gradient coefficient π·γ/(π+γ)² tested at π = 0.01, 0.1, 0.5, 0.9",
    ),
    source=DEMONSTRATIONS, round_=(SOURCE_METRICS,), advantage=adv.GRPO, objective=LUFFY,
    aggregation="token_mean",
    params=clip(0.2, 0.2, dual=False) + group_std() + (
        Param("luffy_gamma", float, 0.1, "γ of the policy shaping f(π) = π/(π+γ) on demonstration tokens",
              check=positive),
        Param("demos_per_group", int, 1, "demonstrations per prompt group (the other G − k rows are rollouts)"),
        Param("demonstration_style", str, "answer", "what a demonstration says: the answer alone (the ideal reply to "
              "'reply with only the number') or the worked solution", choices=DEMONSTRATION_STYLES)),
    kl=(0.0, "k3", "loss"), kl_placements=("loss",), min_group_size=2,
    checks=(fewer_than_group("demos_per_group", "luffy"),),
))


register(policy_gradient_method(
    "moer",
    Card(
        title="MOER: Mix-Policy Optimization under Expert Prefix Guidance with Selective Rollback", arxiv="",
        family="mixed-policy (expert prefixes)",
        samples="native: unguided rollouts; guided: an expert prefix (the task solver's worked solution) continued by "
                "the current weights; expert: the full worked solution when the guided continuation fails",
        learns=_LEARNS, reference="none",
        summary="shrinking expert prefixes, rollback to the full expert trace on a failed continuation; native rows "
                "take the PPO clip, guided and expert rows the unit ratio π_θ/sg(π_θ); A = r − mean_g r",
        not_established="that guided successes mean unguided reachability; expert traces here are solver-written "
                        "worked solutions",
        unconfirmed=("title and id (not found)", "whether the expert-prefix tokens of a guided trace are in the loss "
                     "(train_prefix, default false)", "the prefix schedule (linear decay of prefix_frac over "
                     "prefix_decay_steps: library decision)", "guided rows per group",
                     "a prompt whose expert trace fails the verifier: its k rows become plain rollouts (neither "
                     "prefix nor rollback; library decision)"),
        confirmed="unit ratio value 1 with gradient ∇lp (tested); a guided trace stays guided; rollback only on a "
                  "failed continuation and only to a verified expert trace: every trace is scored by the verifier "
                  "before use, refusals counted in moer/unverified_traces (tested; until issue 24 an unverified "
                  "trace could become an expert row); the schedule never lengthens (tested)",
    ),
    source=EXPERT_PREFIX, round_=(MOER_ROUND, SOURCE_METRICS), corrections=(UNIT_RATIO,),
    advantage=adv.DR_GRPO, objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.2) + (
        Param("guided_per_group", int, 1, "guided rows per prompt group (the other G − k rows are unguided)"),
        Param("prefix_frac", float, 0.5, "fraction of the expert trace given as prefix at step 0",
              check=lambda v: None if 0 <= v <= 1 else "must be in [0, 1]"),
        Param("prefix_decay_steps", int, 100, "steps over which the prefix fraction falls linearly to 0 (0: constant)",
              check=non_negative),
        Param("train_prefix", bool, False, "put the expert-prefix tokens of guided rows in the loss")),
    kl=(0.0, "k3", "loss"), kl_placements=("loss",), min_group_size=2,
    checks=(fewer_than_group("guided_per_group", "moer"),),
))
