"""Sources: where a method's sequences come from.

`ON_POLICY`: the learner's own rollout engine at the current weights, G samples per
prompt, behavior log-probs recorded as sampled (source "native"). `ON_POLICY_TOPK` also
records the behavior's top-K log-probs at every position (SIS needs its envelope).
"""

from __future__ import annotations

from policylab.batch import RolloutBatch
from policylab.methods.context import Sampled, StageContext
from policylab.methods.rows import build_rows, response_ids
from policylab.methods.spec import Stage
from policylab.tasks import guidance


def _generate(n_prompts: int, ctx: StageContext, record_topk: int) -> Sampled:
    examples = ctx.next_train(n_prompts)
    prompt_ids = [ctx.encode(e.prompt) for e in examples]
    G = ctx.run.group_size
    batch = ctx.rollout.generate(
        prompt_ids, group_size=G, sampling=ctx.sampling, max_new_tokens=ctx.run.max_new_tokens,
        policy_version=ctx.policy_version, batch_id=ctx.batch_tag, group_ids=ctx.new_groups(n_prompts),
        record_topk=record_topk,
    )
    texts = ctx.rollout.decode(batch)
    return Sampled(batch, texts, [e for e in examples for _ in range(G)], prompt_ids, list(examples))


def on_policy(n_prompts: int, ctx: StageContext) -> Sampled:
    """n_prompts x G samples from the rollout engine at the current weights."""
    return _generate(n_prompts, ctx, 0)


def on_policy_topk(n_prompts: int, ctx: StageContext) -> Sampled:
    """As `on_policy`, recording the behavior's top-`sis_topk` log-probs per position
    (extras `behavior_topk_ids`, `behavior_topk_logp`, [B, T, K])."""
    return _generate(n_prompts, ctx, int(ctx.p.sis_topk))


SOURCE_WRITES = ("tokens", "loss_mask", "logp_behavior", "group", "policy_version", "source")
ON_POLICY = Stage("source", on_policy, writes=SOURCE_WRITES)
ON_POLICY_TOPK = Stage("source", on_policy_topk, params=("sis_topk",),
                       writes=SOURCE_WRITES + ("extras.behavior_topk_ids", "extras.behavior_topk_logp"))


# the fields a source that builds native and other rows writes
NATIVE_WRITES = ("tokens", "loss_mask", "logp_behavior", "behavior_mask", "group", "policy_version", "source",
                  "producer")


def draw_prompts(n: int, ctx: StageContext):
    """n training examples, their prompts through the chat template, and n fresh group ids."""
    examples = ctx.next_train(n)
    return examples, [ctx.encode(e.prompt) for e in examples], ctx.new_groups(n)


def generate_groups(ctx: StageContext, prompts: list[list[int]], groups: list[int], per_prompt: int) -> RolloutBatch:
    """`per_prompt` native samples of each prompt from the rollout backend at the current weights."""
    return ctx.rollout.generate(prompts, group_size=per_prompt, sampling=ctx.sampling,
                                max_new_tokens=ctx.run.max_new_tokens, policy_version=ctx.policy_version,
                                batch_id=ctx.batch_tag, group_ids=groups)


def pad_id(ctx: StageContext) -> int:
    """The tokenizer's pad id (rows built outside an engine are padded with it)."""
    return int(ctx.tokenizer.pad_token_id)


def repeat_each(xs: list, k: int) -> list:
    """[a, b] -> [a, a, b, b] for k = 2."""
    return [x for x in xs for _ in range(k)]


def solver_rows(ctx: StageContext, examples, prompts, groups, texts, source: str, k: int) -> RolloutBatch:
    """k rows per prompt of solver-written text (a deterministic producer: μ = 1)."""
    ids = [response_ids(ctx.tokenizer, t) for t in texts]
    return build_rows(repeat_each(prompts, k), repeat_each(ids, k), group=repeat_each(groups, k), source=[source] * (k * len(prompts)),
                      producer=repeat_each([guidance.solver_id(e) for e in examples], k), policy_version=ctx.policy_version,
                      batch_id=ctx.batch_tag, sampling=ctx.sampling, engine="solver", pad_id=pad_id(ctx),
                      prompt_index=repeat_each(list(range(len(prompts))), k))
