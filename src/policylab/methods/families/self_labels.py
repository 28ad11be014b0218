"""Test-time adaptation from the model's own agreement: TTPO (split objectives: an RL term
on the replies that agree with the group's self-vote, self-distillation on converged
tokens) and Probe-ERPO (answer-independent probes decide per prompt whether to reinforce
or suppress the top-ranked candidate). Both adapt on unlabeled prompts.

Rule (conventions rule 7): nothing here reads a gold answer. No stage calls `ctx.score`
or `ctx.task_reward` or reads `Example.answer`; every label is made from the model's own
outputs (votes, probe answers). The held-out evaluator, which runs after adaptation, is
the only place gold is read (`tests/methods/test_testtime_gold.py` feeds wrong gold and
checks the update is bit-identical). Their run reports say "adapted" with the sampling and
update budgets (`adaptation_budget`).
"""

from __future__ import annotations

import torch

from policylab.errors import PolicylabError
from policylab.kernels import rewards as rw
from policylab.kernels.rewards.verifiers import extract_last_number
from policylab.kernels.testtime import probe as PR
from policylab.kernels.testtime import ttpo as TT
from policylab.kernels.testtime.ttpo import ERR_LEVELS
from policylab.methods.context import Sampled, StageContext
from policylab.methods.param_types import at_least_one
from policylab.methods.params import clip, group_std, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import (
    Advantages,
    Card,
    LossInputs,
    Param,
    Stage,
    non_negative,
)
from policylab.methods.stages import filters, losses
from policylab.tasks import probes as PB
from policylab.tasks.probes import PROBE_GENERATORS

# ----------------------------------------------------------------------------- votes


def self_vote(s: Sampled, ctx: StageContext):
    """Majority vote of each group's extracted answers (`rewards.ttrl_rewards`, no gold):
    rewards = 1 for a reply that agrees with its group's majority, 0 otherwise, NaN in
    groups without a majority (a tie, nothing parseable: `outcome["eligible"]` False, the
    eligibility filter removes them). outcome["correct"] holds the agreement: for these
    methods it is the self-made label, not a verifier's verdict."""
    rewards, eligible, info = rw.ttrl_rewards(s.texts, s.batch.group)
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    eligible = torch.as_tensor(eligible, dtype=torch.bool)
    out = {"vote/ineligible_fraction": float((~eligible).float().mean()),
           "vote/ties": float(info["n_ties"]), "vote/no_answer_groups": float(info["n_no_answer"])}
    if bool(eligible.any()):
        out["vote/majority_fraction"] = float(info["majority_fraction"])
    return {"rewards": rewards, "outcome": {"correct": torch.nan_to_num(rewards, nan=0.0), "eligible": eligible}}, out


def agreement_diagnostic(s: Sampled, ctx: StageContext):
    """A gold-free diagnostic for methods without a reward (TASCO): rewards and
    outcome["correct"] = 1 for a reply that agrees with its group's majority answer, 0
    otherwise (0 in groups without a majority). Nothing trains on it."""
    rewards, eligible, info = rw.ttrl_rewards(s.texts, s.batch.group)
    agree = torch.nan_to_num(torch.as_tensor(rewards, dtype=torch.float32), nan=0.0)
    m = {"vote/no_majority_fraction": float((~torch.as_tensor(eligible)).float().mean())}
    return {"rewards": agree, "outcome": {"correct": agree.clone()}}, m


SELF_VOTE = Stage("reward", self_vote, kernels=(rw.ttrl_rewards,),
                  writes=("rewards", "outcome.correct", "outcome.eligible"))
AGREEMENT_DIAGNOSTIC = Stage("reward", agreement_diagnostic, kernels=(rw.ttrl_rewards,),
                             writes=("rewards", "outcome.correct"))

# ----------------------------------------------------------------------------- TTPO


def ttpo_split(batch, ctx: StageContext):
    """Once per round: the self-distillation token set (agreeing replies, converged tokens
    out) and the RL token set (dissenting replies, confident errors out), from the vote and
    the sampler's token probabilities (`testtime.ttpo_split`)."""
    batch.require("ttpo", "rewards", "logp_behavior", "outcome.eligible")
    p = ctx.p
    eligible = batch.outcome["eligible"].bool()
    agree = eligible & (torch.nan_to_num(batch.rewards, nan=0.0) == 1)
    distill, rl, info = TT.ttpo_split(agree, eligible, batch.logp_behavior, batch.loss_mask,
                                      tau_conv=p.ttpo_tau_conv, tau_err=p.ttpo_tau_err, err_level=p.ttpo_err_level)
    n = max(int(batch.loss_mask.sum()), 1)
    m = {f"ttpo/{k}": float(v) for k, v in info.items()}
    m["ttpo/distill_token_frac"], m["ttpo/rl_token_frac"] = float(distill.sum()) / n, float(rl.sum()) / n
    return {"extras": {"ttpo_distill_mask": distill, "ttpo_rl_mask": rl}}, m


def ttpo_advantage(batch, ctx: StageContext) -> Advantages:
    """Group-relative advantages of the 0/1 agreements, on the RL token set only, `[B, T]`."""
    if "ttpo_rl_mask" not in batch.extras:
        raise PolicylabError("ttpo needs extras['ttpo_rl_mask'] (the TTPO_SPLIT round stage)")
    p = ctx.p
    a = TT.ttpo_advantages(batch.rewards, batch.group, batch.extras["ttpo_rl_mask"], std=p.std, eps=p.eps,
                           rl_coef=p.ttpo_rl_coef)
    return Advantages(a)


def ttpo_distill(inp: LossInputs, p):
    if "ttpo_distill_mask" not in inp.batch.extras:
        raise PolicylabError("ttpo needs extras['ttpo_distill_mask'] (the TTPO_SPLIT round stage)")
    mask = inp.batch.extras["ttpo_distill_mask"] & inp.mask
    return TT.self_distill_nll(inp.logp, mask, coef=p.ttpo_sd_coef), {}


def ttpo_distill_mask(batch, p) -> torch.Tensor:
    return batch.extras["ttpo_distill_mask"] & batch.loss_mask


TTPO_SPLIT = Stage("round", ttpo_split, kernels=(TT.ttpo_split,),
                   params=("ttpo_tau_conv", "ttpo_tau_err", "ttpo_err_level"),
                   reads=("rewards", "logp_behavior", "outcome.eligible"),
                   writes=("extras.ttpo_distill_mask", "extras.ttpo_rl_mask"))
TTPO_ADVANTAGE = Stage("advantage", ttpo_advantage, kernels=(TT.ttpo_advantages,),
                       params=("std", "eps", "ttpo_rl_coef"), reads=("rewards", "group", "extras.ttpo_rl_mask"))
TTPO_DISTILL = Stage("term", ttpo_distill, name="self_distill", kernels=(TT.self_distill_nll,),
                     params=("ttpo_sd_coef",), reads=("logp", "extras.ttpo_distill_mask"),
                     active=lambda p: p.ttpo_sd_coef > 0, term_mask=ttpo_distill_mask, term_aggregation="token_mean")

# ----------------------------------------------------------------------------- Probe-ERPO


def _group_order(group: torch.Tensor) -> list[int]:
    return list(dict.fromkeys(group.tolist()))


def probe_score(s: Sampled, ctx: StageContext):
    """Rank the candidates (votes for their answer, then their mean sampler log-prob), ask
    each prompt's answer-independent probes to the model (greedy decode), and set the
    prompt's branch from its probe consistency rate. Writes the ranks, the branch and the
    PCR (extras), the agreement with the top-ranked answer (rewards, outcome["correct"]:
    a self-made label) and eligibility (prompts the probe generator cannot parse)."""
    p = ctx.p
    batch = s.batch
    B = batch.size
    answers = [extract_last_number(t) for t in s.texts]
    gids = batch.group.tolist()
    order = _group_order(batch.group)
    votes = torch.zeros(B, dtype=torch.long)
    for g in order:
        rows = [i for i in range(B) if gids[i] == g]
        for i in rows:
            if answers[i] is not None:
                votes[i] = sum(answers[j] == answers[i] for j in rows)
    mask = batch.loss_mask
    lp = torch.where(mask, batch.logp_behavior, torch.zeros((), dtype=batch.logp_behavior.dtype))
    score = lp.sum(-1) / mask.sum(-1).clamp(min=1)
    ranks = PR.rank_candidates(votes, score.double(), batch.group)
    generator = PB.PROBE_GENERATORS[p.probe_generator]
    probe_sets = [generator(ex.prompt) for ex in s.group_examples]
    asked = [(j, q) for j, ps in enumerate(probe_sets) if ps for q in ps]
    replies = []
    if asked:
        ids = ctx.rollout.greedy([ctx.encode(q.question) for _, q in asked], max_new_tokens=ctx.run.max_new_tokens)
        replies = [extract_last_number(ctx.decode(r)) for r in ids]
    pcr_group, eligible_group, k = [], [], 0
    for j, ps in enumerate(probe_sets):
        top = next(i for i in range(B) if gids[i] == order[j] and int(ranks[i]) == 0)
        if not ps:
            pcr_group.append(0.0)
            eligible_group.append(False)
            continue
        consistent = PB.probe_consistency(answers[top], replies[k:k + len(ps)], ps)
        k += len(ps)
        pcr_group.append(sum(consistent) / len(consistent))
        eligible_group.append(True)
    where = {g: j for j, g in enumerate(order)}
    pcr = torch.tensor([pcr_group[where[g]] for g in gids], dtype=torch.float32)
    eligible = torch.tensor([eligible_group[where[g]] for g in gids], dtype=torch.bool)
    low = PR.probe_branch(pcr, tau=p.probe_tau)
    top_answer = {g: answers[next(i for i in range(B) if gids[i] == g and int(ranks[i]) == 0)] for g in order}
    agree = torch.tensor([float(answers[i] is not None and answers[i] == top_answer[gids[i]]) for i in range(B)])
    parsed = sum(r is not None for r in replies)
    info = {"probe/pcr_mean": sum(pcr_group) / len(pcr_group), "probe/low_fraction": float(low.float().mean()),
            "probe/answers_parsed_frac": parsed / max(len(replies), 1), "probe/asked": float(len(asked)),
            "probe/ineligible_fraction": float((~eligible).float().mean())}
    return {"rewards": agree, "outcome": {"correct": agree.clone(), "eligible": eligible},
            "extras": {"probe_rank": ranks, "probe_low": low, "probe_pcr": pcr}}, info


def probe_advantage(batch, ctx: StageContext) -> Advantages:
    """High branch: +c_pos on the top_k candidates; low branch: −c_neg on the lowest ranks."""
    for key in ("probe_rank", "probe_low"):
        if key not in batch.extras:
            raise PolicylabError(f"probe_erpo needs extras['{key}'] (the PROBE_SCORE reward stage)")
    p = ctx.p
    a, info = PR.probe_erpo_advantages(batch.extras["probe_rank"], batch.extras["probe_low"].bool(), batch.group,
                                       top_k=p.probe_top_k, suppress_frac=p.probe_suppress_frac,
                                       pos_coef=p.probe_pos_coef, neg_coef=p.probe_neg_coef)
    return Advantages(a.to(batch.logp_behavior.dtype), info=info)


def probe_entropy(inp: LossInputs, p):
    if inp.entropy is None:
        raise PolicylabError("probe_erpo's entropy term needs the learner's per-token entropy")
    low = inp.batch.extras["probe_low"].bool().unsqueeze(-1)
    return PR.entropy_bonus(inp.entropy, inp.mask & low, coef=p.probe_entropy_coef), {}


def probe_entropy_mask(batch, p) -> torch.Tensor:
    return batch.loss_mask & batch.extras["probe_low"].bool().unsqueeze(-1)


PROBE_SCORE = Stage("reward", probe_score, needs=("rollout.greedy",), kernels=(PR.rank_candidates, PB.probe_consistency, PR.probe_branch),
                    params=("probe_generator", "probe_tau"), reads=("logp_behavior",),
                    writes=("rewards", "outcome.correct", "outcome.eligible", "extras.probe_rank", "extras.probe_low",
                            "extras.probe_pcr"))
PROBE_ADVANTAGE = Stage("advantage", probe_advantage, kernels=(PR.probe_erpo_advantages,),
                        params=("probe_top_k", "probe_suppress_frac", "probe_pos_coef", "probe_neg_coef"),
                        reads=("extras.probe_rank", "extras.probe_low", "group"))
PROBE_ENTROPY = Stage("term", probe_entropy, name="probe_entropy", kernels=(PR.entropy_bonus,),
                      params=("probe_entropy_coef",), reads=("entropy", "extras.probe_low"),
                      active=lambda p: p.probe_entropy_coef > 0, term_mask=probe_entropy_mask,
                      term_aggregation="token_mean")


# ----------------------------------------------------------------------------- registration

FAMILY = "test-time adaptation"


def _prob(v) -> str | None:
    return None if 0 < v <= 1 else "must be a probability in (0, 1]"


def _unit(v) -> str | None:
    return None if 0 <= v <= 1 else "must be in [0, 1]"


def adaptation_budget(run, steps: int) -> dict:
    """What a test-time method's report states: the model was adapted, with these budgets
    (`run`: the run's shape, `steps`: its rollout steps)."""
    return {"adapted": True, "prompts": steps * run.prompts_per_step, "samples_per_prompt": run.group_size,
            "max_new_tokens": run.max_new_tokens, "rollout_steps": steps,
            "optimizer_steps_max": steps * run.epochs * run.minibatches}


ADAPTATION = (("adaptation", adaptation_budget),)  # every method here reports it


register(policy_gradient_method(
    "ttpo",
    Card(
        title="TTPO: Test-Time Policy Optimization", arxiv="", family=FAMILY,
        samples="π_θ, G replies per unlabeled prompt (the rollout engine at the current weights)",
        learns="π_θ (online, on the unlabeled stream)", reference="none",
        summary="majority-agreeing replies: self-distillation (token NLL, converged tokens out); dissenting replies: "
                "group-relative RL (confident errors out); two terms, two normalizers; no gold",
        not_established="that the split beats plain TTRL; consensus can be confidently wrong, and self-distillation "
                        "then sharpens the wrong answer; adapted models are not fixed-model evaluations",
        unconfirmed=("title and arXiv id", "the distillation form (token NLL on own tokens) and the RL form "
                     "(GRPO of the 0/1 agreement on the dissenting replies only)",
                     "converged-token threshold ttpo_tau_conv (0.99: library decision)",
                     "confident-error threshold ttpo_tau_err (0.9) and its level (token or response)",
                     "term weights ttpo_sd_coef and ttpo_rl_coef (1, 1)"),
        confirmed="nothing against the paper's text, which could not be checked; what is tested is the mechanism "
                  "(no gold anywhere; the vote is TTRL's rule: ties make a prompt ineligible)",
    ),
    rewards_=(SELF_VOTE,), filters=(filters.ELIGIBLE,), round_=(TTPO_SPLIT,),
    advantage=TTPO_ADVANTAGE, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    terms=(TTPO_DISTILL,), kl_placements=("loss",),
    params=clip(0.2, 0.2) + group_std() + (
        Param("ttpo_tau_conv", float, 0.99, "converged-token threshold: an agreeing reply's token with sampler "
              "probability p > tau leaves the self-distillation set (1.0: none leaves)", check=_prob),
        Param("ttpo_tau_err", float, 0.9, "confident-error threshold: a dissenting token (or reply, see "
              "ttpo_err_level) with p > tau leaves the RL term (1.0: no filter)", check=_prob),
        Param("ttpo_err_level", str, "token", "the confident-error filter acts on each token's p, or on a reply's "
              "geometric-mean token probability", choices=ERR_LEVELS),
        Param("ttpo_sd_coef", float, 1.0, "weight of the self-distillation term (0: off)", check=non_negative),
        Param("ttpo_rl_coef", float, 1.0, "weight of the RL term (scales its advantages)", check=non_negative)),
    min_group_size=2,
    report_sections=ADAPTATION,
))

register(policy_gradient_method(
    "probe_erpo",
    Card(
        title="Probe-ERPO: probe-consistency-gated reinforcement vs negative ranking", arxiv="", family=FAMILY,
        samples="π_θ, G candidate replies per unlabeled prompt; probes answered by π_θ (greedy decode)",
        learns="π_θ (online, on the unlabeled stream)", reference="none",
        summary="probe consistency rate of the top-ranked answer decides: PCR >= τ reinforces the top-ranked "
                "candidates, PCR < τ pushes down the low-ranked ones and adds an entropy bonus (no positive target)",
        not_established="probe agreement is a hint, not correctness; the built-in probes re-ask arithmetic "
                        "sub-quantities (other tasks need their own probe generator); fixtures test the update path, "
                        "not probe quality",
        unconfirmed=("title and arXiv id", "the ranking rule (votes, then mean log-prob)", "the probes and their "
                     "consistency rule", "PCR threshold probe_tau (0.5)", "how many candidates are reinforced "
                     "(probe_top_k 1) or suppressed (probe_suppress_frac 0.5)", "advantage magnitudes (±1) and the "
                     "entropy coefficient (0.01)"),
        confirmed="nothing against the paper's text, which could not be checked; what is tested is the mechanism: "
                  "the low-PCR branch has no positive "
                  "advantage, the rank mask reads ranks and probe outcomes only, the entropy term raises entropy "
                  "(tested)",
    ),
    rewards_=(PROBE_SCORE,), filters=(filters.ELIGIBLE,),
    advantage=PROBE_ADVANTAGE, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    terms=(PROBE_ENTROPY,), kl_placements=("loss",),
    params=clip(0.2, 0.2) + (
        Param("probe_generator", str, "arithmetic_subquantity", "answer-independent probes of a prompt "
              "(testtime.probes)", choices=tuple(PROBE_GENERATORS)),
        Param("probe_tau", float, 0.5, "PCR threshold: PCR >= tau (inclusive) is the high branch", check=_unit),
        Param("probe_top_k", int, 1, "high branch: the top_k ranked candidates get +probe_pos_coef",
              check=at_least_one),
        Param("probe_suppress_frac", float, 0.5, "low branch: the ceil(frac·G) lowest-ranked candidates get "
              "−probe_neg_coef", check=_prob),
        Param("probe_pos_coef", float, 1.0, "advantage of a reinforced candidate", check=non_negative),
        Param("probe_neg_coef", float, 1.0, "magnitude of a suppressed candidate's (negative) advantage",
              check=non_negative),
        Param("probe_entropy_coef", float, 0.01, "entropy bonus on the low branch's tokens (0: off)",
              check=non_negative)),
    min_group_size=2,
    report_sections=ADAPTATION,
))
