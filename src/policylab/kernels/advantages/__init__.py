"""Advantage estimators: one module per family, pure functions over tensors.

Per-sequence advantages are `[B]` (objectives broadcast them over the tokens); per-token
advantages are `[B, T]`. Every result is detached. Group ids are arbitrary integers
(non-contiguous, unsorted); statistics are scatter-based, never a loop over groups.

    gae, whiten                      gae.py          PPO / GAE
    value_loss, explained_variance   value.py        PPO critic
    grpo, group_stats                grpo.py         GRPO outcome rewards
    grpo_process                     grpo_process.py GRPO process rewards
    dr_grpo                          dr_grpo.py      Dr. GRPO
    rloo                             rloo.py         RLOO
    remax                            remax.py        ReMax
    reinforce_pp, reinforce_pp_returns, reinforce_pp_baseline, EmaScale
                                     reinforce_pp.py REINFORCE++
    length_adaptive_lambda, vapo_advantages, positive_nll, mc_returns
                                     vapo.py         VAPO
    range_grpo                       range_grpo.py   Range-GRPO
    gprl, gprl_stats                 gprl.py         GPRL
    verdict_polarity                 verdict.py      ±1 verdicts (ConSPO, tlm-DRE)
"""

from policylab.kernels.advantages.dr_grpo import dr_grpo
from policylab.kernels.advantages.gae import gae, whiten
from policylab.kernels.advantages.gprl import gprl, gprl_stats
from policylab.kernels.advantages.grpo import group_stats, grpo
from policylab.kernels.advantages.grpo_process import grpo_process
from policylab.kernels.advantages.range_grpo import range_grpo
from policylab.kernels.advantages.reinforce_pp import (
    EmaScale,
    reinforce_pp,
    reinforce_pp_baseline,
    reinforce_pp_returns,
)
from policylab.kernels.advantages.remax import remax
from policylab.kernels.advantages.rloo import rloo
from policylab.kernels.advantages.verdict import verdict_polarity
from policylab.kernels.advantages.value import explained_variance, value_loss
from policylab.kernels.advantages.vapo import length_adaptive_lambda, mc_returns, positive_nll, vapo_advantages

__all__ = [
    "gae", "whiten", "value_loss", "explained_variance",
    "grpo", "group_stats", "grpo_process", "dr_grpo", "rloo", "remax",
    "reinforce_pp", "reinforce_pp_returns", "reinforce_pp_baseline", "EmaScale",
    "length_adaptive_lambda", "vapo_advantages", "positive_nll", "mc_returns",
    "range_grpo", "gprl", "gprl_stats", "verdict_polarity",
]
