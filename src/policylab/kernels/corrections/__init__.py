"""Corrections: detached importance weights between roles (engine mismatch, staleness,
group mass, rejection sampling). Each multiplies a host per-token loss; none aggregates.

    engine ratio   k = exp(lp_old - lp_mu)   train vs rollout engine, same weights
    policy ratio   ρ = exp(lp - lp_old)       two weight versions (the host's clip)

Using one in place of the other is a bug; every function names which one it reads.
Every function returns (result, metrics) with metrics as detached 0-dim tensors keyed
"<method>/<name>". Each public function writes its weight's equation and computes its
diagnostics in a separate `<name>_metrics` function; `icepop`, `tis` and `mismatch_stats`
also have a fast path (`corrections.fast`: in place, fewer [B, T] buffers), taken by
default (`fast=True`); `fast=False` runs the plain equation; both are equal in fp64.
"""

from policylab.kernels.corrections.diagnostics import ess, mismatch_stats
from policylab.kernels.corrections.gmc import gmc
from policylab.kernels.corrections.icepop import icepop, icepop_normalizer_mask
from policylab.kernels.corrections.kpop import binary_kl, kpop
from policylab.kernels.corrections.minirl import RoutingRecord, check_routing
from policylab.kernels.corrections.mis import SeqRatio, mis, seq_log_ratio_sum, seq_ratio_geomean, seq_ratio_product
from policylab.kernels.corrections.missing_old_logits import VersionedLogprobs, decompose, require_exact_old
from policylab.kernels.corrections.online_icepop import BatchLedger
from policylab.kernels.corrections.sis import sis
from policylab.kernels.corrections.tis import tis

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
