"""Worked examples: mixed-policy methods (off_context_grpo, luffy, grin, moer, graft, erils).

Every number comes from the kernels in `policylab.kernels.mixed` or from
`policylab.kernels.advantages`; nothing here re-derives a formula.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels import advantages as adv_mod
from policylab.errors import PolicylabError
from policylab.kernels import mixed as K
from policylab.learn.examples.registry import example
from policylab.learn.examples.core_common import nums, ragged, f64


def _err(fn) -> str:
    try:
        fn()
    except PolicylabError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _g(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.long)


# ----------------------------------------------------------------------------- Off-Context GRPO


@example("off_context_ratio")
def off_context_ratio(lp_unhinted, lp_hinted):
    """One hinted token: numerator on the prompt alone, denominator on prompt + hint."""
    lp = f64([lp_unhinted]).view(1, 1)
    lb = f64([lp_hinted]).view(1, 1)
    den = K.behavior_denominator(lp, lb, torch.tensor([True]))
    den_native = K.behavior_denominator(lp, lb, torch.tensor([False]))
    return {"p_unhinted": round(math.exp(lp_unhinted), 4), "p_hinted": round(math.exp(lp_hinted), 4),
            "ratio": round(float((lp - den).exp()), 4), "ratio_native": round(float((lp - den_native).exp()), 4)}


@example("off_context_refusal")
def off_context_refusal(prompt, hint):
    """The context check: both sides on prompt + hint is refused; the right split passes."""
    hinted = list(prompt) + list(hint)
    same = _err(lambda: K.check_context_separation([hinted], [hinted], [list(hint)], [True]))
    right = _err(lambda: K.check_context_separation([list(prompt)], [hinted], [list(hint)], [True]))
    return {"prompt": str(list(prompt)), "hint": str(list(hint)), "same_context": same, "separated": right}


@example("off_context_vs_grpo")
def off_context_vs_grpo(rewards, lp_unhinted, lp_hinted):
    """GRPO advantages are the same; only the denominator moves: hinted vs empty hint."""
    r = f64(rewards)
    a = adv_mod.grpo(r, _g(len(rewards)), std="unbiased")
    lp, lb = f64(lp_unhinted).view(-1, 1), f64(lp_hinted).view(-1, 1)
    n = len(rewards)
    hinted = K.behavior_denominator(lp, lb, torch.ones(n, dtype=torch.bool))
    empty = K.behavior_denominator(lp, lp, torch.zeros(n, dtype=torch.bool))
    return {"rewards": nums(r), "advantages": nums(a), "ratio_hinted": nums((lp - hinted).exp().view(-1)),
            "ratio_empty_hint": nums((lp - empty).exp().view(-1))}


@example("off_context_fingerprint")
def off_context_fingerprint(prompt, hint):
    """What a batch records per row (fingerprints) is enough for the check."""
    hinted = list(prompt) + list(hint)
    ok = _err(lambda: K.check_context_fingerprints([list(prompt)], [K.fingerprint(hinted)], [K.fingerprint(hint)],
                                                   [len(hint)], [True]))
    leaked = _err(lambda: K.check_context_fingerprints([hinted], [K.fingerprint(hinted + [0])], [K.fingerprint(hint)],
                                                       [len(hint)], [True]))
    return {"prompt": str(list(prompt)), "hint": str(list(hint)), "clean": ok, "leaked": leaked}


# ----------------------------------------------------------------------------- LUFFY


@example("luffy_shaping")
def luffy_shaping(probs, gamma):
    """f(π) = π/(π+γ) and its gradient with respect to lp, π·γ/(π+γ)²."""
    lp = f64(probs).log().requires_grad_(True)
    f = K.luffy_shaped_weight(lp, gamma)
    (g,) = torch.autograd.grad(f.sum(), lp)
    return {"probs": nums(probs), "gamma": float(gamma), "f": nums(f), "grad": nums(g)}


@example("luffy_mixed_group")
def luffy_mixed_group(native_rewards, demo_rewards):
    """Advantages over the mixed group vs over the native rows alone."""
    r = f64(list(native_rewards) + list(demo_rewards))
    mixed = adv_mod.grpo(r, _g(len(r)), std="unbiased")
    alone = adv_mod.grpo(f64(native_rewards), _g(len(native_rewards)), std="unbiased")
    return {"native": nums(native_rewards), "demos": nums(demo_rewards), "mixed": nums(mixed),
            "native_alone": nums(alone)}


@example("luffy_vs_ppo_clip")
def luffy_vs_ppo_clip(prob, prob_old, adv, gamma):
    """One token with π_θ far above π_old: clipped on a native row, shaped on a demo row."""
    lp = f64([[math.log(prob)], [math.log(prob)]]).requires_grad_(True)
    lp_old = f64([[math.log(prob_old)], [0.0]])
    mask = torch.ones(2, 1, dtype=torch.bool)
    loss, _ = K.luffy_loss(lp, lp_old, f64([adv, adv]), mask, torch.tensor([False, True]), gamma=gamma,
                           eps_low=0.2, eps_high=0.2)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return {"prob": float(prob), "prob_old": float(prob_old), "adv": float(adv), "ratio": round(prob / prob_old, 4),
            "native_grad": nums(g[0]), "demo_grad": nums(g[1]), "demo_loss": nums(loss[1].detach())}


@example("luffy_masking")
def luffy_masking(demo_probs, gamma, adv):
    """A demonstration row with a padded tail: padded positions get no loss, no gradient."""
    lp, mask = ragged([[math.log(p) for p in demo_probs], [0.0]], fill=0.0)
    lp[1, 0] = 0.0
    mask[1, 0] = False
    lp = lp.requires_grad_(True)
    lp_old = torch.zeros_like(lp)
    loss, m = K.luffy_loss(lp, lp_old, f64([adv, adv]), mask, torch.tensor([True, True]), gamma=gamma,
                           eps_low=0.2, eps_high=0.2)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return {"demo_probs": nums(demo_probs), "loss_row": nums(loss[0].detach()), "grad_row": nums(g[0]),
            "masked_grad": nums(g[1]), "demo_tokens": int(m["luffy/off_policy_tokens"])}


# ----------------------------------------------------------------------------- GRIN


@example("grin_mixture")
def grin_mixture(p_old, alpha):
    """log q_mix on a gold token vs on a token off the gold text."""
    lp_old = f64([[math.log(p_old), math.log(p_old)]])
    q = K.grin_mixture_logp(lp_old, f64([alpha]), torch.tensor([[True, False]]), torch.ones(1, 2, dtype=torch.bool))
    return {"p_old": float(p_old), "alpha": float(alpha), "q_gold_token": round(float(q[0, 0].exp()), 4),
            "q_off_gold": round(float(q[0, 1].exp()), 4)}


@example("grin_injection_rule")
def grin_injection_rule(group_size, alpha, ema):
    """How many gold rows an all-fail group gets under the success-decay schedule."""
    from policylab.methods.families.hints_and_gold import gold_count

    class P:
        grin_alpha, grin_schedule = alpha, "success_decay"

    class C:
        grin_alpha, grin_schedule = alpha, "constant"

    return {"G": int(group_size), "alpha": float(alpha), "ema": float(ema),
            "k_decay": int(gold_count(P, ema, group_size)), "k_constant": int(gold_count(C, ema, group_size))}


@example("grin_vs_reference")
def grin_vs_reference(p_old, p_ref, alpha, prob):
    """A gold token's ratio with the mixture denominator vs with π_ref in the denominator."""
    lp_old = f64([[math.log(p_old)]])
    q = K.grin_mixture_logp(lp_old, f64([alpha]), torch.tensor([[True]]), torch.ones(1, 1, dtype=torch.bool))
    return {"prob": float(prob), "p_ref": float(p_ref), "q_mix": round(float(q.exp()), 4),
            "ratio_mix": round(prob / float(q.exp()), 4), "ratio_ref": round(prob / p_ref, 4)}


@example("grin_alpha_zero")
def grin_alpha_zero(lp_old, bad_alpha):
    """α = 0: the mixture is π_old exactly; α = 1 (an all-gold group) is refused."""
    lp = f64([lp_old])
    m = torch.ones_like(lp, dtype=torch.bool)
    q = K.grin_mixture_logp(lp, f64([0.0]), m.clone(), m)
    err = _err(lambda: K.grin_mixture_logp(lp, f64([bad_alpha]), m.clone(), m))
    return {"lp_old": nums(lp_old), "q_alpha0": nums(q[0]), "equal": bool(torch.equal(q, lp)), "error": err}


# ----------------------------------------------------------------------------- MOER


@example("moer_unit_ratio")
def moer_unit_ratio(lp, lp_old, adv):
    """Native row: ratio π/π_old (clipped surrogate); guided row: π/sg(π) = 1, gradient −A."""
    from policylab.kernels import objectives as O

    x = f64([lp, lp]).view(2, 1).requires_grad_(True)
    old = f64([lp_old, lp_old]).view(2, 1)
    den = K.unit_ratio_denominator(x, old, torch.tensor([False, True]))
    loss, _ = O.ppo_clip(x, den, f64([adv, adv]), torch.ones(2, 1, dtype=torch.bool), eps_low=0.2, eps_high=0.2)
    (g,) = torch.autograd.grad(loss.sum(), x)
    return {"lp": float(lp), "lp_old": float(lp_old), "ratio_native": round(math.exp(lp - lp_old), 4), "ratio_guided": nums((x - den).exp().view(-1))[1],
            "grad_native": nums(g[0])[0], "grad_guided": nums(g[1])[0], "adv": float(adv)}


@example("moer_schedule")
def moer_schedule(prefix_frac, decay_steps, steps):
    """The prefix fraction over steps: linear decay, never increasing."""
    from policylab.methods.families.demonstrations import prefix_fraction

    class P:
        pass

    P.prefix_frac, P.prefix_decay_steps = prefix_frac, decay_steps
    fr = [prefix_fraction(s, P) for s in steps]
    return {"prefix_frac": float(prefix_frac), "decay_steps": int(decay_steps), "steps": list(steps),
            "fractions": nums(fr),
            "non_increasing": all(a >= b for a, b in zip(fr, fr[1:]))}


@example("moer_vs_luffy")
def moer_vs_luffy(prob, adv, gamma):
    """An off-policy token: MOER's unit ratio gives gradient −A, LUFFY's shaping −A·π·γ/(π+γ)²."""
    from policylab.kernels import objectives as O

    x = f64([[math.log(prob)]]).requires_grad_(True)
    den = K.unit_ratio_denominator(x, torch.zeros_like(x), torch.tensor([True]))
    moer, _ = O.ppo_clip(x, den, f64([adv]), torch.ones(1, 1, dtype=torch.bool), eps_low=0.2, eps_high=0.2)
    (gm,) = torch.autograd.grad(moer.sum(), x)
    y = f64([[math.log(prob)]]).requires_grad_(True)
    luffy, _ = K.luffy_loss(y, torch.zeros_like(y), f64([adv]), torch.ones(1, 1, dtype=torch.bool),
                            torch.tensor([True]), gamma=gamma, eps_low=0.2, eps_high=0.2)
    (gl,) = torch.autograd.grad(luffy.sum(), y)
    return {"prob": float(prob), "adv": float(adv), "gamma": float(gamma), "moer_grad": nums(gm.view(-1))[0],
            "luffy_grad": nums(gl.view(-1))[0]}


@example("moer_advantages")
def moer_advantages(rewards):
    """A = r − mean_g r (no std division) over a group of native, guided and expert rows."""
    r = f64(rewards)
    return {"rewards": nums(r), "advantages": nums(adv_mod.dr_grpo(r, _g(len(rewards))))}


# ----------------------------------------------------------------------------- GRAFT


@example("graft_borrow")
def graft_borrow(receiver, peer_mixed, peer_uniform):
    """When GRAFT borrows: receiver all-fail and peer mixed."""
    r = torch.tensor(receiver, dtype=torch.bool)
    return {"receiver": str(list(receiver)), "peer_mixed": str(list(peer_mixed)),
            "peer_uniform": str(list(peer_uniform)),
            "borrow_mixed": K.graft_should_borrow(r, torch.tensor(peer_mixed, dtype=torch.bool)),
            "borrow_uniform": K.graft_should_borrow(r, torch.tensor(peer_uniform, dtype=torch.bool)),
            "borrow_if_receiver_won": K.graft_should_borrow(torch.tensor([True] + list(receiver[1:]), dtype=torch.bool),
                                                             torch.tensor(peer_mixed, dtype=torch.bool))}


@example("graft_compat")
def graft_compat(lp_receiver, lp_peer, threshold):
    """Compatibility of one text tokenized two ways (different lengths): sequence means."""
    lr, mr = ragged([lp_receiver])
    lpp, mp = ragged([lp_peer])
    c = K.graft_compatibility(lr, mr, lpp, mp)
    return {"n_receiver": len(lp_receiver), "n_peer": len(lp_peer), "compat": nums(c)[0],
            "kept": bool(float(c[0]) >= threshold), "threshold": float(threshold)}


@example("graft_vs_erils")
def graft_vs_erils(peer_rewards, native_rewards):
    """GRAFT normalizes inside the imported group alone; ERILS normalizes each source inside a shared group."""
    peer = f64(peer_rewards)
    graft = adv_mod.grpo(peer, _g(len(peer_rewards)), std="unbiased")
    r = f64(list(native_rewards) + list(peer_rewards))
    ext = torch.tensor([False] * len(native_rewards) + [True] * len(peer_rewards))
    erils = K.erils_advantages(r, _g(len(r)), ext, std="unbiased")
    return {"peer": nums(peer), "native": nums(native_rewards), "graft": nums(graft),
            "erils_native": nums(erils[:len(native_rewards)]), "erils_external": nums(erils[len(native_rewards):])}


@example("graft_tokenwise_refusal")
def graft_tokenwise_refusal(lp_receiver, lp_peer):
    """Position-wise log-ratios across tokenizations of different lengths are refused."""
    T = max(len(lp_receiver), len(lp_peer))
    a, ma = ragged([lp_receiver + [0.0] * (T - len(lp_receiver))])
    ma[0, len(lp_receiver):] = False
    b, mb = ragged([lp_peer + [0.0] * (T - len(lp_peer))])
    mb[0, len(lp_peer):] = False
    return {"error": _err(lambda: K.tokenwise_log_ratio(a, ma, b, mb)),
            "compat": nums(K.graft_compatibility(a, ma, b, mb))[0]}


# ----------------------------------------------------------------------------- ERILS


@example("erils_per_source")
def erils_per_source(native, external):
    """Per-source vs pooled normalization inside one prompt group."""
    r = f64(list(native) + list(external))
    ext = torch.tensor([False] * len(native) + [True] * len(external))
    per = K.erils_advantages(r, _g(len(r)), ext, std="population")
    pooled = K.erils_advantages(r, _g(len(r)), ext, std="population", per_source=False)
    n = len(native)
    return {"native": nums(native), "external": nums(external), "per_native": nums(per[:n]),
            "per_external": nums(per[n:]), "pooled_native": nums(pooled[:n]), "pooled_external": nums(pooled[n:])}


@example("erils_cap")
def erils_cap(lengths, external, cap):
    """Which rows the external length cap keeps (inclusive; native rows always)."""
    keep = K.erils_length_keep(torch.tensor(lengths), torch.tensor(external, dtype=torch.bool), cap)
    return {"lengths": list(lengths), "external": str(list(external)), "cap": int(cap),
            "keep": str([bool(k) for k in keep.tolist()])}


@example("erils_vs_grpo")
def erils_vs_grpo(native, external):
    """The mean advantage of the native rows: pooled GRPO pushes it down, per-source keeps it at 0."""
    out = erils_per_source(native, external)
    return {**out, "mean_per_native": round(sum(out["per_native"]) / len(native), 4) + 0.0,
            "mean_pooled_native": round(sum(out["pooled_native"]) / len(native), 4) + 0.0}


@example("erils_bad_cap")
def erils_bad_cap(cap):
    """A cap below 1 is refused."""
    return {"cap": cap, "error": _err(lambda: K.erils_length_keep(torch.tensor([3]), torch.tensor([True]), cap))}
