"""Sources: where a method's sequences come from.

`ON_POLICY`: the learner's own rollout engine at the current weights, G samples per
prompt, behavior log-probs recorded as sampled (source "native"). `ON_POLICY_TOPK` also
records the behavior's top-K log-probs at every position (SIS needs its envelope).
"""

from __future__ import annotations

from policylab.methods.context import Sampled, StageContext
from policylab.methods.spec import Stage


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
