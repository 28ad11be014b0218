"""Worked examples: advantage estimators and rewards (grpo, grpo_process, dr_grpo, rloo, remax, reinforce_pp, ppo/gae, vapo, ttrl)."""

from __future__ import annotations

import torch
from policylab.kernels import advantages as adv_mod
from policylab.kernels import aggregate as agg_mod
from policylab.kernels import filters, kl
from policylab.errors import PolicylabError
from policylab.kernels.rewards import pseudo_label_agreement, ttrl_rewards
from policylab.kernels.rewards.verifiers import exact_numeric_reward
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
    grads_at_ratio_one,
    rpp_inputs,
    answer_texts,
)


@example("grpo_group_advantages")
def grpo_group_advantages(rewards, group=None, std="unbiased", eps=1e-6):
    r = f64(rewards)
    a = adv_mod.grpo(r, group_ids(group, len(rewards)), std=std, eps=eps)
    return {"rewards": nums(r), "advantages": nums(a), "adv_sum": num(a.sum()),
            "std_convention": str(std), "group_size": len(rewards)}


@example("grpo_std_conventions")
def grpo_std_conventions(rewards):
    r, g = f64(rewards), group_ids(None, len(rewards))
    unb = adv_mod.grpo(r, g, std="unbiased", eps=0.0)
    pop = adv_mod.grpo(r, g, std="population", eps=0.0)
    dr = adv_mod.dr_grpo(r, g)
    flat = adv_mod.grpo(torch.ones(len(rewards), dtype=F64), g, std="unbiased")
    return {"rewards": nums(r), "adv_unbiased": nums(unb), "adv_population": nums(pop),
            "centred": nums(dr), "pop_over_unbiased": num(pop[0] / unb[0]),
            "all_equal_adv": nums(flat), "group_size": len(rewards)}


@example("grpo_first_step")
def grpo_first_step(rewards, lengths, std="unbiased"):
    """lp = lp_old: the policy part of the loss value is 0 under seq_mean_token_mean, but
    the gradient is not (each response's tokens get −A_i/(B·|y_i|))."""
    a = adv_mod.grpo(f64(rewards), group_ids(None, len(rewards)), std=std)
    mask = lengths_mask(lengths)
    value, grad = grads_at_ratio_one(a, mask, "seq_mean_token_mean")
    tok_value, _ = grads_at_ratio_one(a, mask, "token_mean")
    return {"rewards": nums(rewards), "lengths": [int(n) for n in lengths],
            "advantages": nums(a), "loss_value": num(value),
            "token_grads": nums(grad[:, 0]), "token_mean_loss_value": num(tok_value)}


@example("group_advantage_estimators")
def group_advantage_estimators(rewards, group, std="unbiased"):
    """One batch of grouped rewards through four group-relative estimators."""
    r, g = f64(rewards), group_ids(group, len(rewards))
    dr = adv_mod.dr_grpo(r, g)
    rpp = adv_mod.reinforce_pp_baseline(r, g, scale="batch_std")
    k = int(dr.abs().argmax())
    keep, _ = filters.dynamic_sampling_keep(r, g)  # groups with some spread
    rpp_kept = adv_mod.reinforce_pp_baseline(r[keep], g[keep], scale="batch_std")
    kk = int(dr[keep].abs().argmax())
    # spread of the centred rewards of the first two groups (their ratio is shown in the text)
    gaps = [float(dr[g == i].max() - dr[g == i].min()) for i in torch.unique(g).tolist()]
    return {"rewards": nums(r), "grpo": nums(adv_mod.grpo(r, g, std=std)), "dr_grpo": nums(dr),
            "rloo": nums(adv_mod.rloo(r, g)), "reinforce_pp_baseline": nums(rpp),
            "rpp_scale": num(dr[k] / rpp[k]), "rpp_scale_no_flat": num(dr[keep][kk] / rpp_kept[kk]),
            "gap_ratio": num(gaps[0] / gaps[1]) if len(gaps) >= 2 and gaps[1] else 0.0,
            "std_convention": str(std)}


@example("dr_grpo_affine")
def dr_grpo_affine(rewards, scale, shift):
    r, g = f64(rewards), group_ids(None, len(rewards))
    return {"rewards": nums(r), "scale": echo(scale), "shift": echo(shift),
            "dr": nums(adv_mod.dr_grpo(r, g)), "dr_scaled": nums(adv_mod.dr_grpo(scale * r, g)),
            "dr_shifted": nums(adv_mod.dr_grpo(r + shift, g)),
            "grpo": nums(adv_mod.grpo(r, g)), "grpo_scaled": nums(adv_mod.grpo(scale * r, g))}


@example("dr_grpo_lnorm_pitfall")
def dr_grpo_lnorm_pitfall(batch_a, batch_b, adv, L_norm):
    """Token gradient of sequence 0 in two batches: fixed L_norm vs 'L_norm = longest'."""
    out = {"batch_a": [int(n) for n in batch_a], "batch_b": [int(n) for n in batch_b],
           "L_norm": echo(L_norm)}
    for name, lengths in (("a", batch_a), ("b", batch_b)):
        mask, a = lengths_mask(lengths), f64(adv)
        _, fixed = grads_at_ratio_one(a, mask, "seq_mean_token_sum_norm", L_norm=L_norm)
        _, longest = grads_at_ratio_one(a, mask, "seq_mean_token_sum_norm", L_norm=max(lengths))
        out[f"fixed_{name}"] = num(-fixed[0, 0] / a[0])  # weight c: ∂L/∂lp = −c·A
        out[f"longest_{name}"] = num(-longest[0, 0] / a[0])
    return out


@example("grpo_process_advantages")
def grpo_process_advantages(step_rewards, step_ends, T, std="population"):
    """Two (or more) responses of one prompt; pool = the group, and for contrast each
    response normalized on its own (a different, wrong pool)."""
    r = f64(step_rewards)
    ends = torch.tensor(step_ends, dtype=torch.long)
    smask = torch.ones_like(ends, dtype=torch.bool)
    B = r.shape[0]
    a = adv_mod.grpo_process(r, ends, smask, torch.zeros(B, dtype=torch.long), T=T, std=std)
    own = adv_mod.grpo_process(r, ends, smask, torch.arange(B), T=T, std=std)
    # the normalized step scores alone: every step of this one-prompt example is valid, so
    # the pool is all of `r` and grpo's group standardization over it is the same statistic
    normed = adv_mod.grpo(r.flatten(), torch.zeros(r.numel(), dtype=torch.long), std=std).view_as(r)
    out = {"T": int(T), "std_convention": str(std)}
    for i in range(B):
        out[f"steps{i}"] = nums(r[i])
        out[f"ends{i}"] = [int(e) for e in ends[i]]
        out[f"normed{i}"] = nums(normed[i])
        out[f"adv{i}"] = nums(a[i])
        out[f"own_pool{i}"] = nums(own[i])
    return out


@example("grpo_process_single_step")
def grpo_process_single_step(rewards, T, std="unbiased"):
    """One step per response ending at the last token = outcome GRPO broadcast."""
    B = len(rewards)
    ends = torch.full((B, 1), T - 1, dtype=torch.long)
    g = torch.zeros(B, dtype=torch.long)
    a_proc = adv_mod.grpo_process(f64(rewards).unsqueeze(1), ends, torch.ones(B, 1, dtype=torch.bool),
                                  g, T=T, std=std)
    a_out = adv_mod.grpo(f64(rewards), g, std=std)
    return {"rewards": nums(rewards), "T": int(T), "process_first_token": nums(a_proc[:, 0]),
            "outcome": nums(a_out),
            "equal": bool(torch.allclose(a_proc, a_out.unsqueeze(1).expand(B, T)))}


@example("gae_hand_case")
def gae_hand_case(rewards, values, gamma, lam):
    r, v = f64(rewards).unsqueeze(0), f64(values).unsqueeze(0)
    m = torch.ones_like(r, dtype=torch.bool)
    a, ret = adv_mod.gae(r, v, m, gamma=gamma, lam=lam)
    delta, _ = adv_mod.gae(r, v, m, gamma=gamma, lam=0.0)
    mc, _ = adv_mod.gae(r, v, m, gamma=gamma, lam=1.0)
    return {"rewards": nums(r[0]), "values": nums(v[0]), "gamma": num(gamma), "lam": num(lam),
            "deltas": nums(delta[0]), "advantages": nums(a[0]), "returns": nums(ret[0]),
            "mc_advantages": nums(mc[0])}


@example("ppo_vs_grpo_credit")
def ppo_vs_grpo_credit(values, reward, group_rewards, lam):
    """Per-token GAE credit from a critic vs one group-relative number per response."""
    T = len(values)
    tok_r = torch.zeros(1, T, dtype=F64)
    tok_r[0, -1] = reward
    m = torch.ones(1, T, dtype=torch.bool)
    a, _ = adv_mod.gae(tok_r, f64(values).unsqueeze(0), m, gamma=1.0, lam=lam)
    g = adv_mod.grpo(f64(group_rewards), group_ids(None, len(group_rewards)))
    return {"values": nums(values), "reward": num(reward), "lam": num(lam),
            "group_rewards": nums(group_rewards), "gae": nums(a[0]),
            "grpo_tokens": [num(g[0])] * T}


@example("rloo_advantages")
def rloo_advantages(rewards, group=None):
    r, g = f64(rewards), group_ids(group, len(rewards))
    a, c = adv_mod.rloo(r, g), adv_mod.dr_grpo(r, g)
    k = int(c.abs().argmax())
    return {"rewards": nums(r), "advantages": nums(a), "baselines": nums(r - a),
            "centred": nums(c), "grpo": nums(adv_mod.grpo(r, g)),
            "rloo_over_centred": num(a[k] / c[k]), "adv_sum": num(a.sum())}


@example("rloo_singleton")
def rloo_singleton(rewards, group):
    r, g = f64(rewards), group_ids(group, len(rewards))
    try:
        adv_mod.rloo(r, g)
        error = ""
    except PolicylabError as exc:
        error = type(exc).__name__
    ids, counts = torch.unique(g, return_counts=True)
    keep = torch.isin(g, ids[counts > 1])
    a = adv_mod.rloo(r[keep], g[keep])
    return {"rewards": nums(r), "error": error, "grpo_default": nums(adv_mod.grpo(r, g)),
            "without_singleton": nums(a)}


@example("remax_advantages")
def remax_advantages(rewards, greedy_rewards):
    a = adv_mod.remax(f64(rewards), f64(greedy_rewards))
    return {"rewards": nums(rewards), "greedy": nums(greedy_rewards), "advantages": nums(a)}


@example("remax_refusals")
def remax_refusals(rewards):
    r = f64(rewards)
    out = {"rewards": nums(r)}
    for key, greedy in (("missing", None), ("nan", torch.full_like(r, float("nan")))):
        try:
            adv_mod.remax(r, greedy)
            out[key] = ""
        except PolicylabError as exc:
            out[key] = type(exc).__name__
    out["zero_baseline"] = nums(adv_mod.remax(r, torch.zeros_like(r)))
    return out


@example("remax_vs_rloo")
def remax_vs_rloo(sample_reward, greedy_reward, other_sample_reward):
    rm = adv_mod.remax(f64([sample_reward]), f64([greedy_reward]))
    rl = adv_mod.rloo(f64([sample_reward, other_sample_reward]), torch.zeros(2, dtype=torch.long))
    return {"sample": num(sample_reward), "greedy": num(greedy_reward),
            "other": num(other_sample_reward), "remax": num(rm[0]), "rloo": nums(rl)}


@example("reinforce_pp_returns")
def reinforce_pp_returns(rewards, logp_old, logp_ref, kl_coef):
    old, ref, m = rpp_inputs(logp_old, logp_ref)
    pen = kl.reward_penalty(old, ref, m, coef=kl_coef, estimator="k1")  # β·k1 per token, from the sampler
    ret = adv_mod.reinforce_pp_returns(f64(rewards), pen, m)
    wh = adv_mod.reinforce_pp(f64(rewards), pen, m)
    out = {"rewards": nums(rewards), "kl_coef": num(kl_coef)}
    for i in range(len(rewards)):
        n = int(m[i].sum())
        out[f"kl{i}"] = nums(kl.k1(old[i, :n], ref[i, :n]))
        out[f"returns{i}"] = nums(ret[i, :n])
        out[f"whitened{i}"] = nums(wh[i, :n])
    return out


@example("reinforce_pp_vs_gae")
def reinforce_pp_vs_gae(reward, logp_old, logp_ref, values, kl_coef, lam):
    old, ref = f64(logp_old).unsqueeze(0), f64(logp_ref).unsqueeze(0)
    m = torch.ones_like(old, dtype=torch.bool)
    pen = kl.reward_penalty(old, ref, m, coef=kl_coef)
    rpp = adv_mod.reinforce_pp_returns(f64([reward]), pen, m)
    tok_r = -pen.clone()
    tok_r[0, -1] += reward
    mc, _ = adv_mod.gae(tok_r, torch.zeros_like(tok_r), m, gamma=1.0, lam=1.0)
    ppo, _ = adv_mod.gae(tok_r, f64(values).unsqueeze(0), m, gamma=1.0, lam=lam)
    return {"reward": num(reward), "kl_coef": num(kl_coef), "lam": num(lam),
            "values": nums(values), "rpp": nums(rpp[0]), "gae_no_critic": nums(mc[0]),
            "gae_critic": nums(ppo[0]), "equal": bool(torch.allclose(rpp, mc))}


@example("reinforce_pp_whitening_lengths")
def reinforce_pp_whitening_lengths(rewards, lengths):
    """KL off: whitening over tokens weighs a long response more than a short one."""
    mask = lengths_mask(lengths)
    tok = adv_mod.reinforce_pp(f64(rewards), None, mask)
    per_seq = adv_mod.whiten(f64(rewards).unsqueeze(1), torch.ones(len(rewards), 1, dtype=torch.bool), eps=1e-8)
    return {"rewards": nums(rewards), "lengths": [int(n) for n in lengths],
            "token_level": nums(tok[:, 0]), "sequence_level": nums(per_seq[:, 0]),
            "magnitude_ratio": num((tok[0, 0] / tok[1, 0]).abs())}


@example("reinforce_pp_ema")
def reinforce_pp_ema(train_a, eval_batch, train_b, decay):
    """EMA scale: advanced by training batches only, once per batch id."""
    ema = adv_mod.EmaScale(decay)

    def call(r, update, bid):
        return adv_mod.reinforce_pp_baseline(f64(r), torch.zeros(len(r), dtype=torch.long),
                                             scale="ema", ema=ema, update=update, batch_id=bid)
    a1 = call(train_a, True, "train-1")
    s1 = ema.scale
    a_eval = call(eval_batch, False, None)
    s_eval = ema.scale
    try:
        call(train_a, True, "train-1")
        reuse = ""
    except PolicylabError as exc:
        reuse = type(exc).__name__
    a2 = call(train_b, True, "train-2")
    return {"decay": num(decay), "scale_1": num(s1), "scale_after_eval": num(s_eval),
            "scale_2": num(ema.scale), "adv_1": nums(a1), "adv_eval": nums(a_eval),
            "adv_2": nums(a2), "n_updates": ema.n_updates, "reuse_error": reuse}


@example("vapo_lambda")
def vapo_lambda(lengths, alpha=0.05):
    lam, n = adv_mod.length_adaptive_lambda(f64(lengths), alpha=alpha)
    return {"lengths": [int(x) for x in lengths], "alpha": num(alpha), "lambdas": nums(lam),
            "n_clamped": int(n)}


@example("vapo_decoupled_gae")
def vapo_decoupled_gae(reward, values, alpha, other_alpha, ppo_lam):
    T = len(values)
    tok_r = torch.zeros(1, T, dtype=F64)
    tok_r[0, -1] = reward
    v, m = f64(values).unsqueeze(0), torch.ones(1, T, dtype=torch.bool)
    a, ret, info = adv_mod.vapo_advantages(tok_r, v, m, alpha=alpha)
    a2, ret2, info2 = adv_mod.vapo_advantages(tok_r, v, m, alpha=other_alpha)
    ppo_a, ppo_ret = adv_mod.gae(tok_r, v, m, gamma=1.0, lam=ppo_lam)
    return {"reward": num(reward), "values": nums(values), "T": T, "alpha": num(alpha),
            "other_alpha": num(other_alpha), "ppo_lam": num(ppo_lam),
            "lam_policy": num(info["lam_policy_mean"]), "lam_policy_other": num(info2["lam_policy_mean"]),
            "adv_policy": nums(a[0]), "adv_policy_other": nums(a2[0]), "critic_targets": nums(ret[0]),
            "critic_unchanged": bool(torch.equal(ret, ret2)),
            "ppo_adv": nums(ppo_a[0]), "ppo_targets": nums(ppo_ret[0])}


@example("vapo_positive_nll")
def vapo_positive_nll(logp, correct, nll_coef=0.1):
    lp, mask = ragged(logp)
    lp.requires_grad_()
    ok = torch.tensor([bool(c) for c in correct])
    nll = adv_mod.positive_nll(lp, mask, ok)
    sel = mask & ok.unsqueeze(1)
    value = nll_coef * agg_mod.aggregate(nll, sel, "token_mean")
    value.backward()
    return {"correct": [bool(c) for c in correct], "nll_coef": num(nll_coef),
            "n_tokens": int(sel.sum()), "nll_value": num(value),
            "grad_rows": [num(x) for x in lp.grad.abs().sum(dim=1)]}


@example("ttrl_vote")
def ttrl_vote(answers, true_answer):
    comps = answer_texts(answers)
    g = torch.zeros(len(comps), dtype=torch.long)
    pseudo, eligible, info = ttrl_rewards(comps, g)
    # evaluator path only: gold enters here, after the rewards were fixed
    true = f64(exact_numeric_reward(comps, [true_answer] * len(comps)))
    agree = pseudo_label_agreement(pseudo.to(F64), true, eligible)
    return {"answers": [str(a) for a in answers], "label": str(info["labels"][0]),
            "true_answer": str(true_answer), "pseudo_rewards": nums(pseudo),
            "true_rewards": nums(true), "n_correct": int(true.sum()), "agreement": num(agree),
            "majority_fraction": num(info["majority_fraction"]),
            "pseudo_advantages": nums(adv_mod.grpo(pseudo.to(F64), g)),
            "true_advantages": nums(adv_mod.grpo(true, g))}


@example("ttrl_eligibility")
def ttrl_eligibility(prompts):
    """Several prompts' answers (None = unparseable): which prompts get a label."""
    comps, group = [], []
    for k, answers in enumerate(prompts):
        comps += answer_texts(answers)
        group += [k] * len(answers)
    rewards, eligible, info = ttrl_rewards(comps, group)
    g = torch.tensor(group)
    per_prompt = [bool(eligible[g == k].all()) for k in range(len(prompts))]
    return {"labels": ["—" if x is None else str(x) for x in info["labels"]], "eligible": per_prompt,
            "n_eligible": int(info["n_eligible"]), "n_ties": int(info["n_ties"]),
            "n_no_answer": int(info["n_no_answer"]),
            "nan_rewards": int(torch.isnan(rewards).sum())}
