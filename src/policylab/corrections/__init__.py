"""Corrections: detached importance weights between roles (engine mismatch, staleness,
group mass, rejection sampling). Each multiplies a host per-token loss; none aggregates.

    engine ratio   k = exp(lp_old - lp_mu)   train vs rollout engine, same weights
    policy ratio   ρ = exp(lp - lp_old)       two weight versions (the host's clip)

Using one in place of the other is a bug; every function names which one it reads.
Every function returns (result, metrics) with metrics as detached 0-dim tensors keyed
"<method>/<name>".
"""

from .diagnostics import ess, mismatch_stats
from .gmc import gmc
from .icepop import icepop, icepop_normalizer_mask
from .kpop import binary_kl, kpop
from .minirl import RoutingRecord, check_routing
from .mis import SeqRatio, mis, seq_log_ratio_sum, seq_ratio_geomean, seq_ratio_product
from .missing_old_logits import VersionedLogprobs, decompose, require_exact_old
from .online_icepop import BatchLedger
from .sis import sis
from .tis import tis

__all__ = [
    "tis",
    "icepop",
    "icepop_normalizer_mask",
    "BatchLedger",
    "kpop",
    "binary_kl",
    "mis",
    "SeqRatio",
    "seq_log_ratio_sum",
    "seq_ratio_product",
    "seq_ratio_geomean",
    "sis",
    "gmc",
    "decompose",
    "require_exact_old",
    "VersionedLogprobs",
    "RoutingRecord",
    "check_routing",
    "mismatch_stats",
    "ess",
]
