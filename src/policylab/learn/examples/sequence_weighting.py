"""Worked examples: objectives that weight tokens, turns and episodes (erpo, tlm_dre,
rlid), each computed by the method's own kernels or its registered loss."""

from __future__ import annotations

import torch

from policylab import methods
from policylab.kernels import advantages as adv_mod
from policylab.kernels import aggregate as agg_mod
from policylab.kernels.objectives import erpo as erpo_k
from policylab.kernels.objectives import rlid as rlid_k
from policylab.kernels.objectives import tlm_dre as tlm_k
from policylab.learn.examples.core_common import all_valid, error_head, f64, num, nums, single_group
from policylab.learn.examples.registry import example
from policylab.methods.loss import policy_loss, tensor_inputs
from policylab.models.logprobs import token_logprobs


# ============================================================================ erpo


@example("erpo_weights")
def erpo_weights(typicality, qkl_coef):
    w, info = erpo_k.question_weights(f64(typicality), qkl_coef=qkl_coef)
    return {"typicality": nums(f64(typicality)), "qkl_coef": qkl_coef, "weights": nums(w),
            "mean": num(w.mean()), "query_kl": num(info["erpo/query_kl"])}


@example("erpo_penalty_sweep")
def erpo_penalty_sweep(typicality, coefs):
    rows = [erpo_k.question_weights(f64(typicality), qkl_coef=c) for c in coefs]
    return {"typicality": nums(f64(typicality)), "coefs": [float(c) for c in coefs],
            "max_weights": nums(f64([float(w.max()) for w, _ in rows])),
            "query_kls": nums(f64([i["erpo/query_kl"] for _, i in rows]))}


@example("erpo_vs_grpo")
def erpo_vs_grpo(rewards, typicality, qkl_coef):
    r = f64([float(x) for x in rewards])
    g = torch.tensor([0, 0, 1, 1])
    a = adv_mod.grpo(r, g, std="unbiased")
    tau = f64(typicality)
    w, _ = erpo_k.question_weights(tau, qkl_coef=qkl_coef)
    # the same prompts with every reward flipped: GRPO's advantages change sign, and the
    # ERPO advantages divided by them give back the same weights (ω reads no reward)
    a_flip = adv_mod.grpo(1.0 - r, g, std="unbiased")
    erpo_flip = a_flip * erpo_k.question_weights(tau, qkl_coef=qkl_coef)[0]
    return {"rewards": nums(r), "grpo": nums(a), "weights": nums(w), "erpo": nums(a * w),
            "erpo_flipped": nums(erpo_flip), "weights_after_flipping_rewards": nums(erpo_flip / a_flip)}


@example("erpo_question_tokens")
def erpo_question_tokens(prompt_logp, question_mask):
    lp = f64(prompt_logp).reshape(1, -1)
    q = torch.tensor(question_mask).reshape(1, -1)
    tau = erpo_k.question_typicality(lp, q)
    everything = erpo_k.question_typicality(lp, torch.ones_like(q))  # every prompt token, template included
    refusal = error_head(lambda: methods.get("erpo").with_params({"kl_coef": 0.05}, methods.RunShape()))
    return {"prompt_logp": nums(lp.reshape(-1)), "typicality": num(tau[0]),
            "with_template_tokens": num(everything[0]), "refusal": refusal}


# ============================================================================ tlm_dre


@example("tlm_turn_weights")
def tlm_turn_weights(turn_logp_ref, tau):
    """Turn weights from per-turn reference log-probs (lists of token log-probs)."""
    flat = [v for turn in turn_logp_ref for v in turn]
    ids = [k for k, turn in enumerate(turn_logp_ref) for _ in turn]
    lp = f64(flat).reshape(1, -1)
    c, present = tlm_k.turn_confidence(lp, torch.tensor([ids]), all_valid(lp))
    lam = tlm_k.turn_weights(c, present, tau=tau)
    return {"confidence": nums(c.reshape(-1)), "tau": tau, "weights": nums(lam.reshape(-1))}


@example("tlm_token_gradients")
def tlm_token_gradients(log_ratios, kappa_pos, kappa_neg):
    u = f64(log_ratios).reshape(1, -1)
    lp_ref = torch.full_like(u, -1.0)
    out = {}
    for name, pol in (("positive", 1.0), ("negative", -1.0)):
        lp = (lp_ref + u).requires_grad_(True)
        loss, _ = tlm_k.tlm_dre(lp, lp_ref, f64([pol]), torch.zeros_like(u, dtype=torch.long), all_valid(u), tau=1.0,
                                kappa_pos=kappa_pos, kappa_neg=kappa_neg)
        (g,) = torch.autograd.grad(loss.sum(), lp)
        out[name] = nums(g.reshape(-1))
    return {"log_ratios": nums(u.reshape(-1)), "kappa_pos": kappa_pos, "kappa_neg": kappa_neg,
            "grad_positive": out["positive"], "grad_negative": out["negative"]}


@example("tlm_vs_grpo")
def tlm_vs_grpo(turn_logp_ref, reward):
    flat = [v for turn in turn_logp_ref for v in turn]
    ids = [k for k, turn in enumerate(turn_logp_ref) for _ in turn]
    lp_ref = f64(flat).reshape(1, -1)
    lp = lp_ref.clone().requires_grad_(True)
    pol = f64([1.0 if reward >= 0.5 else -1.0])
    loss, _ = tlm_k.tlm_dre(lp, lp_ref, pol, torch.tensor([ids]), all_valid(lp), tau=1.0, kappa_pos=0.0, kappa_neg=1.0)
    (g,) = torch.autograd.grad(agg_mod.aggregate(loss, all_valid(lp), "token_mean"), lp)
    lp2 = lp_ref.clone().requires_grad_(True)
    host, _ = policy_loss(methods.get("grpo").with_params({"kl_coef": 0.0}), tensor_inputs(lp2, pol, all_valid(lp2)))
    (g2,) = torch.autograd.grad(agg_mod.aggregate(host, all_valid(lp2), "token_mean"), lp2)
    return {"turn_of_token": ids, "tlm_grad": nums(g.reshape(-1)), "grpo_grad": nums(g2.reshape(-1))}


@example("tlm_merge_and_missing")
def tlm_merge_and_missing(turn_logp_ref):
    flat = [v for turn in turn_logp_ref for v in turn]
    ids = [k for k, turn in enumerate(turn_logp_ref) for _ in turn]
    lp = f64(flat).reshape(1, -1)
    m = all_valid(lp)
    lam = tlm_k.turn_weights(*tlm_k.turn_confidence(lp, torch.tensor([ids]), m), tau=1.0)
    merged = tlm_k.turn_weights(*tlm_k.turn_confidence(lp, torch.zeros_like(lp, dtype=torch.long), m), tau=1.0)
    missing = error_head(lambda: tlm_k.tlm_dre(lp, lp, f64([1.0]), None, m, tau=1.0, kappa_pos=0.0, kappa_neg=1.0))
    return {"separate": nums(lam.reshape(-1)), "merged": nums(merged[0, :1]), "missing": missing}


# ============================================================================ rlid


@example("rlid_label_marginal")
def rlid_label_marginal(rows_a, rows_b):
    out = {}
    for key, rows in (("a", rows_a), ("b", rows_b)):
        lp = torch.log(f64(rows))
        out[f"R_{key}"] = num(rlid_k.label_marginal_kl(lp, single_group(lp.shape[0])))
        out[f"mbar_{key}"] = nums(lp.exp().mean(0))
    return {"rows_a": str(rows_a), "rows_b": str(rows_b), **out}


@example("rlid_episode_weights")
def rlid_episode_weights(episode_id, episode_len):
    w = rlid_k.episode_weights(torch.tensor(episode_id), torch.tensor(episode_len))
    totals = {}
    for e, v in zip(episode_id, w.tolist()):
        totals[e] = totals.get(e, 0.0) + v
    return {"episode_len": list(episode_len), "weights": nums(w), "episode_totals": nums(f64(list(totals.values())))}


@example("rlid_menu_renormalized")
def rlid_menu_renormalized(logits, menu, chosen):
    """The chosen label's probability over the whole vocabulary and over the menu only."""
    z = f64(logits).reshape(1, 1, -1)
    target = torch.tensor([[chosen]])
    full = token_logprobs(z, target).exp()
    over_menu = token_logprobs(z, target, allowed_ids=tuple(menu)).exp()
    return {"menu": list(menu), "chosen": chosen, "p_full_vocabulary": num(full[0, 0]),
            "p_over_menu": num(over_menu[0, 0])}


@example("rlid_marginal_estimator")
def rlid_marginal_estimator(probs):
    """Exact ∇R against the expectation of the sampled estimator, on menu logits."""
    z = torch.log(f64(probs)).requires_grad_(True)
    grp = single_group(z.shape[0])
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
    return {"probs": str(probs), "exact_grad_row0": nums(exact[0]), "expected_grad_row0": nums(expected[0]),
            "coef_row0": nums(torch.stack(coefs, 1)[0]), "max_abs_difference": num((exact - expected).abs().max())}
