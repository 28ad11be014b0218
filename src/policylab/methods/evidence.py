"""What has been measured for each method beyond its kernel tests: the status on its card.

The one place a card's status comes from: registrations do not set it, `apply()` writes
these entries into the registered cards when `policylab.methods` is imported, and a test
checks that every shipped method (and literature-only card) has exactly one entry. Every
entry points at the file that holds the numbers and the command that produced them. A
method registered from outside the package keeps the status its own card states, or
`registry.EXTERNAL`.
"""

from __future__ import annotations

import dataclasses

from policylab.methods.registry import LITERATURE, REGISTRY

LITERATURE_ONLY = "literature-only: not implemented, every execution path refuses"

_REAL = "kernel verified; 2 real optimizer steps on SmolLM2-135M-Instruct (benchmarks/results/methods_real.md)"
_REAL3 = ("kernel verified; 3 steps in the trainer on SmolLM2-135M-Instruct, finite metrics "
          "(benchmarks/results/methods_real.md); no learning claim")
_MISMATCH = ("kernel verified; in the trainer on SmolLM2-135M-Instruct with the bf16 behavior engine: 8 steps "
             "against the uncorrected run, same seed (benchmarks/results/offpolicy.md: the diagnostics show what "
             "it weighted or masked; rewards within noise of the uncorrected run at this scale)")
_REAL_12B = ("kernel verified; 3 real optimizer steps on SmolLM2-135M-Instruct through the trainer, finite metrics "
             "(benchmarks/results/methods_real_graded_and_geometry.md); no learning claim")
_STALE = ("kernel verified; in the trainer on SmolLM2-135M-Instruct with staleness 2: 8 steps against the "
          "uncorrected run, same seed (benchmarks/results/offpolicy.md); no learning claim at this scale")

_REAL_12A = ("kernel verified; 3 real optimizer steps on SmolLM2-135M-Instruct through the trainer{task}, finite "
             "metrics (benchmarks/results/methods_real_sequence_objectives.md); no learning claim")
_TASKS_12A = {"tlm_dre": " on the two-turn arithmetic dialogue (no dialogue fully correct in the 3 steps: every "
                         "trajectory negative, only the push-down branch ran; recorded with the plain per-token mean, "
                         "before per-turn normalization became the default: not re-run since)",
              "conspo": " (recorded with the earlier row scale, which counted every positive of the round: not re-run "
                        "since the mean over eligible positives)",
              "rlid": " on the menu-label arithmetic task",
              "stare": " (the results file does not record whether the entropy gate opened: below the 0.3-nat "
                       "target it reweights, above it the steps are GRPO's)"}
# the methods of this group whose run is recorded in methods_real_sequence_objectives (the others keep their kernel status)
_RUN_12A = ("conspo", "erpo", "rlid", "stare", "tlm_dre", "zcpo")
_REAL14 = ("kernel verified; 3 trainer steps on SmolLM2-135M-Instruct ({opt} optimizer steps), finite metrics "
           "(benchmarks/results/methods_real_mixed_policy.md){extra}; no learning claim")
_SELF = (", the {role} model a frozen copy of the initial policy (no second model of another size or tokenizer on "
         "this machine)")

# the nine-method comparison: two-digit addition, 20 rollout steps, seeds 0 and 1 (mean ± s.e.)
_CMP = ("trained end to end on SmolLM2-135M-Instruct in the nine-method comparison (two-digit addition, base 1.7% "
        "held-out, 20 rollout steps of 4 prompts x 8, lr 1e-5, seeds 0 and 1; benchmarks/results/compare_harder_task/"
        "compare.md and NOTES.md): final held-out accuracy {final}; {verdict}")
# the off-policy stress scenario: int4 per-row behavior engine, where the uncorrected run degrades
_STRESS = ("kernel verified; {verb} on SmolLM2-135M-Instruct in the off-policy stress scenario (benchmarks/"
           "results/offpolicy_stress.md: single-digit + and x, 30 rollout steps, one seed; the behavior engine samples "
           "from int4 weights with one scale per output row, k3 mismatch KL 1.48, engine ESS 0.15; uncorrected GRPO "
           "falls from the on-policy 94.0% to 26.5% ± 3.1 held-out): {result}; with the bf16 engine (8 steps, "
           "benchmarks/results/offpolicy.md) within noise of the uncorrected run")
_STALE_STRESS = ("staleness level of the stress scenario (benchmarks/results/offpolicy_stress_staleness.md: one "
                 "engine, batches trained one rollout step after sampling in 4 minibatches, a mean 3.2 optimizer "
                 "steps behind, total k3 KL 0.004; uncorrected GRPO 88.0% ± 2.3 against the on-policy 94.0% ± 1.7, "
                 "a marginal drop of 6.0 points against 2 s.e. = 5.7)")
_NS = "{delta} points vs GRPO's 56.2% ± 2.5, no significant difference at two seeds"
_COMPARED = {
    "dr_grpo": ("48.8% ± 5.3", _NS.format(delta="-7.5 ± 5.8")),
    "dapo": ("61.3% ± 2.4, the highest", _NS.format(delta="+5.0 ± 3.5") + "; it sampled ~1.7x the tokens (dynamic "
             "sampling refills), equal optimizer steps"),
    "gspo": ("49.2% ± 2.7", _NS.format(delta="-7.0 ± 3.7")),
    "cispo": ("50.0% ± 2.5", _NS.format(delta="-6.2 ± 3.5") + "; identical to GPPO (one on-policy update per batch: "
              "ratio 1, where the two objectives coincide)"),
    "gppo": ("50.0% ± 2.5", _NS.format(delta="-6.2 ± 3.5") + "; identical to CISPO (one on-policy update per batch: "
             "ratio 1, where the two objectives coincide)"),
    "rloo": ("51.5% ± 5.0", _NS.format(delta="-4.7 ± 5.6")),
    "reinforce_pp_baseline": ("50.5% ± 4.0", _NS.format(delta="-5.7 ± 4.7")),
    "vapo": ("43.5% ± 3.0", "-12.7 ± 3.9 points vs GRPO's 56.2% (z = -3.3), the one significant difference: its "
             "first 5 steps train the critic only (15 policy updates against GRPO's 18), and the critic makes a step "
             "~3.7x slower"),
}

# the reasoning-gym comparison (basic_arithmetic, base 9.0%, one seed): what it adds to a card
_RG_AT = " (benchmarks/results/compare_rg_basic_arith/compare.md, one seed, 20 steps)"
_RG = {
    "dapo": "; on reasoning-gym basic_arithmetic (base 9.0%) 43.0% ± 3.5 against GRPO's 33.5% ± 3.3, +9.5 ± 4.8 "
            "(z = 2.0, at 1.8x the sampled tokens)" + _RG_AT,
    "dr_grpo": "; on reasoning-gym basic_arithmetic (base 9.0%) 28.0% ± 3.2 against GRPO's 33.5% ± 3.3 (z = -1.2)"
               + _RG_AT,
}

EVIDENCE = {
    "grpo": "trained end to end on SmolLM2-135M-Instruct, single-digit + and x: held-out sampled accuracy "
            "13.0% -> 91.0% after 20 steps, 91.5% after 30, 140 s of training steps (quickstart, README); two-digit "
            "addition in the nine-method comparison (20 steps, seeds 0 and 1): 1.7% -> 56.2% ± 2.5 "
            "(benchmarks/results/compare_harder_task/compare.md); reasoning-gym basic_arithmetic: 9.0% -> 33.5% ± 3.3"
            + _RG_AT,
    **{name: _REAL for name in ("ggpo", "gmc", "gppo_fdiv", "grpo_process", "luspo", "ppo", "reinforce_pp")},
    **{name: _REAL3 for name in ("remax", "ripo", "tapo", "ttrl")},
    **{name: _CMP.format(final=f, verdict=v) + _RG.get(name, "") for name, (f, v) in _COMPARED.items()},
    **{name: _MISMATCH for name in ("kpop", "minirl", "online_icepop")},
    "tis": _STRESS.format(verb="corrects a degrading mismatch", result="48.0% ± 3.5, +21.5 ± 4.7 points over the "
                          "uncorrected run (z = 4.6); 9.4% of tokens capped at C = 2. As a control at the staleness level with one engine "
                          "(offpolicy_stress_staleness.md), where its engine ratio is 1: 81.5% ± 2.7 against the "
                          "uncorrected 88.0% ± 2.3 (z = -1.8), equal to Missing-Old-Logits"),
    "icepop": _STRESS.format(verb="corrects a degrading mismatch", result="61.5% ± 3.4, +35.0 ± 4.6 points over the "
                             "uncorrected run (z = 7.6), the best of the five corrections tried; 55% of tokens masked "
                             "outside [0.5, 5]"),
    "mis": _STRESS.format(verb="run in a degrading mismatch", result="34.5% ± 3.4, +8.0 ± 4.6 points over the "
                          "uncorrected run (z = 1.7, not significant): 95% of sequences masked by the geometric-mean "
                          "band [0.5, 2], so few tokens train"),
    "sis": _STALE,
    "gmc": ("kernel verified; in the trainer on SmolLM2-135M-Instruct in two stress levels: at the " + _STALE_STRESS
            + " 89.0% ± 2.2 (+1.0, no significant difference, weights barely capped: ESS after 0.999); at the int4 "
            "per-row engine (benchmarks/results/offpolicy_stress.md, uncorrected 26.5% ± 3.1) 19.5% ± 2.8 (-7.0 ± "
            "4.2, no gain: its one capped trajectory weight per sequence did not help where 59% of tokens fall "
            "outside IcePop's band)"),
    "missing_old_logits": ("kernel verified; in the trainer on SmolLM2-135M-Instruct in two stress levels: at the "
                           "int4 per-row engine (benchmarks/results/offpolicy_stress.md, uncorrected 26.5% ± 3.1) "
                           "48.0% ± 3.5, equal to TIS (no staleness: its engine factor is TIS's), +21.5 ± 4.7 (z = "
                           "4.6); at the " + _STALE_STRESS + " 81.5% ± 2.7 (-6.5 ± 3.6, z = -1.8: no significant "
                           "difference; the engine factor is 1 with one engine, the staleness factor is the same PPO "
                           "clip on π_θ/π_old that GRPO applies)"),
    **{name: _REAL_12A.format(task=_TASKS_12A.get(name, "")) for name in _RUN_12A},
    "off_context_grpo": _REAL14.format(opt=3, extra=", hint_kind 'worked': the first two batches had reward 0 "
                                       "everywhere (zero advantages, gradient norm 0), the third 1 of 16 correct"),
    "luffy": _REAL14.format(opt=3, extra=", one solver demonstration per group of 4 (the reward column counts "
                            "them: they are always correct)"),
    "erils": _REAL14.format(opt=2, extra=_SELF.format(role="external") + "; the third step's batch had reward 0 "
                            "everywhere, so no update"),
    "rlcr": ("kernel verified; 3 real optimizer steps on SmolLM2-135M-Instruct on the confidence task with the "
             "answer format in a system prompt, sampled at T = 0.3, 24 new tokens (benchmarks/results/"
             "methods_real_rich_rewards_followable_prompts.md): 3 of 16 replies stated a parseable confidence in step 2 (Brier 0.205, mean "
             "confidence 0.73), the others went through the explicit missing/malformed penalty path; at T = 1 no "
             "reply ever stated one (methods_real_rich_rewards.md); no learning claim"),
    **{name: _REAL_12B for name in ("cord", "range_grpo", "gprl", "iso")},
    "gcpo": ("kernel verified; 3 trainer steps on SmolLM2-135M-Instruct with LoRA rank 8 (2 optimizer steps: the "
             "first batch had reward 0 everywhere), finite metrics (benchmarks/results/methods_real_graded_and_geometry.md); no "
             "learning claim"),
    "reco": ("kernel verified; 3 trainer steps on SmolLM2-135M-Instruct with 2 minibatches each (6 optimizer steps: "
             "the variance ratio sees a moved policy), finite metrics (benchmarks/results/methods_real_sequence_objectives.md); no "
             "learning claim"),
    "grin": _REAL14.format(opt=3, extra=", gold injected into all-fail groups (the gold rows' accuracy is 1 by "
                           "construction; the reward column counts them)"),
    "moer": _REAL14.format(opt=3, extra=", guided and expert rows in every step (their accuracy is 1 by "
                           "construction; the reward column counts them)"),
    "graft": _REAL14.format(opt=3, extra=_SELF.format(role="peer") + "; no group was borrowed in the 3 steps "
                            "(every row native). With a real second model, the trained quickstart checkpoint as the "
                            "peer (benchmarks/results/graft_peer_quickstart.md, 18 steps): 0 groups borrowed, because "
                            "on the receiver's all-fail prompts the peer's groups were all correct (not mixed); the "
                            "import path has run only in the test suite"),
    "mad_rl": ("kernel verified; 3 real optimizer steps on SmolLM2-135M-Instruct on the distribution task with "
               "task.class_mapper=single_mention (benchmarks/results/methods_real_rich_rewards_followable_prompts.md): 6-25% of replies named one "
               "outcome, the invalid ones kept in f̂'s denominator (invalid_frac 0.75-0.94, TV to the target "
               "0.80-0.93); with the exact mapper every reply was invalid and nothing updated (methods_real_rich_rewards.md); "
               "no learning claim"),
    "code_opt": ("kernel verified; 3 trainer steps on SmolLM2-135M-Instruct on the sandboxed code task (2 prompts x 8, "
                 "64 new tokens): 1 optimizer step (1 of 8 programs correct in step 1, none in steps 2-3, so equal "
                 "rewards), the speed term never non-zero (benchmarks/results/methods_real_rich_rewards.md); no learning claim"),
    "rlcpr": ("kernel verified; 3 real optimizer steps on SmolLM2-135M-Instruct, finite metrics, the posterior gate "
              "closed on 1 group in 12 (benchmarks/results/methods_real_rich_rewards.md); no learning claim"),
    "rfpo": ("kernel verified; a critic trained on 48 of the base model's own labelled rollouts, then 3 real "
             "optimizer steps on SmolLM2-135M-Instruct, finite metrics (benchmarks/results/methods_real_rich_rewards.md). "
             "That critic's calibration Brier (0.38) is worse than the base rate's (0.16): its rewards carry "
             "little signal at this size; no learning claim"),
    # test-time adaptation (unlabeled prompts; the reward is the model's own agreement, not gold)
    "ttpo": ("kernel verified; 3 steps in the trainer on SmolLM2-135M-Instruct, self-vote on unlabeled prompts: 3 "
             "optimizer steps, finite metrics (benchmarks/results/methods_real_test_time.md); no learning claim"),
    "probe_erpo": ("kernel verified; 3 steps in the trainer on SmolLM2-135M-Instruct, probes answered by the model's "
                   "greedy decode: 3 optimizer steps, finite metrics (benchmarks/results/methods_real_test_time.md); no "
                   "learning claim"),
    "tasco": ("kernel verified; 3 steps in the trainer on SmolLM2-135M-Instruct through the soft prefix (HF generate "
              "with the prefix, K = 2 perturbed copies): 3 optimizer steps of the prefix, finite metrics "
              "(benchmarks/results/methods_real_test_time.md); no learning claim"),
    "ppo_rlhf": ("kernel verified; the whole pipeline (SFT -> reward model -> PPO through `policylab train`) ran end to "
                 "end on SmolLM2-135M-Instruct with small step counts (benchmarks/results/ppo_rlhf_pipeline.md): the RM's "
                 "held-out pair accuracy on the procedural preference set is measured there; PPO's before/after numbers "
                 "are within noise: no learning claim"),
    "fusion": ("kernel verified; the pipeline ran end to end on SmolLM2-135M-Instruct with 2 steps per trained model "
               "(benchmarks/results/fusion_pipeline.md): MOPD made 2 optimizer steps (the first with zero gradient: its "
               "teacher had not moved from the base), the sequence expert and Mix RL made none (every reply wrong); "
               "per-domain accuracy on 10 prompts per domain, no learning claim"),
}


LITERATURE_STATUS = {"orl": LITERATURE_ONLY}

# The four levels of evidence a card states (`levels(name)`), each derived from measured results only:
#   formula     the kernel tests (hand-worked cases and naive references): every shipped method's
#   mechanism   the paper's signature against its negative control (`policylab evidence`, declarations in
#               methods/mechanisms.py): MECHANISM below, copied from benchmarks/results/evidence.json (a test
#               checks the two agree), or the declaration's reason it is not measurable here
#   capability  a held-out result with an interval against a reference run on the same prompts: the methods
#               of _CAPABILITY (their EVIDENCE text above holds the numbers), else the evidence runs' comparison
#               with GRPO on the same prompts (CAPABILITY_RUNS), "not measured" otherwise
#   scale       inside verl or TRL (docs/running-at-scale.md): verl's training loop never ran here (no GPU);
#               TRL ran 2-step trainings of a few methods on a tiny random Llama; nothing ran at scale
FORMULA = "kernel tests (hand-worked cases and naive references)"
_TRL_RUNS = frozenset(("grpo", "gspo", "reinforce_pp", "rloo"))
SCALE = "no training inside verl or TRL, nothing at scale"
SCALE_TRL = "2-step TRL trainings on a tiny random Llama only (docs/running-at-scale.md), nothing at scale"
_CAPABILITY = frozenset(("grpo", *_COMPARED, "tis", "icepop", "mis", "gmc", "missing_old_logits"))
NOT_MEASURED = "not measured"

# method -> its rows of benchmarks/results/evidence.json as the card states them: the mechanism
# against its control, and held-out accuracy against GRPO on the same prompts (generated:
# scripts/update_evidence_levels.py after a new part of the runs)
from policylab.methods.evidence_levels import CAPABILITY_RUNS, MECHANISM  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Levels:
    formula: str
    mechanism: str
    capability: str
    scale: str


def _short(reason: str) -> str:
    """The first clause of a not-measurable reason: up to the first colon or semicolon that
    is not inside parentheses (a parenthesis is never cut open)."""
    depth = 0
    for i, ch in enumerate(reason):
        depth += (ch == "(") - (ch == ")")
        if ch in ":;" and depth == 0 and i > 0:
            return reason[:i]
    return reason


def levels(name: str) -> Levels:
    """The four levels of shipped method `name` (see above)."""
    from policylab.methods.mechanisms import MECHANISMS

    if name not in EVIDENCE:
        raise KeyError(f"{name!r} is not a shipped method (methods.evidence.EVIDENCE has no entry)")
    mech = MECHANISM.get(name)
    if mech is None:
        decl = MECHANISMS.get(name)
        if decl is not None and not decl.measurable:
            mech = f"not measurable here: {_short(decl.not_measurable_here)}"
        else:
            mech = NOT_MEASURED
    capability = EVIDENCE[name] if name in _CAPABILITY else CAPABILITY_RUNS.get(name, NOT_MEASURED)
    return Levels(FORMULA, mech, capability, SCALE_TRL if name in _TRL_RUNS else SCALE)


def status_text(name: str) -> str:
    """The card's status: what was run (EVIDENCE), then the levels it does not already say."""
    lv = levels(name)
    cap = "the result above" if name in _CAPABILITY else lv.capability
    return (f"{EVIDENCE[name]}. Levels: formula {lv.formula}; mechanism {lv.mechanism}; capability {cap}; "
            f"scale {lv.scale}")


def apply() -> None:
    """Write the measured status into every shipped card (once, at import)."""
    for name in EVIDENCE:
        r = REGISTRY[name]
        REGISTRY[name] = dataclasses.replace(r, card=dataclasses.replace(r.card, status=status_text(name)))
    for name, status in LITERATURE_STATUS.items():
        LITERATURE[name] = dataclasses.replace(LITERATURE[name], status=status)
