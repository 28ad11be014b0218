"""Worked examples: rewards that read a confidence (rlcr), class frequencies (mad_rl), the
model's answer posterior (rlcpr), runtimes (code_opt) and a frozen critic (rfpo). Every
number comes from the kernels in `policylab.kernels.rewards` (and `advantages` for the GRPO and
GAE comparisons); runtimes here are hand-given and tagged "synthetic"."""

from __future__ import annotations

import torch

from policylab.kernels import advantages as adv_mod
from policylab.kernels.rewards import calibration as cal
from policylab.kernels.rewards import critic_reward as crit
from policylab.kernels.rewards import distribution as dist
from policylab.kernels.rewards import length_gate as lg
from policylab.kernels.rewards import runtime as rt
from policylab.learn.examples.registry import example
from types import SimpleNamespace

from policylab import methods
from policylab.kernels.rewards.verifiers import exact_numeric_reward
from policylab.methods.context import Sampled
from policylab.learn.examples.core_common import F64, method_advantages, num, nums, f64
from policylab.learn.figures.common import bare_batch, reward_stage, stage_context, stage_named


def _zeros(n):
    return torch.zeros(n, dtype=torch.long)


# ----------------------------------------------------------------------------- rlcr
@example("rlcr_rewards")
def rlcr_rewards(correct, confidence, gold=12, wrong=7):
    """RLCR's own reward stage on replies "The answer is <a>. confidence: <q>" (its
    parameters, its parser, the exact-numeric verifier), then GRPO's and RLCR's own
    advantage stages (their registered std convention and eps) on the 0/1 outcome and on
    the RLCR rewards."""
    c, q = f64(correct), f64(confidence)
    texts = [f"The answer is {gold if ok else wrong}. confidence: {conf}" for ok, conf in zip(correct, confidence)]
    r = f64(reward_stage(methods.get("rlcr"), "rlcr_confidence", texts, [str(gold)] * len(texts),
                         task_reward=exact_numeric_reward)["rewards"])
    return {"correct": nums(c), "confidence": nums(q), "rewards": nums(r),
            "std": methods.get("grpo").p["std"],
            "binary_advantages": method_advantages("grpo", nums(c)),
            "rlcr_advantages": method_advantages("rlcr", nums(r))}


@example("rlcr_expected")
def rlcr_expected(p, grid):
    qs = f64(grid)
    e = cal.expected_reward(p, qs)
    return {"p": num(p), "grid": nums(qs), "expected": nums(e), "best_q": num(qs[int(torch.argmax(e))])}


@example("rlcr_parse")
def rlcr_parse(replies, answer):
    parsed = [cal.parse_confidence(r) for r in replies]
    c = f64(cal.confidence_answer_reward(list(replies), [answer] * len(replies)))
    valid = torch.tensor([p.status == "ok" for p in parsed])
    q = f64([p.q if p.q is not None else 0.0 for p in parsed])
    r = cal.rlcr_rewards(c, q, valid, invalid_penalty=1.0)
    return {"replies": " | ".join(repr(x) for x in replies), "statuses": ", ".join(p.status for p in parsed),
            "correct": nums(c), "rewards": nums(r)}


@example("rlcr_brier_multiclass")
def rlcr_brier_multiclass(probs, target):
    p = f64([probs]).requires_grad_(True)
    b = cal.brier_score(p, torch.tensor([target]))
    b.sum().backward()
    return {"probs": nums(probs), "target": int(target), "brier": num(b[0]), "grad": nums(p.grad[0])}


# ----------------------------------------------------------------------------- mad_rl
def _mad_stage(classes, replies, target):
    """MaD-RL's own reward stage (`mad_match`, its registered λ, smoothing and form) on one
    group: (class ids, rewards, the stage's extras)."""
    n = len(replies)
    cls = list(classes)
    correct = [1.0 if dist.map_class(r, cls) < len(cls) else 0.0 for r in replies]
    method = methods.get("mad_rl")
    batch = bare_batch(n, 1, rewards=correct).replace(outcome={"correct": torch.tensor(correct, dtype=F64)})
    examples = [SimpleNamespace(answer="", prompt="", meta={"classes": cls, "target": list(target)})] * n
    stage = stage_named(method, "reward", "mad_match")
    changes, _ = stage.fn(Sampled(batch, list(replies), examples, [], []), stage_context(method, stage))
    return changes["extras"]["class_id"], changes["rewards"].to(F64), correct


@example("mad_group")
def mad_group(classes, replies, target):
    """MaD-RL's reward stage on one group, and the same quantities from the kernels with the
    method's registered λ (match_coef), smoothing and form, which must agree."""
    p = methods.get("mad_rl").p
    ids, r_stage, correct = _mad_stage(classes, replies, target)
    n = len(replies)
    r, info = dist.mad_rl_rewards(f64(correct), ids, _zeros(n), f64([list(target)] * n), coef=p["match_coef"],
                                  smoothing=p["target_smoothing"], form=p["match_form"])
    if not torch.allclose(r, r_stage):
        raise ValueError(f"mad_rl's reward stage {nums(r_stage)} and its kernel {nums(r)} disagree")
    names = list(classes) + ["invalid"]
    return {"replies": ", ".join(replies), "classes": ", ".join(names[int(i)] for i in ids),
            "smoothing": num(p["target_smoothing"]), "coef": num(p["match_coef"]),
            "freq": nums(info["freq"][0]), "smoothed_target": nums(info["target"][0]),
            "match": nums(info["match"]), "rewards": nums(r_stage), "kl": num(info["kl"][0]),
            "tv": num(info["tv"][0]), "sum_match": num(info["match"].sum()), "minus_G_kl": num(-n * info["kl"][0])}


@example("mad_invalid_denominator")
def mad_invalid_denominator(class_ids, n_classes):
    ids = torch.tensor(class_ids)
    kept = dist.group_frequencies(ids, _zeros(len(class_ids)), n_classes)[0]
    valid = ids[ids < n_classes - 1]
    dropped = dist.group_frequencies(valid, _zeros(len(valid)), n_classes)[0]
    try:
        dist.smooth_target(f64([0.5, 0.5, 0.0]), 0.0)
        err = "no error"
    except ValueError as exc:
        err = str(exc).split(":")[0]
    return {"class_ids": list(class_ids), "with_invalid": nums(kept), "without_invalid": nums(dropped),
            "zero_target_error": err}


@example("mad_vs_grpo")
def mad_vs_grpo(classes, replies, target):
    """GRPO's own advantage stage on the 0/1 outcome vs MaD-RL's (reward stage, then its
    advantage stage), both with their registered parameters."""
    ids, r, correct = _mad_stage(classes, replies, target)
    n = len(replies)
    freq = dist.group_frequencies(ids, _zeros(n), len(classes) + 1)[0]
    return {"replies": ", ".join(replies), "grpo_advantages": method_advantages("grpo", correct),
            "mad_advantages": method_advantages("mad_rl", nums(r)), "freq": nums(freq)}


# ----------------------------------------------------------------------------- rlcpr
@example("rlcpr_gate")
def rlcpr_gate(lengths, posteriors, rewards, length_threshold, posterior_range, coef):
    shaped, gate, info = lg.rlcpr_shaping(f64(rewards), f64(lengths), f64(posteriors), _zeros(len(lengths)),
                                          length_threshold=length_threshold, posterior_range=posterior_range,
                                          coef=coef, eps=1e-6)
    return {"lengths": [int(x) for x in lengths], "posteriors": nums(posteriors), "rewards": nums(rewards),
            "shaped": nums(shaped), "gated": bool(gate.all()), "posterior_spread": num(max(posteriors) - min(posteriors)),
            "min_length": int(min(lengths)), "L_thr": num(length_threshold), "tau": num(posterior_range)}


@example("rlcpr_entropy_cdf")
def rlcpr_entropy_cdf(entropies):
    return {"entropies": nums(entropies), "cdf": nums(lg.entropy_cdf(f64(entropies)))}


@example("rlcpr_posterior")
def rlcpr_posterior(answer_logprobs, n_tokens):
    lp = f64(answer_logprobs)
    n = torch.tensor(n_tokens)
    return {"answer_logprobs": nums(lp), "joint": nums(lg.answer_posteriors(lp, n, form="joint")),
            "geomean": nums(lg.answer_posteriors(lp, n, form="token_geomean"))}


# ----------------------------------------------------------------------------- code_opt
_SPEED = dict(alpha=0.1, min_rel_band=0.05, speedup_cap=4.0, provenance="synthetic")


@example("code_opt_scores")
def code_opt_scores(correct, candidates, reference, speed_weight):
    n_min = min(len(reference), *[len(c) for c in candidates])
    r, scores = rt.code_opt_rewards(list(correct), [list(c) for c in candidates], [list(reference)] * len(correct),
                                    timed_out=[False] * len(correct), form="percentile", n_min=n_min,
                                    speed_weight=speed_weight, incorrect_reward=0.0, **_SPEED)
    lo, hi = rt.noise_band(reference, alpha=0.1, min_rel_band=0.05, n_min=n_min)
    return {"correct": [bool(c) for c in correct], "medians": [num(rt.runtime_statistic(c, n_min=n_min)) for c in candidates],
            "band_low": num(lo), "band_high": num(hi), "ref_median": num(rt.runtime_statistic(reference, n_min=n_min)),
            "speed": [num(s.speed) if s is not None else "none" for s in scores], "rewards": nums(r),
            "provenance": next((s.provenance for s in scores if s is not None), "synthetic")}


@example("code_opt_single_timing")
def code_opt_single_timing(timings, n_min):
    try:
        rt.runtime_statistic(timings, n_min=n_min)
        err = "no error"
    except rt.TimingError as exc:
        err = str(exc)
    return {"timings": nums(timings), "error": err}


# ----------------------------------------------------------------------------- rfpo
@example("rfpo_rewards")
def rfpo_rewards(values, lengths, finished, bias, tau):
    r, verdict, forecast = crit.rfpo_rewards(f64(values), torch.tensor(lengths), torch.tensor(finished),
                                             bias=tuple(bias), tau=tau)
    deb = crit.debias(f64(values), torch.tensor(lengths), tuple(bias))
    return {"values": nums(values), "lengths": [int(x) for x in lengths], "debiased": nums(deb),
            "rewards": nums(r), "verdict": [bool(v) for v in verdict], "forecast": [bool(f) for f in forecast],
            "tau": num(tau)}


@example("rfpo_length_bias")
def rfpo_length_bias(lengths, labels, slope):
    L, y = f64(lengths), f64(labels)
    values = 0.3 + slope * L
    a, beta = crit.fit_length_bias(values, y, L)
    deb = crit.debias(values, L, (a, beta))
    return {"values": nums(values), "fitted_slope": num(beta), "fitted_intercept": num(a), "debiased": nums(deb)}


@example("rfpo_gae_baseline")
def rfpo_gae_baseline(values, reward, gamma, lam):
    v = f64([values])
    T = len(values)
    tr = torch.zeros(1, T, dtype=F64)
    tr[0, -1] = reward
    adv, _ = adv_mod.gae(tr, v, torch.ones(1, T, dtype=torch.bool), gamma=gamma, lam=lam)
    return {"values": nums(values), "reward": num(reward), "advantages": nums(adv[0])}
