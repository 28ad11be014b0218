"""Worked examples for the cross-method questions of topics.yaml."""

from __future__ import annotations

import torch
from policylab.kernels import advantages, aggregate as agg, corrections, kl, objectives
from policylab import methods

from policylab.kernels.rewards import ttrl_rewards
from policylab.learn.examples.registry import example
from policylab.learn.examples.offpolicy_common import F64, row_tensor, log_row, ones_mask, flat, scalar, grad_leaf, grad_of, padded_rows


@example("xm_engine_vs_policy_ratio")
def xm_engine_vs_policy_ratio(p_behavior, p_old, adv, cap, eps):
    """First minibatch (π_θ = π_old in value) of a batch with engine mismatch."""
    lp_mu, lp_old = log_row([p_behavior]), log_row([p_old])
    mask = ones_mask(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    right, _ = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    lp = grad_leaf(lp_old)
    wrong_w, _ = corrections.tis(lp, lp_old, mask, cap=cap)  # "TIS" on π_θ/π_old: always 1 here
    l_ok, _ = objectives.ppo_clip(lp, lp_old, a, mask, eps_low=eps, eps_high=eps)
    lp2 = grad_leaf(lp_old)
    l_bad, _ = objectives.ppo_clip(lp2, lp_mu, a, mask, eps_low=eps, eps_high=eps)  # clip on π_θ/μ
    return {"engine_ratio": p_old / p_behavior, "cap": cap, "eps": eps, "right_weight": scalar(right[0, 0]),
            "swapped_weight": scalar(wrong_w[0, 0]), "ppo_policy_grad": grad_of(l_ok.sum(), lp)[0],
            "ppo_engine_grad": grad_of(l_bad.sum(), lp2)[0]}


@example("xm_cispo_ppo")
def xm_cispo_ppo(rho, adv, eps_low, eps_high):
    lp_old = log_row([0.3] * len(rho))
    mask = ones_mask(lp_old)
    a = row_tensor(adv)
    out = {"rho": list(map(float, rho)), "adv": list(map(float, adv)), "eps_high": eps_high}
    for name, fn in (("ppo", objectives.ppo_clip), ("cispo", objectives.cispo), ("gppo", objectives.gppo)):
        lp = grad_leaf(lp_old + torch.log(row_tensor(rho)))
        loss, _ = fn(lp, lp_old, a, mask, eps_low=eps_low, eps_high=eps_high)
        out[f"{name}_grad"] = grad_of(loss.sum(), lp)
    return out


@example("xm_dr_grpo_grpo")
def xm_dr_grpo_grpo(rewards, scale):
    r = torch.tensor([float(v) for v in rewards], dtype=F64)
    g = torch.zeros(len(rewards), dtype=torch.long)
    return {"rewards": list(map(float, rewards)), "scale": scale,
            "grpo": flat(advantages.grpo(r, g, std="unbiased")),
            "grpo_scaled": flat(advantages.grpo(scale * r, g, std="unbiased")),
            "dr_grpo": flat(advantages.dr_grpo(r, g)), "dr_grpo_scaled": flat(advantages.dr_grpo(scale * r, g))}


@example("xm_k1_k3")
def xm_k1_k3(log_ratio_to_ref):
    """Per-token value and autograd gradient of k1/k2/k3 at lp − lp_ref = given values."""
    lp_ref = torch.full((1, len(log_ratio_to_ref)), -2.0, dtype=F64)
    where_zh = {"loss": "损失", "reward": "奖励"}
    out = {"log_ratio": list(map(float, log_ratio_to_ref))}
    for name in ("grpo", "reinforce_pp"):
        p = methods.get(name).p
        out[f"{name}_kl"] = f"{p.kl_estimator} in the {p.kl_placement}"
        out[f"{name}_kl_zh"] = f"{p.kl_estimator}（放在{where_zh[p.kl_placement]}中）"
    for name in ("k1", "k2", "k3"):
        lp = grad_leaf(lp_ref + row_tensor(log_ratio_to_ref))
        v = getattr(kl, name)(lp, lp_ref)
        out[f"{name}_value"], out[f"{name}_grad"] = flat(v), grad_of(v.sum(), lp)
    return out


@example("xm_aggregation_length")
def xm_aggregation_length(losses, L_norm):
    """Per-token losses of ragged responses under the three reductions."""
    loss, mask = padded_rows(losses)
    return {"token_mean": scalar(agg.aggregate(loss, mask, "token_mean")),
            "seq_mean_token_mean": scalar(agg.aggregate(loss, mask, "seq_mean_token_mean")),
            "seq_mean_token_sum_norm": scalar(agg.aggregate(loss, mask, "seq_mean_token_sum_norm", L_norm=L_norm)),
            "L_norm": L_norm, "dapo_mode": methods.get("dapo").aggregation,
            "grpo_mode": methods.get("grpo").aggregation, "dr_grpo_mode": methods.get("dr_grpo").aggregation}


@example("xm_ttrl_grpo")
def xm_ttrl_grpo(completions, tied_completions):
    """Majority-vote pseudo-rewards feeding GRPO advantages; a tied vote gives no label."""
    rewards, eligible, info = ttrl_rewards(list(completions), [0] * len(completions))
    adv = advantages.grpo(rewards.to(F64), torch.zeros(len(completions), dtype=torch.long), std="unbiased")
    _, tie_eligible, tie_info = ttrl_rewards(list(tied_completions), [0] * len(tied_completions))
    return {"label": str(info["labels"][0]), "rewards": flat(rewards), "advantages": flat(adv),
            "eligible": bool(eligible.all()), "tie_label": str(tie_info["labels"][0]),
            "tie_eligible": bool(tie_eligible.any())}
