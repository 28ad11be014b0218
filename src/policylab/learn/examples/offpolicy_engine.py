"""Worked examples: engine-mismatch corrections (tis, icepop, online_icepop, kpop, mis)."""

from __future__ import annotations

import math
import torch
from policylab.kernels import aggregate as agg, corrections, objectives

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
    constant_sequences,
    method_loss,
)


@example("tis_weights")
def tis_weights(p_old, p_behavior, cap):
    lp_old, lp_mu = log_row(p_old), log_row(p_behavior)
    mask = ones_mask(lp_old)
    raw, _ = corrections.tis(lp_old, lp_mu, mask, cap=math.inf)
    w, m = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    return {"p_old": list(map(float, p_old)), "p_behavior": list(map(float, p_behavior)), "cap": cap,
            "ratios": flat(raw), "weights": flat(w), "frac_capped": scalar(m["tis/frac_capped"]),
            "ess": scalar(m["tis/ess"])}


@example("tis_host_gradient")
def tis_host_gradient(p_old, p_behavior, adv, cap, eps):
    """First minibatch (logp = logp_old): the TIS weight scales the PPO gradient -A."""
    lp_old, lp_mu = log_row(p_old), log_row(p_behavior)
    mask = ones_mask(lp_old)
    w, _ = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    lp = grad_leaf(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    host, _ = objectives.ppo_clip(lp, lp_old, a, mask, eps_low=eps, eps_high=eps)
    plain = grad_of(host.sum(), lp)
    lp2 = grad_leaf(lp_old)
    host2, _ = objectives.ppo_clip(lp2, lp_old, a, mask, eps_low=eps, eps_high=eps)
    return {"adv": adv, "cap": cap, "weights": flat(w), "grad_plain": plain,
            "grad_tis": grad_of((host2 * w).sum(), lp2)}


@example("tis_vs_icepop")
def tis_vs_icepop(ratios, cap, low, high):
    lp_old, lp_mu = engine_pair(ratios)
    mask = ones_mask(lp_old)
    w_tis, _ = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    w_ice, m = corrections.icepop(lp_old, lp_mu, mask, low=low, high=high)
    return {"ratios": list(map(float, ratios)), "cap": cap, "low": low, "high": high,
            "tis": flat(w_tis), "icepop": flat(w_ice), "icepop_frac_masked": scalar(m["icepop/frac_masked"])}


@example("tis_role_pitfall")
def tis_role_pitfall(p_old, p_behavior, p_current, cap):
    lp_old, lp_mu, lp_now = log_row([p_old]), log_row([p_behavior]), log_row([p_current])
    mask = ones_mask(lp_old)
    right, _ = corrections.tis(lp_old, lp_mu, mask, cap=cap)
    swapped, _ = corrections.tis(lp_mu, lp_old, mask, cap=cap)
    live, _ = corrections.tis(grad_leaf(lp_now), lp_mu, mask, cap=cap)
    return {"p_old": p_old, "p_behavior": p_behavior, "p_current": p_current, "cap": cap,
            "correct": scalar(right[0, 0]), "swapped": scalar(swapped[0, 0]), "live": scalar(live[0, 0]),
            "live_requires_grad": bool(live.requires_grad)}


@example("icepop_weights")
def icepop_weights(ratios, low, high):
    lp_old, lp_mu = engine_pair(ratios)
    w, m = corrections.icepop(lp_old, lp_mu, ones_mask(lp_old), low=low, high=high)
    return {"ratios": list(map(float, ratios)), "low": low, "high": high, "weights": flat(w),
            "frac_masked": scalar(m["icepop/frac_masked"]), "frac_masked_low": scalar(m["icepop/frac_masked_low"]),
            "frac_masked_high": scalar(m["icepop/frac_masked_high"])}


@example("icepop_vs_mis")
def icepop_vs_mis(ratios, low, high, mis_low, mis_high):
    """One response: token masking (IcePop) vs one decision per response (MIS)."""
    lp_old, lp_mu = engine_pair(ratios)
    mask = ones_mask(lp_old)
    w_ice, _ = corrections.icepop(lp_old, lp_mu, mask, low=low, high=high)
    out = {"ratios": list(map(float, ratios)), "low": low, "high": high, "mis_low": mis_low,
           "mis_high": mis_high, "icepop": flat(w_ice)}
    for kind in ("geomean", "product"):
        w, m = corrections.mis(lp_old, lp_mu, mask, low=mis_low, high=mis_high, kind=kind)
        out[f"{kind}_ratio"] = math.exp(scalar(m["mis/log_ratio_mean"]))
        out[f"{kind}_weight"] = scalar(w[0])
    return out


@example("icepop_normalizer")
def icepop_normalizer(host_losses, ratios, low, high):
    """token_mean of the weighted losses with the zeroed tokens kept in / dropped from the
    denominator (icepop_normalizer_mask)."""
    lp_old, lp_mu = engine_pair(ratios)
    mask = ones_mask(lp_old)
    w, _ = corrections.icepop(lp_old, lp_mu, mask, low=low, high=high)
    weighted = row_tensor(host_losses) * w
    keep = corrections.icepop_normalizer_mask(w, mask, masked_in_normalizer=True)
    drop = corrections.icepop_normalizer_mask(w, mask, masked_in_normalizer=False)
    return {"ratios": list(map(float, ratios)), "weights": flat(w), "kept_in_denominator": scalar(agg.aggregate(weighted, keep, "token_mean")),
            "dropped_from_denominator": scalar(agg.aggregate(weighted, drop, "token_mean")),
            "n_keep": int(keep.sum()), "n_drop": int(drop.sum())}


@example("online_icepop_grad")
def online_icepop_grad(ratios, adv, low, high):
    """Learner at the sampling version: gradient -M(k)·A per token, no clip."""
    lp_now, lp_mu = engine_pair(ratios)
    lp = grad_leaf(lp_now)
    a = torch.full((1,), float(adv), dtype=F64)
    loss, m = method_loss("online_icepop", {"icepop_low": low, "icepop_high": high}, lp, a, ones_mask(lp),
                           logp_behavior=lp_mu)
    return {"ratios": list(map(float, ratios)), "adv": adv, "low": low, "high": high,
            "loss": flat(loss), "grad": grad_of(loss.sum(), lp),
            "frac_masked": scalar(m["correction/online_icepop/frac_masked"])}


@example("online_vs_icepop")
def online_vs_icepop(ratio, adv, rho_reused, low, high, eps):
    """Fresh batch: online IcePop = IcePop x PPO at ρ = 1. Reused batch (ρ ≠ 1): the
    clipped IcePop stops, a clip-free update would keep pushing."""
    lp_old, lp_mu = engine_pair([ratio])
    mask = ones_mask(lp_old)
    a = torch.full((1,), float(adv), dtype=F64)
    w, _ = corrections.icepop(lp_old, lp_mu, mask, low=low, high=high)

    def icepop_grad(shift):
        lp = grad_leaf(lp_old + math.log(shift))
        host, _ = objectives.ppo_clip(lp, lp_old, a, mask, eps_low=eps, eps_high=eps)
        return grad_of((host * w).sum(), lp)[0]

    def online_grad(shift):
        lp = grad_leaf(lp_old + math.log(shift))
        loss, _ = method_loss("online_icepop", {"icepop_low": low, "icepop_high": high}, lp, a, mask,
                               logp_behavior=lp_mu)
        return grad_of(loss.sum(), lp)[0]

    fresh_i, fresh_o = icepop_grad(1.0), online_grad(1.0)
    return {"ratio": ratio, "adv": adv, "rho_reused": rho_reused, "eps": eps,
            "icepop_fresh": fresh_i, "online_fresh": fresh_o, "equal_fresh": abs(fresh_i - fresh_o) < 1e-12,
            "icepop_reused": icepop_grad(rho_reused), "online_reused": online_grad(rho_reused)}


@example("online_icepop_ledger")
def online_icepop_ledger(batch_id, version):
    ledger = corrections.BatchLedger()
    ledger.consume(batch_id, version, version)
    again = error_text(lambda: ledger.consume(batch_id, version, version))
    stale = error_text(lambda: ledger.check(f"{batch_id}-next", version, version + 1))
    return {"batch_id": batch_id, "version": version, "n_consumed": len(ledger),
            "reuse_error": again, "stale_error": stale}


@example("kpop_decisions")
def kpop_decisions(p_old, p_behavior, delta):
    lp_old, lp_mu = log_row(p_old), log_row(p_behavior)
    w, _ = corrections.kpop(lp_old, lp_mu, ones_mask(lp_old), delta=delta, in_region_weight="ratio")
    pa, pb = row_tensor(p_old), row_tensor(p_behavior)
    d_f = corrections.binary_kl(pa, 1 - pa, pb, 1 - pb)
    d_r = corrections.binary_kl(pb, 1 - pb, pa, 1 - pa)
    return {"p_old": list(map(float, p_old)), "p_behavior": list(map(float, p_behavior)), "delta": delta,
            "ratios": flat(pa / pb), "kl_forward": flat(d_f), "kl_reverse": flat(d_r), "weights": flat(w),
            "decisions": ", ".join("kept" if v > 0 else "masked" for v in flat(w)),
            "decisions_zh": "、".join("保留" if v > 0 else "掩码" for v in flat(w))}


@example("kpop_vs_icepop")
def kpop_vs_icepop(p_old, p_behavior, delta, low, high):
    lp_old, lp_mu = log_row(p_old), log_row(p_behavior)
    mask = ones_mask(lp_old)
    w_k, _ = corrections.kpop(lp_old, lp_mu, mask, delta=delta, in_region_weight="ratio")
    w_i, _ = corrections.icepop(lp_old, lp_mu, mask, low=low, high=high)
    return {"p_old": list(map(float, p_old)), "p_behavior": list(map(float, p_behavior)), "delta": delta,
            "low": low, "high": high, "ratios": flat(torch.exp(lp_old - lp_mu)),
            "kpop": flat(w_k), "icepop": flat(w_i)}


@example("kpop_edge")
def kpop_edge(p_old, p_behavior, delta, eps):
    lp_old, lp_mu = log_row(p_old), log_row(p_behavior)
    mask = ones_mask(lp_old)
    w_ratio, m = corrections.kpop(lp_old, lp_mu, mask, delta=delta, eps=eps, in_region_weight="ratio")
    w_one, _ = corrections.kpop(lp_old, lp_mu, mask, delta=delta, eps=eps, in_region_weight="one")
    pa, pb = row_tensor(p_old), row_tensor(p_behavior)
    naive = corrections.binary_kl(pa, 1 - pa, pb, 1 - pb)  # no clamp: 0 · log 0 at p = 1
    return {"p_old": list(map(float, p_old)), "p_behavior": list(map(float, p_behavior)), "eps": eps,
            "weights_ratio": flat(w_ratio), "weights_one": flat(w_one),
            "all_finite": bool(torch.isfinite(w_ratio).all()), "kl_forward_max": scalar(m["kpop/kl_forward_max"]),
            "naive_kl": str(flat(naive)), "naive_has_nan": bool(torch.isnan(naive).any())}


@example("mis_weights")
def mis_weights(per_token_log_ratio, lengths, low, high):
    lp_old, lp_mu, mask = constant_sequences(per_token_log_ratio, lengths)
    out = {"lengths": list(lengths), "per_token_log_ratio": list(map(float, per_token_log_ratio)),
           "low": low, "high": high}
    for kind in ("geomean", "product"):
        w, _ = corrections.mis(lp_old, lp_mu, mask, low=low, high=high, kind=kind)
        fn = corrections.seq_ratio_geomean if kind == "geomean" else corrections.seq_ratio_product
        out[f"{kind}_ratio"] = flat(fn(lp_old, lp_mu, mask).ratio)
        out[f"{kind}_weight"] = flat(w)
    return out


@example("mis_vs_gspo")
def mis_vs_gspo(engine_log_ratios, policy_log_ratios, low, high, eps_low, eps_high):
    """Same geometric-mean formula, two different ratios: MIS reads π_old/μ, GSPO π_θ/π_old."""
    lp_mu = torch.full((1, len(engine_log_ratios)), -1.0, dtype=F64)
    lp_old = lp_mu + row_tensor(engine_log_ratios)
    mask = ones_mask(lp_old)
    w, _ = corrections.mis(lp_old, lp_mu, mask, low=low, high=high, kind="geomean")
    lp = grad_leaf(lp_old + row_tensor(policy_log_ratios))
    w_after, _ = corrections.mis(lp_old, lp_mu, mask, low=low, high=high, kind="geomean")
    loss, m = objectives.gspo(lp, lp_old, torch.ones(1, dtype=F64), mask, eps_low=eps_low, eps_high=eps_high)
    grad = grad_of(agg.aggregate(loss, mask, "seq_mean_token_mean"), lp)
    return {"mis_ratio": scalar(corrections.seq_ratio_geomean(lp_old, lp_mu, mask).ratio[0]),
            "mis_weight": scalar(w[0]), "mis_weight_after_update": scalar(w_after[0]),
            "gspo_ratio": scalar(m["ratio/mean"]), "gspo_grad": grad, "eps_high": eps_high}


@example("mis_long_sequence")
def mis_long_sequence(length, p_old, p_behavior, low, high):
    """Probabilities of a long response multiplied directly underflow; log space does not."""
    lp_old = torch.full((1, length), math.log(p_old), dtype=F64)
    lp_mu = torch.full((1, length), math.log(p_behavior), dtype=F64)
    mask = ones_mask(lp_old)
    naive = torch.exp(lp_old).prod() / torch.exp(lp_mu).prod()  # 0 / 0 in float64
    prod = corrections.seq_ratio_product(lp_old, lp_mu, mask)
    geo = corrections.seq_ratio_geomean(lp_old, lp_mu, mask)
    w_p, _ = corrections.mis(lp_old, lp_mu, mask, low=low, high=high, kind="product")
    w_g, _ = corrections.mis(lp_old, lp_mu, mask, low=low, high=high, kind="geomean")
    return {"length": length, "p_old": p_old, "p_behavior": p_behavior, "naive_ratio": str(float(naive)),
            "log_product": scalar(prod.log_ratio[0]), "product_guard_hit": bool(prod.clamped[0]),
            "product_weight": scalar(w_p[0]), "geomean_ratio": scalar(geo.ratio[0]), "geomean_weight": scalar(w_g[0])}
