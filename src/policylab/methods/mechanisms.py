"""What each method's paper says its mechanism does, how a run shows it, and the run with
the mechanism switched off: the declarations `policylab evidence` measures.

A `Mechanism` names, for one registered method:

- `signature`: the claim, in words (what should differ between the method and its control);
- `quantity`: a small pure function of a run's metric rows (metrics.jsonl step rows) that
  measures it, with the `direction` the claim predicts (+1: the method's value is larger
  than the control's, -1: smaller);
- `control`: the same run with the mechanism switched off: parameter overrides of the
  method itself (a mapping), or another registered method (a name, with
  `control_params`), optionally with run-config overrides (`control_run`, e.g. lr 0 for
  the no-update control of a self-labelling method);
- `task`: the key of the shared run setting (`TASKS`) the method is meant for; the
  method's own spec `exercise` settings are applied on top of it for both arms;
- `not_measurable_here`: when non-empty, why the claim cannot be measured on this machine
  (2 CPU cores, SmolLM2-135M, a handful of steps) or by this command, and what it would
  take. Such a mechanism has no quantity and no runs.

`mechanism(name)` looks one up (an unknown name raises the registry's error with close
matches); every registered method has exactly one entry (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

REDUCTIONS = ("mean", "late", "final")


@dataclass(frozen=True)
class Quantity:
    """One number from a run's metric rows: `key` read at every step that logged it as a
    finite number, reduced by `reduce`:

    mean  the mean over those steps;
    late  the mean over their second half (values v_1..v_n in step order: v_{⌊n/2⌋+1}..v_n),
          where a claim about where training goes (entropy kept, lengths grown) shows;
    final the last one (for a held-out measure, `eval/...`: the evaluation after training;
          the evidence table passes evaluation rows at the step they describe).

    Returns None when no step logged the key."""
    key: str
    reduce: str = "mean"

    def __post_init__(self):
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"Quantity.reduce must be one of {REDUCTIONS}, got {self.reduce!r}")

    def values(self, rows: list[Mapping[str, Any]]) -> list[float]:
        rows = sorted((r for r in rows if isinstance(r.get("step"), int)), key=lambda r: r["step"])
        return [float(r[self.key]) for r in rows
                if isinstance(r.get(self.key), (int, float)) and not isinstance(r.get(self.key), bool)
                and math.isfinite(r[self.key])]

    def __call__(self, rows: list[Mapping[str, Any]]) -> float | None:
        v = self.values(rows)
        if not v:
            return None
        if self.reduce == "late":
            v = v[len(v) // 2:]
        elif self.reduce == "final":
            v = v[-1:]
        return sum(v) / len(v)

    @property
    def label(self) -> str:
        return f"{ {'mean': 'mean', 'late': 'late-half mean', 'final': 'final value'}[self.reduce]} of `{self.key}`"


@dataclass(frozen=True)
class Mechanism:
    method: str
    signature: str
    task: str = "arithmetic"
    quantity: Quantity | None = None
    direction: int = 1
    control: str | Mapping[str, Any] = field(default_factory=dict)
    control_params: Mapping[str, Any] = field(default_factory=dict)
    control_run: Mapping[str, Any] = field(default_factory=dict)
    method_params: Mapping[str, Any] = field(default_factory=dict)
    not_measurable_here: str = ""

    @property
    def measurable(self) -> bool:
        return not self.not_measurable_here

    @property
    def control_method(self) -> str:
        """The control arm's method: another method's name, or the method itself."""
        return self.control if isinstance(self.control, str) else self.method

    @property
    def control_method_params(self) -> dict:
        return dict(self.control_params) if isinstance(self.control, str) else dict(self.control)

    def describe_control(self) -> str:
        what = self.control_method if isinstance(self.control, str) else self.method
        params = self.control_method_params
        out = what + (f" with {', '.join(f'{k}={v}' for k, v in params.items())}" if params else "")
        if self.control_run:
            out += " and " + ", ".join(f"{sec}.{k}={v}" for sec, kv in self.control_run.items() for k, v in kv.items())
        return out


# The shared run every arm starts from (sections of a run config; the evidence command adds
# the model, seeds, steps and evaluation size): the quickstart's task and batch. Four
# minibatches per rollout step: every minibatch after the first sees a moved policy, so
# ratios leave 1 and clip, trust-region and correction mechanisms act (with one minibatch
# the ratio is exactly 1).
BASE_RUN = {"task": {"name": "arithmetic", "ops": ["+", "*"], "digits": 1},
            "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 16, "temperature": 1.0},
            "train": {"lr": 1.0e-5, "micro_batch_size": 8, "grad_clip": 1.0, "minibatches": 4}}

_ONE_UPDATE = {"minibatches": 1, "micro_batch_size": 16}
# A task is what the mechanism's runs change in BASE_RUN, applied after the method's spec
# `exercise` settings ("own": the task the method's `exercise` names, e.g. menu labels,
# two turns, a target distribution, sandboxed code).
TASKS: dict[str, dict] = {
    "arithmetic": {},
    "arithmetic-onpolicy": {"train": _ONE_UPDATE},  # one update per batch (REINFORCE-style methods)
    # a behavior engine that samples from int4 weights (groups of 32): a real train/serve mismatch
    "int4-engine": {"rollout": {"engine_dtype": "int4"}},
    "int4-engine-onpolicy": {"rollout": {"engine_dtype": "int4"}, "train": _ONE_UPDATE},
    # batches trained one rollout step after they were sampled
    "stale1": {"rollout": {"staleness": 1}},
    "stale1-int4": {"rollout": {"staleness": 1, "engine_dtype": "int4"}},
    "own": {},
    # the method's own task, evaluated at the rollout's low temperature (the stated-confidence format
    # appears at T = 0.3, rarely at T = 1)
    "own-eval-t0.3": {"eval": {"temperature": 0.3}},
}

_ENTROPY = Quantity("policy/entropy", "late")
_CLIP = Quantity("policy/clip_frac", "mean")
_GRAD = Quantity("grad_norm", "mean")
_LENGTH = Quantity("response/length_mean", "late")
_REWARD = Quantity("reward/mean", "late")
_ACCURACY = Quantity("accuracy", "late")
_ZERO_SPREAD = Quantity("groups/zero_spread_frac", "mean")
_RATIO_MAX = Quantity("policy/ratio/max", "mean")
_MISMATCH = Quantity("mismatch/old_vs_behavior_abs_dlogp_mean", "late")
_NO_UPDATE = {"train": {"lr": 0.0}}

_LEARNS = "group-relative updates raise the training reward above the no-update control (same prompts, lr 0)"
_FASTER = ("{what}: a higher training reward than GRPO's on the same prompts within the same optimizer steps "
           "(the paper's claim is a better or more stable learner; a handful of steps shows only an early lead)")
_TRUST = ("{what} keeps the policy ratio π_θ/π_old of later minibatches closer to 1 than PPO's clip does: a smaller "
          "largest ratio")
_MISMATCH_SIG = ("{what} keeps the train/serve mismatch from growing under an int4 behavior engine: a smaller "
                 "|log π_old − log μ| late in the run than uncorrected GRPO on the same engine (the growth is a "
                 "long-horizon effect: a handful of steps may not show it)")
_SIGNAL = ("{what} gives groups a learning signal where the model alone fails everything: fewer zero-spread "
           "groups (all rewards equal, zero advantage) than {control}")
_SELF = ("{what} raises the training accuracy (gold, which its reward never sees) above the no-update control "
         "on the same prompts")
# TTPO's and Probe-ERPO's training steps never read gold (tests/methods/test_testtime_gold.py): their
# claim is measured where gold is read, by the held-out evaluator after training
_SELF_HELD = ("{what} raises the held-out accuracy after training (the evaluator's gold, which no training step "
              "reads) above the no-update control on the same prompts")
_HELD_OUT = Quantity("eval/accuracy", "final")
_RETENTION = ("needs a retention probe: the quantity (NLL on held-back data, or the drift of the protected "
              "subspace) is logged by the method's own stage only, so the control (the method's mechanism off, ")
_CRITIC = ("needs a longer horizon: in a handful of steps the critic is barely trained (value pretraining and GAE "
           "act over tens of steps), so no step-level signature of the paper's claim exists at this budget")


def _m(method, signature, **kw) -> Mechanism:
    return Mechanism(method, signature, **kw)


MECHANISMS: dict[str, Mechanism] = {m.method: m for m in (
    # --- clipping and objectives -------------------------------------------------------------------------
    _m("grpo", _LEARNS, quantity=_REWARD, control={}, control_run=_NO_UPDATE),
    _m("dapo", "clip-higher (ε_high 0.28 > ε_low 0.2) keeps the policy entropy from collapsing: a higher entropy "
       "late in the run than the same DAPO run with symmetric clipping (ε_high = ε_low = 0.2)",
       quantity=_ENTROPY, control={"eps_high": 0.2}),
    _m("gspo", "one length-normalized ratio per sequence and one clip decision per sequence: a far larger fraction "
       "of tokens clipped than GRPO's token-level ratios", quantity=_CLIP, control="grpo"),
    _m("luspo", "GSPO's sequence loss scaled by the response length removes GSPO's bias towards short responses: "
       "longer responses late in the run than GSPO", quantity=_LENGTH, control="gspo"),
    _m("cispo", "clipped tokens keep their gradient (the clipped weight is detached, the log-prob is not): a larger "
       "gradient norm than GRPO's PPO clip, which zeroes them", quantity=_GRAD, control="grpo"),
    _m("gppo", "clipped tokens keep a bounded gradient instead of none: a larger gradient norm than GRPO's PPO "
       "clip", quantity=_GRAD, control="grpo"),
    _m("dr_grpo", "no per-response length normalization and no std division: no growth of response length "
       "(the length bias of GRPO's per-sequence token mean): shorter responses late in the run than GRPO",
       quantity=_LENGTH, direction=-1, control="grpo"),
    _m("tapo", _TRUST.format(what="TAPO's position-dependent trust interval"), quantity=_RATIO_MAX, direction=-1,
       control="grpo"),
    _m("ripo", _TRUST.format(what="RIPO's Fisher–Rao bounds from the frozen old probability"), quantity=_RATIO_MAX,
       direction=-1, control="grpo"),
    _m("gppo_fdiv", _TRUST.format(what="the f-divergence ratio interval"), quantity=_RATIO_MAX, direction=-1,
       control="grpo"),
    _m("stare", "amplifying the advantages of high-surprisal tokens while the entropy is below target keeps "
       "entropy up: a higher entropy late in the run than the same run without amplification (stare_amplify = 1)",
       quantity=_ENTROPY, control={"stare_amplify": 1.0}),
    _m("reco", "down-weighting likely (redundant) responses favours rarer ones: a higher entropy late in the run "
       "than GRPO", quantity=_ENTROPY, control="grpo"),
    _m("conspo", _FASTER.format(what="a contrastive group objective"), quantity=_REWARD, control="grpo"),
    _m("zcpo", _FASTER.format(what="zero-sum group coefficients with the KL drift"), quantity=_REWARD,
       control="grpo"),
    _m("erpo", _FASTER.format(what="question weights from the reference's likelihood"), quantity=_REWARD,
       control="grpo"),
    _m("ggpo", _FASTER.format(what="the within-group Gibbs-gap objective"), quantity=_REWARD, control="grpo"),
    # --- advantages --------------------------------------------------------------------------------------
    _m("rloo", _FASTER.format(what="a leave-one-out baseline"), task="arithmetic-onpolicy", quantity=_REWARD,
       control="grpo"),
    _m("remax", _FASTER.format(what="the greedy decode's reward as baseline"), task="arithmetic-onpolicy",
       quantity=_REWARD, control="grpo"),
    _m("reinforce_pp", _FASTER.format(what="batch-whitened KL-shaped returns"), quantity=_REWARD, control="grpo"),
    _m("reinforce_pp_baseline", _FASTER.format(what="group centring with one global scale"), quantity=_REWARD,
       control="grpo"),
    _m("grpo_process", _FASTER.format(what="step rewards normalized over the group's pool"), quantity=_REWARD,
       control="grpo"),
    _m("range_grpo", "interval judgements with point intervals reduce to Dr. GRPO: the same training reward as "
       "Dr. GRPO on numeric answers (a difference is the interval judge's)", quantity=_REWARD, control="dr_grpo"),
    _m("gprl", _FASTER.format(what="per-dimension group standardization"), quantity=_REWARD, control="grpo"),
    # --- engine mismatch and staleness -------------------------------------------------------------------
    _m("tis", "truncating the engine ratio at C bounds the importance weight's variance: a higher effective "
       "sample size of the weights than the untruncated weights (tis_cap = 1e6) on the int4 engine",
       task="int4-engine", quantity=Quantity("correction/tis/ess", "mean"), control={"tis_cap": 1.0e6}),
    _m("icepop", _MISMATCH_SIG.format(what="masking tokens outside the engine-ratio band"), task="int4-engine",
       quantity=_MISMATCH, direction=-1, control="grpo"),
    _m("kpop", _MISMATCH_SIG.format(what="keeping only tokens whose binary KLs are <= δ"), task="int4-engine",
       quantity=_MISMATCH, direction=-1, control="grpo"),
    _m("mis", _MISMATCH_SIG.format(what="masking sequences outside the geometric-mean band"), task="int4-engine",
       quantity=_MISMATCH, direction=-1, control="grpo"),
    _m("minirl", _MISMATCH_SIG.format(what="the detached engine ratio"), task="int4-engine", quantity=_MISMATCH,
       direction=-1, control="grpo"),
    _m("online_icepop", _MISMATCH_SIG.format(what="the IcePop band on the current policy"),
       task="int4-engine-onpolicy", quantity=_MISMATCH, direction=-1, control="grpo"),
    _m("missing_old_logits", _MISMATCH_SIG.format(what="TIS on the engine factor with π_old recovered exactly"),
       task="stale1-int4", quantity=_MISMATCH, direction=-1, control="grpo"),
    _m("sis", "tokens accepted by rejection sampling train as on-policy (ratio 1): a smaller clipped fraction than "
       "GRPO on batches one step stale", task="stale1", quantity=_CLIP, direction=-1, control="grpo"),
    _m("gmc", "capping each group's trajectory-weight mass bounds the update from stale batches: a smaller gradient "
       "norm than GRPO on batches one step stale", task="stale1", quantity=_GRAD, direction=-1, control="grpo"),
    # --- mixed policy: demonstrations, hints, gold, peers --------------------------------------------------
    _m("luffy", "the shaping f(π) = π/(π+γ) with γ = 0.1 keeps gradient on low-probability demonstration tokens "
       "(coefficient πγ/(π+γ)² ≫ π for π ≪ γ): the demonstration tokens' probability rises more than with γ = 1 "
       "(f ≈ π there: the unshaped ratio against μ = 1)", quantity=Quantity("policy/luffy/demo_token_prob_mean",
                                                                             "late"), control={"luffy_gamma": 1.0}),
    _m("off_context_grpo", _SIGNAL.format(what="sampling with a worked-solution hint", control="GRPO (hint 'none')"),
       quantity=_ZERO_SPREAD, direction=-1, control={"hint_kind": "none"}),
    _m("grin", _SIGNAL.format(what="injecting gold into all-fail groups", control="GRPO"), quantity=_ZERO_SPREAD,
       direction=-1, control="grpo"),
    _m("moer", _SIGNAL.format(what="expert-prefix guided rows", control="GRPO"), quantity=_ZERO_SPREAD,
       direction=-1, control="grpo"),
    _m("erils", _SIGNAL.format(what="external rollouts (here a frozen copy of the initial policy)", control="GRPO"),
       quantity=_ZERO_SPREAD, direction=-1, control="grpo"),
    _m("graft", _SIGNAL.format(what="importing a peer's mixed group (here a frozen copy of the initial policy)",
                               control="GRPO"), quantity=_ZERO_SPREAD, direction=-1, control="grpo"),
    # --- rewards on their own tasks ----------------------------------------------------------------------
    _m("rlid", "the KL(uniform ‖ label marginal) regularizer removes label bias: a smaller label-marginal KL late in "
       "the run than the same run without it (marginal_coef = 0)", task="own",
       quantity=Quantity("rlid/label_marginal_kl", "late"), direction=-1, control={"marginal_coef": 0.0}),
    _m("mad_rl", "the match reward moves the group's output frequencies towards the target: a smaller total "
       "variation to the target late in the run than correctness alone (match_coef = 0)", task="own",
       quantity=Quantity("distribution/tv_mean", "late"), direction=-1, control={"match_coef": 0.0}),
    _m("rlcpr", "the gated relative length penalty shortens replies: shorter responses late in the run than the "
       "same run without the penalty (length_coef = 0)", quantity=_LENGTH, direction=-1,
       control={"length_coef": 0.0}),
    _m("code_opt", "the speed term pays correct programs for running faster: a higher mean speed score than the "
       "same run without it (speed_weight = 0)", task="own", quantity=Quantity("code/speed_mean", "late"),
       control={"speed_weight": 0.0}),
    _m("tlm_dre", _FASTER.format(what="turn weights from the reference's log-probs on two-turn dialogues"),
       task="own", quantity=_REWARD, control="grpo"),
    _m("rlcr", "the Brier term makes the stated confidence calibrated: a lower held-out Brier score of the stated "
       "confidence than the same task trained for correctness only (GRPO with the task's verifier), both arms' "
       "replies parsed by the same parser after training (replies without a parseable confidence are left out of "
       "the score and counted in `eval/confidence/parsed_frac`)",
       task="own-eval-t0.3", quantity=Quantity("eval/confidence/brier", "final"), direction=-1, control="grpo"),
    # --- self-labelling / test-time ----------------------------------------------------------------------
    _m("ttrl", _SELF.format(what="majority-vote pseudo-labels"), quantity=_ACCURACY, control={},
       control_run=_NO_UPDATE),
    _m("ttpo", _SELF_HELD.format(what="self-distillation on agreeing replies and RL on dissenting ones"),
       quantity=_HELD_OUT, control={}, control_run=_NO_UPDATE),
    _m("probe_erpo", _SELF_HELD.format(what="probe-consistency gated reinforcement"), quantity=_HELD_OUT, control={},
       control_run=_NO_UPDATE),
    _m("tasco", "tuning a soft prefix to minimize entropy plus a stability divergence lowers the token entropy "
       "below the no-update control", quantity=_ENTROPY, direction=-1, control={}, control_run=_NO_UPDATE),
    # --- gradient geometry, critics, pipelines: not measurable by this command ---------------------------
    _m("cord", "projecting out the RL gradient's conflict with the retention gradient protects the retention loss",
       not_measurable_here=_RETENTION + "a plain sum of the two gradients) has no parameter that keeps the "
       "retention loss and drops only the projection (cord_mode is conflict_only or always); it needs a "
       "no-projection mode or a retention probe of both arms' checkpoints"),
    _m("gcpo", "projecting LoRA gradients off W_0's top singular spaces protects what those spaces encode",
       not_measurable_here=_RETENTION + "project_gradients = false still re-projects the factors after each step) "
       "measures nothing comparable; it needs a retention probe on held-back data of both arms' checkpoints"),
    _m("iso", "frozen singular values with retracted frames keep the layers' spectrum, protecting pretrained "
       "behaviour", not_measurable_here=_RETENTION + "the only alternative, retraction qr, keeps the spectrum "
       "too); it needs a retention probe on held-back data against unconstrained GRPO"),
    _m("ppo", "GAE advantages from a learned critic lower the policy gradient's variance", not_measurable_here=_CRITIC),
    _m("vapo", "value pretraining and decoupled GAE make the critic's advantages usable from the start",
       not_measurable_here=_CRITIC + "; the nine-method comparison measured its capability (20 steps, 2 seeds)"),
    _m("rfpo", "rewards from a frozen critic replace the verifier during RL", not_measurable_here="needs a critic "
       "trained first (`policylab train-critic`) shared by both arms, and a control rewarded by the verifier; the "
       "critic trained here is worse calibrated than the base rate (Brier 0.38 vs 0.16), so its rewards carry "
       "little signal at this size"),
    _m("ppo_rlhf", "a reward model learned from preferences steers PPO", not_measurable_here="a three-stage pipeline "
       "(SFT, reward model, PPO: `policylab pipeline ppo_rlhf`), not a single run with a switch; its signature is "
       "the reward model's held-out pair accuracy (benchmarks/results/ppo_rlhf_pipeline.md)"),
    _m("fusion", "on-policy distillation from per-domain teachers transfers each domain's skill",
       not_measurable_here="a multi-stage pipeline (`policylab pipeline fusion`) needing trained per-domain "
                           "teachers, which at this budget do not move from the base"),
)}


def mechanism(name: str) -> Mechanism:
    """The declared mechanism of registered method `name`; an unknown name raises the
    registry's error (with close matches), a registered method without a declaration
    raises KeyError (a test keeps that from happening for the shipped methods)."""
    from policylab.methods.registry import get

    spec = get(name)
    try:
        return MECHANISMS[spec.name]
    except KeyError:
        raise KeyError(f"method {spec.name!r} declares no mechanism (policylab.methods.mechanisms.MECHANISMS)") from None
