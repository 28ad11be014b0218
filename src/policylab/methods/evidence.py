"""What has been measured for each method beyond its kernel tests: the status on its card.

Kept in one place so a new measurement updates one line. Every entry points at the file
that holds the numbers and the command that produced them.
"""

from __future__ import annotations

import dataclasses

from .registry import REGISTRY

_REAL = "kernel verified; 2 real optimizer steps on SmolLM2-135M-Instruct (benchmarks/results/methods_real.md)"
_REAL3 = ("kernel verified; 3 steps in the trainer on SmolLM2-135M-Instruct, finite metrics "
          "(benchmarks/results/methods_real.md); no learning claim")
_MISMATCH = ("kernel verified; in the trainer on SmolLM2-135M-Instruct with the bf16 behavior engine: 8 steps "
             "against the uncorrected run, same seed (benchmarks/results/offpolicy.md: the diagnostics show what "
             "it weighted or masked; rewards within noise of the uncorrected run at this scale)")
_STALE = ("kernel verified; in the trainer on SmolLM2-135M-Instruct with staleness 2: 8 steps against the "
          "uncorrected run, same seed (benchmarks/results/offpolicy.md); no learning claim at this scale")

EVIDENCE = {
    "grpo": "trained end to end on SmolLM2-135M-Instruct, single-digit + and x: held-out sampled accuracy "
            "13.0% -> 91.0% after 20 steps, 91.5% after 30, 140 s of training steps (quickstart, README)",
    **{name: _REAL for name in ("cispo", "dapo", "dr_grpo", "ggpo", "gmc", "gppo", "gppo_fdiv", "grpo_process",
                                "gspo", "luspo", "ppo", "reinforce_pp")},
    **{name: _REAL3 for name in ("remax", "ripo", "rloo", "tapo", "ttrl", "reinforce_pp_baseline")},
    "vapo": ("kernel verified; in the trainer on SmolLM2-135M-Instruct: 1 value-pretraining step then 2 policy "
             "steps, finite metrics (benchmarks/results/methods_real.md); no learning claim"),
    **{name: _MISMATCH for name in ("tis", "icepop", "kpop", "mis", "minirl", "online_icepop")},
    **{name: _STALE for name in ("gmc", "sis", "missing_old_logits")},
    # test-time adaptation (unlabeled prompts; the reward is the model's own agreement, not gold)
    "ttpo": ("kernel verified; 3 steps in the trainer on SmolLM2-135M-Instruct, self-vote on unlabeled prompts: 3 "
             "optimizer steps, finite metrics (benchmarks/results/methods_real_13b.md); no learning claim"),
    "probe_erpo": ("kernel verified; 3 steps in the trainer on SmolLM2-135M-Instruct, probes answered by the model's "
                   "greedy decode: 3 optimizer steps, finite metrics (benchmarks/results/methods_real_13b.md); no "
                   "learning claim"),
    "tasco": ("kernel verified; 3 steps in the trainer on SmolLM2-135M-Instruct through the soft prefix (HF generate "
              "with the prefix, K = 2 perturbed copies): 3 optimizer steps of the prefix, finite metrics "
              "(benchmarks/results/methods_real_13b.md); no learning claim"),
}


def apply() -> None:
    for name, status in EVIDENCE.items():
        r = REGISTRY[name]
        REGISTRY[name] = dataclasses.replace(r, card=dataclasses.replace(r.card, status=status))
