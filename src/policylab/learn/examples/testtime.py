"""Worked examples: test-time adaptation (ttpo, probe_erpo, tasco) and the evaluation
metrics (sharpening_tax, calib_rl). Each calls the real kernels."""

from __future__ import annotations

import math

import torch

from policylab.kernels import aggregate as agg_mod
from policylab import methods
from policylab.eval.calibration import calib_rl, calibration_metrics, fit_temperature
from policylab.eval.coverage import coverage_at_k, sharpening_tax
from policylab.errors import PolicylabError
from policylab.methods.loss import loss_terms, tensor_inputs, term_masks
from policylab.kernels.metrics import ece, pass_at_k
from policylab.kernels.rewards import ttrl_rewards
from policylab.tasks.probes import arithmetic_subquantity, probe_consistency
from policylab.kernels.testtime import (
    entropy_bonus,
    probe_branch,
    probe_erpo_advantages,
    rank_candidates,
    tasco_loss,
    ttpo_advantages,
    ttpo_split,
)
from policylab.models.soft_prefix import PrefixEmbedding
from policylab.learn.examples.registry import example
from policylab.learn.examples.core_common import F64, num, nums, ragged


def _split(answers, probs, tau_conv, tau_err, level="token"):
    texts = [str(a) for a in answers]
    r, eligible, info = ttrl_rewards(texts, [0] * len(texts))
    agree = eligible & (torch.nan_to_num(r) == 1)
    p, mask = ragged(probs, fill=1.0)
    d, rl, sinfo = ttpo_split(agree, eligible, p.log(), mask, tau_conv=tau_conv, tau_err=tau_err, err_level=level)
    adv = ttpo_advantages(torch.nan_to_num(r).to(F64), torch.zeros(len(texts), dtype=torch.long), rl,
                          std="unbiased", eps=0.0, rl_coef=1.0)
    return texts, r, agree, p, mask, d, rl, adv, info, sinfo


def _cells(m, mask):
    return [[int(v) for v, k in zip(row, km) if k] for row, km in zip(m.tolist(), mask.tolist())]


@example("ttpo_split")
def ttpo_split_example(answers, probs, tau_conv=0.99, tau_err=0.9, level="token"):
    texts, r, agree, p, mask, d, rl, adv, info, sinfo = _split(answers, probs, tau_conv, tau_err, level)
    dissent = [i for i in range(len(texts)) if not bool(agree[i])]
    return {"answers": texts, "label": str(info["labels"][0]), "agree": [bool(a) for a in agree],
            "distill": _cells(d, mask), "rl": _cells(rl, mask), "tau_conv": num(tau_conv), "tau_err": num(tau_err),
            "n_converged": int(sinfo["converged_tokens"]), "n_filtered": int(sinfo["filtered_tokens"]),
            "dissent_adv": [num(adv[i][mask[i]].min()) if bool(rl[i].any()) else 0.0 for i in dissent]}


@example("ttpo_vs_ttrl")
def ttpo_vs_ttrl(answers, probs):
    """The gradient coefficient ∂L/∂lp on an agreeing reply's tokens: TTRL (GRPO, seq-mean
    token-mean) vs TTPO (self-distillation NLL, token mean over its own set)."""
    texts, r, agree, p, mask, d, rl, adv, info, _ = _split(answers, probs, 1.0, 1.0)
    g = torch.zeros(len(texts), dtype=torch.long)
    from policylab.kernels import advantages as A

    a_ttrl = A.grpo(torch.nan_to_num(r).to(F64), g, eps=0.0)
    i = int(agree.nonzero()[0])
    B, n_i = len(texts), int(mask[i].sum())
    return {"answers": texts, "ttrl_coef": num(-a_ttrl[i] / (B * n_i)),
            "ttpo_coef": num(-1.0 / int(d.sum())), "agree_adv_ttrl": num(a_ttrl[i]),
            "dissent_adv": num(adv[~agree][mask[~agree]].mean()) if bool((~agree).any()) else 0.0}


@example("ttpo_two_terms")
def ttpo_two_terms(answers, probs):
    """The method's own composition: the policy term and the self-distillation term, each
    with its own mask and normalizer."""
    m = methods.get("ttpo")
    texts, r, agree, p, mask, d, rl, adv, info, _ = _split(answers, probs, m.p.ttpo_tau_conv, m.p.ttpo_tau_err)
    lp = torch.where(mask, p.log(), torch.zeros_like(p)).requires_grad_()
    inp = tensor_inputs(lp, adv, mask, rewards=torch.nan_to_num(r).to(F64), group=torch.zeros(len(texts), dtype=torch.long),
                        extras={"ttpo_distill_mask": d, "ttpo_rl_mask": rl})
    mats, _ = loss_terms(m, inp)
    masks = term_masks(m, inp.batch)
    out = {"answers": texts}
    for name, mat in mats.items():
        mk, mode, L = masks[name]
        n = agg_mod.normalizer(mk, mode, L_norm=L)
        out[f"{name}_mode"] = mode
        out[f"{name}_normalizer"] = num(n)
        out[f"{name}_value"] = num(agg_mod.aggregate(mat, mk, mode, normalizer=n, L_norm=L))
    out["converged_grad"] = num(torch.autograd.grad(mats["self_distill"].sum(), lp)[0][0, 1])
    return out


@example("probe_erpo_branches")
def probe_erpo_branches(prompt, candidates, probe_answers, tau=0.5):
    """One prompt: ranks from votes (then position), PCR of the top answer, branch, advantages."""
    texts = [str(c) if c is not None else "" for c in candidates]
    votes = torch.tensor([sum(t == u for u in texts) if t else 0 for t in texts])
    score = -torch.arange(len(texts), dtype=F64) * 0.01  # earlier replies score a little higher
    g = torch.zeros(len(texts), dtype=torch.long)
    ranks = rank_candidates(votes, score, g)
    probes = arithmetic_subquantity(prompt)
    top = texts[int((ranks == 0).nonzero()[0])]
    cons = probe_consistency(top or None, [str(a) if a is not None else None for a in probe_answers], probes)
    pcr = sum(cons) / len(cons)
    low = probe_branch(torch.full((len(texts),), pcr, dtype=F64), tau=tau)
    a, _ = probe_erpo_advantages(ranks, low, g, top_k=1, suppress_frac=0.5, pos_coef=1.0, neg_coef=1.0)
    return {"prompt": prompt, "candidates": texts, "probes": [p.question.split("?")[0] + "?" for p in probes],
            "probe_answers": [str(a) for a in probe_answers], "top": top, "consistent": cons, "pcr": num(pcr),
            "tau": num(tau), "branch": "low" if bool(low[0]) else "high", "ranks": ranks.tolist(),
            "advantages": nums(a), "any_positive": bool((a > 0).any())}


@example("probe_entropy_step")
def probe_entropy_step(logits, coef=0.1, lr=0.5):
    """One gradient step on the low branch's entropy term raises the entropy."""
    z = torch.tensor(logits, dtype=F64).view(1, 1, -1).requires_grad_()
    lp = torch.log_softmax(z, -1)
    h = -(lp.exp() * lp).sum(-1)
    loss = entropy_bonus(h, torch.ones_like(h, dtype=torch.bool), coef=coef).sum()
    loss.backward()
    with torch.no_grad():
        lp2 = torch.log_softmax(z - lr * z.grad, -1)
        h2 = -(lp2.exp() * lp2).sum(-1)
    return {"entropy_before": num(h[0, 0]), "entropy_after": num(h2[0, 0]), "coef": num(coef)}


@example("tasco_loss_parts")
def tasco_loss_parts(clean_probs, perturbed_probs, entropies, lam=1.0):
    """One reply and its K = 1 perturbed copy: the confidence and stability parts of L(P)."""
    lp = torch.log(torch.tensor([clean_probs, perturbed_probs], dtype=F64))
    ent = torch.tensor([entropies, [0.0] * len(entropies)], dtype=F64)
    mask = torch.ones_like(lp, dtype=torch.bool)
    loss, m = tasco_loss(lp, ent, mask, torch.tensor([0, 1]), torch.tensor([0, 0]), lam=lam, n_perturb=1,
                         divergence="k3")
    total = agg_mod.aggregate(loss, mask, "token_mean", normalizer=agg_mod.normalizer(mask, "token_mean"))
    return {"confidence_term": num(m["tasco/entropy"]), "instability": num(m["tasco/instability"]),
            "lam": num(lam), "loss": num(total)}


@example("tasco_prefix_table")
def tasco_prefix_table(vocab=50, hidden=8, m=3, k=2):
    """What the soft prefix is: virtual ids read P (block 0) or P + ξ_k; real ids the frozen
    table; only P has a gradient."""
    torch.manual_seed(0)
    base = torch.nn.Embedding(vocab, hidden).double().requires_grad_(False)
    emb = PrefixEmbedding(base, torch.randn(m, hidden, dtype=F64), n_perturb=k)
    emb.redraw(torch.Generator().manual_seed(1), 0.1)
    ids = torch.tensor([[3, vocab, vocab + 1, vocab + m]])
    e = emb(ids)
    e.sum().backward()
    return {"vocab": vocab, "m": m, "k": k, "trainable": sum(p.numel() for p in emb.parameters() if p.requires_grad),
            "frozen": base.weight.numel(), "real_is_frozen_row": bool(torch.equal(e[0, 0], base.weight[3])),
            "block0_is_prefix": bool(torch.equal(e[0, 1], emb.prefix[0])),
            "block1_is_perturbed": bool(torch.allclose(e[0, 3], emb.prefix[0] + emb.xi[0, 0])),
            "grad_on_prefix_rows": [bool(g.abs().sum() > 0) for g in emb.prefix.grad]}


@example("coverage_tax")
def coverage_tax(base_correct, post_correct, n, ks):
    """Per-task correct counts of two models (n samples each): coverage and tax per K."""
    ids = list(range(len(base_correct)))
    out = {"n": n, "base_correct": list(base_correct), "post_correct": list(post_correct)}
    for k in ks:
        t = sharpening_tax(coverage_at_k(ids, [n] * len(ids), base_correct, k),
                           coverage_at_k(ids, [n] * len(ids), post_correct, k))
        out[f"cov_base_{k}"], out[f"cov_post_{k}"], out[f"tax_{k}"] = (num(t["cov_base"]), num(t["cov_post"]),
                                                                       num(t["tax"]))
    return out


@example("pass_at_k_estimators")
def pass_at_k_estimators(n, c, k):
    """The unbiased estimator against the plug-in 1 − (1 − c/n)^k."""
    return {"n": n, "c": c, "k": k, "unbiased": num(pass_at_k(n, c, k)), "plugin": num(1 - (1 - c / n) ** k),
            "exact": num(1 - math.comb(n - c, k) / math.comb(n, k))}


@example("coverage_refusals")
def coverage_refusals():
    a = coverage_at_k(["p1", "p2"], [4, 4], [1, 2], 2)
    msgs = []
    for other in (coverage_at_k(["p1", "p2"], [4, 4], [1, 2], 3), coverage_at_k(["p1", "p3"], [4, 4], [1, 2], 2)):
        try:
            sharpening_tax(a, other)
            msgs.append("no error")
        except PolicylabError as exc:
            msgs.append(str(exc).split(": the")[0])
    try:
        coverage_at_k(["p1"], [1], [0], 2)
        small = "no error"
    except PolicylabError as exc:
        small = str(exc)
    return {"k_mismatch": msgs[0], "task_mismatch": msgs[1], "n_below_k": small}


@example("ece_hand")
def ece_hand(conf, correct, n_bins):
    c = torch.tensor(conf, dtype=F64)
    return {"conf": list(conf), "correct": list(correct), "n_bins": n_bins,
            "ece": num(ece(c, torch.tensor(correct), n_bins=n_bins))}


def _overconfident(n, C, sharp, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    z = torch.randn(n, C, generator=g, dtype=F64)
    z[torch.arange(n), y] += 1.0
    return z * sharp, y


@example("calib_fit")
def calib_fit(n=200, choices=10, sharp=3.0, seed=0):
    """Over-confident logits: T fitted on the val half, ECE on the test half before/after."""
    z, y = _overconfident(n, choices, sharp, seed)
    tags = ["val" if i % 2 else "test" for i in range(n)]
    out = calib_rl(z, y, tags, n_bins=10)
    return {"n_val": out["n_val"], "n_test": out["n_test"], "temperature": num(out["temperature"]),
            "ece_raw": num(out["raw"]["ece"]), "ece_scaled": num(out["scaled"]["ece"]),
            "brier_raw": num(out["raw"]["brier"]), "brier_scaled": num(out["scaled"]["brier"]),
            "accuracy": num(out["raw"]["accuracy"]), "accuracy_scaled": num(out["scaled"]["accuracy"])}


@example("calib_sharp_vs_soft")
def calib_sharp_vs_soft(sharp=6.0, soft=1.0, n=200, seed=1):
    """The same decisions at two sharpness levels: equal accuracy, different ECE."""
    z, y = _overconfident(n, 10, 1.0, seed)
    a = calibration_metrics(z * sharp, y)
    b = calibration_metrics(z * soft, y)
    return {"acc_sharp": num(a["accuracy"]), "acc_soft": num(b["accuracy"]), "conf_sharp": num(a["confidence"]),
            "conf_soft": num(b["confidence"]), "ece_sharp": num(a["ece"]), "ece_soft": num(b["ece"])}


@example("calib_refuses_test")
def calib_refuses_test():
    z, y = _overconfident(8, 4, 2.0, 0)
    try:
        fit_temperature(z, y, ["val"] * 6 + ["test"] * 2)
        msg = "no error"
    except PolicylabError as exc:
        msg = str(exc)
    return {"error": msg}
