"""Worked examples: objectives over a group of sampled responses (conspo, zcpo, stare,
reco), each computed by the method's own kernels or its registered loss. ERPO, TLM-DRE
and RLID, which weight tokens, turns and episodes, are in `sequence_weighting`."""

from __future__ import annotations

import torch

from policylab.kernels import advantages as adv_mod
from policylab import methods
from policylab.methods.loss import policy_loss, tensor_inputs
from policylab.kernels.objectives import conspo as conspo_k
from policylab.kernels.objectives import reco as reco_k
from policylab.kernels.objectives import stare as stare_k
from policylab.kernels.objectives import zcpo as zcpo_k
from policylab.learn.examples.registry import example
from policylab.learn.examples.core_common import F64, all_valid, error_head, f64, num, nums, single_group


def _col(values) -> torch.Tensor:
    """[B, 1] float64: one token per response."""
    return f64([float(v) for v in values]).reshape(-1, 1)


# ============================================================================ conspo


def _conspo(scores, positive, tau, margin):
    lp = _col(scores).requires_grad_(True)
    loss, m = conspo_k.conspo(lp, all_valid(lp), single_group(len(scores)), torch.tensor([bool(p) for p in positive]),
                              tau=tau, margin=margin)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return loss, m, g


@example("conspo_infonce")
def conspo_infonce(scores, positive, tau, margin, extra_negative):
    loss, m, _ = _conspo(scores, positive, tau, margin)
    z = f64([float(s) for s in scores]) / tau
    soft = torch.softmax(z, 0)
    loss2, _, _ = _conspo(list(scores) + [extra_negative], list(positive) + [False], tau, margin)
    return {"scores": nums(f64(scores)), "tau": tau, "loss": num(loss.sum()), "softmax": nums(soft),
            "extra_negative": extra_negative, "loss_with_extra": num(loss2.sum())}


@example("conspo_gradients")
def conspo_gradients(scores, positive, tau):
    loss, m, g = _conspo(scores, positive, tau, 0.0)
    soft = torch.softmax(f64([float(s) for s in scores]) / tau, 0)
    neg = torch.tensor([not p for p in positive])
    p_idx = [i for i, p in enumerate(positive) if p][0]
    return {"scores": nums(f64(scores)), "tau": tau, "grad": nums(g.reshape(-1)),
            "negatives_softmax_over_tau": nums(soft[neg] / tau),
            "one_minus_softmax_p_over_tau": num((1 - soft[p_idx]) / tau)}


@example("conspo_vs_grpo")
def conspo_vs_grpo(scores, positive):
    """Gradient on each response's score: ConSPO's vs GRPO's advantages (what a sequence
    score gets under −A·s)."""
    _, _, g = _conspo(scores, positive, 1.0, 0.0)
    r = f64([float(p) for p in positive])
    a = adv_mod.grpo(r, single_group(len(scores)), std="population")
    return {"scores": nums(f64(scores)), "conspo_grad": nums(g.reshape(-1)), "grpo_grad": nums(-a)}


@example("conspo_schedule_and_edge_cases")
def conspo_schedule_and_edge_cases(margin_max, ramp_steps, steps, token_logp):
    margins = [conspo_k.margin_at(s, margin_max=margin_max, ramp_steps=ramp_steps) for s in steps]
    once = f64(token_logp).reshape(1, -1)
    twice = torch.cat([once, once], 1)
    s1 = conspo_k.conspo_scores(once, all_valid(once))
    s2 = conspo_k.conspo_scores(twice, all_valid(twice))
    loss, _, _ = _conspo([-0.5, -1.0, -2.0], [True, True, True], 1.0, 0.0)
    return {"steps": list(steps), "margins": nums(f64(margins)), "token_logp": nums(once.reshape(-1)),
            "score_once": num(s1[0]),
            "score_twice": num(s2[0]), "all_positive_loss": num(loss.sum()),
            "aggregation": methods.get("conspo").aggregation}


# ============================================================================ zcpo


def _drift(values) -> zcpo_k.FullVocabKL:
    return zcpo_k.FullVocabKL(_col(values), "example")


@example("zcpo_coefficients")
def zcpo_coefficients(rewards, drift, beta):
    r = f64([float(x) for x in rewards])
    c, _ = zcpo_k.zcpo_coefficients(r, single_group(len(rewards)), _drift(drift), all_valid(_col(drift)), beta=beta,
                                    std="population")
    return {"rewards": nums(r), "drift": nums(f64(drift)), "beta": beta, "coefficients": nums(c),
            "sum": num(c.sum()), "grpo": nums(adv_mod.grpo(r, single_group(len(rewards)), std="population",
                                                             eps=0.0))}


@example("zcpo_eligibility")
def zcpo_eligibility(rewards, drift, groups):
    r = f64([float(x) for x in rewards])
    c, info = zcpo_k.zcpo_coefficients(r, torch.tensor(groups), _drift(drift), all_valid(_col(drift)), beta=1.0,
                                       std="population")
    return {"rewards": nums(r), "groups": list(groups), "coefficients": nums(c),
            "eligible_frac": num(info["zcpo/eligible_group_frac"])}


@example("zcpo_vs_grpo")
def zcpo_vs_grpo(rewards, drift, beta, kl_coef):
    """Same group: GRPO's advantage (its KL sits in the loss, the same push on every
    response) vs ZCPO's coefficients (the drift re-ranks the responses within the group)."""
    r = f64([float(x) for x in rewards])
    g = single_group(len(rewards))
    c, _ = zcpo_k.zcpo_coefficients(r, g, _drift(drift), all_valid(_col(drift)), beta=beta, std="population")
    return {"rewards": nums(r), "drift": nums(f64(drift)), "grpo": nums(adv_mod.grpo(r, g, std="population",
                                                                                      eps=0.0)),
            "zcpo": nums(c), "beta": beta, "kl_coef": kl_coef}


@example("zcpo_full_vs_sampled")
def zcpo_full_vs_sampled(p, q, sampled):
    """The exact KL of two small distributions against the sampled-token log-ratios."""
    lp = torch.log(f64(p)).reshape(1, 1, -1)
    lq = torch.log(f64(q)).reshape(1, 1, -1)
    exact = zcpo_k.full_vocab_kl(lp, lq, torch.ones(1, 1, dtype=torch.bool)).values
    ratios = [float(lp[0, 0, v] - lq[0, 0, v]) for v in sampled]
    refused = error_head(lambda: zcpo_k.zcpo_coefficients(f64([1.0]), single_group(1), f64([[ratios[0]]]),
                                                    torch.ones(1, 1, dtype=torch.bool), beta=1.0, std="population"))
    return {"p": nums(f64(p)), "q": nums(f64(q)), "exact_kl": num(exact[0, 0]), "sampled": list(sampled),
            "sampled_log_ratios": nums(f64(ratios)), "refusal": refused}


# ============================================================================ stare


def _quadrant_case(entropy, target, amplify, attenuate, gate="below", direction="advantage"):
    """(A>0, rare), (A>0, common), (A<0, rare), (A<0, common), every token critical."""
    adv = f64([[1.0, 1.0], [-1.0, -1.0]])
    lp = f64([[-2.0, -0.5], [-2.0, -0.5]])
    return stare_k.stare_reweight(adv, lp, all_valid(lp), entropy=entropy, target=target, quantile=0.0, gate=gate,
                                  amplify=amplify, attenuate=attenuate, direction=direction)


@example("stare_quadrants")
def stare_quadrants(entropy, target_low, target_high, amplify, attenuate):
    o1, _ = _quadrant_case(entropy, target_high, amplify, 1.0)  # H < H*: the gate is on
    c2, _ = _quadrant_case(entropy, target_high, amplify, attenuate)
    above, _ = _quadrant_case(entropy, target_low, amplify, attenuate)  # H > H*: off
    first, _ = _quadrant_case(entropy, target_high, amplify, attenuate, direction="first_order")
    return {"entropy": entropy, "target_high": target_high, "target_low": target_low, "amplify": amplify,
            "attenuate": attenuate, "one_sided": nums(o1.reshape(-1)), "two_sided": nums(c2.reshape(-1)),
            "above_target": nums(above.reshape(-1)), "first_order": nums(first.reshape(-1))}


@example("stare_per_sign")
def stare_per_sign(adv, logp, mask, q):
    a, lp, m = f64([float(x) for x in adv]), f64(logp), torch.tensor(mask)
    A = a.unsqueeze(-1).expand_as(lp)
    crit, info = stare_k.critical_tokens(A, lp, m, q, "per_sign")
    padded = torch.where(m, lp, torch.tensor(-30.0, dtype=F64))
    _, info_pad = stare_k.critical_tokens(A, padded, m, q, "per_sign")
    return {"adv": nums(a), "surprisals": nums(-lp[m]), "q": q, "threshold_pos": info["stare/threshold_pos"],
            "threshold_neg": info["stare/threshold_neg"], "critical": str(crit[m].tolist()).lower(),
            "threshold_pos_with_padding": info_pad["stare/threshold_pos"]}


@example("stare_vs_grpo")
def stare_vs_grpo(rewards, token_logp, entropy, target, q):
    r = f64([float(x) for x in rewards])
    a = adv_mod.grpo(r, single_group(len(rewards)), std="unbiased")
    lp = f64(token_logp)
    m = all_valid(lp)
    kw = dict(quantile=q, amplify=1.1, attenuate=1.0)
    above, _ = stare_k.stare_reweight(a, lp, m, entropy=entropy, target=entropy / 2, **kw)
    below, info = stare_k.stare_reweight(a, lp, m, entropy=entropy, target=target, **kw)
    return {"grpo": nums(a), "above_target": nums(above.reshape(-1)), "below_target": nums(below.reshape(-1)),
            "entropy": entropy, "target": target, "q": q}


@example("stare_sign_kept")
def stare_sign_kept(amplify, attenuate):
    out, _ = _quadrant_case(1.0, 2.0, amplify, attenuate, gate="sign", direction="first_order")
    flipped, _ = _quadrant_case(1.0, 0.2, amplify, attenuate, gate="sign", direction="first_order")
    a = f64([[1.0, 1.0], [-1.0, -1.0]])
    return {"amplify": amplify, "attenuate": attenuate, "reweighted": nums(out.reshape(-1)),
            "reweighted_flipped": nums(flipped.reshape(-1)),
            "signs_kept": bool(((out * a) >= 0).all() and ((flipped * a) >= 0).all())}


# ============================================================================ reco


@example("reco_expected_counts")
def reco_expected_counts(probs, group_size):
    lp_old = torch.log(_col(probs))
    w, _ = reco_k.reco_weights(lp_old, lp_old, all_valid(lp_old), group_size=group_size, eps_v=1e-3, g_min=0.1,
                               g_max=4.0)
    n = reco_k.expected_counts(lp_old, all_valid(lp_old), group_size).exp()
    return {"probs": nums(f64(probs)), "group_size": group_size, "expected_counts": nums(n),
            "weights": nums(w.reshape(-1))}


@example("reco_variance_ratio")
def reco_variance_ratio(p_old, p):
    lp_old, lp = torch.log(_col([p_old])), torch.log(_col([p]))
    w, _ = reco_k.reco_weights(lp, lp_old, all_valid(lp), group_size=1, eps_v=1e-3, g_min=0.1, g_max=4.0)
    same, _ = reco_k.reco_weights(lp, lp, all_valid(lp), group_size=1, eps_v=1e-3, g_min=0.1, g_max=4.0)
    return {"p_old": p_old, "p": p, "ratio": num(w[0, 0]), "current_on_both_sides": num(same[0, 0])}


@example("reco_vs_grpo")
def reco_vs_grpo(p_old, p, adv, group_size):
    lp_old = torch.log(f64([p_old])).reshape(1, -1)
    lp = torch.log(f64([p])).reshape(1, -1).requires_grad_(True)
    a, m = f64([adv]), all_valid(lp_old)
    out = {}
    for name, params in (("reco", {"reco_group_size": group_size}), ("grpo", {"kl_coef": 0.0})):
        loss, _ = policy_loss(methods.get(name).with_params(params), tensor_inputs(lp, a, m, logp_old=lp_old))
        (g,) = torch.autograd.grad(loss.sum(), lp)
        out[name] = nums(g.reshape(-1))
    w, _ = reco_k.reco_weights(lp, lp_old, m, group_size=group_size, eps_v=1e-3, g_min=0.1, g_max=4.0)
    return {"p_old": list(map(float, p_old)), "p": list(map(float, p)), "reco_grad": out["reco"],
            "grpo_grad": out["grpo"], "weights": nums(w.reshape(-1))}


@example("reco_floor")
def reco_floor(p_old, p, eps_v, g_max):
    lp_old, lp = torch.log(_col([p_old])), torch.log(_col([p]))
    raw = p * (1 - p) / max(p_old * (1 - p_old), eps_v)
    w, m = reco_k.reco_weights(lp, lp_old, all_valid(lp), group_size=1, eps_v=eps_v, g_min=0.1, g_max=g_max)
    return {"p_old": p_old, "p": p, "eps_v": eps_v, "g_max": g_max, "unbounded_ratio": num(raw),
            "weight": num(w[0, 0]), "finite": bool(torch.isfinite(w).all())}
