"""Test-time adaptation kernels: pure functions over tensors (and, for TASCO, the soft
prefix that is its only learner).

    ttpo_split, ttpo_advantages, self_distill_nll   ttpo.py    TTPO's two objectives
    rank_candidates, probe_branch, probe_erpo_advantages, entropy_bonus
                                                    probe.py   Probe-ERPO
    tasco_loss                                      tasco.py   TASCO's confidence + stability

Probe-ERPO's answer-independent probes are questions made from the task
(`policylab.tasks.probes`); TASCO's prefix-injection path is a model piece
(`policylab.models.soft_prefix`).

Shared rule (conventions rule 7): nothing here takes a gold answer. The labels these
methods learn from are made from the model's own outputs; a gold answer reaches only the
evaluator, which runs after adaptation.
"""

from policylab.kernels.testtime.probe import entropy_bonus, probe_branch, probe_erpo_advantages, rank_candidates
from policylab.kernels.testtime.tasco import tasco_loss
from policylab.kernels.testtime.ttpo import self_distill_nll, ttpo_advantages, ttpo_split

__all__ = ["entropy_bonus", "probe_branch", "probe_erpo_advantages", "rank_candidates", "self_distill_nll",
           "tasco_loss", "ttpo_advantages", "ttpo_split"]
