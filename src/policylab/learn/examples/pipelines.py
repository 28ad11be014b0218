"""Worked examples: the pipeline methods (ppo_rlhf, fusion).

The numbers come from the reward model's pairwise loss (`pipelines.reward_model`), the
procedural preference set (`pipelines.preferences`), the method's own stages (the
KL-in-reward round stage, the advantage stage and the loss through
`methods.loss.policy_loss`), the task-vector merge (`pipelines.fusion`) and the MOPD
kernel (`mixedpolicy.kernels`); nothing here re-derives a formula.
"""

from __future__ import annotations

import torch

from policylab.errors import PolicylabError
from policylab.learn.examples.registry import example
from policylab.learn.examples.core_common import F64, nums, f64


def _ppo_rlhf(**over):
    from policylab import methods

    return methods.get("ppo_rlhf").with_params({"reward_model": "untrained", **over})


def _shaped(method, rm, lp_old, lp_ref, mask):
    """(token rewards [B, T], advantages [B, T]) through the method's round and GAE stages
    with zero critic values."""
    from policylab.methods.loss import tensor_inputs
    from policylab.methods.stages.advantages import token_rewards
    from policylab.trainer.rollout import apply_changes
    from policylab.learn.figures.common import stage_context

    inp = tensor_inputs(torch.zeros_like(lp_old), torch.zeros(lp_old.shape[0], dtype=F64), mask, rewards=f64(rm))
    b = inp.batch.replace(logp_old=lp_old, logp_ref=lp_ref, values=torch.zeros_like(lp_old)).validate()
    for stage in method.active("round"):
        changes, _ = stage.fn(b, stage_context(method, stage))
        b = apply_changes(b, changes, stage)
    return token_rewards(b, method.name), method.advantage.fn(b, stage_context(method, method.advantage)).adv


# ----------------------------------------------------------------------------- ppo_rlhf


@example("rlhf_pair_loss")
def rlhf_pair_loss(scores, margin):
    """The RM loss of one prompt's K ranked replies (best first) at `scores`, at equal
    scores, and for one pair with the winner `margin` above the loser and swapped."""
    from policylab.models.reward_model import pairwise_loss

    K = len(scores)
    ranks = f64([[float(K - i) for i in range(K)]])
    loss, m = pairwise_loss(f64([scores]), ranks)
    equal, _ = pairwise_loss(torch.zeros(1, K, dtype=F64), ranks)
    right, _ = pairwise_loss(f64([[margin, 0.0]]), f64([[1.0, 0.0]]))
    wrong, _ = pairwise_loss(f64([[margin, 0.0]]), f64([[0.0, 1.0]]))
    return {"scores": nums(scores), "pairs": m["pairs"], "loss": round(float(loss), 4),
            "accuracy": round(m["pair_accuracy"], 4), "equal_loss": round(float(equal), 4), "margin": margin,
            "right_loss": round(float(right), 4), "swapped_loss": round(float(wrong), 4)}


@example("rlhf_shaped_reward")
def rlhf_shaped_reward(rm_score, lp_old, lp_ref, beta):
    """One response: the per-token reward PPO sees (KL from lp_old at every token, the RM
    score once at the last) and the GAE advantages (γ = λ = 1, zero values)."""
    m = _ppo_rlhf(kl_coef=beta, lam=1.0)
    lo, lr = f64([lp_old]), f64([lp_ref])
    r, a = _shaped(m, [rm_score], lo, lr, torch.ones_like(lo, dtype=torch.bool))
    return {"rm_score": rm_score, "beta": beta, "lp_old": nums(lp_old), "lp_ref": nums(lp_ref),
            "rewards": nums(r[0].tolist()), "reward_sum": round(float(r.sum()), 4),
            "advantages": nums(a[0].tolist())}


@example("rlhf_reference_vs_ratio")
def rlhf_reference_vs_ratio(rm_score, lp_old, lp_ref, lp, ref_shift):
    """π_ref moves the shaped reward (and the advantages), never the loss given them; the
    learner's lp moves only the ratio."""
    from policylab.methods.loss import policy_loss, tensor_inputs

    m = _ppo_rlhf()
    lo, lr, l = f64([lp_old]), f64([lp_ref]), f64([lp])
    mask = torch.ones_like(lo, dtype=torch.bool)
    _, a1 = _shaped(m, [rm_score], lo, lr, mask)
    _, a2 = _shaped(m, [rm_score], lo, lr + ref_shift, mask)
    loss1, _ = policy_loss(m, tensor_inputs(l, a1, mask, logp_old=lo, logp_ref=lr))
    loss2, _ = policy_loss(m, tensor_inputs(l, a1, mask, logp_old=lo, logp_ref=lr + ref_shift))
    return {"adv_first": round(float(a1[0, 0]), 4), "adv_first_shifted": round(float(a2[0, 0]), 4),
            "loss": round(float(loss1.sum()), 6), "loss_shifted_ref": round(float(loss2.sum()), 6),
            "ratios": nums((l - lo).exp()[0].tolist()), "ref_shift": ref_shift}


@example("rlhf_true_preference")
def rlhf_true_preference(a, b):
    """The procedural preference set for a + b: the four ranked candidates and their true
    scores (the RM is trained on their C(4, 2) = 6 ordered pairs)."""
    from policylab.tasks import preferences
    from policylab.tasks.arithmetic import PROMPT
    from policylab.tasks.example import Example

    a, b = int(a), int(b)  # a training problem of the task, as its train stream writes it
    ex = Example(PROMPT.format(a=a, op="+", b=b), str(a + b), {"op": "+", "a": a, "b": b, "split": "train"})
    replies, scores = preferences.ranked(ex)
    return {"prompt": ex.prompt, "replies": " | ".join(replies), "scores": nums(scores)}


# ----------------------------------------------------------------------------- fusion


@example("fusion_merge")
def fusion_merge(base, experts, alphas):
    """Task-vector arithmetic on one two-element tensor: θ = θ_base + Σ α_k (θ_k − θ_base)."""
    from policylab.pipelines.fusion import merge_task_vectors

    merged = merge_task_vectors({"w": f64(base)}, [{"w": f64(e)} for e in experts], list(alphas))
    one = merge_task_vectors({"w": f64(base)}, [{"w": f64(experts[0])}], [1.0])
    return {"base": nums(base), "experts": " and ".join(str(nums(e)) for e in experts), "alphas": nums(alphas),
            "merged": nums(merged["w"].tolist()), "one_expert": nums(one["w"].tolist())}


@example("fusion_merge_refusal")
def fusion_merge_refusal(base_shape, expert_shape):
    """A layout (or vocabulary) mismatch between base and expert is refused."""
    from policylab.pipelines.fusion import merge_task_vectors

    try:
        merge_task_vectors({"model.embed_tokens.weight": torch.zeros(base_shape, dtype=F64)},
                           [{"model.embed_tokens.weight": torch.zeros(expert_shape, dtype=F64)}], [1.0])
        msg = "no error"
    except PolicylabError as exc:
        msg = f"{type(exc).__name__}: {exc}"
    return {"base_shape": str(list(base_shape)), "expert_shape": str(list(expert_shape)), "error": msg}


@example("fusion_mopd")
def fusion_mopd(lp_student, lp_teacher):
    """MOPD's per-token advantage from the domain teacher, both horizons."""
    from policylab.kernels import mixed as K

    s, t = f64([lp_student]), f64([lp_teacher])
    mask = torch.ones_like(s, dtype=torch.bool)
    tok = K.mopd_advantages(s, t, mask, horizon="token")
    seq = K.mopd_advantages(s, t, mask, horizon="sequence")
    same = K.mopd_advantages(s, s, mask, horizon="token")
    return {"lp_student": nums(lp_student), "lp_teacher": nums(lp_teacher), "token": nums(tok[0].tolist()),
            "sequence": nums(seq[0].tolist()), "self_teacher": nums(same[0].tolist())}


@example("fusion_per_domain")
def fusion_per_domain(domains, accuracy_a, accuracy_b):
    """Two models' per-domain accuracies through the pipeline's summary: the mean is
    reported next to the worst domain, never alone."""
    from policylab.pipelines.fusion import summarize_domains

    a = summarize_domains(dict(zip(domains, accuracy_a)))
    b = summarize_domains(dict(zip(domains, accuracy_b)))
    return {"domains": ", ".join(domains), "a": nums(accuracy_a), "b": nums(accuracy_b),
            "mean_a": round(a["mean_over_domains"], 4), "mean_b": round(b["mean_over_domains"], 4),
            "worst_a": f"{a['worst_domain']} ({a['worst_accuracy']:g})",
            "worst_b": f"{b['worst_domain']} ({b['worst_accuracy']:g})"}
