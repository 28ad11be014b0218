"""Reward stages of the calibration, execution and critic-derived methods (rlcr, mad_rl,
rlcpr, code_opt, rfpo) and rfpo's advantage stage.

Each stage reads the decoded replies (and, for rlcpr, a scoring forward of the policy;
for code_opt, the sandbox; for rfpo, the frozen critic in the method's state), calls the
kernels of `policylab.kernels.rewards` and writes the shaped reward apart from the raw outcome.
"""

from __future__ import annotations

import torch

from policylab.kernels import advantages as A
from policylab.errors import PolicylabError
from policylab.kernels.rewards import calibration as cal
from policylab.kernels.rewards import critic_reward as crit
from policylab.kernels.rewards import distribution as dist
from policylab.kernels.rewards import length_gate as lg
from policylab.kernels.rewards import runtime as rt
from policylab.methods.context import Sampled, StageContext
from policylab.methods.spec import Advantages, Stage
from policylab.methods.stages.advantages import token_rewards


def _verifier(ctx: StageContext, texts: list[str], answers: list[str], who: str) -> torch.Tensor:
    vals = ctx.task_reward(texts, answers)
    if any(v is None for v in vals):
        raise PolicylabError(f"{who}: the task verifier returned None: a verifier must score every reply")
    return torch.tensor([float(v) for v in vals], dtype=torch.float32)


# ----------------------------------------------------------------------------- rlcr
def rlcr_confidence(s: Sampled, ctx: StageContext):
    """Strict parse of each reply's confidence; correctness by the task verifier on the
    answer part (the text before the field, so the confidence is never read as the
    answer); R = c − (q − c)², or c − invalid_confidence_penalty when q did not parse."""
    parsed = [cal.parse_confidence(t) for t in s.texts]
    c = _verifier(ctx, [p.answer for p in parsed], [e.answer for e in s.examples], "rlcr")
    valid = torch.tensor([p.status == "ok" for p in parsed])
    q = torch.tensor([p.q if p.q is not None else 0.0 for p in parsed], dtype=torch.float32)
    r = cal.rlcr_rewards(c, q, valid, invalid_penalty=ctx.p.invalid_confidence_penalty)
    summary = cal.calibration_summary(c, q, valid)
    info = {f"calibration/{k}": v for k, v in summary.items()}
    for st in cal.CONFIDENCE_STATUSES[1:]:
        info[f"calibration/{st}_frac"] = sum(p.status == st for p in parsed) / len(parsed)
    return {"rewards": r, "outcome": {"correct": c.clone()},
            "extras": {"gold_correct": c, "confidence": q, "confidence_valid": valid}}, info


RLCR_CONFIDENCE = Stage("reward", rlcr_confidence, kernels=(cal.parse_confidence, cal.rlcr_rewards),
                        params=("invalid_confidence_penalty",),
                        writes=("rewards", "outcome.correct", "extras.gold_correct", "extras.confidence",
                                "extras.confidence_valid"))


# ----------------------------------------------------------------------------- mad_rl
def _classes(e) -> tuple[list[str], list[float]]:
    meta = getattr(e, "meta", {}) or {}
    if "classes" not in meta or "target" not in meta:
        raise PolicylabError("mad_rl needs examples whose meta holds `classes` (the named outcomes) and `target` "
                             "(p* over them plus the invalid class): use task.name=distribution or a task that "
                             "provides them")
    classes, target = list(meta["classes"]), [float(x) for x in meta["target"]]
    if len(target) != len(classes) + 1:
        raise PolicylabError(f"mad_rl: target has {len(target)} entries for {len(classes)} classes + invalid")
    return classes, target


def mad_match(s: Sampled, ctx: StageContext):
    """Map each reply to its class (the invalid class kept), then r = correct + λ·r^match
    with the group's detached frequencies against p* (`rewards.distribution`)."""
    s.batch.require("mad_rl", "outcome.correct")
    p = ctx.p
    correct = s.batch.outcome["correct"].float()
    B = s.batch.size
    class_ids = torch.empty(B, dtype=torch.long)
    rewards = torch.empty(B, dtype=torch.float32)
    match = torch.empty(B, dtype=torch.float32)
    tv, kl = [], []
    group = s.batch.group
    for g in torch.unique(group):
        rows = (group == g).nonzero().squeeze(-1)
        classes, target = _classes(s.examples[int(rows[0])])
        mapper = (getattr(s.examples[int(rows[0])], "meta", {}) or {}).get("mapper", "exact")
        ids = torch.tensor([dist.map_class(s.texts[int(i)], classes, mapper) for i in rows], dtype=torch.long)
        tgt = torch.tensor([target] * len(rows), dtype=torch.float64)
        r, info = dist.mad_rl_rewards(correct[rows].double(), ids, torch.zeros(len(rows), dtype=torch.long), tgt,
                                      coef=p.match_coef, smoothing=p.target_smoothing, form=p.match_form)
        class_ids[rows], rewards[rows], match[rows] = ids, r.float(), info["match"].float()
        tv.append(float(info["tv"][0]))
        kl.append(float(info["kl"][0]))
    invalid = torch.tensor([int(class_ids[i]) == len(_classes(s.examples[i])[0]) for i in range(B)])
    info = {"distribution/tv_mean": sum(tv) / len(tv), "distribution/kl_mean": sum(kl) / len(kl),
            "distribution/invalid_frac": float(invalid.float().mean()), "reward/match_mean": float(match.mean())}
    return {"rewards": rewards, "extras": {"class_id": class_ids, "match_reward": match}}, info


MAD_MATCH = Stage("reward", mad_match, kernels=(dist.map_class, dist.mad_rl_rewards, dist.group_frequencies),
                  params=("match_coef", "target_smoothing", "match_form"), reads=("outcome.correct", "group"),
                  writes=("rewards", "extras.class_id", "extras.match_reward"))


# ----------------------------------------------------------------------------- rlcpr
def rlcpr_posterior(s: Sampled, ctx: StageContext):
    """Answer posteriors from a scoring forward of the policy (the probability of the
    reference answer's tokens after `posterior_prefix`, appended to each reply without its
    EOS), then the gated relative length penalty (`rewards.length_gate`)."""
    s.batch.require("rlcpr", "rewards")
    p = ctx.p
    tok = ctx.tokenizer
    if tok is None:
        raise PolicylabError("rlcpr needs the tokenizer to encode the reference answer after each reply")
    prefix = tok.encode(p.posterior_prefix, add_special_tokens=False)
    conts, scored = [], []
    for e in s.examples:
        ans = tok.encode(" " + str(e.answer).strip(), add_special_tokens=False)
        conts.append(prefix + ans)
        scored.append(len(ans))
    lp = ctx.worker.continuation_logprobs(s.batch, conts, scored, strip_token=tok.eos_token_id)
    post = lg.answer_posteriors(lp.double(), torch.tensor(scored), form=p.posterior_form)
    shaped, gate, info = lg.rlcpr_shaping(s.batch.rewards, s.batch.response_lengths.to(s.batch.rewards.dtype),
                                          post.to(s.batch.rewards.dtype), s.batch.group,
                                          length_threshold=p.length_threshold, posterior_range=p.posterior_range,
                                          coef=p.length_coef, eps=p.length_eps)
    out = {"rlcpr/gated_groups_frac": info["gated_groups"] / info["groups"],
           "rlcpr/posterior_mean": float(post.mean()), "rlcpr/posterior_range_mean": info["posterior_range_mean"],
           "rlcpr/penalty_mean": info["penalty_mean"]}
    return {"rewards": shaped, "extras": {"answer_posterior": post.float(), "length_gate": gate}}, out


RLCPR_POSTERIOR = Stage("reward", rlcpr_posterior, needs=("worker.continuation_logprobs",), kernels=(lg.answer_posteriors, lg.rlcpr_shaping),
                        params=("posterior_prefix", "posterior_form", "length_threshold", "posterior_range",
                                "length_coef", "length_eps"),
                        reads=("rewards", "group"), writes=("rewards", "extras.answer_posterior", "extras.length_gate"))


# ----------------------------------------------------------------------------- code_opt
def code_runtime(s: Sampled, ctx: StageContext):
    """Run every reply in the sandbox: the tests, then (when they pass) timings against
    the reference solution in the same process; reward = the correctness-gated speed
    score (`rewards.runtime`), provenance "measured"."""
    p = ctx.p
    verifier = ctx.task_reward
    if not hasattr(verifier, "run_timed"):
        raise PolicylabError("code_opt needs the code task's sandboxed verifier: task.name=code, task.reward=code_tests")
    outs = verifier.run_timed(s.texts, [e.answer for e in s.examples], repeats=p.timing_repeats,
                              warmup=p.timing_warmup)
    rewards, scores = rt.code_opt_rewards(
        [o.correct for o in outs], [o.candidate_ns for o in outs], [o.reference_ns for o in outs],
        timed_out=[o.timed_out for o in outs], form=p.speed_form, alpha=p.band_alpha, min_rel_band=p.min_rel_band,
        n_min=p.timing_repeats, speedup_cap=p.speedup_cap, speed_weight=p.speed_weight,
        incorrect_reward=p.incorrect_reward, provenance="measured")
    correct = torch.tensor([float(o.correct) for o in outs])
    speed = torch.tensor([sc.speed if sc is not None else 0.0 for sc in scores], dtype=torch.float32)
    scored = torch.tensor([sc is not None for sc in scores])
    info = {"code/correct_frac": float(correct.mean()), "code/timed_frac": float(scored.float().mean()),
            "code/speed_mean": float(speed[scored].mean()) if bool(scored.any()) else 0.0,
            "code/timing_over_limit_frac": sum(o.timed_out for o in outs) / len(outs)}
    for st in ("ok", "timeout", "cpu_limit", "memory", "violation", "forked", "output_limit", "error"):
        info[f"code/status_{st}_frac"] = sum(o.status == st for o in outs) / len(outs)
    return {"rewards": rewards, "outcome": {"correct": correct.clone()},
            "extras": {"gold_correct": correct, "speed_score": speed, "speed_scored": scored}}, info


CODE_RUNTIME = Stage("reward", code_runtime, kernels=(rt.code_opt_rewards, rt.speed_score, rt.noise_band),
                     params=("timing_repeats", "timing_warmup", "speed_form", "band_alpha", "min_rel_band",
                             "speedup_cap", "speed_weight", "incorrect_reward"),
                     writes=("rewards", "outcome.correct", "extras.gold_correct", "extras.speed_score",
                             "extras.speed_scored"))


# ----------------------------------------------------------------------------- rfpo
def rfpo_critic(s: Sampled, ctx: StageContext):
    """The frozen critic's values of every prefix (the baseline) and of the whole reply
    (the reward after length debiasing and thresholding; truncated replies get the
    debiased value as a flagged forecast). The verifier is read only for `gold_correct`,
    an evaluator-side diagnostic that never reaches rewards or advantages."""
    b = s.batch
    critic = ctx.state["frozen_critic"]
    values, final = critic.values(b.tokens, b.attention_mask, b.loss_mask, b.prompt_width)
    if "truncated" not in b.extras:
        raise PolicylabError("rfpo needs extras['truncated'] from the rollout engine (which replies ended)")
    finished = ~b.extras["truncated"].bool()
    r, verdict, forecast = crit.rfpo_rewards(final, b.response_lengths, finished, bias=critic.length_bias,
                                             tau=ctx.p.tau)
    gold = _verifier(ctx, s.texts, [e.answer for e in s.examples], "rfpo")
    info = {"rfpo/critic_final_mean": float(final.mean()), "rfpo/verdict_frac": float(verdict.float().mean()),
            "rfpo/forecast_frac": float(forecast.float().mean()),
            "rfpo/verdict_gold_agreement": float((verdict.float() == gold).float().mean())}
    return {"rewards": r.float(), "outcome": {"correct": verdict.float()},
            "extras": {"gold_correct": gold, "critic_values": values.to(b.logp_behavior.dtype), "forecast": forecast}}, info


RFPO_CRITIC = Stage("reward", rfpo_critic, kernels=(crit.rfpo_rewards, crit.debias), params=("tau",),
                    writes=("rewards", "outcome.correct", "extras.gold_correct", "extras.critic_values",
                            "extras.forecast"))


def rfpo_gae(batch, ctx: StageContext) -> Advantages:
    """GAE over the token rewards (the critic-derived reward at the last counted token,
    minus a KL penalty when KL is in the reward) with the frozen critic's V_ψ(s_t) as the
    baseline; no returns (nothing trains the critic)."""
    if "critic_values" not in batch.extras:
        raise PolicylabError("rfpo advantages need extras['critic_values'] from the rfpo_critic reward stage")
    adv, _ = A.gae(token_rewards(batch, "rfpo"), batch.extras["critic_values"].to(batch.rewards.dtype),
                   batch.loss_mask, gamma=ctx.p.gamma, lam=ctx.p.lam)
    return Advantages(adv.detach())


RFPO_GAE = Stage("advantage", rfpo_gae, kernels=(A.gae,), params=("gamma", "lam"),
                 reads=("rewards", "extras.critic_values"))
