"""Worked examples: sequence, token and turn objectives (conspo, zcpo, stare, reco, erpo,
tlm_dre, rlid), each computed by the method's own kernels or its registered loss."""

from __future__ import annotations

import torch

from policylab.kernels import advantages as adv_mod
from policylab.kernels import aggregate as agg_mod
from policylab import methods
from policylab.errors import PolicylabError
from policylab.models.logprobs import token_logprobs
from policylab.methods.loss import policy_loss, tensor_inputs
from policylab.kernels.objectives import conspo as conspo_k
from policylab.kernels.objectives import erpo as erpo_k
from policylab.kernels.objectives import reco as reco_k
from policylab.kernels.objectives import rlid as rlid_k
from policylab.kernels.objectives import stare as stare_k
from policylab.kernels.objectives import tlm_dre as tlm_k
from policylab.kernels.objectives import zcpo as zcpo_k
from policylab.learn.examples import example
from policylab.learn.examples.core_common import F64, _num, _nums, _t


def _col(values) -> torch.Tensor:
    """[B, 1] float64: one token per response."""
    return _t([float(v) for v in values]).reshape(-1, 1)


def _ones(t: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(t, dtype=torch.bool)


def _zeros_group(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.long)


def _err(fn) -> str:
    try:
        fn()
    except (PolicylabError, ValueError) as exc:
        return f"{type(exc).__name__}: {str(exc).split(';')[0]}"
    return "no error"


# ============================================================================ conspo


def _conspo(scores, positive, tau, margin):
    lp = _col(scores).requires_grad_(True)
    loss, m = conspo_k.conspo(lp, _ones(lp), _zeros_group(len(scores)), torch.tensor([bool(p) for p in positive]),
                              tau=tau, margin=margin)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return loss, m, g


@example("conspo_infonce")
def conspo_infonce(scores, positive, tau, margin, extra_negative):
    loss, m, _ = _conspo(scores, positive, tau, margin)
    z = _t([float(s) for s in scores]) / tau
    soft = torch.softmax(z, 0)
    loss2, _, _ = _conspo(list(scores) + [extra_negative], list(positive) + [False], tau, margin)
    return {"scores": _nums(_t(scores)), "tau": tau, "loss": _num(loss.sum()), "softmax": _nums(soft),
            "extra_negative": extra_negative, "loss_with_extra": _num(loss2.sum())}


@example("conspo_gradients")
def conspo_gradients(scores, positive, tau):
    loss, m, g = _conspo(scores, positive, tau, 0.0)
    soft = torch.softmax(_t([float(s) for s in scores]) / tau, 0)
    neg = torch.tensor([not p for p in positive])
    p_idx = [i for i, p in enumerate(positive) if p][0]
    return {"scores": _nums(_t(scores)), "tau": tau, "grad": _nums(g.reshape(-1)),
            "negatives_softmax_over_tau": _nums(soft[neg] / tau),
            "one_minus_softmax_p_over_tau": _num((1 - soft[p_idx]) / tau)}


@example("conspo_vs_grpo")
def conspo_vs_grpo(scores, positive):
    """Gradient on each response's score: ConSPO's vs GRPO's advantages (what a sequence
    score gets under −A·s)."""
    _, _, g = _conspo(scores, positive, 1.0, 0.0)
    r = _t([float(p) for p in positive])
    a = adv_mod.grpo(r, _zeros_group(len(scores)), std="population")
    return {"scores": _nums(_t(scores)), "conspo_grad": _nums(g.reshape(-1)), "grpo_grad": _nums(-a)}


@example("conspo_schedule_and_edge_cases")
def conspo_schedule_and_edge_cases(margin_max, ramp_steps, steps, token_logp):
    margins = [conspo_k.margin_at(s, margin_max=margin_max, ramp_steps=ramp_steps) for s in steps]
    once = _t(token_logp).reshape(1, -1)
    twice = torch.cat([once, once], 1)
    s1 = conspo_k.conspo_scores(once, _ones(once))
    s2 = conspo_k.conspo_scores(twice, _ones(twice))
    loss, _, _ = _conspo([-0.5, -1.0, -2.0], [True, True, True], 1.0, 0.0)
    return {"steps": list(steps), "margins": _nums(_t(margins)), "token_logp": _nums(once.reshape(-1)),
            "score_once": _num(s1[0]),
            "score_twice": _num(s2[0]), "all_positive_loss": _num(loss.sum()),
            "aggregation": methods.get("conspo").aggregation}


# ============================================================================ zcpo


def _drift(values) -> zcpo_k.FullVocabKL:
    return zcpo_k.FullVocabKL(_col(values), "example")


@example("zcpo_coefficients")
def zcpo_coefficients(rewards, drift, beta):
    r = _t([float(x) for x in rewards])
    c, _ = zcpo_k.zcpo_coefficients(r, _zeros_group(len(rewards)), _drift(drift), _ones(_col(drift)), beta=beta,
                                    std="population")
    return {"rewards": _nums(r), "drift": _nums(_t(drift)), "beta": beta, "coefficients": _nums(c),
            "sum": _num(c.sum()), "grpo": _nums(adv_mod.grpo(r, _zeros_group(len(rewards)), std="population",
                                                             eps=0.0))}


@example("zcpo_eligibility")
def zcpo_eligibility(rewards, drift, groups):
    r = _t([float(x) for x in rewards])
    c, info = zcpo_k.zcpo_coefficients(r, torch.tensor(groups), _drift(drift), _ones(_col(drift)), beta=1.0,
                                       std="population")
    return {"rewards": _nums(r), "groups": list(groups), "coefficients": _nums(c),
            "eligible_frac": _num(info["zcpo/eligible_group_frac"])}


@example("zcpo_vs_grpo")
def zcpo_vs_grpo(rewards, drift, beta, kl_coef):
    """Same group: GRPO's advantage (its KL sits in the loss, the same push on every
    response) vs ZCPO's coefficients (the drift re-ranks the responses within the group)."""
    r = _t([float(x) for x in rewards])
    g = _zeros_group(len(rewards))
    c, _ = zcpo_k.zcpo_coefficients(r, g, _drift(drift), _ones(_col(drift)), beta=beta, std="population")
    return {"rewards": _nums(r), "drift": _nums(_t(drift)), "grpo": _nums(adv_mod.grpo(r, g, std="population",
                                                                                      eps=0.0)),
            "zcpo": _nums(c), "beta": beta, "kl_coef": kl_coef}


@example("zcpo_full_vs_sampled")
def zcpo_full_vs_sampled(p, q, sampled):
    """The exact KL of two small distributions against the sampled-token log-ratios."""
    lp = torch.log(_t(p)).reshape(1, 1, -1)
    lq = torch.log(_t(q)).reshape(1, 1, -1)
    exact = zcpo_k.full_vocab_kl(lp, lq, torch.ones(1, 1, dtype=torch.bool)).values
    ratios = [float(lp[0, 0, v] - lq[0, 0, v]) for v in sampled]
    refused = _err(lambda: zcpo_k.zcpo_coefficients(_t([1.0]), _zeros_group(1), _t([[ratios[0]]]),
                                                    torch.ones(1, 1, dtype=torch.bool), beta=1.0, std="population"))
    return {"p": _nums(_t(p)), "q": _nums(_t(q)), "exact_kl": _num(exact[0, 0]), "sampled": list(sampled),
            "sampled_log_ratios": _nums(_t(ratios)), "refusal": refused}


# ============================================================================ stare


def _quadrant_case(entropy, target, amplify, attenuate, gate="below", direction="advantage"):
    """(A>0, rare), (A>0, common), (A<0, rare), (A<0, common), every token critical."""
    adv = _t([[1.0, 1.0], [-1.0, -1.0]])
    lp = _t([[-2.0, -0.5], [-2.0, -0.5]])
    return stare_k.stare_reweight(adv, lp, _ones(lp), entropy=entropy, target=target, quantile=0.0, gate=gate,
                                  amplify=amplify, attenuate=attenuate, direction=direction)


@example("stare_quadrants")
def stare_quadrants(entropy, target_low, target_high, amplify, attenuate):
    o1, _ = _quadrant_case(entropy, target_high, amplify, 1.0)  # H < H*: the gate is on
    c2, _ = _quadrant_case(entropy, target_high, amplify, attenuate)
    above, _ = _quadrant_case(entropy, target_low, amplify, attenuate)  # H > H*: off
    first, _ = _quadrant_case(entropy, target_high, amplify, attenuate, direction="first_order")
    return {"entropy": entropy, "target_high": target_high, "target_low": target_low, "amplify": amplify,
            "attenuate": attenuate, "one_sided": _nums(o1.reshape(-1)), "two_sided": _nums(c2.reshape(-1)),
            "above_target": _nums(above.reshape(-1)), "first_order": _nums(first.reshape(-1))}


@example("stare_per_sign")
def stare_per_sign(adv, logp, mask, q):
    a, lp, m = _t([float(x) for x in adv]), _t(logp), torch.tensor(mask)
    A = a.unsqueeze(-1).expand_as(lp)
    crit, info = stare_k.critical_tokens(A, lp, m, q, "per_sign")
    padded = torch.where(m, lp, torch.tensor(-30.0, dtype=F64))
    _, info_pad = stare_k.critical_tokens(A, padded, m, q, "per_sign")
    return {"adv": _nums(a), "surprisals": _nums(-lp[m]), "q": q, "threshold_pos": info["stare/threshold_pos"],
            "threshold_neg": info["stare/threshold_neg"], "critical": str(crit[m].tolist()).lower(),
            "threshold_pos_with_padding": info_pad["stare/threshold_pos"]}


@example("stare_vs_grpo")
def stare_vs_grpo(rewards, token_logp, entropy, target, q):
    r = _t([float(x) for x in rewards])
    a = adv_mod.grpo(r, _zeros_group(len(rewards)), std="unbiased")
    lp = _t(token_logp)
    m = _ones(lp)
    kw = dict(quantile=q, amplify=1.1, attenuate=1.0)
    above, _ = stare_k.stare_reweight(a, lp, m, entropy=entropy, target=entropy / 2, **kw)
    below, info = stare_k.stare_reweight(a, lp, m, entropy=entropy, target=target, **kw)
    return {"grpo": _nums(a), "above_target": _nums(above.reshape(-1)), "below_target": _nums(below.reshape(-1)),
            "entropy": entropy, "target": target, "q": q}


@example("stare_sign_kept")
def stare_sign_kept(amplify, attenuate):
    out, _ = _quadrant_case(1.0, 2.0, amplify, attenuate, gate="sign", direction="first_order")
    flipped, _ = _quadrant_case(1.0, 0.2, amplify, attenuate, gate="sign", direction="first_order")
    a = _t([[1.0, 1.0], [-1.0, -1.0]])
    return {"amplify": amplify, "attenuate": attenuate, "reweighted": _nums(out.reshape(-1)),
            "reweighted_flipped": _nums(flipped.reshape(-1)),
            "signs_kept": bool(((out * a) >= 0).all() and ((flipped * a) >= 0).all())}


# ============================================================================ reco


@example("reco_expected_counts")
def reco_expected_counts(probs, group_size):
    lp_old = torch.log(_col(probs))
    w, _ = reco_k.reco_weights(lp_old, lp_old, _ones(lp_old), group_size=group_size, eps_v=1e-3, g_min=0.1,
                               g_max=4.0)
    n = reco_k.expected_counts(lp_old, _ones(lp_old), group_size).exp()
    return {"probs": _nums(_t(probs)), "group_size": group_size, "expected_counts": _nums(n),
            "weights": _nums(w.reshape(-1))}


@example("reco_variance_ratio")
def reco_variance_ratio(p_old, p):
    lp_old, lp = torch.log(_col([p_old])), torch.log(_col([p]))
    w, _ = reco_k.reco_weights(lp, lp_old, _ones(lp), group_size=1, eps_v=1e-3, g_min=0.1, g_max=4.0)
    same, _ = reco_k.reco_weights(lp, lp, _ones(lp), group_size=1, eps_v=1e-3, g_min=0.1, g_max=4.0)
    return {"p_old": p_old, "p": p, "ratio": _num(w[0, 0]), "current_on_both_sides": _num(same[0, 0])}


@example("reco_vs_grpo")
def reco_vs_grpo(p_old, p, adv, group_size):
    lp_old = torch.log(_t([p_old])).reshape(1, -1)
    lp = torch.log(_t([p])).reshape(1, -1).requires_grad_(True)
    a, m = _t([adv]), _ones(lp_old)
    out = {}
    for name, params in (("reco", {"reco_group_size": group_size}), ("grpo", {"kl_coef": 0.0})):
        loss, _ = policy_loss(methods.get(name).with_params(params), tensor_inputs(lp, a, m, logp_old=lp_old))
        (g,) = torch.autograd.grad(loss.sum(), lp)
        out[name] = _nums(g.reshape(-1))
    w, _ = reco_k.reco_weights(lp, lp_old, m, group_size=group_size, eps_v=1e-3, g_min=0.1, g_max=4.0)
    return {"p_old": list(map(float, p_old)), "p": list(map(float, p)), "reco_grad": out["reco"],
            "grpo_grad": out["grpo"], "weights": _nums(w.reshape(-1))}


@example("reco_floor")
def reco_floor(p_old, p, eps_v, g_max):
    lp_old, lp = torch.log(_col([p_old])), torch.log(_col([p]))
    raw = p * (1 - p) / max(p_old * (1 - p_old), eps_v)
    w, m = reco_k.reco_weights(lp, lp_old, _ones(lp), group_size=1, eps_v=eps_v, g_min=0.1, g_max=g_max)
    return {"p_old": p_old, "p": p, "eps_v": eps_v, "g_max": g_max, "unbounded_ratio": _num(raw),
            "weight": _num(w[0, 0]), "finite": bool(torch.isfinite(w).all())}


# ============================================================================ erpo


@example("erpo_weights")
def erpo_weights(typicality, qkl_coef):
    w, info = erpo_k.question_weights(_t(typicality), qkl_coef=qkl_coef)
    return {"typicality": _nums(_t(typicality)), "qkl_coef": qkl_coef, "weights": _nums(w),
            "mean": _num(w.mean()), "query_kl": _num(info["erpo/query_kl"])}


@example("erpo_penalty_sweep")
def erpo_penalty_sweep(typicality, coefs):
    rows = [erpo_k.question_weights(_t(typicality), qkl_coef=c) for c in coefs]
    return {"typicality": _nums(_t(typicality)), "coefs": [float(c) for c in coefs],
            "max_weights": _nums(_t([float(w.max()) for w, _ in rows])),
            "query_kls": _nums(_t([i["erpo/query_kl"] for _, i in rows]))}


@example("erpo_vs_grpo")
def erpo_vs_grpo(rewards, typicality, qkl_coef):
    r = _t([float(x) for x in rewards])
    g = torch.tensor([0, 0, 1, 1])
    a = adv_mod.grpo(r, g, std="unbiased")
    tau = _t(typicality)
    w, _ = erpo_k.question_weights(tau, qkl_coef=qkl_coef)
    # the same prompts with every reward flipped: GRPO's advantages change sign, and the
    # ERPO advantages divided by them give back the same weights (ω reads no reward)
    a_flip = adv_mod.grpo(1.0 - r, g, std="unbiased")
    erpo_flip = a_flip * erpo_k.question_weights(tau, qkl_coef=qkl_coef)[0]
    return {"rewards": _nums(r), "grpo": _nums(a), "weights": _nums(w), "erpo": _nums(a * w),
            "erpo_flipped": _nums(erpo_flip), "weights_after_flipping_rewards": _nums(erpo_flip / a_flip)}


@example("erpo_question_tokens")
def erpo_question_tokens(prompt_logp, question_mask):
    lp = _t(prompt_logp).reshape(1, -1)
    q = torch.tensor(question_mask).reshape(1, -1)
    tau = erpo_k.question_typicality(lp, q)
    everything = erpo_k.question_typicality(lp, lp != 0)
    refusal = _err(lambda: methods.get("erpo").with_params({"kl_coef": 0.05}, methods.RunShape()))
    return {"prompt_logp": _nums(lp.reshape(-1)), "typicality": _num(tau[0]),
            "with_template_tokens": _num(everything[0]), "refusal": refusal}


# ============================================================================ tlm_dre


@example("tlm_turn_weights")
def tlm_turn_weights(turn_logp_ref, tau):
    """Turn weights from per-turn reference log-probs (lists of token log-probs)."""
    flat = [v for turn in turn_logp_ref for v in turn]
    ids = [k for k, turn in enumerate(turn_logp_ref) for _ in turn]
    lp = _t(flat).reshape(1, -1)
    c, present = tlm_k.turn_confidence(lp, torch.tensor([ids]), _ones(lp))
    lam = tlm_k.turn_weights(c, present, tau=tau)
    return {"confidence": _nums(c.reshape(-1)), "tau": tau, "weights": _nums(lam.reshape(-1))}


@example("tlm_token_gradients")
def tlm_token_gradients(log_ratios, kappa_pos, kappa_neg):
    u = _t(log_ratios).reshape(1, -1)
    lp_ref = torch.full_like(u, -1.0)
    out = {}
    for name, pol in (("positive", 1.0), ("negative", -1.0)):
        lp = (lp_ref + u).requires_grad_(True)
        loss, _ = tlm_k.tlm_dre(lp, lp_ref, _t([pol]), torch.zeros_like(u, dtype=torch.long), _ones(u), tau=1.0,
                                kappa_pos=kappa_pos, kappa_neg=kappa_neg)
        (g,) = torch.autograd.grad(loss.sum(), lp)
        out[name] = _nums(g.reshape(-1))
    return {"log_ratios": _nums(u.reshape(-1)), "kappa_pos": kappa_pos, "kappa_neg": kappa_neg,
            "grad_positive": out["positive"], "grad_negative": out["negative"]}


@example("tlm_vs_grpo")
def tlm_vs_grpo(turn_logp_ref, reward):
    flat = [v for turn in turn_logp_ref for v in turn]
    ids = [k for k, turn in enumerate(turn_logp_ref) for _ in turn]
    lp_ref = _t(flat).reshape(1, -1)
    lp = lp_ref.clone().requires_grad_(True)
    pol = _t([1.0 if reward >= 0.5 else -1.0])
    loss, _ = tlm_k.tlm_dre(lp, lp_ref, pol, torch.tensor([ids]), _ones(lp), tau=1.0, kappa_pos=0.0, kappa_neg=1.0)
    (g,) = torch.autograd.grad(agg_mod.aggregate(loss, _ones(lp), "token_mean"), lp)
    lp2 = lp_ref.clone().requires_grad_(True)
    host, _ = policy_loss(methods.get("grpo").with_params({"kl_coef": 0.0}), tensor_inputs(lp2, pol, _ones(lp2)))
    (g2,) = torch.autograd.grad(agg_mod.aggregate(host, _ones(lp2), "token_mean"), lp2)
    return {"turn_of_token": ids, "tlm_grad": _nums(g.reshape(-1)), "grpo_grad": _nums(g2.reshape(-1))}


@example("tlm_merge_and_missing")
def tlm_merge_and_missing(turn_logp_ref):
    flat = [v for turn in turn_logp_ref for v in turn]
    ids = [k for k, turn in enumerate(turn_logp_ref) for _ in turn]
    lp = _t(flat).reshape(1, -1)
    m = _ones(lp)
    lam = tlm_k.turn_weights(*tlm_k.turn_confidence(lp, torch.tensor([ids]), m), tau=1.0)
    merged = tlm_k.turn_weights(*tlm_k.turn_confidence(lp, torch.zeros_like(lp, dtype=torch.long), m), tau=1.0)
    missing = _err(lambda: tlm_k.tlm_dre(lp, lp, _t([1.0]), None, m, tau=1.0, kappa_pos=0.0, kappa_neg=1.0))
    return {"separate": _nums(lam.reshape(-1)), "merged": _nums(merged[0, :1]), "missing": missing}


# ============================================================================ rlid


@example("rlid_label_marginal")
def rlid_label_marginal(rows_a, rows_b):
    out = {}
    for key, rows in (("a", rows_a), ("b", rows_b)):
        lp = torch.log(_t(rows))
        out[f"R_{key}"] = _num(rlid_k.label_marginal_kl(lp, _zeros_group(lp.shape[0])))
        out[f"mbar_{key}"] = _nums(lp.exp().mean(0))
    return {"rows_a": str(rows_a), "rows_b": str(rows_b), **out}


@example("rlid_episode_weights")
def rlid_episode_weights(episode_id, episode_len):
    w = rlid_k.episode_weights(torch.tensor(episode_id), torch.tensor(episode_len))
    totals = {}
    for e, v in zip(episode_id, w.tolist()):
        totals[e] = totals.get(e, 0.0) + v
    return {"episode_len": list(episode_len), "weights": _nums(w), "episode_totals": _nums(_t(list(totals.values())))}


@example("rlid_menu_renormalized")
def rlid_menu_renormalized(logits, menu, chosen):
    """The chosen label's probability over the whole vocabulary and over the menu only."""
    z = _t(logits).reshape(1, 1, -1)
    target = torch.tensor([[chosen]])
    full = token_logprobs(z, target).exp()
    over_menu = token_logprobs(z, target, allowed_ids=tuple(menu)).exp()
    return {"menu": list(menu), "chosen": chosen, "p_full_vocabulary": _num(full[0, 0]),
            "p_over_menu": _num(over_menu[0, 0])}


@example("rlid_marginal_estimator")
def rlid_marginal_estimator(probs):
    """Exact ∇R against the expectation of the sampled estimator, on menu logits."""
    z = torch.log(_t(probs)).requires_grad_(True)
    grp = _zeros_group(z.shape[0])
    lsm = torch.log_softmax(z, -1)
    (exact,) = torch.autograd.grad(rlid_k.label_marginal_kl(lsm, grp), z, retain_graph=True)
    p = lsm.exp().detach()
    expected = torch.zeros_like(z)
    coefs = []
    for a in range(z.shape[1]):
        coef, _ = rlid_k.marginal_coefficients(lsm.detach(), torch.full((z.shape[0],), a), grp)
        coefs.append(coef)
        lpa = lsm[:, a]
        (ga,) = torch.autograd.grad((p[:, a] * coef * torch.exp(lpa - lpa.detach())).sum() / z.shape[0], z,
                                    retain_graph=True)
        expected += ga
    return {"probs": str(probs), "exact_grad_row0": _nums(exact[0]), "expected_grad_row0": _nums(expected[0]),
            "coef_row0": _nums(torch.stack(coefs, 1)[0]), "max_abs_difference": _num((exact - expected).abs().max())}
