"""Worked examples: staleness and off-policy tokens (gmc, missing_old_logits, minirl, sis)."""

from __future__ import annotations

import math
import torch
from policylab.kernels import corrections, objectives

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
    engine_pair,
    versioned,
    sis_inputs,
    method_loss,
)


@example("gmc_cap")
def gmc_cap(weights, group, cap):
    w = torch.tensor([float(v) for v in weights], dtype=F64)
    g = torch.tensor(group)
    out, m = corrections.gmc(w, g, cap=cap)
    return {"weights": list(map(float, weights)), "group": str(list(group)), "cap": cap, "capped": flat(out),
            "max_mass_before": scalar(m["gmc/max_group_mass"]), "max_mass_after": scalar(m["gmc/max_group_mass_capped"]),
            "frac_groups_capped": scalar(m["gmc/frac_groups_capped"]),
            "ess_before": scalar(m["gmc/ess_before"]), "ess_after": scalar(m["gmc/ess_after"])}


@example("gmc_vs_trajectory_clip")
def gmc_vs_trajectory_clip(weights, cap, clip):
    """GMC on one group vs clipping each trajectory weight on its own (the `mis` kernel in
    truncate mode on one-token trajectories whose log-ratio is log w)."""
    w = torch.tensor([float(v) for v in weights], dtype=F64)
    capped, _ = corrections.gmc(w, torch.zeros(len(weights), dtype=torch.long), cap=cap)
    lp_num = torch.log(w).unsqueeze(-1)
    clipped, _ = corrections.mis(lp_num, torch.zeros_like(lp_num), ones_mask(lp_num), low=0.0, high=clip,
                                 kind="product", mode="truncate")
    return {"weights": list(map(float, weights)), "cap": cap, "clip": clip, "gmc": flat(capped),
            "clipped": flat(clipped), "gmc_mass": scalar(capped.sum()), "clipped_mass": scalar(clipped.sum()),
            "gmc_first_over_second": scalar(capped[0] / capped[1]),
            "clipped_first_over_second": scalar(clipped[0] / clipped[1])}


@example("gmc_edge")
def gmc_edge(weights, cap, bad_weights):
    w = torch.tensor([float(v) for v in weights], dtype=F64)
    out, m = corrections.gmc(w, torch.full((len(weights),), 5), cap=cap)
    bad = torch.tensor([float(v) for v in bad_weights], dtype=F64)
    msg = error_text(lambda: corrections.gmc(bad, torch.zeros(len(bad_weights), dtype=torch.long), cap=cap))
    return {"weights": list(map(float, weights)), "cap": cap, "mass": scalar(w.sum()), "capped": flat(out),
            "rescaled": scalar(m["gmc/frac_groups_capped"]) > 0, "bad_weights": str(list(bad_weights)),
            "negative_error": msg}


@example("mol_decompose")
def mol_decompose(p_behavior, p_old, p_current):
    lp_mu, lp_old, lp_now = log_row([p_behavior]), log_row([p_old]), log_row([p_current])
    parts = corrections.decompose(lp_now, lp_old, lp_mu, ones_mask(lp_now))
    d, s, total = (math.exp(scalar(parts[k][0, 0])) for k in ("engine_log_ratio", "staleness_log_ratio",
                                                           "total_log_ratio"))
    return {"p_behavior": p_behavior, "p_old": p_old, "p_current": p_current, "d": d, "s": s,
            "total": total, "d_times_s": d * s, "matches": abs(d * s - total) < 1e-12}


@example("mol_total_vs_decoupled")
def mol_total_vs_decoupled(p_behavior, p_old, p_current, adv, cap, eps):
    lp_mu, lp_old, lp_now = log_row([p_behavior]), log_row([p_old]), log_row([p_current])
    mask = ones_mask(lp_now)
    a = torch.full((1,), float(adv), dtype=F64)
    lp = grad_leaf(lp_now)
    single, _ = objectives.ppo_clip(lp, lp_mu, a, mask, eps_low=eps, eps_high=eps)  # one clip on π_θ/μ
    g_single = grad_of(single.sum(), lp)[0]
    lp2 = grad_leaf(lp_now)
    loss, m = method_loss("missing_old_logits", {"tis_cap": cap, "eps_low": eps, "eps_high": eps}, lp2, a, mask,
                           logp_old=lp_old, logp_behavior=lp_mu)
    return {"p_behavior": p_behavior, "p_old": p_old, "p_current": p_current, "adv": adv, "cap": cap, "eps": eps,
            "d": p_old / p_behavior, "s": p_current / p_old, "total": p_current / p_behavior,
            "single_clip_grad": g_single, "decoupled_grad": grad_of(loss.sum(), lp2)[0]}


@example("mol_vs_minirl")
def mol_vs_minirl(p_behavior, p_old, p_current, adv, cap, eps):
    lp_mu, lp_old, lp_now = log_row(p_behavior), log_row(p_old), log_row(p_current)
    mask = ones_mask(lp_now)
    a = torch.full((1,), float(adv), dtype=F64)
    lp1, lp2 = grad_leaf(lp_now), grad_leaf(lp_now)
    clip_ = {"eps_low": eps, "eps_high": eps}
    l1, _ = method_loss("missing_old_logits", {"tis_cap": cap, **clip_}, lp1, a, mask, logp_old=lp_old,
                         logp_behavior=lp_mu)
    l2, _ = method_loss("minirl", {"engine_cap": cap, **clip_}, lp2, a, mask, logp_old=lp_old, logp_behavior=lp_mu)
    g1, g2 = grad_of(l1.sum(), lp1), grad_of(l2.sum(), lp2)
    # missing_old_logits checks the old log-probs' version before any loss (its round stage);
    # minirl has no such check: a stale logp_old goes through
    stale_old = versioned(lp_old, 6, "trainer")
    refused = error_text(lambda: corrections.require_exact_old(stale_old, versioned(lp_mu, 7, "bf16")))
    accepted = error_text(lambda: method_loss("minirl", {"engine_cap": cap, **clip_}, grad_leaf(lp_now), a, mask,
                                           logp_old=stale_old.tensor, logp_behavior=lp_mu))
    return {"mol_loss": flat(l1), "minirl_loss": flat(l2), "mol_grad": g1, "minirl_grad": g2,
            "same": bool(torch.allclose(l1, l2)) and g1 == g2, "mol_version_error": refused,
            "minirl_version_error": accepted}


@example("mol_refusals")
def mol_refusals(p_behavior, p_old):
    lp_mu, lp_old = log_row([p_behavior]), log_row([p_old])
    beh = versioned(lp_mu, 5, "bf16")
    approx = corrections.VersionedLogprobs(lp_old, 5, "trainer", "approx_ewma")
    return {"missing": error_text(lambda: corrections.require_exact_old(None, beh)),
            "approx": error_text(lambda: corrections.require_exact_old(approx, beh)),
            "version": error_text(lambda: corrections.require_exact_old(versioned(lp_old, 4, "trainer"), beh)),
            "exact_ok": error_text(lambda: corrections.require_exact_old(versioned(lp_old, 5, "trainer"), beh))}


@example("minirl_first_minibatch")
def minirl_first_minibatch(p_old, p_behavior, adv, eps):
    """ρ = 1: the clipped term is inactive and MiniRL = REINFORCE weighted by π_old/μ."""
    lp_old, lp_mu = log_row(p_old), log_row(p_behavior)
    mask = ones_mask(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    lp = grad_leaf(lp_old)
    loss, _ = method_loss("minirl", {"eps_low": eps, "eps_high": eps}, lp, a, mask, logp_old=lp_old,
                           logp_behavior=lp_mu)
    lp2 = grad_leaf(lp_old)
    w, _ = corrections.tis(lp_old, lp_mu, mask, cap=math.inf)  # the untruncated engine ratio
    ref, _ = objectives.reinforce(lp2, a, mask, weight=w)
    g1, g2 = grad_of(loss.sum(), lp), grad_of(ref.sum(), lp2)
    return {"adv": adv, "engine_ratio": flat(w), "minirl_grad": g1, "reinforce_grad": g2,
            "equal": all(abs(x - y) < 1e-12 for x, y in zip(g1, g2))}


@example("minirl_minibatches")
def minirl_minibatches(ratio_engine, rhos, adv, eps):
    """One token per entry of `rhos`: later minibatches see ρ ≠ 1 and the clip bites."""
    lp_old, lp_mu = engine_pair([ratio_engine] * len(rhos))
    mask = ones_mask(lp_old)
    lp = grad_leaf(lp_old + torch.log(row_tensor(rhos)))
    a = torch.full((1,), float(adv), dtype=F64)
    loss, m = method_loss("minirl", {"eps_low": eps, "eps_high": eps}, lp, a, mask, logp_old=lp_old,
                           logp_behavior=lp_mu)
    return {"ratio_engine": ratio_engine, "rhos": list(map(float, rhos)), "adv": adv, "eps": eps,
            "grad": grad_of(loss.sum(), lp), "clip_frac": scalar(m["policy/clip_frac"])}


@example("minirl_vs_tis")
def minirl_vs_tis(ratio_engine, adv, cap, eps):
    lp_old, lp_mu = engine_pair([ratio_engine])
    mask = ones_mask(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    lp = grad_leaf(lp_old)
    loss, _ = method_loss("minirl", {"eps_low": eps, "eps_high": eps}, lp, a, mask, logp_old=lp_old,
                           logp_behavior=lp_mu)
    w, _ = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    lp2 = grad_leaf(lp_old)
    host, _ = objectives.ppo_clip(lp2, lp_old, a, mask, eps_low=eps, eps_high=eps)
    return {"ratio_engine": ratio_engine, "cap": cap, "minirl_grad": grad_of(loss.sum(), lp)[0],
            "tis_grad": grad_of((host * w).sum(), lp2)[0], "tis_weight": scalar(w[0, 0])}


@example("minirl_routing")
def minirl_routing(layers, k):
    rec = corrections.RoutingRecord(torch.zeros((1, 3, layers, k), dtype=torch.long), "tiny-moe")
    return {"dense_with_routes": error_text(lambda: corrections.check_routing(rec, model_is_moe=False,
                                                                          n_layers=layers, k=k)),
            "moe_without_routes": error_text(lambda: corrections.check_routing(None, model_is_moe=True,
                                                                           n_layers=layers, k=k)),
            "wrong_top_k": error_text(lambda: corrections.check_routing(rec, model_is_moe=True, n_layers=layers,
                                                                    k=k + 1)),
            "ok": error_text(lambda: corrections.check_routing(rec, model_is_moe=True, n_layers=layers, k=k,
                                                           batch_shape=(1, 3), model_id="tiny-moe"))}


@example("sis_accept_prob")
def sis_accept_prob(behavior_topk, current_topk, sampled, positions, seed):
    lp, ids, lmk, lpk, tok, lmu, mask = sis_inputs(behavior_topk, current_topk, sampled, positions)
    gen = torch.Generator().manual_seed(int(seed))
    acc, m = corrections.sis(lp, ids, lmk, lpk, tok, lmu, mask, generator=gen)
    return {"p_current": float(current_topk[sampled]), "p_behavior": float(behavior_topk[sampled]),
            "envelope": math.exp(scalar(m["sis/log_envelope_mean"])), "accept_prob": scalar(m["sis/accept_prob_mean"]),
            "accept_rate": scalar(m["sis/accept_rate"]), "positions": positions}


@example("sis_mechanism")
def sis_mechanism(topk, positions, seed):
    """π = μ: every token accepted; an accepted token's ratio is the unit carrier."""
    lp, ids, lmk, lpk, tok, lmu, mask = sis_inputs(topk, topk, 0, positions)
    acc, m = corrections.sis(lp, ids, lmk, lpk, tok, lmu, mask, generator=torch.Generator().manual_seed(seed))
    # an accepted token's ratio denominator becomes sg(lp): ratio value 1, gradient ∇lp
    from policylab.methods.loss import tensor_inputs
    from policylab.methods.stages.losses import sis_denominator

    leaf = grad_leaf(lp[:, :1])
    inp = tensor_inputs(leaf, torch.ones(1, dtype=F64), ones_mask(leaf), logp_old=leaf.detach() - 0.5,
                        extras={"sis_accepted": torch.ones_like(leaf, dtype=torch.bool)})
    ratio = torch.exp(leaf - sis_denominator(inp, None).logp_old)
    return {"accept_rate": scalar(m["sis/accept_rate"]), "envelope": math.exp(scalar(m["sis/log_envelope_mean"])),
            "carrier_value": scalar(ratio[0, 0]), "carrier_grad": grad_of(ratio.sum(), leaf)[0]}


@example("sis_vs_ppo")
def sis_vs_ppo(rho, adv, eps):
    """A token with ρ = π_θ/π_old above 1 + ε and A > 0: accepted by SIS vs clipped by PPO."""
    lp_old = log_row([0.2])
    mask = ones_mask(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)

    def host_grad(accepted: bool) -> float:
        lp = grad_leaf(lp_old + math.log(rho))
        loss, _ = method_loss("sis", {"eps_low": eps, "eps_high": eps}, lp, a, mask, logp_old=lp_old,
                               extras={"sis_accepted": torch.full_like(mask, accepted)})
        return grad_of(loss.sum(), lp)[0]

    lp = grad_leaf(lp_old + math.log(rho))
    ppo, _ = objectives.ppo_clip(lp, lp_old, a, mask, eps_low=eps, eps_high=eps)
    return {"rho": rho, "adv": adv, "eps": eps, "accepted_grad": host_grad(True),
            "rejected_grad": host_grad(False), "ppo_grad": grad_of(ppo.sum(), lp)[0]}


@example("sis_seeded")
def sis_seeded(behavior_topk, current_topk, positions, seed):
    args = sis_inputs(behavior_topk, current_topk, 0, positions)
    run = lambda s: corrections.sis(*args, generator=torch.Generator().manual_seed(s))[0]  # noqa: E731
    a, b, c = run(seed), run(seed), run(seed + 1)
    return {"seed": seed, "same_seed_equal": bool(torch.equal(a, b)),
            "other_seed_differs": int((a != c).sum()), "positions": positions,
            "no_generator": error_text(lambda: corrections.sis(*args, generator=None))}
