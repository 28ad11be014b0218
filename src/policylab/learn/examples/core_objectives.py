"""Worked examples: objectives, KL, aggregation and filters (ppo clip family, cispo, gppo, gspo, dapo, k1/k3, token vs sequence means)."""

from __future__ import annotations

import math
import torch
from policylab.kernels import advantages as adv_mod
from policylab.kernels import aggregate as agg_mod
from policylab.kernels import filters, kl, objectives

from policylab.kernels.rewards import overlong_penalty

from policylab.learn.examples.registry import example
from policylab.learn.examples.core_common import (
    F64,
    f64,
    num,
    nums,
    echo,
    group_ids,
    ragged,
    lengths_mask,
    single_token,
    grads_at_ratio_one,
    gspo_run,
)


@example("k3_kl_term")
def k3_kl_term(logp, logp_ref, coef=0.04):
    lp = f64(logp).unsqueeze(0).requires_grad_()
    ref = f64(logp_ref).unsqueeze(0)
    k3 = kl.k3(lp, ref)
    (coef * k3).sum().backward()
    k1 = kl.k1(lp.detach(), ref)
    try:
        kl.check_placement(True, True)
        both_refused = False
    except ValueError:
        both_refused = True
    return {"logp": nums(logp), "logp_ref": nums(logp_ref), "coef": num(coef),
            "k1": nums(k1[0]), "k3": nums(k3.detach()[0]), "k3_grad": nums(lp.grad[0]),
            "both_refused": both_refused}


@example("length_bias_gradients")
def length_bias_gradients(lengths, adv, L_norm):
    """Per-token gradient of each sequence under three aggregation modes (ρ = 1)."""
    mask, a = lengths_mask(lengths), f64(adv)
    out = {"lengths": [int(n) for n in lengths], "adv": nums(a), "L_norm": echo(L_norm)}
    for key, mode in (("seq_mean_token_mean", "seq_mean_token_mean"), ("token_mean", "token_mean"),
                      ("sum_norm", "seq_mean_token_sum_norm")):
        _, grad = grads_at_ratio_one(a, mask, mode, L_norm=L_norm)
        w = -grad / a.unsqueeze(1)  # weight c of each token: ∂L/∂lp = −c·A
        out[key] = nums(w[:, 0])
        out[key + "_total"] = nums(torch.where(mask, w, 0.0).sum(dim=1))
    out["smtm_ratio"] = num(out["seq_mean_token_mean"][0] / out["seq_mean_token_mean"][1])
    return out


@example("aggregation_modes")
def aggregation_modes(losses):
    loss, mask = ragged(losses)
    out = {f"losses{i}": nums(r) for i, r in enumerate(losses)}
    return {**out, "lengths": [len(r) for r in losses],
            "token_mean": num(agg_mod.aggregate(loss, mask, "token_mean")),
            "seq_mean_token_mean": num(agg_mod.aggregate(loss, mask, "seq_mean_token_mean")),
            "seq_mean_token_sum": num(agg_mod.aggregate(loss, mask, "seq_mean_token_sum"))}


@example("dapo_dynamic_sampling")
def dapo_dynamic_sampling(correct, group):
    o, g = f64(correct), group_ids(group, len(correct))
    keep, info = filters.dynamic_sampling_keep(o, g)
    a = adv_mod.grpo(o, g)
    kept = sorted({int(x) for x in g[keep].tolist()})
    dropped = sorted({int(x) for x in g[~keep].tolist()})
    return {"correct": [echo(x) for x in correct], "kept_groups": kept, "dropped_groups": dropped,
            "n_groups": int(info["n_groups"]), "n_kept": int(info["n_kept"]),
            "filtered_fraction": num(info["filtered_fraction"]),
            "advantages": nums(a)}


@example("dapo_filter_raw_vs_shaped")
def dapo_filter_raw_vs_shaped(correct, lengths, group, max_len, cache_len):
    o, g = f64(correct), group_ids(group, len(correct))
    pen = overlong_penalty(torch.tensor(lengths), max_len=max_len, cache_len=cache_len).to(F64)
    shaped = o + pen
    keep_raw, info_raw = filters.dynamic_sampling_keep(o, g)
    keep_shaped, info_shaped = filters.dynamic_sampling_keep(shaped, g)
    return {"correct": [echo(x) for x in correct], "lengths": [int(n) for n in lengths], "max_len": int(max_len),
            "cache_len": int(cache_len), "penalty": nums(pen), "shaped": nums(shaped),
            "kept_on_raw": int(info_raw["n_kept"]), "kept_on_shaped": int(info_shaped["n_kept"]),
            "shaped_advantages": nums(adv_mod.grpo(shaped, g))}


@example("clip_gradient_coefficients")
def clip_gradient_coefficients(ratios, advs, eps_low, eps_high, cispo_eps_low=None):
    """Gradient coefficient c (∂ℓ/∂lp = −c·A) of ppo_clip, gppo and cispo per token."""
    kw = dict(eps_low=eps_low, eps_high=eps_high)
    c_ppo, l_ppo, m_ppo = single_token(objectives.ppo_clip, ratios, advs, **kw)
    c_gppo, l_gppo, m_gppo = single_token(objectives.gppo, ratios, advs, **kw)
    c_cis, l_cis, _ = single_token(objectives.cispo, ratios, advs, eps_low=cispo_eps_low, eps_high=eps_high)
    return {"ratios": nums(ratios), "advs": nums(advs), "eps_low": num(eps_low),
            "eps_high": num(eps_high), "upper": num(1 + eps_high), "lower": num(1 - eps_low),
            "ppo": nums(c_ppo), "gppo": nums(c_gppo), "cispo": nums(c_cis),
            "ppo_loss": nums(l_ppo), "gppo_loss": nums(l_gppo), "cispo_loss": nums(l_cis),
            "same_forward": bool(torch.equal(l_ppo, l_gppo)),
            "ppo_clip_frac": num(m_ppo["clip_frac"]), "gppo_clip_frac": num(m_gppo["clip_frac"]),
            "gppo_high_pos_frac": num(m_gppo["clip_frac/high_pos"])}


@example("clip_higher_vs_symmetric")
def clip_higher_vs_symmetric(ratios, adv, eps_low, eps_high, eps_sym):
    advs = [adv] * len(ratios)
    c_dapo, _, _ = single_token(objectives.ppo_clip, ratios, advs, eps_low=eps_low, eps_high=eps_high)
    c_sym, _, _ = single_token(objectives.ppo_clip, ratios, advs, eps_low=eps_sym, eps_high=eps_sym)
    return {"ratios": nums(ratios), "adv": num(adv), "eps_high": num(eps_high),
            "eps_sym": num(eps_sym), "dapo": nums(c_dapo), "symmetric": nums(c_sym),
            "upper_dapo": num(1 + eps_high), "upper_sym": num(1 + eps_sym)}


@example("cispo_loss_value")
def cispo_loss_value(logp, adv, eps_high):
    """First minibatch (ρ = 1): same gradient as PPO, different loss value."""
    def run(fn, **kw):
        lp = f64(logp).unsqueeze(0).requires_grad_()
        loss, _ = fn(lp, lp.detach().clone(), f64([adv]), torch.ones_like(lp, dtype=torch.bool), **kw)
        value = agg_mod.aggregate(loss, torch.ones_like(lp, dtype=torch.bool), "token_mean")
        value.backward()
        return value.detach(), lp.grad[0]
    v_cis, g_cis = run(objectives.cispo, eps_low=None, eps_high=eps_high)
    v_ppo, g_ppo = run(objectives.ppo_clip, eps_low=0.2, eps_high=eps_high)
    return {"logp": nums(logp), "adv": num(adv), "cispo_value": num(v_cis), "ppo_value": num(v_ppo),
            "cispo_grad": nums(g_cis), "ppo_grad": nums(g_ppo),
            "same_grad": bool(torch.allclose(g_cis, g_ppo))}


@example("kl_in_reward")
def kl_in_reward(outcome, logp_old, logp_ref, values, coef, lam=0.95):
    """InstructGPT-style shaping: −β·k1(lp_old, lp_ref) per token + outcome at the end."""
    old, ref = f64(logp_old).unsqueeze(0), f64(logp_ref).unsqueeze(0)
    m = torch.ones_like(old, dtype=torch.bool)
    pen = kl.reward_penalty(old, ref, m, coef=coef)
    tok_r = -pen
    tok_r[0, -1] += outcome
    a, _ = adv_mod.gae(tok_r, f64(values).unsqueeze(0), m, gamma=1.0, lam=lam)
    try:
        kl.reward_penalty(old.clone().requires_grad_(), ref, m, coef=coef)
        refused = False
    except ValueError:
        refused = True
    return {"outcome": num(outcome), "coef": num(coef), "logp_old": nums(logp_old),
            "logp_ref": nums(logp_ref), "penalty": nums(pen[0]),
            "token_rewards": nums(tok_r[0]), "advantages": nums(a[0]),
            "learner_logp_refused": refused}


@example("reinforce_token_gradients")
def reinforce_token_gradients(rewards, lengths, greedy_rewards=None, mode="seq_mean_token_sum"):
    """REINFORCE (−A·lp) aggregated, A from ReMax (greedy_rewards given) or RLOO (one
    group): the per-token gradient ∂L/∂lp of each response."""
    r, mask = f64(rewards), lengths_mask(lengths)
    if greedy_rewards is not None:
        a = adv_mod.remax(r, f64(greedy_rewards))
    else:
        a = adv_mod.rloo(r, torch.zeros(len(rewards), dtype=torch.long))
    value, grad = grads_at_ratio_one(a, mask, mode, objective="reinforce")
    return {"rewards": nums(r), "greedy": nums(greedy_rewards or []), "adv": nums(a),
            "lengths": [int(n) for n in lengths], "mode": mode,
            "token_grads": nums(grad[:, 0]), "loss_value": num(value)}


@example("gspo_sequence_ratio")
def gspo_sequence_ratio(log_ratios, eps_low=3e-4, eps_high=4e-4):
    _, metrics, _ = gspo_run(objectives.gspo, [log_ratios], [1.0], eps_low, eps_high)
    return {"log_ratios": nums(log_ratios), "token_ratios": [num(math.exp(x)) for x in log_ratios],
            "sequence_ratio": num(metrics["ratio/mean"]),
            "product_ratio": num(math.exp(sum(log_ratios)))}


@example("gspo_gradients")
def gspo_gradients(log_ratios, adv, eps_low=3e-4, eps_high=4e-4):
    """Per-row sequence ratio s_i and the gradient ∂L/∂lp of every token of that row."""
    g, _, _ = gspo_run(objectives.gspo, log_ratios, adv, eps_low, eps_high)
    out = {"adv": nums(adv), "eps_low": num(eps_low), "eps_high": num(eps_high)}
    for i, row in enumerate(log_ratios):
        lr, m = ragged([row])
        _, metrics = objectives.gspo(lr, torch.zeros_like(lr), f64([adv[i]]), m, eps_low=eps_low, eps_high=eps_high)
        out[f"s{i}"] = num(metrics["ratio/mean"])
        out[f"grads{i}"] = nums(g[i, : len(row)])
        out[f"clipped{i}"] = bool(metrics["clip_frac"] > 0)
    return out


@example("gspo_vs_token_clip")
def gspo_vs_token_clip(log_ratios, adv, eps_low, eps_high):
    g_seq, m_seq, _ = gspo_run(objectives.gspo, [log_ratios], [adv], eps_low, eps_high)
    g_tok, m_tok, _ = gspo_run(objectives.ppo_clip, [log_ratios], [adv], eps_low, eps_high)
    return {"log_ratios": nums(log_ratios), "token_ratios": [num(math.exp(x)) for x in log_ratios],
            "adv": num(adv), "eps_low": num(eps_low), "eps_high": num(eps_high),
            "sequence_ratio": num(m_seq["ratio/mean"]), "gspo_grads": nums(g_seq[0]),
            "ppo_grads": nums(g_tok[0]), "gspo_clip_frac": num(m_seq["clip_frac"]),
            "ppo_clip_frac": num(m_tok["clip_frac"])}


@example("gspo_aggregation")
def gspo_aggregation(lengths, adv, eps_low=3e-4, eps_high=4e-4):
    """Total gradient each response receives under the paper's mode vs token_mean."""
    rows = [[0.0] * int(n) for n in lengths]
    out = {"lengths": [int(n) for n in lengths], "adv": nums(adv)}
    for key, mode in (("seq_mean", "seq_mean_token_mean"), ("token_mean", "token_mean")):
        g, _, _ = gspo_run(objectives.gspo, rows, adv, eps_low, eps_high, mode)
        out[key] = nums(-g.sum(dim=1) / f64(adv))  # total weight of each response
    return out
