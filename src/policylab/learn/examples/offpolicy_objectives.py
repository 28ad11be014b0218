"""Worked examples: trust-region and sequence objectives (ripo, gppo_fdiv, tapo, luspo, ggpo)."""

from __future__ import annotations

import inspect
import math
import torch
from policylab.kernels import advantages, aggregate as agg, corrections, objectives
from policylab import methods

from policylab.learn.examples.registry import example
from policylab.learn.examples.offpolicy_common import (
    F64,
    row_tensor,
    log_row,
    ones_mask,
    flat,
    scalar,
    grad_leaf,
    grad_of,
    error_text,
    tapo_rows,
    wide_eps,
    seq_batch,
    first_valid,
    row_sums,
)


@example("ripo_bounds_table")
def ripo_bounds_table(p_old, delta):
    lp_old = log_row(p_old)
    lo, hi = objectives.ripo_bounds(lp_old, delta=delta)
    p = row_tensor(p_old)
    return {"p_old": list(map(float, p_old)), "delta": delta, "lo": flat(lo), "hi": flat(hi),
            "p_new_lo": flat(lo * p), "p_new_hi": flat(hi * p)}


@example("ripo_vs_ppo")
def ripo_vs_ppo(p_old, rho, adv, delta, eps):
    """Per token: gradient of RIPO and of PPO (fixed ε) at the same ratio ρ and advantage."""
    lp_old = log_row(p_old)
    mask = ones_mask(lp_old)
    a = row_tensor(adv)
    lp1, lp2 = grad_leaf(lp_old + torch.log(row_tensor(rho))), grad_leaf(lp_old + torch.log(row_tensor(rho)))
    l1, _ = objectives.ripo(lp1, lp_old, a, mask, delta=delta)
    l2, _ = objectives.ppo_clip(lp2, lp_old, a, mask, eps_low=eps, eps_high=eps)
    lo, hi = objectives.ripo_bounds(lp_old, delta=delta)
    return {"p_old": list(map(float, p_old)), "rho": list(map(float, rho)), "adv": list(map(float, adv)),
            "eps": eps, "ripo_lo": flat(lo), "ripo_hi": flat(hi),
            "ripo_grad": grad_of(l1.sum(), lp1), "ppo_grad": grad_of(l2.sum(), lp2)}


@example("ripo_frozen")
def ripo_frozen(p_old, p_current, delta):
    lp_old, lp_now = log_row([p_old]), log_row([p_current])
    mask = ones_mask(lp_old)
    _, hi_old = objectives.ripo_bounds(lp_old, delta=delta)
    _, hi_live = objectives.ripo_bounds(lp_now, delta=delta)  # the bug: bounds from the learner
    _, m = objectives.ripo(grad_leaf(lp_now), lp_old, torch.ones(1, dtype=F64), mask, delta=delta)
    return {"p_old": p_old, "p_current": p_current, "delta": delta, "hi_from_old": scalar(hi_old[0, 0]),
            "hi_from_live": scalar(hi_live[0, 0]), "hi_used_by_ripo": scalar(m["ripo/bound_hi_mean"]),
            "rho": p_current / p_old}


@example("fdiv_intervals")
def fdiv_intervals(divergence, topology, p_old, delta):
    lo, hi = objectives.fdiv_bounds(log_row(p_old), divergence=divergence, topology=topology, delta=delta)
    return {"divergence": divergence, "topology": topology, "p_old": list(map(float, p_old)), "delta": delta,
            "lo": flat(lo), "hi": flat(hi), "p_new_hi": flat(hi * row_tensor(p_old))}


@example("fdiv_vs_ripo")
def fdiv_vs_ripo(p_old, fdiv_delta, ripo_delta):
    lp_old = log_row(p_old)
    flo, fhi = objectives.fdiv_bounds(lp_old, divergence="kl_old_new", topology="binary", delta=fdiv_delta)
    rlo, rhi = objectives.ripo_bounds(lp_old, delta=ripo_delta)
    return {"p_old": list(map(float, p_old)), "fdiv_delta": fdiv_delta, "ripo_delta": ripo_delta,
            "fdiv_lo": flat(flo), "fdiv_hi": flat(fhi), "ripo_lo": flat(rlo), "ripo_hi": flat(rhi)}


@example("fdiv_names")
def fdiv_names(p_old, delta):
    lp_old = log_row(p_old)
    mc_lo, mc_hi = objectives.fdiv_bounds(lp_old, divergence="kl_old_new", topology="mc", delta=delta)
    b_lo, b_hi = objectives.fdiv_bounds(lp_old, divergence="kl_old_new", topology="binary", delta=delta)
    wrong = error_text(lambda: objectives.fdiv_bounds(lp_old, divergence="kl", topology="mc", delta=delta))
    return {"p_old": list(map(float, p_old)), "delta": delta, "mc_lo": flat(mc_lo), "mc_hi": flat(mc_hi),
            "binary_lo": flat(b_lo), "binary_hi": flat(b_hi), "unknown_name": wrong}


@example("fdiv_ppo_as_tv")
def fdiv_ppo_as_tv(p_old, delta, rho, adv):
    """TV under the MC topology gives the fixed band [1 - 2δ, 1 + 2δ]: PPO's clip."""
    lp_old = log_row(p_old)
    mask = ones_mask(lp_old)
    lo, hi = objectives.fdiv_bounds(lp_old, divergence="tv", topology="mc", delta=delta)
    a = torch.full((1,), float(adv), dtype=F64)
    lp1, lp2 = grad_leaf(lp_old + math.log(rho)), grad_leaf(lp_old + math.log(rho))
    l1, _ = objectives.gppo_fdiv(lp1, lp_old, a, mask, divergence="tv", topology="mc", delta=delta)
    l2, _ = objectives.ppo_clip(lp2, lp_old, a, mask, eps_low=2 * delta, eps_high=2 * delta)
    return {"p_old": list(map(float, p_old)), "delta": delta, "lo": flat(lo), "hi": flat(hi),
            "fdiv_loss": flat(l1), "ppo_loss": flat(l2), "fdiv_grad": grad_of(l1.sum(), lp1),
            "ppo_grad": grad_of(l2.sum(), lp2), "rho": rho, "eps": 2 * delta}


@example("tapo_prefix")
def tapo_prefix(log_ratios):
    lp_old, lp_now = tapo_rows(log_ratios)
    mask = ones_mask(lp_old)
    G, _ = objectives.prefix_geometric_ratio(lp_now, lp_old, mask)
    return {"log_ratios": list(map(float, log_ratios)), "G": flat(G),
            "product": scalar(corrections.seq_ratio_product(lp_now, lp_old, mask).ratio[0]),
            "geomean": scalar(corrections.seq_ratio_geomean(lp_now, lp_old, mask).ratio[0])}


@example("tapo_grad")
def tapo_grad(log_ratios, adv):
    lp_old, lp_now = tapo_rows(log_ratios)
    mask = ones_mask(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    T = len(log_ratios)
    jac = torch.zeros(T, T, dtype=F64)
    for t in range(T):
        lp = grad_leaf(lp_now)
        loss, _ = objectives.tapo(lp, lp_old, a, mask, eps_schedule=wide_eps)
        jac[t] = torch.tensor(grad_of(loss[0, t], lp), dtype=F64)
    off = jac - torch.diag(torch.diagonal(jac))
    return {"log_ratios": list(map(float, log_ratios)), "adv": adv, "diag": flat(torch.diagonal(jac)),
            "off_diag_max": scalar(off.abs().max())}


@example("tapo_vs_gspo")
def tapo_vs_gspo(log_ratios, adv):
    lp_old, lp_now = tapo_rows(log_ratios)
    mask = ones_mask(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    lp1, lp2 = grad_leaf(lp_now), grad_leaf(lp_now)
    l1, _ = objectives.tapo(lp1, lp_old, a, mask, eps_schedule=wide_eps)
    l2, m2 = objectives.gspo(lp2, lp_old, a, mask, eps_low=0.99, eps_high=10.0)
    return {"log_ratios": list(map(float, log_ratios)), "adv": adv, "gspo_ratio": scalar(m2["ratio/mean"]),
            "tapo_grad": grad_of(agg.aggregate(l1, mask, "token_mean"), lp1),
            "gspo_grad": grad_of(agg.aggregate(l2, mask, "seq_mean_token_mean"), lp2)}


@example("tapo_padding")
def tapo_padding(log_ratios, pad_after, garbage):
    """A padded position (garbage log-probs) inserted after `pad_after` valid tokens."""
    lp_old, lp_now = tapo_rows(log_ratios)
    cut = int(pad_after)
    pad = torch.tensor([[float(garbage)]], dtype=F64)
    old_p = torch.cat([lp_old[:, :cut], pad, lp_old[:, cut:]], dim=1)
    now_p = torch.cat([lp_now[:, :cut], pad * 3, lp_now[:, cut:]], dim=1)
    mask_p = ones_mask(old_p)
    mask_p[0, cut] = False
    G_pad, _ = objectives.prefix_geometric_ratio(now_p, old_p, mask_p)
    G_clean, _ = objectives.prefix_geometric_ratio(lp_now, lp_old, ones_mask(lp_old))
    G_excl, _ = objectives.prefix_geometric_ratio(lp_now, lp_old, ones_mask(lp_old), include_current=False)
    return {"log_ratios": list(map(float, log_ratios)), "G_padded_valid": flat(G_pad[mask_p]),
            "G_clean": flat(G_clean), "same": bool(torch.allclose(G_pad[mask_p], G_clean[0])),
            "G_exclusive": flat(G_excl)}


@example("luspo_vs_gspo_grad")
def luspo_vs_gspo_grad(lengths, adv, eps_low, eps_high):
    lp_old, lp_now, mask = seq_batch(lengths)
    a = torch.full((len(lengths),), float(adv), dtype=F64)
    lp1, lp2 = grad_leaf(lp_now), grad_leaf(lp_now)
    l1, _ = objectives.luspo(lp1, lp_old, a, mask, eps_low=eps_low, eps_high=eps_high)
    l2, _ = objectives.gspo(lp2, lp_old, a, mask, eps_low=eps_low, eps_high=eps_high)
    g1 = grad_of(agg.aggregate(l1, mask, "token_mean"), lp1)
    g2 = grad_of(agg.aggregate(l2, mask, "seq_mean_token_mean"), lp2)
    return {"lengths": list(lengths), "adv": adv, "luspo_token_grad": first_valid(g1, mask),
            "gspo_token_grad": first_valid(g2, mask), "luspo_seq_total": row_sums(g1, mask),
            "gspo_seq_total": row_sums(g2, mask)}


@example("luspo_loss_matrix")
def luspo_loss_matrix(lengths, mean_log_ratios, adv, eps_low, eps_high):
    lp_old, lp_now, mask = seq_batch(lengths, mean_log_ratios)
    a = torch.full((len(lengths),), float(adv), dtype=F64)
    lp = grad_leaf(lp_now)
    loss, m = objectives.luspo(lp, lp_old, a, mask, eps_low=eps_low, eps_high=eps_high)
    g = grad_of(agg.aggregate(loss, mask, "token_mean"), lp)
    s = corrections.seq_ratio_geomean(lp_now, lp_old, mask).ratio
    return {"lengths": list(lengths), "eps_high": eps_high, "s": flat(s), "row_sums": flat(loss.sum(-1)),
            "grad_per_seq": row_sums(g, mask), "clip_frac": scalar(m["clip_frac"])}


@example("luspo_aggregation_pitfall")
def luspo_aggregation_pitfall(lengths, adv):
    lp_old, lp_now, mask = seq_batch(lengths)
    a = torch.full((len(lengths),), float(adv), dtype=F64)
    grads = {}
    for mode in ("token_mean", "seq_mean_token_mean"):
        lp = grad_leaf(lp_now)
        loss, _ = objectives.luspo(lp, lp_old, a, mask, eps_low=3e-4, eps_high=4e-4)
        grads[mode] = first_valid(grad_of(agg.aggregate(loss, mask, mode), lp), mask)
    lp = grad_leaf(lp_now)
    loss, _ = objectives.gspo(lp, lp_old, a, mask, eps_low=3e-4, eps_high=4e-4)
    gspo = first_valid(grad_of(agg.aggregate(loss, mask, "seq_mean_token_mean"), lp), mask)
    return {"lengths": list(lengths), "registry_mode": methods.get("luspo").aggregation,
            "token_mean_grad": grads["token_mean"], "seq_mean_grad": grads["seq_mean_token_mean"],
            "gspo_grad": gspo, "seq_mean_equals_gspo": grads["seq_mean_token_mean"] == gspo}


@example("ggpo_coefficients")
def ggpo_coefficients(rewards, ref_log_ratio, beta, coef_clip):
    r = torch.tensor([float(v) for v in rewards], dtype=F64)
    lr = torch.tensor([float(v) for v in ref_log_ratio], dtype=F64)
    kappa, gap, a = objectives.gibbs_coefficients(lr, r, torch.zeros(len(rewards), dtype=torch.long),
                                                  beta=beta, coef_clip=coef_clip)
    return {"rewards": list(map(float, rewards)), "beta": beta, "coef_clip": coef_clip, "a": flat(a),
            "softmax": flat(kappa + 1.0 / len(rewards)), "kappa": flat(kappa), "gap": scalar(gap[0]),
            "kappa_sum": scalar(kappa.sum())}


@example("ggpo_clip_gradient")
def ggpo_clip_gradient(rewards, ref_log_ratio, beta, coef_clip):
    """One token per response with lp − lp_ref = ref_log_ratio; gradient of the
    seq_mean_token_sum loss with respect to each response's log-prob."""
    lp_ref = torch.full((len(rewards), 1), -2.0, dtype=F64)
    lp = grad_leaf(lp_ref + torch.tensor([float(v) for v in ref_log_ratio], dtype=F64).unsqueeze(-1))
    mask = ones_mask(lp)
    r = torch.tensor([float(v) for v in rewards], dtype=F64)
    g = torch.zeros(len(rewards), dtype=torch.long)
    loss, m = objectives.ggpo(lp, lp_ref, r, g, mask, beta=beta, coef_clip=coef_clip)
    kappa, _, a = objectives.gibbs_coefficients(lp.detach().sub(lp_ref).sum(-1), r, g, beta=beta,
                                                coef_clip=coef_clip)
    return {"rewards": list(map(float, rewards)), "ref_log_ratio": list(map(float, ref_log_ratio)),
            "coef_clip": coef_clip, "a": flat(a), "kappa": flat(kappa),
            "grad": grad_of(agg.aggregate(loss, mask, "seq_mean_token_sum"), lp),
            "frac_clipped": scalar(m["ggpo/frac_ref_ratio_clipped"])}


@example("ggpo_vs_grpo")
def ggpo_vs_grpo(rewards, beta_small, beta_large):
    r = torch.tensor([float(v) for v in rewards], dtype=F64)
    g = torch.zeros(len(rewards), dtype=torch.long)
    zero = torch.zeros_like(r)
    k_small, _, _ = objectives.gibbs_coefficients(zero, r, g, beta=beta_small, coef_clip=5.0)
    k_large, _, _ = objectives.gibbs_coefficients(zero, r, g, beta=beta_large, coef_clip=5.0)
    return {"rewards": list(map(float, rewards)), "beta_small": beta_small, "beta_large": beta_large,
            "grpo": flat(advantages.grpo(r, g, std="unbiased")), "grpo_x10": flat(advantages.grpo(10 * r, g)),
            "kappa_small_beta": flat(k_small), "kappa_large_beta": flat(k_large)}


@example("ggpo_signature")
def ggpo_signature(rewards, tokens_per_response):
    params = list(inspect.signature(objectives.ggpo).parameters)
    B, T = len(rewards), int(tokens_per_response)
    lp_ref = torch.full((B, T), -1.0, dtype=F64)
    lp = grad_leaf(lp_ref)
    mask = ones_mask(lp)
    r = torch.tensor([float(v) for v in rewards], dtype=F64)
    g = torch.zeros(B, dtype=torch.long)
    loss, _ = objectives.ggpo(lp, lp_ref, r, g, mask, beta=1.0, coef_clip=5.0)
    grad = torch.tensor(grad_of(agg.aggregate(loss, mask, methods.get("ggpo").aggregation), lp),
                        dtype=F64).reshape(B, T)
    kappa, _, _ = objectives.gibbs_coefficients(torch.zeros(B, dtype=F64), r, g, beta=1.0, coef_clip=5.0)
    return {"arguments": ", ".join(params), "reads_behavior": any("behavior" in p for p in params),
            "aggregation": methods.get("ggpo").aggregation, "grad_first_token": flat(grad[:, 0]),
            "minus_kappa_over_B": flat(-kappa / B), "n_responses": B}
