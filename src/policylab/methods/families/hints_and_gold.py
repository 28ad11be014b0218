"""Learning with privileged information from the task: Off-Context GRPO (sampled on
prompt ⊕ hint, trained on the prompt alone, the hinted policy as the denominator) and
GRIN (gold answers replace failed samples of all-fail groups, under a mixture
denominator). Every row keeps its `source` and `producer` (`policylab.batch`); hints and
gold come from `policylab.tasks.guidance`, train split only; kernels in
`policylab.kernels.mixed`.
"""

from __future__ import annotations

import math

import torch

from policylab.batch import LEARNER, RolloutBatch
from policylab.errors import PolicylabError
from policylab.kernels import mixed as K
from policylab.methods.context import Sampled, StageContext
from policylab.methods.params import DEPLOYMENT_LEARNER as _LEARNS
from policylab.methods.params import (
    clip,
    group_std,
    policy_gradient_method,
)
from policylab.methods.peers import SuccessEma
from policylab.methods.registry import register
from policylab.methods.rows import (
    assemble,
    real_prompts,
    response_ids,
    with_prompts,
)
from policylab.methods.spec import (
    Card,
    LossInputs,
    Param,
    Stage,
    StateSpec,
    Weighting,
    unit_interval,
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
from policylab.tasks.guidance import HINT_KINDS


def with_hint(prompt: str, hint_text: str) -> str:
    """The privileged context x ⊕ h: the hint on its own line after the prompt."""
    return f"{prompt}\n{hint_text}" if hint_text else prompt


def hinted(n_prompts: int, ctx: StageContext) -> Sampled:
    """Sample G responses per prompt on x ⊕ h (the hint from the train split), then rebuild
    every row on x alone: the learner's numerator is computed without the hint, while
    `logp_behavior` stays what the hinted sampler produced. Rows of an empty hint are
    native (sampled from the deployment context itself)."""
    G = ctx.run.group_size
    examples, prompts, groups = draw_prompts(n_prompts, ctx)
    hints = [guidance.hint(e, ctx.p.hint_kind) for e in examples]
    behavior_prompts = [ctx.encode(with_hint(e.prompt, h)) if h else prompts[i]
                        for i, (e, h) in enumerate(zip(examples, hints))]
    hint_ids = [ctx.tokenizer(h, add_special_tokens=False)["input_ids"] if h else [] for h in hints]
    K.check_context_separation(prompts, behavior_prompts, hint_ids, [bool(h) for h in hints])
    b = generate_groups(ctx, behavior_prompts, groups, G)
    texts = ctx.rollout.decode(b)
    rows = repeat_each(list(range(n_prompts)), G)
    learner = with_prompts(b, [prompts[i] for i in rows], pad_id=pad_id(ctx),
                           source=["hinted" if hints[i] else "native" for i in rows], producer=[LEARNER] * b.size)
    extras = {**learner.extras,
              "behavior_prompt_hash": torch.tensor([K.fingerprint(behavior_prompts[i]) for i in rows]),
              "hint_hash": torch.tensor([K.fingerprint(hint_ids[i]) for i in rows]),
              "hint_len": torch.tensor([len(hint_ids[i]) for i in rows])}
    return Sampled(learner.replace(extras=extras), texts, repeat_each(examples, G), prompts, list(examples))


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
               writes=NATIVE_WRITES + ("extras.behavior_prompt_hash", "extras.hint_hash", "extras.hint_len"))


CONTEXT_CHECK = Stage("round", context_check, kernels=(K.check_context_fingerprints,),
                      reads=("tokens", "source", "extras.behavior_prompt_hash"))


HINTED_DENOMINATOR = Stage("correction", hinted_denominator, kernels=(K.behavior_denominator,),
                           reads=("logp_old", "logp_behavior", "source"))


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
    examples, prompts, groups = draw_prompts(n_prompts, ctx)
    nat = generate_groups(ctx, prompts, groups, G)
    texts = ctx.rollout.decode(nat)
    rows_ex = repeat_each(examples, G)
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
        gb = solver_rows(ctx, ex_i, [prompts[i] for i in inject], [groups[i] for i in inject], gtexts, "gold", n_gold)
        parts.append((gb, repeat_each(gtexts, n_gold), repeat_each(ex_i, n_gold)))
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
                       writes=NATIVE_WRITES + ("extras.grin_alpha", "extras.grin_gold_match", "extras.grin_unverified"))


MIXTURE_DENOMINATOR = Stage("correction", mixture_denominator, kernels=(K.grin_mixture_logp,),
                            reads=("logp_old", "extras.grin_alpha", "extras.grin_gold_match"))


GRIN_ROUND = Stage("round", grin_round, reads=("source", "extras.grin_alpha"))


register(policy_gradient_method(
    "off_context_grpo",
    Card(
        title="Off-Context GRPO: Learning to Reason on Hard Problems using Privileged Information", arxiv="",
        family="mixed-policy (hinted context)",
        samples="μ = the current weights conditioned on prompt ⊕ hint (the hint from the task's solver, train split "
                "only); rows of an empty hint are native",
        learns=_LEARNS + "; the numerator π_θ(y|x) never sees the hint",
        reference="π_ref on the prompt alone (k3 KL in the loss, as GRPO; kl_coef=0 drops it); evaluation has no hint",
        summary="sample with a privileged hint, learn without it: ratio π_θ(y|x)/μ(y|x⊕h) with GRPO advantages and "
                "the PPO clip; an empty hint is GRPO exactly",
        not_established="that the hinted successes transfer to unhinted prompts; behavior of the clip under the large "
                        "initial mismatch between hinted and unhinted contexts",
        unconfirmed=("title and arXiv id (not found)", "clip range under a large initial mismatch (eps_low/eps_high, "
                     "GRPO's 0.2 by default)", "hint content and placement (a line after the prompt: library decision)"),
        confirmed="the denominator comes from the hinted sampler and the numerator from the unhinted prompt (a batch "
                  "where both sides saw the same context is refused, tested); hint_kind 'none' reproduces GRPO's "
                  "update exactly (tested)",
    ),
    source=HINTED, round_=(CONTEXT_CHECK, SOURCE_METRICS), corrections=(HINTED_DENOMINATOR,),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("hint_kind", str, "worked", "the privileged hint: 'worked' (the worked solution's steps without its "
              "result), 'answer' (the answer itself) or 'none' (no hint: GRPO)", choices=HINT_KINDS),),
    kl=(0.04, "k3", "loss"), min_group_size=2,
))


register(policy_gradient_method(
    "grin",
    Card(
        title="From Memorization to Absorption: Mixed-Policy RL for Continual Knowledge Injection", arxiv="",
        family="mixed-policy (gold injection)",
        samples="native rollouts of the current weights; in a group where all of them fail, verified gold answers of "
                "the task's solver replace the last n samples (source gold; μ = 1 on their tokens)",
        learns=_LEARNS, reference="none by default (kl_coef > 0: π_ref as a KL anchor only, never the IS denominator)",
        summary="gold injected only into all-fail groups; ratio π_θ/q_mix with q_mix = (1 − α)·π_old + α·q_gold, α the "
                "group's real mixture weight; the injection rate decays as native success rises",
        not_established="knowledge absorption (arithmetic answers are not a knowledge-injection corpus); that the "
                        "per-token mixture with a fixed α is the paper's exact estimator",
        unconfirmed=("title and id (not found)", "the token-level mixture form and q_gold on native tokens (1 while they "
                     "follow the gold text)", "the schedule α·(1 − EMA of native success) and its decay",
                     "injection replaces failed samples (library decision: group size stays G)"),
        confirmed="no injection into a group with any native success; the denominator is the mixture, not π_ref "
                  "(tested); grin_alpha = 0 reproduces GRPO's update exactly (tested)",
    ),
    source=GOLD_INJECTION, round_=(GRIN_ROUND, SOURCE_METRICS), corrections=(MIXTURE_DENOMINATOR,),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("grin_alpha", float, 0.25, "target injection rate α: an all-fail group gets round(α_eff·G) gold rows "
              "(at most G − 1)", check=unit_interval),
        Param("grin_schedule", str, "success_decay", "α_eff = α (constant) or α·(1 − EMA of the native success rate)",
              choices=("constant", "success_decay")),
        Param("grin_ema_decay", float, 0.9, "decay d of the native-success EMA, m <- d·m + (1 − d)·rate",
              check=unit_interval)),
    state=(StateSpec("grin_success", lambda p, seed: SuccessEma(p.grin_ema_decay), params=("grin_ema_decay",),
                     doc="EMA of the native success rate (the injection schedule)"),),
    kl=(0.0, "k3", "loss"), min_group_size=2,
))
