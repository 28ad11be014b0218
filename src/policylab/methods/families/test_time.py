"""Registered test-time adaptation methods: TTPO, Probe-ERPO, TASCO (one `register` each).

They adapt the model on unlabeled prompts: every label they learn from is made from the
model's own outputs (votes, probe answers, its confidence); gold answers reach only the
held-out evaluator, after adaptation (conventions rule 7, tested by feeding wrong gold).
Their run reports say "adapted" with the sampling and update budgets (`adaptation_budget`).
"""

from __future__ import annotations

from policylab.tasks.probes import PROBE_GENERATORS
from policylab.kernels.testtime.tasco import DIVERGENCES
from policylab.kernels.testtime.ttpo import ERR_LEVELS
from policylab.methods.params import clip, group_std, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import Card, Param, StateSpec, non_negative, positive
from policylab.methods.stages import filters, losses
from policylab.methods.stages import testtime as tt

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


def _at_least_one(v) -> str | None:
    return None if v >= 1 else "must be >= 1"


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
    rewards_=(tt.SELF_VOTE,), filters=(filters.ELIGIBLE,), round_=(tt.TTPO_SPLIT,),
    advantage=tt.TTPO_ADVANTAGE, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    terms=(tt.TTPO_DISTILL,), kl_placements=("loss",),
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
    rewards_=(tt.PROBE_SCORE,), filters=(filters.ELIGIBLE,),
    advantage=tt.PROBE_ADVANTAGE, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    terms=(tt.PROBE_ENTROPY,), kl_placements=("loss",),
    params=clip(0.2, 0.2) + (
        Param("probe_generator", str, "arithmetic_subquantity", "answer-independent probes of a prompt "
              "(testtime.probes)", choices=tuple(PROBE_GENERATORS)),
        Param("probe_tau", float, 0.5, "PCR threshold: PCR >= tau (inclusive) is the high branch", check=_unit),
        Param("probe_top_k", int, 1, "high branch: the top_k ranked candidates get +probe_pos_coef",
              check=_at_least_one),
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

register(policy_gradient_method(
    "tasco",
    Card(
        title="Beyond Confidence: Stability-Aware Test-Time Adaptation for LLM Reasoning", arxiv="", family=FAMILY,
        samples="the frozen model with the soft prefix P, G replies per unlabeled prompt (HF generate through the "
                "prefix: the FastEngine runs plain Llama decoders only)",
        learns="the soft prefix P only (m virtual tokens); the backbone is frozen and bit-identical after adaptation",
        reference="none",
        summary="tune a soft prefix on a frozen model: minimize token entropy (confidence) plus λ × a divergence "
                "between predictions under P and under seeded perturbations P + ξ_k (stability)",
        not_established="stability is not correctness; one prefix is adapted over the stream (not reset per "
                        "input); cost is (K + 1) training forwards per reply, not comparable to best-of-N counts",
        unconfirmed=("arXiv id", "Conf as negative token entropy of the sampled replies", "Instab as a sampled-token "
                     "divergence estimate (k3) between P and P + ξ_k", "perturbations in prefix space, "
                     "ξ ~ N(0, (σ·rms(E))²), σ = 0.1, K = 2, redrawn after every step", "λ = 1",
                     "prefix length and initialization (the embeddings of tasco_init_text's tokens)"),
        confirmed="the title only (the paper's text could not be checked); what is tested is the structure "
                  "L(P) = −Conf + λ·Instab with gradients to P only and a bit-identical frozen backbone",
    ),
    source=tt.TASCO_SOURCE, rewards_=(tt.AGREEMENT_DIAGNOSTIC,), model=(tt.SOFT_PREFIX,), poststep=(tt.REDRAW,),
    advantage=tt.NO_ADVANTAGE, objective=tt.TASCO_OBJECTIVE, aggregation="token_mean", kl_placements=("loss",),
    state=(StateSpec("tasco_prefix", lambda p, seed: tt.PrefixState(seed),
                     doc="the perturbations' seeded generator and the virtual prefix ids"),),
    params=(
        Param("tasco_init_text", str, "Think step by step, then answer.", "the prefix starts as the embeddings of "
              "this text's tokens (its token count is the prefix length m)"),
        Param("tasco_perturbations", int, 2, "K perturbed prefixes P + ξ_k per step", check=_at_least_one),
        Param("tasco_sigma", float, 0.1, "perturbation scale: ξ ~ N(0, (σ·s)² I), s = RMS of the embedding rows",
              check=positive),
        Param("tasco_lambda", float, 1.0, "λ: weight of the instability term", check=non_negative),
        Param("tasco_divergence", str, "k3", "per-token divergence estimate between P and P + ξ on the sampled "
              "token (both sides differentiable)", choices=DIVERGENCES),
        Param("tasco_redraw", bool, True, "draw new perturbations after every optimizer step (False: keep the "
              "first draw for the whole run)")),
    report_sections=ADAPTATION,
))
