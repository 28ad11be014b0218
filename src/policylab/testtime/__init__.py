"""Test-time adaptation kernels: pure functions over tensors (and, for TASCO, the soft
prefix that is its only learner).

    ttpo_split, ttpo_advantages, self_distill_nll   ttpo.py    TTPO's two objectives
    rank_candidates, probe_branch, probe_erpo_advantages, entropy_bonus
                                                    probe.py   Probe-ERPO
    arithmetic_subquantity, PROBE_GENERATORS,
    probe_consistency                               probes.py  answer-independent probes
    tasco_loss                                      tasco.py   TASCO's confidence + stability
    SoftPrefix, PrefixedLM, attach_prefix           prefix_model.py  the prefix-injection path

Shared rule (conventions rule 7): nothing here takes a gold answer. The labels these
methods learn from are made from the model's own outputs; a gold answer reaches only the
evaluator, which runs after adaptation.
"""

from .probe import entropy_bonus, probe_branch, probe_erpo_advantages, rank_candidates
from .probes import PROBE_GENERATORS, Probe, arithmetic_subquantity, probe_consistency
from .tasco import tasco_loss
from .ttpo import self_distill_nll, ttpo_advantages, ttpo_split

__all__ = ["PROBE_GENERATORS", "Probe", "arithmetic_subquantity", "entropy_bonus", "probe_branch",
           "probe_consistency", "probe_erpo_advantages", "rank_candidates", "self_distill_nll", "tasco_loss",
           "ttpo_advantages", "ttpo_split"]
