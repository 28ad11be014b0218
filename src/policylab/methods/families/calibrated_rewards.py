"""Rewards for calibrated outputs: RLCR (correctness plus a proper scoring rule on a
verbalized confidence), MaD-RL (a group rewarded for matching a target distribution over
output classes) and RLCPR (length shaping gated on how concentrated the model's own
answer posteriors are). Each is a reward stage over the kernels in
`policylab.kernels.rewards` that writes the shaped reward apart from the raw outcome.
"""

from __future__ import annotations

import torch

from policylab.errors import PolicylabError
from policylab.kernels.rewards import calibration as cal
from policylab.kernels.rewards import distribution as dist
from policylab.kernels.rewards import length_gate as lg
from policylab.kernels.rewards.distribution import MATCH_FORMS
from policylab.methods.context import Sampled, StageContext
from policylab.methods.params import ON_POLICY_ROLES as _ROLES
from policylab.methods.params import clip, group_std, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import (
    Card,
    Param,
    Stage,
    non_negative,
)
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses, rewards
from policylab.methods.stages.rewards import verifier_scores


# ----------------------------------------------------------------------------- rlcr
def rlcr_confidence(s: Sampled, ctx: StageContext):
    """Strict parse of each reply's confidence; correctness by the task verifier on the
    answer part (the text before the field, so the confidence is never read as the
    answer); R = c − (q − c)², or c − invalid_confidence_penalty when q did not parse."""
    parsed = [cal.parse_confidence(t) for t in s.texts]
    c = verifier_scores(ctx, [p.answer for p in parsed], [e.answer for e in s.examples], "rlcr")
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


# ----------------------------------------------------------------------------- registration

# the system prompt of rlcr's exercise run: the answer format shown once, with a made-up example
RLCR_SYSTEM_PROMPT = ("You answer in exactly two lines. Line 1: the number. Line 2: 'Confidence: ' and the "
                      "probability from 0 to 1 that the number is right. Example:\n12\nConfidence: 0.7")



register(policy_gradient_method(
    "rlcr",
    Card(
        title="Beyond Binary Rewards: Training LMs to Reason About Their Uncertainty", arxiv="2507.16806",
        family="reward (calibration)", **_ROLES, reference="none",
        summary="reward = correctness − Brier of the verbalized confidence, c − (q − c)²; strict confidence "
                "parse, an unparseable or out-of-range confidence takes an explicit penalty",
        not_established="that a 135M model learns calibrated confidences; verbalized confidence as the model's "
                        "belief; accuracy and calibration are logged apart (calibration/*), neither implies the other",
        unconfirmed=("the handling of a missing or malformed confidence (a penalty c − invalid_confidence_penalty: "
                     "library decision)", "the answer format (answer, then 'confidence: q'; the paper uses tags)",
                     "GRPO as the host estimator"),
        confirmed="the reward R = 1[y ≡ y*] − (q − 1[y ≡ y*])² of the paper (arXiv 2507.16806) and its "
                  "properness: the expected reward is maximal at q = p (tested on a grid); the logged "
                  "calibration/ece is the project's one ECE (kernels.metrics.ece, 10 equal-width bins, exact at "
                  "every edge 0.0, 0.1, ..., 1.0 whatever the confidence's dtype: tested; until issue 24 RLCR binned "
                  "its float32 confidences with floor(10·q), which put 0.7 and 0.9 one bin low)",
    ),
    rewards_=(RLCR_CONFIDENCE,),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("invalid_confidence_penalty", float, 1.0, "the Brier term of a reply whose confidence is missing, "
              "malformed, ambiguous or outside [0, 1]: R = c − penalty (1.0: the worst parsed confidence; "
              "never a clamp)", check=non_negative),),
    min_group_size=2,
    # the two-line format shown in a system prompt, sampled at T = 0.3: at T = 1 the 135M model never wrote the
    # field (16 of 16 replies without it, with or without the system prompt); at T = 0.3 most replies carry it
    exercise={"task": {"name": "confidence", "reward": "confidence_answer", "system_prompt": RLCR_SYSTEM_PROMPT},
              "rollout": {"max_new_tokens": 24, "temperature": 0.3}},
))

register(policy_gradient_method(
    "mad_rl",
    Card(
        title="MaD-RL: Matching Distributions for Calibrating LLMs with Reinforcement Learning", arxiv="",
        family="reward (calibration of output frequencies)", **_ROLES, reference="none",
        summary="r = correct + λ·log(p̃*(c_i)/f̂_g(c_i)): each reply paid for its class's share of the distance "
                "between the group's detached class frequencies (invalid replies kept) and the target",
        not_established="matching frequencies does not make a reply correct, nor the converse; the task's "
                        "correctness is validity (a named outcome): there is no single right draw",
        unconfirmed=("title, arXiv id", "the match term (log ratio or gap)", "smoothing ε", "λ (match_coef)"),
        confirmed="not checked against the paper (title and id unconfirmed); tested: invalid replies stay in "
                  "f̂'s denominator (dropping them changes f̂), f̂ has no gradient path, a zero target entry "
                  "without smoothing raises, unsampled classes get nothing",
    ),
    rewards_=(rewards.VERIFIER, MAD_MATCH),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("match_coef", float, 1.0, "λ: weight of the match reward next to correctness", check=non_negative),
        Param("target_smoothing", float, 0.01, "ε: p̃* = (1 − ε)p* + ε/K (0 refuses a target with a zero entry)",
              check=lambda v: None if 0 <= v < 1 else "must be in [0, 1)"),
        Param("match_form", str, "log_ratio", "log_ratio: log(p̃*(c_i)/f̂(c_i)) (a group sums to −G·KL(f̂‖p̃*)); "
              "gap: p̃*(c_i) − f̂(c_i)", choices=MATCH_FORMS)),
    min_group_size=2,
    # single_mention: the 135M model answers in sentences ("I'll draw a red marble."); with the exact mapper
    # every reply of a real run was invalid, all rewards equal, nothing to learn from
    exercise={"task": {"name": "distribution", "reward": "valid_outcome", "class_mapper": "single_mention"}},
))

register(policy_gradient_method(
    "rlcpr",
    Card(
        title="RLCPR: Rethinking Probability-Based Reinforcement Learning From Posterior Concentration", arxiv="",
        family="reward (shaping)", **_ROLES, reference="none",
        summary="relative length penalty only when every reply of the group is longer than L_thr and the model's "
                "own answer posteriors (a scoring forward: the probability of the reference answer after the "
                "reply) span less than τ",
        not_established="RL improvement from the shaping; the entropy-CDF stratified prompt mix is a kernel only "
                        "(the source samples prompts in stream order)",
        unconfirmed=("title, arXiv id", "the relative penalty form", "L_thr, τ_post, λ, eps defaults (set for "
                     "short-answer tasks here)", "how the posterior is read (the answer after posterior_prefix; "
                     "joint probability)"),
        confirmed="not checked against the paper (title and id unconfirmed); tested: both gates strict (minimum "
                  "length exactly L_thr, posterior range exactly τ_post: no penalty), one short reply disables the "
                  "group's penalty, the shortest reply is never penalized; the posteriors equal an unpadded "
                  "forward of the policy",
    ),
    rewards_=(rewards.VERIFIER, RLCPR_POSTERIOR),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std() + (
        Param("posterior_prefix", str, "\nFinal answer:", "text appended after each reply (its EOS removed) before "
              "the reference answer whose probability is scored"),
        Param("posterior_form", str, "joint", "joint: p = Π p(answer tokens); token_geomean: per-token geometric "
              "mean", choices=("joint", "token_geomean")),
        Param("length_threshold", float, 4.0, "L_thr: the gate needs every reply longer than this (strict), in "
              "tokens", check=non_negative),
        Param("posterior_range", float, 0.1, "τ_post: the gate needs max p − min p below this (strict)",
              check=non_negative),
        Param("length_coef", float, 0.2, "λ: the largest penalty (the longest reply of a gated group)",
              check=non_negative),
        Param("length_eps", float, 1e-6, "eps in the relative length's denominator", check=non_negative)),
    min_group_size=2,
))
