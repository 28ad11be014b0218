"""Worked examples for corrections and trust-region objectives (tis ... sis), plus the
cross-method comparisons of `learn/topics.yaml` (names starting with `xm_`).

Every example takes plain keyword arguments, builds small float64 tensors, calls the real
kernels of policylab and returns plain values (floats, ints, strs, bools, lists of floats).
Gradients are taken with autograd on the learner's `logp`, the only differentiable input.
Probabilities are given as plain numbers and turned into log-probs here; "ratio" arguments
are engine or policy ratios that become log-ratio offsets on a base log-prob.
"""

from __future__ import annotations

import inspect
import math

import torch

from ... import advantages, aggregate as agg, corrections, kl, methods, objectives
from ...corrections._host import clipped_surrogate
from ...rewards import ttrl_rewards
from . import example

F64 = torch.float64


# ----------------------------------------------------------------------------- helpers


def _row(values) -> torch.Tensor:
    """A [1, T] float64 tensor."""
    return torch.tensor([float(v) for v in values], dtype=F64).reshape(1, -1)


def _log_row(probs) -> torch.Tensor:
    return torch.log(_row(probs))


def _ones(t: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(t, dtype=torch.bool)


def _flat(t: torch.Tensor) -> list[float]:
    return [float(v) + 0.0 for v in t.detach().reshape(-1).tolist()]  # + 0.0: no "-0.0"


def _f(t) -> float:
    return (float(t.detach()) if isinstance(t, torch.Tensor) else float(t)) + 0.0


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def _grad(loss_sum: torch.Tensor, leaf: torch.Tensor) -> list[float]:
    (g,) = torch.autograd.grad(loss_sum, leaf)
    return _flat(g)


def _error(fn) -> str:
    """The message of the error `fn` raises ("no error" if it returns)."""
    try:
        fn()
    except (ValueError, TypeError) as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def _engine_pair(ratios, base_prob: float = 0.1):
    """(logp_old, logp_behavior) [1, T] whose engine ratio exp(lp_old - lp_mu) = ratios."""
    lp_mu = torch.full((1, len(ratios)), math.log(base_prob), dtype=F64)
    return lp_mu + torch.log(_row(ratios)), lp_mu


def _padded(rows, fill: float = 0.0):
    """[B, T] tensor + bool mask from ragged lists."""
    T = max(len(r) for r in rows)
    x = torch.full((len(rows), T), fill, dtype=F64)
    m = torch.zeros((len(rows), T), dtype=torch.bool)
    for i, r in enumerate(rows):
        x[i, : len(r)] = torch.tensor([float(v) for v in r], dtype=F64)
        m[i, : len(r)] = True
    return x, m


# --------------------------------------------------------------------------------- tis


@example("tis_weights")
def tis_weights(p_old, p_behavior, cap):
    lp_old, lp_mu = _log_row(p_old), _log_row(p_behavior)
    mask = _ones(lp_old)
    raw, _ = corrections.tis(lp_old, lp_mu, mask, cap=math.inf)
    w, m = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    return {"p_old": list(map(float, p_old)), "p_behavior": list(map(float, p_behavior)), "cap": cap,
            "ratios": _flat(raw), "weights": _flat(w), "frac_capped": _f(m["tis/frac_capped"]),
            "ess": _f(m["tis/ess"])}


@example("tis_host_gradient")
def tis_host_gradient(p_old, p_behavior, adv, cap, eps):
    """First minibatch (logp = logp_old): the TIS weight scales the PPO gradient -A."""
    lp_old, lp_mu = _log_row(p_old), _log_row(p_behavior)
    mask = _ones(lp_old)
    w, _ = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    lp = _leaf(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    host, _ = objectives.ppo_clip(lp, lp_old, a, mask, eps_low=eps, eps_high=eps)
    plain = _grad(host.sum(), lp)
    lp2 = _leaf(lp_old)
    host2, _ = objectives.ppo_clip(lp2, lp_old, a, mask, eps_low=eps, eps_high=eps)
    return {"adv": adv, "cap": cap, "weights": _flat(w), "grad_plain": plain,
            "grad_tis": _grad((host2 * w).sum(), lp2)}


@example("tis_vs_icepop")
def tis_vs_icepop(ratios, cap, low, high):
    lp_old, lp_mu = _engine_pair(ratios)
    mask = _ones(lp_old)
    w_tis, _ = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    w_ice, m = corrections.icepop(lp_old, lp_mu, mask, low=low, high=high)
    return {"ratios": list(map(float, ratios)), "cap": cap, "low": low, "high": high,
            "tis": _flat(w_tis), "icepop": _flat(w_ice), "icepop_frac_masked": _f(m["icepop/frac_masked"])}


@example("tis_role_pitfall")
def tis_role_pitfall(p_old, p_behavior, p_current, cap):
    lp_old, lp_mu, lp_now = _log_row([p_old]), _log_row([p_behavior]), _log_row([p_current])
    mask = _ones(lp_old)
    right, _ = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    swapped, _ = corrections.tis(lp_mu, lp_old, mask, cap=cap)
    live, _ = corrections.tis(_leaf(lp_now), lp_mu, mask, cap=cap)
    return {"p_old": p_old, "p_behavior": p_behavior, "p_current": p_current, "cap": cap,
            "correct": _f(right[0, 0]), "swapped": _f(swapped[0, 0]), "live": _f(live[0, 0]),
            "live_requires_grad": bool(live.requires_grad)}


# ------------------------------------------------------------------------------ icepop


@example("icepop_weights")
def icepop_weights(ratios, low, high):
    lp_old, lp_mu = _engine_pair(ratios)
    w, m = corrections.icepop(lp_old, lp_mu, _ones(lp_old), low=low, high=high)
    return {"ratios": list(map(float, ratios)), "low": low, "high": high, "weights": _flat(w),
            "frac_masked": _f(m["icepop/frac_masked"]), "frac_masked_low": _f(m["icepop/frac_masked_low"]),
            "frac_masked_high": _f(m["icepop/frac_masked_high"])}


@example("icepop_vs_mis")
def icepop_vs_mis(ratios, low, high, mis_low, mis_high):
    """One response: token masking (IcePop) vs one decision per response (MIS)."""
    lp_old, lp_mu = _engine_pair(ratios)
    mask = _ones(lp_old)
    w_ice, _ = corrections.icepop(lp_old, lp_mu, mask, low=low, high=high)
    out = {"ratios": list(map(float, ratios)), "low": low, "high": high, "mis_low": mis_low,
           "mis_high": mis_high, "icepop": _flat(w_ice)}
    for kind in ("geomean", "product"):
        w, m = corrections.mis(lp_old, lp_mu, mask, low=mis_low, high=mis_high, kind=kind)
        out[f"{kind}_ratio"] = math.exp(_f(m["mis/log_ratio_mean"]))
        out[f"{kind}_weight"] = _f(w[0])
    return out


@example("icepop_normalizer")
def icepop_normalizer(host_losses, ratios, low, high):
    """token_mean of the weighted losses with the zeroed tokens kept in / dropped from the
    denominator (icepop_normalizer_mask)."""
    lp_old, lp_mu = _engine_pair(ratios)
    mask = _ones(lp_old)
    w, _ = corrections.icepop(lp_old, lp_mu, mask, low=low, high=high)
    weighted = _row(host_losses) * w
    keep = corrections.icepop_normalizer_mask(w, mask, masked_in_normalizer=True)
    drop = corrections.icepop_normalizer_mask(w, mask, masked_in_normalizer=False)
    return {"ratios": list(map(float, ratios)), "weights": _flat(w), "kept_in_denominator": _f(agg.aggregate(weighted, keep, "token_mean")),
            "dropped_from_denominator": _f(agg.aggregate(weighted, drop, "token_mean")),
            "n_keep": int(keep.sum()), "n_drop": int(drop.sum())}


# ----------------------------------------------------------------------- online_icepop


@example("online_icepop_grad")
def online_icepop_grad(ratios, adv, low, high):
    """Learner at the sampling version: gradient -M(k)·A per token, no clip."""
    lp_now, lp_mu = _engine_pair(ratios)
    lp = _leaf(lp_now)
    a = torch.full((1,), float(adv), dtype=F64)
    loss, m = corrections.online_icepop(lp, lp_mu, a, _ones(lp), low=low, high=high)
    return {"ratios": list(map(float, ratios)), "adv": adv, "low": low, "high": high,
            "loss": _flat(loss), "grad": _grad(loss.sum(), lp),
            "frac_masked": _f(m["online_icepop/frac_masked"])}


@example("online_vs_icepop")
def online_vs_icepop(ratio, adv, rho_reused, low, high, eps):
    """Fresh batch: online IcePop = IcePop x PPO at ρ = 1. Reused batch (ρ ≠ 1): the
    clipped IcePop stops, a clip-free update would keep pushing."""
    lp_old, lp_mu = _engine_pair([ratio])
    mask = _ones(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    w, _ = corrections.icepop(lp_old, lp_mu, mask, low=low, high=high)

    def icepop_grad(shift):
        lp = _leaf(lp_old + math.log(shift))
        host, _ = objectives.ppo_clip(lp, lp_old, a, mask, eps_low=eps, eps_high=eps)
        return _grad((host * w).sum(), lp)[0]

    def online_grad(shift):
        lp = _leaf(lp_old + math.log(shift))
        loss, _ = corrections.online_icepop(lp, lp_mu, a, mask, low=low, high=high)
        return _grad(loss.sum(), lp)[0]

    fresh_i, fresh_o = icepop_grad(1.0), online_grad(1.0)
    return {"ratio": ratio, "adv": adv, "rho_reused": rho_reused, "eps": eps,
            "icepop_fresh": fresh_i, "online_fresh": fresh_o, "equal_fresh": abs(fresh_i - fresh_o) < 1e-12,
            "icepop_reused": icepop_grad(rho_reused), "online_reused": online_grad(rho_reused)}


@example("online_icepop_ledger")
def online_icepop_ledger(batch_id, version):
    ledger = corrections.BatchLedger()
    ledger.consume(batch_id, version, version)
    again = _error(lambda: ledger.consume(batch_id, version, version))
    stale = _error(lambda: ledger.check(f"{batch_id}-next", version, version + 1))
    return {"batch_id": batch_id, "version": version, "n_consumed": len(ledger),
            "reuse_error": again, "stale_error": stale}


# -------------------------------------------------------------------------------- kpop


@example("kpop_decisions")
def kpop_decisions(p_old, p_behavior, delta):
    lp_old, lp_mu = _log_row(p_old), _log_row(p_behavior)
    w, _ = corrections.kpop(lp_old, lp_mu, _ones(lp_old), delta=delta, in_region_weight="ratio")
    pa, pb = _row(p_old), _row(p_behavior)
    d_f = corrections.binary_kl(pa, 1 - pa, pb, 1 - pb)
    d_r = corrections.binary_kl(pb, 1 - pb, pa, 1 - pa)
    return {"p_old": list(map(float, p_old)), "p_behavior": list(map(float, p_behavior)), "delta": delta,
            "ratios": _flat(pa / pb), "kl_forward": _flat(d_f), "kl_reverse": _flat(d_r), "weights": _flat(w),
            "decisions": ", ".join("kept" if v > 0 else "masked" for v in _flat(w)),
            "decisions_zh": "、".join("保留" if v > 0 else "掩码" for v in _flat(w))}


@example("kpop_vs_icepop")
def kpop_vs_icepop(p_old, p_behavior, delta, low, high):
    lp_old, lp_mu = _log_row(p_old), _log_row(p_behavior)
    mask = _ones(lp_old)
    w_k, _ = corrections.kpop(lp_old, lp_mu, mask, delta=delta, in_region_weight="ratio")
    w_i, _ = corrections.icepop(lp_old, lp_mu, mask, low=low, high=high)
    return {"p_old": list(map(float, p_old)), "p_behavior": list(map(float, p_behavior)), "delta": delta,
            "low": low, "high": high, "ratios": _flat(torch.exp(lp_old - lp_mu)),
            "kpop": _flat(w_k), "icepop": _flat(w_i)}


@example("kpop_edge")
def kpop_edge(p_old, p_behavior, delta, eps):
    lp_old, lp_mu = _log_row(p_old), _log_row(p_behavior)
    mask = _ones(lp_old)
    w_ratio, m = corrections.kpop(lp_old, lp_mu, mask, delta=delta, eps=eps, in_region_weight="ratio")
    w_one, _ = corrections.kpop(lp_old, lp_mu, mask, delta=delta, eps=eps, in_region_weight="one")
    pa, pb = _row(p_old), _row(p_behavior)
    naive = corrections.binary_kl(pa, 1 - pa, pb, 1 - pb)  # no clamp: 0 · log 0 at p = 1
    return {"p_old": list(map(float, p_old)), "p_behavior": list(map(float, p_behavior)), "eps": eps,
            "weights_ratio": _flat(w_ratio), "weights_one": _flat(w_one),
            "all_finite": bool(torch.isfinite(w_ratio).all()), "kl_forward_max": _f(m["kpop/kl_forward_max"]),
            "naive_kl": str(_flat(naive)), "naive_has_nan": bool(torch.isnan(naive).any())}


# --------------------------------------------------------------------------------- mis


def _constant_sequences(per_token_log_ratio, lengths, base=-1.0):
    lp_mu, mask = _padded([[base] * n for n in lengths])
    shift = torch.tensor([float(d) for d in per_token_log_ratio], dtype=F64).unsqueeze(-1)
    return torch.where(mask, lp_mu + shift, lp_mu), lp_mu, mask


@example("mis_weights")
def mis_weights(per_token_log_ratio, lengths, low, high):
    lp_old, lp_mu, mask = _constant_sequences(per_token_log_ratio, lengths)
    out = {"lengths": list(lengths), "per_token_log_ratio": list(map(float, per_token_log_ratio)),
           "low": low, "high": high}
    for kind in ("geomean", "product"):
        w, _ = corrections.mis(lp_old, lp_mu, mask, low=low, high=high, kind=kind)
        fn = corrections.seq_ratio_geomean if kind == "geomean" else corrections.seq_ratio_product
        out[f"{kind}_ratio"] = _flat(fn(lp_old, lp_mu, mask).ratio)
        out[f"{kind}_weight"] = _flat(w)
    return out


@example("mis_vs_gspo")
def mis_vs_gspo(engine_log_ratios, policy_log_ratios, low, high, eps_low, eps_high):
    """Same geometric-mean formula, two different ratios: MIS reads π_old/μ, GSPO π_θ/π_old."""
    lp_mu = torch.full((1, len(engine_log_ratios)), -1.0, dtype=F64)
    lp_old = lp_mu + _row(engine_log_ratios)
    mask = _ones(lp_old)
    w, _ = corrections.mis(lp_old, lp_mu, mask, low=low, high=high, kind="geomean")
    lp = _leaf(lp_old + _row(policy_log_ratios))
    w_after, _ = corrections.mis(lp_old, lp_mu, mask, low=low, high=high, kind="geomean")
    loss, m = objectives.gspo(lp, lp_old, torch.ones(1, dtype=F64), mask, eps_low=eps_low, eps_high=eps_high)
    grad = _grad(agg.aggregate(loss, mask, "seq_mean_token_mean"), lp)
    return {"mis_ratio": _f(corrections.seq_ratio_geomean(lp_old, lp_mu, mask).ratio[0]),
            "mis_weight": _f(w[0]), "mis_weight_after_update": _f(w_after[0]),
            "gspo_ratio": _f(m["ratio/mean"]), "gspo_grad": grad, "eps_high": eps_high}


@example("mis_long_sequence")
def mis_long_sequence(length, p_old, p_behavior, low, high):
    """Probabilities of a long response multiplied directly underflow; log space does not."""
    lp_old = torch.full((1, length), math.log(p_old), dtype=F64)
    lp_mu = torch.full((1, length), math.log(p_behavior), dtype=F64)
    mask = _ones(lp_old)
    naive = torch.exp(lp_old).prod() / torch.exp(lp_mu).prod()  # 0 / 0 in float64
    prod = corrections.seq_ratio_product(lp_old, lp_mu, mask)
    geo = corrections.seq_ratio_geomean(lp_old, lp_mu, mask)
    w_p, _ = corrections.mis(lp_old, lp_mu, mask, low=low, high=high, kind="product")
    w_g, _ = corrections.mis(lp_old, lp_mu, mask, low=low, high=high, kind="geomean")
    return {"length": length, "p_old": p_old, "p_behavior": p_behavior, "naive_ratio": str(float(naive)),
            "log_product": _f(prod.log_ratio[0]), "product_guard_hit": bool(prod.clamped[0]),
            "product_weight": _f(w_p[0]), "geomean_ratio": _f(geo.ratio[0]), "geomean_weight": _f(w_g[0])}


# --------------------------------------------------------------------------------- gmc


@example("gmc_cap")
def gmc_cap(weights, group, cap):
    w = torch.tensor([float(v) for v in weights], dtype=F64)
    g = torch.tensor(group)
    out, m = corrections.gmc(w, g, cap=cap)
    return {"weights": list(map(float, weights)), "group": str(list(group)), "cap": cap, "capped": _flat(out),
            "max_mass_before": _f(m["gmc/max_group_mass"]), "max_mass_after": _f(m["gmc/max_group_mass_capped"]),
            "frac_groups_capped": _f(m["gmc/frac_groups_capped"]),
            "ess_before": _f(m["gmc/ess_before"]), "ess_after": _f(m["gmc/ess_after"])}


@example("gmc_vs_trajectory_clip")
def gmc_vs_trajectory_clip(weights, cap, clip):
    """GMC on one group vs clipping each trajectory weight on its own (the `mis` kernel in
    truncate mode on one-token trajectories whose log-ratio is log w)."""
    w = torch.tensor([float(v) for v in weights], dtype=F64)
    capped, _ = corrections.gmc(w, torch.zeros(len(weights), dtype=torch.long), cap=cap)
    lp_num = torch.log(w).unsqueeze(-1)
    clipped, _ = corrections.mis(lp_num, torch.zeros_like(lp_num), _ones(lp_num), low=0.0, high=clip,
                                 kind="product", mode="truncate")
    return {"weights": list(map(float, weights)), "cap": cap, "clip": clip, "gmc": _flat(capped),
            "clipped": _flat(clipped), "gmc_mass": _f(capped.sum()), "clipped_mass": _f(clipped.sum()),
            "gmc_first_over_second": _f(capped[0] / capped[1]),
            "clipped_first_over_second": _f(clipped[0] / clipped[1])}


@example("gmc_edge")
def gmc_edge(weights, cap, bad_weights):
    w = torch.tensor([float(v) for v in weights], dtype=F64)
    out, m = corrections.gmc(w, torch.full((len(weights),), 5), cap=cap)
    bad = torch.tensor([float(v) for v in bad_weights], dtype=F64)
    msg = _error(lambda: corrections.gmc(bad, torch.zeros(len(bad_weights), dtype=torch.long), cap=cap))
    return {"weights": list(map(float, weights)), "cap": cap, "mass": _f(w.sum()), "capped": _flat(out),
            "rescaled": _f(m["gmc/frac_groups_capped"]) > 0, "bad_weights": str(list(bad_weights)),
            "negative_error": msg}


# ------------------------------------------------------------------ missing_old_logits


def _versioned(lp, version, engine):
    return corrections.VersionedLogprobs(lp, version, engine)


@example("mol_decompose")
def mol_decompose(p_behavior, p_old, p_current):
    lp_mu, lp_old, lp_now = _log_row([p_behavior]), _log_row([p_old]), _log_row([p_current])
    parts = corrections.decompose(lp_now, lp_old, lp_mu, _ones(lp_now))
    d, s, total = (math.exp(_f(parts[k][0, 0])) for k in ("engine_log_ratio", "staleness_log_ratio",
                                                           "total_log_ratio"))
    return {"p_behavior": p_behavior, "p_old": p_old, "p_current": p_current, "d": d, "s": s,
            "total": total, "d_times_s": d * s, "matches": abs(d * s - total) < 1e-12}


@example("mol_total_vs_decoupled")
def mol_total_vs_decoupled(p_behavior, p_old, p_current, adv, cap, eps):
    lp_mu, lp_old, lp_now = _log_row([p_behavior]), _log_row([p_old]), _log_row([p_current])
    mask = _ones(lp_now)
    a = torch.full((1,), float(adv), dtype=F64)
    lp = _leaf(lp_now)
    single, _ = objectives.ppo_clip(lp, lp_mu, a, mask, eps_low=eps, eps_high=eps)  # one clip on π_θ/μ
    g_single = _grad(single.sum(), lp)[0]
    lp2 = _leaf(lp_now)
    loss, m = corrections.decoupled_loss(lp2, _versioned(lp_old, 3, "trainer"), _versioned(lp_mu, 3, "bf16"),
                                         a, mask, correction="tis", correction_kwargs={"cap": cap},
                                         eps_low=eps, eps_high=eps)
    return {"p_behavior": p_behavior, "p_old": p_old, "p_current": p_current, "adv": adv, "cap": cap, "eps": eps,
            "d": p_old / p_behavior, "s": p_current / p_old, "total": p_current / p_behavior,
            "single_clip_grad": g_single, "decoupled_grad": _grad(loss.sum(), lp2)[0]}


@example("mol_vs_minirl")
def mol_vs_minirl(p_behavior, p_old, p_current, adv, cap, eps):
    lp_mu, lp_old, lp_now = _log_row(p_behavior), _log_row(p_old), _log_row(p_current)
    mask = _ones(lp_now)
    a = torch.full((1,), float(adv), dtype=F64)
    lp1, lp2 = _leaf(lp_now), _leaf(lp_now)
    l1, _ = corrections.decoupled_loss(lp1, _versioned(lp_old, 7, "trainer"), _versioned(lp_mu, 7, "bf16"), a,
                                       mask, correction="tis", correction_kwargs={"cap": cap},
                                       eps_low=eps, eps_high=eps)
    l2, _ = corrections.minirl_loss(lp2, lp_old, lp_mu, a, mask, eps_low=eps, eps_high=eps, engine_cap=cap)
    g1, g2 = _grad(l1.sum(), lp1), _grad(l2.sum(), lp2)
    stale_old = _versioned(lp_old, 6, "trainer")
    refused = _error(lambda: corrections.decoupled_loss(
        _leaf(lp_now), stale_old, _versioned(lp_mu, 7, "bf16"), a, mask, correction="tis",
        correction_kwargs={"cap": cap}, eps_low=eps, eps_high=eps))
    accepted = _error(lambda: corrections.minirl_loss(_leaf(lp_now), stale_old.tensor, lp_mu, a, mask,
                                                      eps_low=eps, eps_high=eps, engine_cap=cap))
    return {"mol_loss": _flat(l1), "minirl_loss": _flat(l2), "mol_grad": g1, "minirl_grad": g2,
            "same": bool(torch.allclose(l1, l2)) and g1 == g2, "mol_version_error": refused,
            "minirl_version_error": accepted}


@example("mol_refusals")
def mol_refusals(p_behavior, p_old):
    lp_mu, lp_old = _log_row([p_behavior]), _log_row([p_old])
    beh = _versioned(lp_mu, 5, "bf16")
    approx = corrections.VersionedLogprobs(lp_old, 5, "trainer", "approx_ewma")
    return {"missing": _error(lambda: corrections.require_exact_old(None, beh)),
            "approx": _error(lambda: corrections.require_exact_old(approx, beh)),
            "version": _error(lambda: corrections.require_exact_old(_versioned(lp_old, 4, "trainer"), beh)),
            "exact_ok": _error(lambda: corrections.require_exact_old(_versioned(lp_old, 5, "trainer"), beh))}


# ------------------------------------------------------------------------------ minirl


@example("minirl_first_minibatch")
def minirl_first_minibatch(p_old, p_behavior, adv, eps):
    """ρ = 1: the clipped term is inactive and MiniRL = REINFORCE weighted by π_old/μ."""
    lp_old, lp_mu = _log_row(p_old), _log_row(p_behavior)
    mask = _ones(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    lp = _leaf(lp_old)
    loss, _ = corrections.minirl_loss(lp, lp_old, lp_mu, a, mask, eps_low=eps, eps_high=eps, engine_cap=None)
    lp2 = _leaf(lp_old)
    w, _ = corrections.tis(lp_old, lp_mu, mask, cap=math.inf)  # the untruncated engine ratio
    ref, _ = objectives.reinforce(lp2, a, mask, weight=w)
    g1, g2 = _grad(loss.sum(), lp), _grad(ref.sum(), lp2)
    return {"adv": adv, "engine_ratio": _flat(w), "minirl_grad": g1, "reinforce_grad": g2,
            "equal": all(abs(x - y) < 1e-12 for x, y in zip(g1, g2))}


@example("minirl_minibatches")
def minirl_minibatches(ratio_engine, rhos, adv, eps):
    """One token per entry of `rhos`: later minibatches see ρ ≠ 1 and the clip bites."""
    lp_old, lp_mu = _engine_pair([ratio_engine] * len(rhos))
    mask = _ones(lp_old)
    lp = _leaf(lp_old + torch.log(_row(rhos)))
    a = torch.full((1,), float(adv), dtype=F64)
    loss, m = corrections.minirl_loss(lp, lp_old, lp_mu, a, mask, eps_low=eps, eps_high=eps, engine_cap=None)
    return {"ratio_engine": ratio_engine, "rhos": list(map(float, rhos)), "adv": adv, "eps": eps,
            "grad": _grad(loss.sum(), lp), "clip_frac": _f(m["minirl/clip_frac"])}


@example("minirl_vs_tis")
def minirl_vs_tis(ratio_engine, adv, cap, eps):
    lp_old, lp_mu = _engine_pair([ratio_engine])
    mask = _ones(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    lp = _leaf(lp_old)
    loss, _ = corrections.minirl_loss(lp, lp_old, lp_mu, a, mask, eps_low=eps, eps_high=eps, engine_cap=None)
    w, _ = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    lp2 = _leaf(lp_old)
    host, _ = objectives.ppo_clip(lp2, lp_old, a, mask, eps_low=eps, eps_high=eps)
    return {"ratio_engine": ratio_engine, "cap": cap, "minirl_grad": _grad(loss.sum(), lp)[0],
            "tis_grad": _grad((host * w).sum(), lp2)[0], "tis_weight": _f(w[0, 0])}


@example("minirl_routing")
def minirl_routing(layers, k):
    rec = corrections.RoutingRecord(torch.zeros((1, 3, layers, k), dtype=torch.long), "tiny-moe")
    return {"dense_with_routes": _error(lambda: corrections.check_routing(rec, model_is_moe=False,
                                                                          n_layers=layers, k=k)),
            "moe_without_routes": _error(lambda: corrections.check_routing(None, model_is_moe=True,
                                                                           n_layers=layers, k=k)),
            "wrong_top_k": _error(lambda: corrections.check_routing(rec, model_is_moe=True, n_layers=layers,
                                                                    k=k + 1)),
            "ok": _error(lambda: corrections.check_routing(rec, model_is_moe=True, n_layers=layers, k=k,
                                                           batch_shape=(1, 3), model_id="tiny-moe"))}


# --------------------------------------------------------------------------------- sis


def _sis_inputs(behavior_topk, current_topk, sampled, positions):
    """`positions` identical positions with a top-K of the given probabilities."""
    K = len(behavior_topk)
    ids = torch.arange(K).expand(1, positions, K).clone()
    lp_mu_k = torch.log(torch.tensor([float(p) for p in behavior_topk], dtype=F64)).expand(1, positions, K)
    lp_pi_k = torch.log(torch.tensor([float(p) for p in current_topk], dtype=F64)).expand(1, positions, K)
    tokens = torch.full((1, positions), int(sampled))
    lp = lp_pi_k[..., int(sampled)].clone()
    lp_mu = lp_mu_k[..., int(sampled)].clone()
    return lp, ids, lp_mu_k.clone(), lp_pi_k.clone(), tokens, lp_mu, _ones(lp)


@example("sis_accept_prob")
def sis_accept_prob(behavior_topk, current_topk, sampled, positions, seed):
    lp, ids, lmk, lpk, tok, lmu, mask = _sis_inputs(behavior_topk, current_topk, sampled, positions)
    gen = torch.Generator().manual_seed(int(seed))
    acc, m = corrections.sis(lp, ids, lmk, lpk, tok, lmu, mask, generator=gen)
    return {"p_current": float(current_topk[sampled]), "p_behavior": float(behavior_topk[sampled]),
            "envelope": math.exp(_f(m["sis/log_envelope_mean"])), "accept_prob": _f(m["sis/accept_prob_mean"]),
            "accept_rate": _f(m["sis/accept_rate"]), "positions": positions}


@example("sis_mechanism")
def sis_mechanism(topk, positions, seed):
    """π = μ: every token accepted; an accepted token's ratio is the unit carrier."""
    lp, ids, lmk, lpk, tok, lmu, mask = _sis_inputs(topk, topk, 0, positions)
    acc, m = corrections.sis(lp, ids, lmk, lpk, tok, lmu, mask, generator=torch.Generator().manual_seed(seed))
    leaf = _leaf(lp[:, :1])
    w = corrections.sis_weights(leaf, torch.full_like(leaf, 1.7), torch.ones_like(leaf, dtype=torch.bool))
    return {"accept_rate": _f(m["sis/accept_rate"]), "envelope": math.exp(_f(m["sis/log_envelope_mean"])),
            "carrier_value": _f(w[0, 0]), "carrier_grad": _grad(w.sum(), leaf)[0]}


@example("sis_vs_ppo")
def sis_vs_ppo(rho, adv, eps):
    """A token with ρ = π_θ/π_old above 1 + ε and A > 0: accepted by SIS vs clipped by PPO."""
    lp_old = _log_row([0.2])
    mask = _ones(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)

    def host_grad(accepted: bool) -> float:
        lp = _leaf(lp_old + math.log(rho))
        ratio = torch.exp(lp - lp_old)
        w = corrections.sis_weights(lp, ratio, torch.full_like(mask, accepted))
        return _grad(clipped_surrogate(w, a.unsqueeze(-1), 1 - eps, 1 + eps).sum(), lp)[0]

    lp = _leaf(lp_old + math.log(rho))
    ppo, _ = objectives.ppo_clip(lp, lp_old, a, mask, eps_low=eps, eps_high=eps)
    return {"rho": rho, "adv": adv, "eps": eps, "accepted_grad": host_grad(True),
            "rejected_grad": host_grad(False), "ppo_grad": _grad(ppo.sum(), lp)[0]}


@example("sis_seeded")
def sis_seeded(behavior_topk, current_topk, positions, seed):
    args = _sis_inputs(behavior_topk, current_topk, 0, positions)
    run = lambda s: corrections.sis(*args, generator=torch.Generator().manual_seed(s))[0]  # noqa: E731
    a, b, c = run(seed), run(seed), run(seed + 1)
    return {"seed": seed, "same_seed_equal": bool(torch.equal(a, b)),
            "other_seed_differs": int((a != c).sum()), "positions": positions,
            "no_generator": _error(lambda: corrections.sis(*args, generator=None))}


# -------------------------------------------------------------------------------- ripo


@example("ripo_bounds_table")
def ripo_bounds_table(p_old, delta):
    lp_old = _log_row(p_old)
    lo, hi = objectives.ripo_bounds(lp_old, delta=delta)
    p = _row(p_old)
    return {"p_old": list(map(float, p_old)), "delta": delta, "lo": _flat(lo), "hi": _flat(hi),
            "p_new_lo": _flat(lo * p), "p_new_hi": _flat(hi * p)}


@example("ripo_vs_ppo")
def ripo_vs_ppo(p_old, rho, adv, delta, eps):
    """Per token: gradient of RIPO and of PPO (fixed ε) at the same ratio ρ and advantage."""
    lp_old = _log_row(p_old)
    mask = _ones(lp_old)
    a = _row(adv)
    lp1, lp2 = _leaf(lp_old + torch.log(_row(rho))), _leaf(lp_old + torch.log(_row(rho)))
    l1, _ = objectives.ripo(lp1, lp_old, a, mask, delta=delta)
    l2, _ = objectives.ppo_clip(lp2, lp_old, a, mask, eps_low=eps, eps_high=eps)
    lo, hi = objectives.ripo_bounds(lp_old, delta=delta)
    return {"p_old": list(map(float, p_old)), "rho": list(map(float, rho)), "adv": list(map(float, adv)),
            "eps": eps, "ripo_lo": _flat(lo), "ripo_hi": _flat(hi),
            "ripo_grad": _grad(l1.sum(), lp1), "ppo_grad": _grad(l2.sum(), lp2)}


@example("ripo_frozen")
def ripo_frozen(p_old, p_current, delta):
    lp_old, lp_now = _log_row([p_old]), _log_row([p_current])
    mask = _ones(lp_old)
    _, hi_old = objectives.ripo_bounds(lp_old, delta=delta)
    _, hi_live = objectives.ripo_bounds(lp_now, delta=delta)  # the bug: bounds from the learner
    _, m = objectives.ripo(_leaf(lp_now), lp_old, torch.ones(1, dtype=F64), mask, delta=delta)
    return {"p_old": p_old, "p_current": p_current, "delta": delta, "hi_from_old": _f(hi_old[0, 0]),
            "hi_from_live": _f(hi_live[0, 0]), "hi_used_by_ripo": _f(m["ripo/bound_hi_mean"]),
            "rho": p_current / p_old}


# --------------------------------------------------------------------------- gppo_fdiv


@example("fdiv_intervals")
def fdiv_intervals(divergence, topology, p_old, delta):
    lo, hi = objectives.fdiv_bounds(_log_row(p_old), divergence=divergence, topology=topology, delta=delta)
    return {"divergence": divergence, "topology": topology, "p_old": list(map(float, p_old)), "delta": delta,
            "lo": _flat(lo), "hi": _flat(hi), "p_new_hi": _flat(hi * _row(p_old))}


@example("fdiv_vs_ripo")
def fdiv_vs_ripo(p_old, fdiv_delta, ripo_delta):
    lp_old = _log_row(p_old)
    flo, fhi = objectives.fdiv_bounds(lp_old, divergence="kl_old_new", topology="binary", delta=fdiv_delta)
    rlo, rhi = objectives.ripo_bounds(lp_old, delta=ripo_delta)
    return {"p_old": list(map(float, p_old)), "fdiv_delta": fdiv_delta, "ripo_delta": ripo_delta,
            "fdiv_lo": _flat(flo), "fdiv_hi": _flat(fhi), "ripo_lo": _flat(rlo), "ripo_hi": _flat(rhi)}


@example("fdiv_names")
def fdiv_names(p_old, delta):
    lp_old = _log_row(p_old)
    mc_lo, mc_hi = objectives.fdiv_bounds(lp_old, divergence="kl_old_new", topology="mc", delta=delta)
    b_lo, b_hi = objectives.fdiv_bounds(lp_old, divergence="kl_old_new", topology="binary", delta=delta)
    wrong = _error(lambda: objectives.fdiv_bounds(lp_old, divergence="kl", topology="mc", delta=delta))
    return {"p_old": list(map(float, p_old)), "delta": delta, "mc_lo": _flat(mc_lo), "mc_hi": _flat(mc_hi),
            "binary_lo": _flat(b_lo), "binary_hi": _flat(b_hi), "unknown_name": wrong}


@example("fdiv_ppo_as_tv")
def fdiv_ppo_as_tv(p_old, delta, rho, adv):
    """TV under the MC topology gives the fixed band [1 - 2δ, 1 + 2δ]: PPO's clip."""
    lp_old = _log_row(p_old)
    mask = _ones(lp_old)
    lo, hi = objectives.fdiv_bounds(lp_old, divergence="tv", topology="mc", delta=delta)
    a = torch.full((1,), float(adv), dtype=F64)
    lp1, lp2 = _leaf(lp_old + math.log(rho)), _leaf(lp_old + math.log(rho))
    l1, _ = objectives.gppo_fdiv(lp1, lp_old, a, mask, divergence="tv", topology="mc", delta=delta)
    l2, _ = objectives.ppo_clip(lp2, lp_old, a, mask, eps_low=2 * delta, eps_high=2 * delta)
    return {"p_old": list(map(float, p_old)), "delta": delta, "lo": _flat(lo), "hi": _flat(hi),
            "fdiv_loss": _flat(l1), "ppo_loss": _flat(l2), "fdiv_grad": _grad(l1.sum(), lp1),
            "ppo_grad": _grad(l2.sum(), lp2), "rho": rho, "eps": 2 * delta}


# -------------------------------------------------------------------------------- tapo


def _tapo_rows(log_ratios):
    lp_old = torch.full((1, len(log_ratios)), -1.0, dtype=F64)
    return lp_old, lp_old + _row(log_ratios)


def _wide(t: torch.Tensor) -> torch.Tensor:
    return torch.full(t.shape, 10.0, dtype=F64)  # ε(t) = 10 everywhere: no clipping


@example("tapo_prefix")
def tapo_prefix(log_ratios):
    lp_old, lp_now = _tapo_rows(log_ratios)
    mask = _ones(lp_old)
    G, _ = objectives.prefix_geometric_ratio(lp_now, lp_old, mask)
    return {"log_ratios": list(map(float, log_ratios)), "G": _flat(G),
            "product": _f(corrections.seq_ratio_product(lp_now, lp_old, mask).ratio[0]),
            "geomean": _f(corrections.seq_ratio_geomean(lp_now, lp_old, mask).ratio[0])}


@example("tapo_grad")
def tapo_grad(log_ratios, adv):
    lp_old, lp_now = _tapo_rows(log_ratios)
    mask = _ones(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    T = len(log_ratios)
    jac = torch.zeros(T, T, dtype=F64)
    for t in range(T):
        lp = _leaf(lp_now)
        loss, _ = objectives.tapo(lp, lp_old, a, mask, eps_schedule=_wide)
        jac[t] = torch.tensor(_grad(loss[0, t], lp), dtype=F64)
    off = jac - torch.diag(torch.diagonal(jac))
    return {"log_ratios": list(map(float, log_ratios)), "adv": adv, "diag": _flat(torch.diagonal(jac)),
            "off_diag_max": _f(off.abs().max())}


@example("tapo_vs_gspo")
def tapo_vs_gspo(log_ratios, adv):
    lp_old, lp_now = _tapo_rows(log_ratios)
    mask = _ones(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    lp1, lp2 = _leaf(lp_now), _leaf(lp_now)
    l1, _ = objectives.tapo(lp1, lp_old, a, mask, eps_schedule=_wide)
    l2, m2 = objectives.gspo(lp2, lp_old, a, mask, eps_low=0.99, eps_high=10.0)
    return {"log_ratios": list(map(float, log_ratios)), "adv": adv, "gspo_ratio": _f(m2["ratio/mean"]),
            "tapo_grad": _grad(agg.aggregate(l1, mask, "token_mean"), lp1),
            "gspo_grad": _grad(agg.aggregate(l2, mask, "seq_mean_token_mean"), lp2)}


@example("tapo_padding")
def tapo_padding(log_ratios, pad_after, garbage):
    """A padded position (garbage log-probs) inserted after `pad_after` valid tokens."""
    lp_old, lp_now = _tapo_rows(log_ratios)
    cut = int(pad_after)
    pad = torch.tensor([[float(garbage)]], dtype=F64)
    old_p = torch.cat([lp_old[:, :cut], pad, lp_old[:, cut:]], dim=1)
    now_p = torch.cat([lp_now[:, :cut], pad * 3, lp_now[:, cut:]], dim=1)
    mask_p = _ones(old_p)
    mask_p[0, cut] = False
    G_pad, _ = objectives.prefix_geometric_ratio(now_p, old_p, mask_p)
    G_clean, _ = objectives.prefix_geometric_ratio(lp_now, lp_old, _ones(lp_old))
    G_excl, _ = objectives.prefix_geometric_ratio(lp_now, lp_old, _ones(lp_old), include_current=False)
    return {"log_ratios": list(map(float, log_ratios)), "G_padded_valid": _flat(G_pad[mask_p]),
            "G_clean": _flat(G_clean), "same": bool(torch.allclose(G_pad[mask_p], G_clean[0])),
            "G_exclusive": _flat(G_excl)}


# ------------------------------------------------------------------------------- luspo


def _seq_batch(lengths, mean_log_ratios=None):
    lp_old, mask = _padded([[-1.0] * n for n in lengths])
    shift = torch.tensor([float(d) for d in (mean_log_ratios or [0.0] * len(lengths))], dtype=F64)
    return lp_old, torch.where(mask, lp_old + shift.unsqueeze(-1), lp_old), mask


def _first_valid(grad: list[float], mask: torch.Tensor) -> list[float]:
    g = torch.tensor(grad, dtype=F64).reshape(mask.shape)
    return [float(g[i, 0]) for i in range(mask.shape[0])]


def _row_sums(grad: list[float], mask: torch.Tensor) -> list[float]:
    return _flat(torch.tensor(grad, dtype=F64).reshape(mask.shape).sum(-1))


@example("luspo_vs_gspo_grad")
def luspo_vs_gspo_grad(lengths, adv, eps_low, eps_high):
    lp_old, lp_now, mask = _seq_batch(lengths)
    a = torch.full((len(lengths),), float(adv), dtype=F64)
    lp1, lp2 = _leaf(lp_now), _leaf(lp_now)
    l1, _ = objectives.luspo(lp1, lp_old, a, mask, eps_low=eps_low, eps_high=eps_high)
    l2, _ = objectives.gspo(lp2, lp_old, a, mask, eps_low=eps_low, eps_high=eps_high)
    g1 = _grad(agg.aggregate(l1, mask, "token_mean"), lp1)
    g2 = _grad(agg.aggregate(l2, mask, "seq_mean_token_mean"), lp2)
    return {"lengths": list(lengths), "adv": adv, "luspo_token_grad": _first_valid(g1, mask),
            "gspo_token_grad": _first_valid(g2, mask), "luspo_seq_total": _row_sums(g1, mask),
            "gspo_seq_total": _row_sums(g2, mask)}


@example("luspo_loss_matrix")
def luspo_loss_matrix(lengths, mean_log_ratios, adv, eps_low, eps_high):
    lp_old, lp_now, mask = _seq_batch(lengths, mean_log_ratios)
    a = torch.full((len(lengths),), float(adv), dtype=F64)
    lp = _leaf(lp_now)
    loss, m = objectives.luspo(lp, lp_old, a, mask, eps_low=eps_low, eps_high=eps_high)
    g = _grad(agg.aggregate(loss, mask, "token_mean"), lp)
    s = corrections.seq_ratio_geomean(lp_now, lp_old, mask).ratio
    return {"lengths": list(lengths), "eps_high": eps_high, "s": _flat(s), "row_sums": _flat(loss.sum(-1)),
            "grad_per_seq": _row_sums(g, mask), "clip_frac": _f(m["clip_frac"])}


@example("luspo_aggregation_pitfall")
def luspo_aggregation_pitfall(lengths, adv):
    lp_old, lp_now, mask = _seq_batch(lengths)
    a = torch.full((len(lengths),), float(adv), dtype=F64)
    grads = {}
    for mode in ("token_mean", "seq_mean_token_mean"):
        lp = _leaf(lp_now)
        loss, _ = objectives.luspo(lp, lp_old, a, mask, eps_low=3e-4, eps_high=4e-4)
        grads[mode] = _first_valid(_grad(agg.aggregate(loss, mask, mode), lp), mask)
    lp = _leaf(lp_now)
    loss, _ = objectives.gspo(lp, lp_old, a, mask, eps_low=3e-4, eps_high=4e-4)
    gspo = _first_valid(_grad(agg.aggregate(loss, mask, "seq_mean_token_mean"), lp), mask)
    return {"lengths": list(lengths), "registry_mode": methods.get("luspo").aggregation,
            "token_mean_grad": grads["token_mean"], "seq_mean_grad": grads["seq_mean_token_mean"],
            "gspo_grad": gspo, "seq_mean_equals_gspo": grads["seq_mean_token_mean"] == gspo}


# -------------------------------------------------------------------------------- ggpo


@example("ggpo_coefficients")
def ggpo_coefficients(rewards, ref_log_ratio, beta, coef_clip):
    r = torch.tensor([float(v) for v in rewards], dtype=F64)
    lr = torch.tensor([float(v) for v in ref_log_ratio], dtype=F64)
    kappa, gap, a = objectives.gibbs_coefficients(lr, r, torch.zeros(len(rewards), dtype=torch.long),
                                                  beta=beta, coef_clip=coef_clip)
    return {"rewards": list(map(float, rewards)), "beta": beta, "coef_clip": coef_clip, "a": _flat(a),
            "softmax": _flat(kappa + 1.0 / len(rewards)), "kappa": _flat(kappa), "gap": _f(gap[0]),
            "kappa_sum": _f(kappa.sum())}


@example("ggpo_clip_gradient")
def ggpo_clip_gradient(rewards, ref_log_ratio, beta, coef_clip):
    """One token per response with lp − lp_ref = ref_log_ratio; gradient of the
    seq_mean_token_sum loss with respect to each response's log-prob."""
    lp_ref = torch.full((len(rewards), 1), -2.0, dtype=F64)
    lp = _leaf(lp_ref + torch.tensor([float(v) for v in ref_log_ratio], dtype=F64).unsqueeze(-1))
    mask = _ones(lp)
    r = torch.tensor([float(v) for v in rewards], dtype=F64)
    g = torch.zeros(len(rewards), dtype=torch.long)
    loss, m = objectives.ggpo(lp, lp_ref, r, g, mask, beta=beta, coef_clip=coef_clip)
    kappa, _, a = objectives.gibbs_coefficients(lp.detach().sub(lp_ref).sum(-1), r, g, beta=beta,
                                                coef_clip=coef_clip)
    return {"rewards": list(map(float, rewards)), "ref_log_ratio": list(map(float, ref_log_ratio)),
            "coef_clip": coef_clip, "a": _flat(a), "kappa": _flat(kappa),
            "grad": _grad(agg.aggregate(loss, mask, "seq_mean_token_sum"), lp),
            "frac_clipped": _f(m["ggpo/frac_ref_ratio_clipped"])}


@example("ggpo_vs_grpo")
def ggpo_vs_grpo(rewards, beta_small, beta_large):
    r = torch.tensor([float(v) for v in rewards], dtype=F64)
    g = torch.zeros(len(rewards), dtype=torch.long)
    zero = torch.zeros_like(r)
    k_small, _, _ = objectives.gibbs_coefficients(zero, r, g, beta=beta_small, coef_clip=5.0)
    k_large, _, _ = objectives.gibbs_coefficients(zero, r, g, beta=beta_large, coef_clip=5.0)
    return {"rewards": list(map(float, rewards)), "beta_small": beta_small, "beta_large": beta_large,
            "grpo": _flat(advantages.grpo(r, g, std="unbiased")), "grpo_x10": _flat(advantages.grpo(10 * r, g)),
            "kappa_small_beta": _flat(k_small), "kappa_large_beta": _flat(k_large)}


@example("ggpo_signature")
def ggpo_signature(rewards, tokens_per_response):
    params = list(inspect.signature(objectives.ggpo).parameters)
    B, T = len(rewards), int(tokens_per_response)
    lp_ref = torch.full((B, T), -1.0, dtype=F64)
    lp = _leaf(lp_ref)
    mask = _ones(lp)
    r = torch.tensor([float(v) for v in rewards], dtype=F64)
    g = torch.zeros(B, dtype=torch.long)
    loss, _ = objectives.ggpo(lp, lp_ref, r, g, mask, beta=1.0, coef_clip=5.0)
    grad = torch.tensor(_grad(agg.aggregate(loss, mask, methods.get("ggpo").aggregation), lp),
                        dtype=F64).reshape(B, T)
    kappa, _, _ = objectives.gibbs_coefficients(torch.zeros(B, dtype=F64), r, g, beta=1.0, coef_clip=5.0)
    return {"arguments": ", ".join(params), "reads_behavior": any("behavior" in p for p in params),
            "aggregation": methods.get("ggpo").aggregation, "grad_first_token": _flat(grad[:, 0]),
            "minus_kappa_over_B": _flat(-kappa / B), "n_responses": B}


# ------------------------------------------------------------- cross-method (topics.yaml)


@example("xm_engine_vs_policy_ratio")
def xm_engine_vs_policy_ratio(p_behavior, p_old, adv, cap, eps):
    """First minibatch (π_θ = π_old in value) of a batch with engine mismatch."""
    lp_mu, lp_old = _log_row([p_behavior]), _log_row([p_old])
    mask = _ones(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    right, _ = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    lp = _leaf(lp_old)
    wrong_w, _ = corrections.tis(lp, lp_old, mask, cap=cap)  # "TIS" on π_θ/π_old: always 1 here
    l_ok, _ = objectives.ppo_clip(lp, lp_old, a, mask, eps_low=eps, eps_high=eps)
    lp2 = _leaf(lp_old)
    l_bad, _ = objectives.ppo_clip(lp2, lp_mu, a, mask, eps_low=eps, eps_high=eps)  # clip on π_θ/μ
    return {"engine_ratio": p_old / p_behavior, "cap": cap, "eps": eps, "right_weight": _f(right[0, 0]),
            "swapped_weight": _f(wrong_w[0, 0]), "ppo_policy_grad": _grad(l_ok.sum(), lp)[0],
            "ppo_engine_grad": _grad(l_bad.sum(), lp2)[0]}


@example("xm_cispo_ppo")
def xm_cispo_ppo(rho, adv, eps_low, eps_high):
    lp_old = _log_row([0.3] * len(rho))
    mask = _ones(lp_old)
    a = _row(adv)
    out = {"rho": list(map(float, rho)), "adv": list(map(float, adv)), "eps_high": eps_high}
    for name, fn in (("ppo", objectives.ppo_clip), ("cispo", objectives.cispo), ("gppo", objectives.gppo)):
        lp = _leaf(lp_old + torch.log(_row(rho)))
        loss, _ = fn(lp, lp_old, a, mask, eps_low=eps_low, eps_high=eps_high)
        out[f"{name}_grad"] = _grad(loss.sum(), lp)
    return out


@example("xm_dr_grpo_grpo")
def xm_dr_grpo_grpo(rewards, scale):
    r = torch.tensor([float(v) for v in rewards], dtype=F64)
    g = torch.zeros(len(rewards), dtype=torch.long)
    return {"rewards": list(map(float, rewards)), "scale": scale,
            "grpo": _flat(advantages.grpo(r, g, std="unbiased")),
            "grpo_scaled": _flat(advantages.grpo(scale * r, g, std="unbiased")),
            "dr_grpo": _flat(advantages.dr_grpo(r, g)), "dr_grpo_scaled": _flat(advantages.dr_grpo(scale * r, g))}


@example("xm_k1_k3")
def xm_k1_k3(log_ratio_to_ref):
    """Per-token value and autograd gradient of k1/k2/k3 at lp − lp_ref = given values."""
    lp_ref = torch.full((1, len(log_ratio_to_ref)), -2.0, dtype=F64)
    where_zh = {"loss": "损失", "reward": "奖励"}
    out = {"log_ratio": list(map(float, log_ratio_to_ref))}
    for name in ("grpo", "reinforce_pp"):
        spec = methods.get(name).kl
        out[f"{name}_kl"] = f"{spec.estimator} in the {spec.placement}"
        out[f"{name}_kl_zh"] = f"{spec.estimator}（放在{where_zh[spec.placement]}中）"
    for name in ("k1", "k2", "k3"):
        lp = _leaf(lp_ref + _row(log_ratio_to_ref))
        v = getattr(kl, name)(lp, lp_ref)
        out[f"{name}_value"], out[f"{name}_grad"] = _flat(v), _grad(v.sum(), lp)
    return out


@example("xm_aggregation_length")
def xm_aggregation_length(losses, L_norm):
    """Per-token losses of ragged responses under the three reductions."""
    loss, mask = _padded(losses)
    return {"token_mean": _f(agg.aggregate(loss, mask, "token_mean")),
            "seq_mean_token_mean": _f(agg.aggregate(loss, mask, "seq_mean_token_mean")),
            "seq_mean_token_sum_norm": _f(agg.aggregate(loss, mask, "seq_mean_token_sum_norm", L_norm=L_norm)),
            "L_norm": L_norm, "dapo_mode": methods.get("dapo").aggregation,
            "grpo_mode": methods.get("grpo").aggregation, "dr_grpo_mode": methods.get("dr_grpo").aggregation}


@example("xm_ttrl_grpo")
def xm_ttrl_grpo(completions, tied_completions):
    """Majority-vote pseudo-rewards feeding GRPO advantages; a tied vote gives no label."""
    rewards, eligible, info = ttrl_rewards(list(completions), [0] * len(completions))
    adv = advantages.grpo(rewards.to(F64), torch.zeros(len(completions), dtype=torch.long), std="unbiased")
    _, tie_eligible, tie_info = ttrl_rewards(list(tied_completions), [0] * len(tied_completions))
    return {"label": str(info["labels"][0]), "rewards": _flat(rewards), "advantages": _flat(adv),
            "eligible": bool(eligible.all()), "tie_label": str(tie_info["labels"][0]),
            "tie_eligible": bool(tie_eligible.any())}
