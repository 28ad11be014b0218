"""Stages of the test-time adaptation methods (TTPO, Probe-ERPO, TASCO).

Rule (conventions rule 7): no stage here reads a gold answer. They never call
`ctx.score` or `ctx.task_reward` and never read `Example.answer`; every label they train
on is made from the model's own outputs (votes, probe answers, its own confidence). The
held-out evaluator, which runs after adaptation, is the only place gold is read
(`tests/methods/test_testtime_gold.py` feeds wrong gold and checks the update is
bit-identical).
"""

from __future__ import annotations

import torch

from policylab.kernels import rewards as rw
from policylab.batch import LEARNER, concat_batches
from policylab.errors import PolicylabError
from policylab.kernels.rewards.verifiers import extract_last_number
from policylab.kernels.testtime import probe as PR
from policylab.tasks import probes as PB
from policylab.kernels.testtime import tasco as TA
from policylab.kernels.testtime import ttpo as TT
from policylab.models.soft_prefix import attach_prefix
from policylab.methods.context import Sampled, StageContext
from policylab.methods.spec import Advantages, LossInputs, Stage

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

# ----------------------------------------------------------------------------- TASCO


class PrefixState:
    """TASCO's per-run state: the seeded generator of the perturbations ξ (checkpointed)
    and the layout of the virtual prefix ids (vocabulary size V, prefix length m, K),
    recorded by the model stage when the run is built."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(int(seed) + 31)
        self.vocab = self.m = self.n_perturb = None

    def block(self, k: int) -> list[int]:
        if self.vocab is None:
            raise PolicylabError("tasco: the soft prefix was not attached (the SOFT_PREFIX model stage runs first)")
        start = self.vocab + k * self.m
        return list(range(start, start + self.m))

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"])


def soft_prefix(model, setup):
    """Freeze the backbone, wrap it with the soft prefix (`testtime.attach_prefix`), draw
    the first perturbations from the method's generator and record the id layout."""
    p, st = setup.p, setup.state["tasco_prefix"]
    lm = attach_prefix(model, setup.tokenizer, init_text=p.tasco_init_text, n_perturb=p.tasco_perturbations)
    lm.embedding.redraw(st.generator, p.tasco_sigma)
    st.vocab, st.m, st.n_perturb = lm.embedding.vocab, lm.embedding.m, lm.embedding.n_perturb
    return lm


def tasco_source(n_prompts: int, ctx: StageContext) -> Sampled:
    """G replies per prompt sampled under the prefix P (block 0 in front of each prompt),
    then K copies of every reply with block k (P + ξ_k) in front: the same tokens,
    re-scored under the perturbed prefix by the training forward. Copies are not samples:
    source "perturbed", the behavior log-probs of the clean reply (the policy that emitted
    the tokens), extras tasco_copy (k) and tasco_pair (the clean reply's id)."""
    st = ctx.state["tasco_prefix"]
    examples = ctx.next_train(n_prompts)
    prompt_ids = [st.block(0) + ctx.encode(e.prompt) for e in examples]
    G = ctx.run.group_size
    batch = ctx.rollout.generate(prompt_ids, group_size=G, sampling=ctx.sampling, max_new_tokens=ctx.run.max_new_tokens,
                                 policy_version=ctx.policy_version, batch_id=ctx.batch_tag,
                                 group_ids=ctx.new_groups(n_prompts))
    texts = ctx.rollout.decode(batch)
    B = batch.size
    pair = batch.group * G + torch.arange(B) % G
    parts = [batch.replace(extras={**batch.extras, "tasco_copy": torch.zeros(B, dtype=torch.long), "tasco_pair": pair})]
    P = batch.prompt_width
    for k in range(1, st.n_perturb + 1):
        tokens = batch.tokens.clone()
        head = tokens[:, :P]
        tokens[:, :P] = torch.where(head >= st.vocab, head + k * st.m, head)
        parts.append(batch.replace(tokens=tokens, source=("perturbed",) * B, producer=(LEARNER,) * B,
                                   extras={**batch.extras, "tasco_copy": torch.full((B,), k, dtype=torch.long),
                                           "tasco_pair": pair}))
    full = concat_batches(parts, batch.batch_id).validate()
    K1 = st.n_perturb + 1
    return Sampled(full, texts * K1, [e for e in examples for _ in range(G)] * K1, prompt_ids, list(examples))


def no_advantage(batch, ctx: StageContext) -> Advantages:
    """TASCO's loss is not a policy gradient: it has no advantage (identically 0, unread)."""
    return Advantages(TA.no_advantage(batch.size, batch.logp_behavior.dtype))


def tasco_objective(inp: LossInputs, p):
    ex = inp.batch.extras
    if inp.entropy is None or "tasco_copy" not in ex:
        raise PolicylabError("tasco needs the learner's entropy and the perturbed copies of its source")
    return TA.tasco_loss(inp.logp, inp.entropy, inp.mask, ex["tasco_copy"], ex["tasco_pair"], lam=p.tasco_lambda,
                         n_perturb=p.tasco_perturbations, divergence=p.tasco_divergence)


def redraw_perturbations(model, ctx: StageContext) -> dict:
    """After every optimizer step: new perturbations ξ from the method's generator."""
    if not ctx.p.tasco_redraw:
        return {}
    model.embedding.redraw(ctx.state["tasco_prefix"].generator, ctx.p.tasco_sigma)
    return {"tasco/prefix_norm": float(model.embedding.prefix.detach().norm())}


SOFT_PREFIX = Stage("model", soft_prefix, kernels=(attach_prefix,),
                    params=("tasco_init_text", "tasco_perturbations", "tasco_sigma"))
TASCO_SOURCE = Stage("source", tasco_source, params=("tasco_perturbations",),
                     writes=("tokens", "loss_mask", "logp_behavior", "group", "policy_version", "source",
                             "extras.tasco_copy", "extras.tasco_pair"))
NO_ADVANTAGE = Stage("advantage", no_advantage, name="none", kernels=(TA.no_advantage,))
TASCO_OBJECTIVE = Stage("objective", tasco_objective, name="tasco", kernels=(TA.tasco_loss,),
                        params=("tasco_lambda", "tasco_perturbations", "tasco_divergence"),
                        reads=("logp", "entropy", "extras.tasco_copy", "extras.tasco_pair"), row_coupling="group")
REDRAW = Stage("poststep", redraw_perturbations, name="redraw_perturbations",
               params=("tasco_redraw", "tasco_sigma"))
