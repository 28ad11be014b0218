"""Worked examples for the on-policy methods (ppo ... ttrl).

Every function takes plain keyword arguments (numbers, lists, strings), builds small
float64 tensors, calls policylab's kernels, and returns plain values. Gradients are read
with autograd through the real objectives and `aggregate`; nothing here re-implements a
method's formula (arithmetic outside a kernel is limited to display contrasts such as the
product ratio GSPO does not use).
"""

from __future__ import annotations

import math

import torch

from ... import advantages as adv_mod
from ... import aggregate as agg_mod
from ... import filters, kl, objectives
from ...errors import PolicylabError
from ...rewards import overlong_penalty, pseudo_label_agreement, ttrl_rewards
from ...rewards.verifiers import exact_numeric_reward
from . import example

F64 = torch.float64


# ---------------------------------------------------------------- helpers
def _t(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=F64)


def _num(x) -> float:
    """A clean Python float (no -0.0, no 1e-17 noise)."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
    return round(float(x), 10) + 0.0


def _nums(t) -> list[float]:
    return [_num(v) for v in (t.detach().tolist() if isinstance(t, torch.Tensor) else t)]


def _echo(x):
    """An input echoed for the text: ints stay ints, other numbers become floats."""
    return x if isinstance(x, int) and not isinstance(x, bool) else _num(x)


def _group(group, n: int) -> torch.Tensor:
    return torch.tensor(group if group is not None else [0] * n, dtype=torch.long)


def _ragged(rows, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths -> (values [B, T], mask [B, T]), padded with `fill`."""
    T = max(len(r) for r in rows)
    vals = torch.full((len(rows), T), fill, dtype=F64)
    mask = torch.zeros((len(rows), T), dtype=torch.bool)
    for i, r in enumerate(rows):
        vals[i, : len(r)] = _t(r)
        mask[i, : len(r)] = True
    return vals, mask


def _lengths_mask(lengths) -> torch.Tensor:
    return _ragged([[0.0] * int(n) for n in lengths])[1]


def _single_token(fn, ratios, advs, **kw):
    """One token per row with lp_old = 0, lp = log ρ. Returns (coef, loss, metrics) where
    the objective's gradient is ∂ℓ/∂lp = −coef·A (coef 0 where A = 0)."""
    lp = torch.log(_t(ratios)).unsqueeze(1).requires_grad_()
    adv = _t(advs)
    loss, metrics = fn(lp, torch.zeros_like(lp), adv, torch.ones_like(lp, dtype=torch.bool), **kw)
    loss.sum().backward()
    g = lp.grad.squeeze(1)
    coef = torch.where(adv != 0, -g / torch.where(adv != 0, adv, 1.0), 0.0)
    return coef, loss.detach().squeeze(1), metrics


def _at_ratio_one_grads(adv, mask, mode, *, L_norm=None, objective="ppo_clip", logp_value=-1.0):
    """Per-token gradient of the aggregated loss at the first minibatch (lp = lp_old)."""
    lp = torch.full(mask.shape, logp_value, dtype=F64, requires_grad=True)
    if objective == "reinforce":
        loss, _ = objectives.reinforce(lp, adv, mask)
    else:
        loss, _ = objectives.ppo_clip(lp, lp.detach().clone(), adv, mask, eps_low=0.2, eps_high=0.2)
    value = agg_mod.aggregate(loss, mask, mode, L_norm=L_norm)
    value.backward()
    return value.detach(), lp.grad


# ---------------------------------------------------------------- GRPO family
@example("grpo_group_advantages")
def grpo_group_advantages(rewards, group=None, std="unbiased", eps=1e-6):
    r = _t(rewards)
    a = adv_mod.grpo(r, _group(group, len(rewards)), std=std, eps=eps)
    return {"rewards": _nums(r), "advantages": _nums(a), "adv_sum": _num(a.sum()),
            "std_convention": str(std), "group_size": len(rewards)}


@example("grpo_std_conventions")
def grpo_std_conventions(rewards):
    r, g = _t(rewards), _group(None, len(rewards))
    unb = adv_mod.grpo(r, g, std="unbiased", eps=0.0)
    pop = adv_mod.grpo(r, g, std="population", eps=0.0)
    dr = adv_mod.dr_grpo(r, g)
    flat = adv_mod.grpo(torch.ones(len(rewards), dtype=F64), g, std="unbiased")
    return {"rewards": _nums(r), "adv_unbiased": _nums(unb), "adv_population": _nums(pop),
            "centred": _nums(dr), "pop_over_unbiased": _num(pop[0] / unb[0]),
            "all_equal_adv": _nums(flat), "group_size": len(rewards)}


@example("grpo_first_step")
def grpo_first_step(rewards, lengths, std="unbiased"):
    """lp = lp_old: the policy part of the loss value is 0 under seq_mean_token_mean, but
    the gradient is not (each response's tokens get −A_i/(B·|y_i|))."""
    a = adv_mod.grpo(_t(rewards), _group(None, len(rewards)), std=std)
    mask = _lengths_mask(lengths)
    value, grad = _at_ratio_one_grads(a, mask, "seq_mean_token_mean")
    tok_value, _ = _at_ratio_one_grads(a, mask, "token_mean")
    return {"rewards": _nums(rewards), "lengths": [int(n) for n in lengths],
            "advantages": _nums(a), "loss_value": _num(value),
            "token_grads": _nums(grad[:, 0]), "token_mean_loss_value": _num(tok_value)}


@example("k3_kl_term")
def k3_kl_term(logp, logp_ref, coef=0.04):
    lp = _t(logp).unsqueeze(0).requires_grad_()
    ref = _t(logp_ref).unsqueeze(0)
    k3 = kl.k3(lp, ref)
    (coef * k3).sum().backward()
    k1 = kl.k1(lp.detach(), ref)
    try:
        kl.check_placement(True, True)
        both_refused = False
    except ValueError:
        both_refused = True
    return {"logp": _nums(logp), "logp_ref": _nums(logp_ref), "coef": _num(coef),
            "k1": _nums(k1[0]), "k3": _nums(k3.detach()[0]), "k3_grad": _nums(lp.grad[0]),
            "both_refused": both_refused}


@example("group_advantage_estimators")
def group_advantage_estimators(rewards, group, std="unbiased"):
    """One batch of grouped rewards through four group-relative estimators."""
    r, g = _t(rewards), _group(group, len(rewards))
    dr = adv_mod.dr_grpo(r, g)
    rpp = adv_mod.reinforce_pp_baseline(r, g, scale="batch_std")
    k = int(dr.abs().argmax())
    keep, _ = filters.dynamic_sampling_keep(r, g)  # groups with some spread
    rpp_kept = adv_mod.reinforce_pp_baseline(r[keep], g[keep], scale="batch_std")
    kk = int(dr[keep].abs().argmax())
    # spread of the centred rewards of the first two groups (their ratio is shown in the text)
    gaps = [float(dr[g == i].max() - dr[g == i].min()) for i in torch.unique(g).tolist()]
    return {"rewards": _nums(r), "grpo": _nums(adv_mod.grpo(r, g, std=std)), "dr_grpo": _nums(dr),
            "rloo": _nums(adv_mod.rloo(r, g)), "reinforce_pp_baseline": _nums(rpp),
            "rpp_scale": _num(dr[k] / rpp[k]), "rpp_scale_no_flat": _num(dr[keep][kk] / rpp_kept[kk]),
            "gap_ratio": _num(gaps[0] / gaps[1]) if len(gaps) >= 2 and gaps[1] else 0.0,
            "std_convention": str(std)}


@example("dr_grpo_affine")
def dr_grpo_affine(rewards, scale, shift):
    r, g = _t(rewards), _group(None, len(rewards))
    return {"rewards": _nums(r), "scale": _echo(scale), "shift": _echo(shift),
            "dr": _nums(adv_mod.dr_grpo(r, g)), "dr_scaled": _nums(adv_mod.dr_grpo(scale * r, g)),
            "dr_shifted": _nums(adv_mod.dr_grpo(r + shift, g)),
            "grpo": _nums(adv_mod.grpo(r, g)), "grpo_scaled": _nums(adv_mod.grpo(scale * r, g))}


@example("length_bias_gradients")
def length_bias_gradients(lengths, adv, L_norm):
    """Per-token gradient of each sequence under three aggregation modes (ρ = 1)."""
    mask, a = _lengths_mask(lengths), _t(adv)
    out = {"lengths": [int(n) for n in lengths], "adv": _nums(a), "L_norm": _echo(L_norm)}
    for key, mode in (("seq_mean_token_mean", "seq_mean_token_mean"), ("token_mean", "token_mean"),
                      ("sum_norm", "seq_mean_token_sum_norm")):
        _, grad = _at_ratio_one_grads(a, mask, mode, L_norm=L_norm)
        w = -grad / a.unsqueeze(1)  # weight c of each token: ∂L/∂lp = −c·A
        out[key] = _nums(w[:, 0])
        out[key + "_total"] = _nums(torch.where(mask, w, 0.0).sum(dim=1))
    out["smtm_ratio"] = _num(out["seq_mean_token_mean"][0] / out["seq_mean_token_mean"][1])
    return out


@example("dr_grpo_lnorm_pitfall")
def dr_grpo_lnorm_pitfall(batch_a, batch_b, adv, L_norm):
    """Token gradient of sequence 0 in two batches: fixed L_norm vs 'L_norm = longest'."""
    out = {"batch_a": [int(n) for n in batch_a], "batch_b": [int(n) for n in batch_b],
           "L_norm": _echo(L_norm)}
    for name, lengths in (("a", batch_a), ("b", batch_b)):
        mask, a = _lengths_mask(lengths), _t(adv)
        _, fixed = _at_ratio_one_grads(a, mask, "seq_mean_token_sum_norm", L_norm=L_norm)
        _, longest = _at_ratio_one_grads(a, mask, "seq_mean_token_sum_norm", L_norm=max(lengths))
        out[f"fixed_{name}"] = _num(-fixed[0, 0] / a[0])  # weight c: ∂L/∂lp = −c·A
        out[f"longest_{name}"] = _num(-longest[0, 0] / a[0])
    return out


@example("aggregation_modes")
def aggregation_modes(losses):
    loss, mask = _ragged(losses)
    out = {f"losses{i}": _nums(r) for i, r in enumerate(losses)}
    return {**out, "lengths": [len(r) for r in losses],
            "token_mean": _num(agg_mod.aggregate(loss, mask, "token_mean")),
            "seq_mean_token_mean": _num(agg_mod.aggregate(loss, mask, "seq_mean_token_mean")),
            "seq_mean_token_sum": _num(agg_mod.aggregate(loss, mask, "seq_mean_token_sum"))}


@example("grpo_process_advantages")
def grpo_process_advantages(step_rewards, step_ends, T, std="population"):
    """Two (or more) responses of one prompt; pool = the group, and for contrast each
    response normalized on its own (a different, wrong pool)."""
    r = _t(step_rewards)
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
        out[f"steps{i}"] = _nums(r[i])
        out[f"ends{i}"] = [int(e) for e in ends[i]]
        out[f"normed{i}"] = _nums(normed[i])
        out[f"adv{i}"] = _nums(a[i])
        out[f"own_pool{i}"] = _nums(own[i])
    return out


@example("grpo_process_single_step")
def grpo_process_single_step(rewards, T, std="unbiased"):
    """One step per response ending at the last token = outcome GRPO broadcast."""
    B = len(rewards)
    ends = torch.full((B, 1), T - 1, dtype=torch.long)
    g = torch.zeros(B, dtype=torch.long)
    a_proc = adv_mod.grpo_process(_t(rewards).unsqueeze(1), ends, torch.ones(B, 1, dtype=torch.bool),
                                  g, T=T, std=std)
    a_out = adv_mod.grpo(_t(rewards), g, std=std)
    return {"rewards": _nums(rewards), "T": int(T), "process_first_token": _nums(a_proc[:, 0]),
            "outcome": _nums(a_out),
            "equal": bool(torch.allclose(a_proc, a_out.unsqueeze(1).expand(B, T)))}


# ---------------------------------------------------------------- DAPO
@example("dapo_dynamic_sampling")
def dapo_dynamic_sampling(correct, group):
    o, g = _t(correct), _group(group, len(correct))
    keep, info = filters.dynamic_sampling_keep(o, g)
    a = adv_mod.grpo(o, g)
    kept = sorted({int(x) for x in g[keep].tolist()})
    dropped = sorted({int(x) for x in g[~keep].tolist()})
    return {"correct": [_echo(x) for x in correct], "kept_groups": kept, "dropped_groups": dropped,
            "n_groups": int(info["n_groups"]), "n_kept": int(info["n_kept"]),
            "filtered_fraction": _num(info["filtered_fraction"]),
            "advantages": _nums(a)}


@example("dapo_filter_raw_vs_shaped")
def dapo_filter_raw_vs_shaped(correct, lengths, group, max_len, cache_len):
    o, g = _t(correct), _group(group, len(correct))
    pen = overlong_penalty(torch.tensor(lengths), max_len=max_len, cache_len=cache_len).to(F64)
    shaped = o + pen
    keep_raw, info_raw = filters.dynamic_sampling_keep(o, g)
    keep_shaped, info_shaped = filters.dynamic_sampling_keep(shaped, g)
    return {"correct": [_echo(x) for x in correct], "lengths": [int(n) for n in lengths], "max_len": int(max_len),
            "cache_len": int(cache_len), "penalty": _nums(pen), "shaped": _nums(shaped),
            "kept_on_raw": int(info_raw["n_kept"]), "kept_on_shaped": int(info_shaped["n_kept"]),
            "shaped_advantages": _nums(adv_mod.grpo(shaped, g))}


@example("clip_gradient_coefficients")
def clip_gradient_coefficients(ratios, advs, eps_low, eps_high, cispo_eps_low=None):
    """Gradient coefficient c (∂ℓ/∂lp = −c·A) of ppo_clip, gppo and cispo per token."""
    kw = dict(eps_low=eps_low, eps_high=eps_high)
    c_ppo, l_ppo, m_ppo = _single_token(objectives.ppo_clip, ratios, advs, **kw)
    c_gppo, l_gppo, m_gppo = _single_token(objectives.gppo, ratios, advs, **kw)
    c_cis, l_cis, _ = _single_token(objectives.cispo, ratios, advs, eps_low=cispo_eps_low, eps_high=eps_high)
    return {"ratios": _nums(ratios), "advs": _nums(advs), "eps_low": _num(eps_low),
            "eps_high": _num(eps_high), "upper": _num(1 + eps_high), "lower": _num(1 - eps_low),
            "ppo": _nums(c_ppo), "gppo": _nums(c_gppo), "cispo": _nums(c_cis),
            "ppo_loss": _nums(l_ppo), "gppo_loss": _nums(l_gppo), "cispo_loss": _nums(l_cis),
            "same_forward": bool(torch.equal(l_ppo, l_gppo)),
            "ppo_clip_frac": _num(m_ppo["clip_frac"]), "gppo_clip_frac": _num(m_gppo["clip_frac"]),
            "gppo_high_pos_frac": _num(m_gppo["clip_frac/high_pos"])}


@example("clip_higher_vs_symmetric")
def clip_higher_vs_symmetric(ratios, adv, eps_low, eps_high, eps_sym):
    advs = [adv] * len(ratios)
    c_dapo, _, _ = _single_token(objectives.ppo_clip, ratios, advs, eps_low=eps_low, eps_high=eps_high)
    c_sym, _, _ = _single_token(objectives.ppo_clip, ratios, advs, eps_low=eps_sym, eps_high=eps_sym)
    return {"ratios": _nums(ratios), "adv": _num(adv), "eps_high": _num(eps_high),
            "eps_sym": _num(eps_sym), "dapo": _nums(c_dapo), "symmetric": _nums(c_sym),
            "upper_dapo": _num(1 + eps_high), "upper_sym": _num(1 + eps_sym)}


@example("cispo_loss_value")
def cispo_loss_value(logp, adv, eps_high):
    """First minibatch (ρ = 1): same gradient as PPO, different loss value."""
    def run(fn, **kw):
        lp = _t(logp).unsqueeze(0).requires_grad_()
        loss, _ = fn(lp, lp.detach().clone(), _t([adv]), torch.ones_like(lp, dtype=torch.bool), **kw)
        value = agg_mod.aggregate(loss, torch.ones_like(lp, dtype=torch.bool), "token_mean")
        value.backward()
        return value.detach(), lp.grad[0]
    v_cis, g_cis = run(objectives.cispo, eps_low=None, eps_high=eps_high)
    v_ppo, g_ppo = run(objectives.ppo_clip, eps_low=0.2, eps_high=eps_high)
    return {"logp": _nums(logp), "adv": _num(adv), "cispo_value": _num(v_cis), "ppo_value": _num(v_ppo),
            "cispo_grad": _nums(g_cis), "ppo_grad": _nums(g_ppo),
            "same_grad": bool(torch.allclose(g_cis, g_ppo))}


# ---------------------------------------------------------------- PPO / GAE
@example("gae_hand_case")
def gae_hand_case(rewards, values, gamma, lam):
    r, v = _t(rewards).unsqueeze(0), _t(values).unsqueeze(0)
    m = torch.ones_like(r, dtype=torch.bool)
    a, ret = adv_mod.gae(r, v, m, gamma=gamma, lam=lam)
    delta, _ = adv_mod.gae(r, v, m, gamma=gamma, lam=0.0)
    mc, _ = adv_mod.gae(r, v, m, gamma=gamma, lam=1.0)
    return {"rewards": _nums(r[0]), "values": _nums(v[0]), "gamma": _num(gamma), "lam": _num(lam),
            "deltas": _nums(delta[0]), "advantages": _nums(a[0]), "returns": _nums(ret[0]),
            "mc_advantages": _nums(mc[0])}


@example("ppo_vs_grpo_credit")
def ppo_vs_grpo_credit(values, reward, group_rewards, lam):
    """Per-token GAE credit from a critic vs one group-relative number per response."""
    T = len(values)
    tok_r = torch.zeros(1, T, dtype=F64)
    tok_r[0, -1] = reward
    m = torch.ones(1, T, dtype=torch.bool)
    a, _ = adv_mod.gae(tok_r, _t(values).unsqueeze(0), m, gamma=1.0, lam=lam)
    g = adv_mod.grpo(_t(group_rewards), _group(None, len(group_rewards)))
    return {"values": _nums(values), "reward": _num(reward), "lam": _num(lam),
            "group_rewards": _nums(group_rewards), "gae": _nums(a[0]),
            "grpo_tokens": [_num(g[0])] * T}


@example("kl_in_reward")
def kl_in_reward(outcome, logp_old, logp_ref, values, coef, lam=0.95):
    """InstructGPT-style shaping: −β·k1(lp_old, lp_ref) per token + outcome at the end."""
    old, ref = _t(logp_old).unsqueeze(0), _t(logp_ref).unsqueeze(0)
    m = torch.ones_like(old, dtype=torch.bool)
    pen = kl.reward_penalty(old, ref, m, coef=coef)
    tok_r = -pen
    tok_r[0, -1] += outcome
    a, _ = adv_mod.gae(tok_r, _t(values).unsqueeze(0), m, gamma=1.0, lam=lam)
    try:
        kl.reward_penalty(old.clone().requires_grad_(), ref, m, coef=coef)
        refused = False
    except ValueError:
        refused = True
    return {"outcome": _num(outcome), "coef": _num(coef), "logp_old": _nums(logp_old),
            "logp_ref": _nums(logp_ref), "penalty": _nums(pen[0]),
            "token_rewards": _nums(tok_r[0]), "advantages": _nums(a[0]),
            "learner_logp_refused": refused}


# ---------------------------------------------------------------- RLOO / ReMax
@example("rloo_advantages")
def rloo_advantages(rewards, group=None):
    r, g = _t(rewards), _group(group, len(rewards))
    a, c = adv_mod.rloo(r, g), adv_mod.dr_grpo(r, g)
    k = int(c.abs().argmax())
    return {"rewards": _nums(r), "advantages": _nums(a), "baselines": _nums(r - a),
            "centred": _nums(c), "grpo": _nums(adv_mod.grpo(r, g)),
            "rloo_over_centred": _num(a[k] / c[k]), "adv_sum": _num(a.sum())}


@example("rloo_singleton")
def rloo_singleton(rewards, group):
    r, g = _t(rewards), _group(group, len(rewards))
    try:
        adv_mod.rloo(r, g)
        error = ""
    except PolicylabError as exc:
        error = type(exc).__name__
    ids, counts = torch.unique(g, return_counts=True)
    keep = torch.isin(g, ids[counts > 1])
    a = adv_mod.rloo(r[keep], g[keep])
    return {"rewards": _nums(r), "error": error, "grpo_default": _nums(adv_mod.grpo(r, g)),
            "without_singleton": _nums(a)}


@example("reinforce_token_gradients")
def reinforce_token_gradients(rewards, lengths, greedy_rewards=None, mode="seq_mean_token_sum"):
    """REINFORCE (−A·lp) aggregated, A from ReMax (greedy_rewards given) or RLOO (one
    group): the per-token gradient ∂L/∂lp of each response."""
    r, mask = _t(rewards), _lengths_mask(lengths)
    if greedy_rewards is not None:
        a = adv_mod.remax(r, _t(greedy_rewards))
    else:
        a = adv_mod.rloo(r, torch.zeros(len(rewards), dtype=torch.long))
    value, grad = _at_ratio_one_grads(a, mask, mode, objective="reinforce")
    return {"rewards": _nums(r), "greedy": _nums(greedy_rewards or []), "adv": _nums(a),
            "lengths": [int(n) for n in lengths], "mode": mode,
            "token_grads": _nums(grad[:, 0]), "loss_value": _num(value)}


@example("remax_advantages")
def remax_advantages(rewards, greedy_rewards):
    a = adv_mod.remax(_t(rewards), _t(greedy_rewards))
    return {"rewards": _nums(rewards), "greedy": _nums(greedy_rewards), "advantages": _nums(a)}


@example("remax_refusals")
def remax_refusals(rewards):
    r = _t(rewards)
    out = {"rewards": _nums(r)}
    for key, greedy in (("missing", None), ("nan", torch.full_like(r, float("nan")))):
        try:
            adv_mod.remax(r, greedy)
            out[key] = ""
        except PolicylabError as exc:
            out[key] = type(exc).__name__
    out["zero_baseline"] = _nums(adv_mod.remax(r, torch.zeros_like(r)))
    return out


@example("remax_vs_rloo")
def remax_vs_rloo(sample_reward, greedy_reward, other_sample_reward):
    rm = adv_mod.remax(_t([sample_reward]), _t([greedy_reward]))
    rl = adv_mod.rloo(_t([sample_reward, other_sample_reward]), torch.zeros(2, dtype=torch.long))
    return {"sample": _num(sample_reward), "greedy": _num(greedy_reward),
            "other": _num(other_sample_reward), "remax": _num(rm[0]), "rloo": _nums(rl)}


# ---------------------------------------------------------------- REINFORCE++
def _rpp_inputs(logp_old, logp_ref):
    old, m = _ragged(logp_old)
    ref, _ = _ragged(logp_ref)
    return old, ref, m


@example("reinforce_pp_returns")
def reinforce_pp_returns(rewards, logp_old, logp_ref, kl_coef):
    old, ref, m = _rpp_inputs(logp_old, logp_ref)
    ret = adv_mod.reinforce_pp_returns(_t(rewards), old, ref, m, kl_coef=kl_coef)
    wh = adv_mod.reinforce_pp(_t(rewards), old, ref, m, kl_coef=kl_coef)
    out = {"rewards": _nums(rewards), "kl_coef": _num(kl_coef)}
    for i in range(len(rewards)):
        n = int(m[i].sum())
        out[f"kl{i}"] = _nums(kl.k1(old[i, :n], ref[i, :n]))
        out[f"returns{i}"] = _nums(ret[i, :n])
        out[f"whitened{i}"] = _nums(wh[i, :n])
    return out


@example("reinforce_pp_vs_gae")
def reinforce_pp_vs_gae(reward, logp_old, logp_ref, values, kl_coef, lam):
    old, ref = _t(logp_old).unsqueeze(0), _t(logp_ref).unsqueeze(0)
    m = torch.ones_like(old, dtype=torch.bool)
    rpp = adv_mod.reinforce_pp_returns(_t([reward]), old, ref, m, kl_coef=kl_coef)
    tok_r = -kl.reward_penalty(old, ref, m, coef=kl_coef)
    tok_r[0, -1] += reward
    mc, _ = adv_mod.gae(tok_r, torch.zeros_like(tok_r), m, gamma=1.0, lam=1.0)
    ppo, _ = adv_mod.gae(tok_r, _t(values).unsqueeze(0), m, gamma=1.0, lam=lam)
    return {"reward": _num(reward), "kl_coef": _num(kl_coef), "lam": _num(lam),
            "values": _nums(values), "rpp": _nums(rpp[0]), "gae_no_critic": _nums(mc[0]),
            "gae_critic": _nums(ppo[0]), "equal": bool(torch.allclose(rpp, mc))}


@example("reinforce_pp_whitening_lengths")
def reinforce_pp_whitening_lengths(rewards, lengths):
    """KL off: whitening over tokens weighs a long response more than a short one."""
    mask = _lengths_mask(lengths)
    z = torch.zeros(mask.shape, dtype=F64)
    tok = adv_mod.reinforce_pp(_t(rewards), z, z, mask, kl_coef=0.0)
    per_seq = adv_mod.whiten(_t(rewards).unsqueeze(1), torch.ones(len(rewards), 1, dtype=torch.bool), eps=1e-8)
    return {"rewards": _nums(rewards), "lengths": [int(n) for n in lengths],
            "token_level": _nums(tok[:, 0]), "sequence_level": _nums(per_seq[:, 0]),
            "magnitude_ratio": _num((tok[0, 0] / tok[1, 0]).abs())}


@example("reinforce_pp_ema")
def reinforce_pp_ema(train_a, eval_batch, train_b, decay):
    """EMA scale: advanced by training batches only, once per batch id."""
    ema = adv_mod.EmaScale(decay)

    def call(r, update, bid):
        return adv_mod.reinforce_pp_baseline(_t(r), torch.zeros(len(r), dtype=torch.long),
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
    return {"decay": _num(decay), "scale_1": _num(s1), "scale_after_eval": _num(s_eval),
            "scale_2": _num(ema.scale), "adv_1": _nums(a1), "adv_eval": _nums(a_eval),
            "adv_2": _nums(a2), "n_updates": ema.n_updates, "reuse_error": reuse}


# ---------------------------------------------------------------- VAPO
@example("vapo_lambda")
def vapo_lambda(lengths, alpha=0.05):
    lam, n = adv_mod.length_adaptive_lambda(_t(lengths), alpha=alpha)
    return {"lengths": [int(x) for x in lengths], "alpha": _num(alpha), "lambdas": _nums(lam),
            "n_clamped": int(n)}


@example("vapo_decoupled_gae")
def vapo_decoupled_gae(reward, values, alpha, other_alpha, ppo_lam):
    T = len(values)
    tok_r = torch.zeros(1, T, dtype=F64)
    tok_r[0, -1] = reward
    v, m = _t(values).unsqueeze(0), torch.ones(1, T, dtype=torch.bool)
    a, ret, info = adv_mod.vapo_advantages(tok_r, v, m, alpha=alpha)
    a2, ret2, info2 = adv_mod.vapo_advantages(tok_r, v, m, alpha=other_alpha)
    ppo_a, ppo_ret = adv_mod.gae(tok_r, v, m, gamma=1.0, lam=ppo_lam)
    return {"reward": _num(reward), "values": _nums(values), "T": T, "alpha": _num(alpha),
            "other_alpha": _num(other_alpha), "ppo_lam": _num(ppo_lam),
            "lam_policy": _num(info["lam_policy_mean"]), "lam_policy_other": _num(info2["lam_policy_mean"]),
            "adv_policy": _nums(a[0]), "adv_policy_other": _nums(a2[0]), "critic_targets": _nums(ret[0]),
            "critic_unchanged": bool(torch.equal(ret, ret2)),
            "ppo_adv": _nums(ppo_a[0]), "ppo_targets": _nums(ppo_ret[0])}


@example("vapo_positive_nll")
def vapo_positive_nll(logp, correct, nll_coef=0.1):
    lp, mask = _ragged(logp)
    lp.requires_grad_()
    ok = torch.tensor([bool(c) for c in correct])
    nll = adv_mod.positive_nll(lp, mask, ok)
    sel = mask & ok.unsqueeze(1)
    value = nll_coef * agg_mod.aggregate(nll, sel, "token_mean")
    value.backward()
    return {"correct": [bool(c) for c in correct], "nll_coef": _num(nll_coef),
            "n_tokens": int(sel.sum()), "nll_value": _num(value),
            "grad_rows": [_num(x) for x in lp.grad.abs().sum(dim=1)]}


# ---------------------------------------------------------------- GSPO
def _gspo_run(fn, log_ratios, adv, eps_low, eps_high, mode="seq_mean_token_mean"):
    lp, mask = _ragged(log_ratios)
    lp.requires_grad_()
    loss, metrics = fn(lp, torch.zeros_like(lp), _t(adv), mask, eps_low=eps_low, eps_high=eps_high)
    agg_mod.aggregate(loss, mask, mode).backward()
    return lp.grad, metrics, mask


@example("gspo_sequence_ratio")
def gspo_sequence_ratio(log_ratios, eps_low=3e-4, eps_high=4e-4):
    _, metrics, _ = _gspo_run(objectives.gspo, [log_ratios], [1.0], eps_low, eps_high)
    return {"log_ratios": _nums(log_ratios), "token_ratios": [_num(math.exp(x)) for x in log_ratios],
            "sequence_ratio": _num(metrics["ratio/mean"]),
            "product_ratio": _num(math.exp(sum(log_ratios)))}


@example("gspo_gradients")
def gspo_gradients(log_ratios, adv, eps_low=3e-4, eps_high=4e-4):
    """Per-row sequence ratio s_i and the gradient ∂L/∂lp of every token of that row."""
    g, _, _ = _gspo_run(objectives.gspo, log_ratios, adv, eps_low, eps_high)
    out = {"adv": _nums(adv), "eps_low": _num(eps_low), "eps_high": _num(eps_high)}
    for i, row in enumerate(log_ratios):
        lr, m = _ragged([row])
        _, metrics = objectives.gspo(lr, torch.zeros_like(lr), _t([adv[i]]), m, eps_low=eps_low, eps_high=eps_high)
        out[f"s{i}"] = _num(metrics["ratio/mean"])
        out[f"grads{i}"] = _nums(g[i, : len(row)])
        out[f"clipped{i}"] = bool(metrics["clip_frac"] > 0)
    return out


@example("gspo_vs_token_clip")
def gspo_vs_token_clip(log_ratios, adv, eps_low, eps_high):
    g_seq, m_seq, _ = _gspo_run(objectives.gspo, [log_ratios], [adv], eps_low, eps_high)
    g_tok, m_tok, _ = _gspo_run(objectives.ppo_clip, [log_ratios], [adv], eps_low, eps_high)
    return {"log_ratios": _nums(log_ratios), "token_ratios": [_num(math.exp(x)) for x in log_ratios],
            "adv": _num(adv), "eps_low": _num(eps_low), "eps_high": _num(eps_high),
            "sequence_ratio": _num(m_seq["ratio/mean"]), "gspo_grads": _nums(g_seq[0]),
            "ppo_grads": _nums(g_tok[0]), "gspo_clip_frac": _num(m_seq["clip_frac"]),
            "ppo_clip_frac": _num(m_tok["clip_frac"])}


@example("gspo_aggregation")
def gspo_aggregation(lengths, adv, eps_low=3e-4, eps_high=4e-4):
    """Total gradient each response receives under the paper's mode vs token_mean."""
    rows = [[0.0] * int(n) for n in lengths]
    out = {"lengths": [int(n) for n in lengths], "adv": _nums(adv)}
    for key, mode in (("seq_mean", "seq_mean_token_mean"), ("token_mean", "token_mean")):
        g, _, _ = _gspo_run(objectives.gspo, rows, adv, eps_low, eps_high, mode)
        out[key] = _nums(-g.sum(dim=1) / _t(adv))  # total weight of each response
    return out


# ---------------------------------------------------------------- TTRL
def _completions(answers) -> list[str]:
    return [f"... so the answer is {a}." if a is not None else "I could not finish." for a in answers]


@example("ttrl_vote")
def ttrl_vote(answers, true_answer):
    comps = _completions(answers)
    g = torch.zeros(len(comps), dtype=torch.long)
    pseudo, eligible, info = ttrl_rewards(comps, g)
    # evaluator path only: gold enters here, after the rewards were fixed
    true = _t(exact_numeric_reward(comps, [true_answer] * len(comps)))
    agree = pseudo_label_agreement(pseudo.to(F64), true, eligible)
    return {"answers": [str(a) for a in answers], "label": str(info["labels"][0]),
            "true_answer": str(true_answer), "pseudo_rewards": _nums(pseudo),
            "true_rewards": _nums(true), "n_correct": int(true.sum()), "agreement": _num(agree),
            "majority_fraction": _num(info["majority_fraction"]),
            "pseudo_advantages": _nums(adv_mod.grpo(pseudo.to(F64), g)),
            "true_advantages": _nums(adv_mod.grpo(true, g))}


@example("ttrl_eligibility")
def ttrl_eligibility(prompts):
    """Several prompts' answers (None = unparseable): which prompts get a label."""
    comps, group = [], []
    for k, answers in enumerate(prompts):
        comps += _completions(answers)
        group += [k] * len(answers)
    rewards, eligible, info = ttrl_rewards(comps, group)
    g = torch.tensor(group)
    per_prompt = [bool(eligible[g == k].all()) for k in range(len(prompts))]
    return {"labels": ["—" if x is None else str(x) for x in info["labels"]], "eligible": per_prompt,
            "n_eligible": int(info["n_eligible"]), "n_ties": int(info["n_ties"]),
            "n_no_answer": int(info["n_no_answer"]),
            "nan_rewards": int(torch.isnan(rewards).sum())}
