"""Objectives: per-token loss matrices `[B, T]` plus detached diagnostics; never aggregated.

Every objective returns `(loss [B, T], metrics)`: loss is exactly 0 at masked positions,
metrics are detached 0-dim tensors with the keys `METRIC_KEYS` (explained in
`objectives.common`). Reduce the loss with `policylab.kernels.aggregate.aggregate`.

Each public function writes its paper's equation (ratio, clip/min form, mask, detached
weight) and computes its diagnostics in a separate `<name>_metrics` function. PPO and
CISPO also have a fast path (`objectives.fast`: in place, per-row clamps), taken by default
(`fast=True`); `fast=False` runs the plain equation; both are equal in fp64.

    ppo_clip    token PPO clip (+ DAPO clip-higher, + dual clip)        ppo.py
    gspo        sequence ratio, one clip per response                   gspo.py
    gspo_token  sequence ratio with per-token advantages                gspo.py
    cispo       clipped detached IS weight × log-prob                   cispo.py
    gppo        PPO values, bounded gradients on clipped tokens         gppo.py
    reinforce   −A·lp with an optional detached weight                  reinforce.py
    ripo        probability-dependent ratio bounds (Fisher–Rao ball)    ripo.py
    gppo_fdiv   f-divergence trust region                               fdiv.py
    tapo        prefix geometric-mean ratio, position-dependent trust   tapo.py
    luspo       GSPO's sequence ratio, length-proportional loss         luspo.py
    ggpo        Gibbs-gap coefficients (KL-regularized Gibbs target)    ggpo.py
    masked_nll, entropy_bonus   token terms next to an objective        terms.py
"""

from policylab.kernels.objectives.cispo import cispo
from policylab.kernels.objectives.common import DEFAULT_LOG_RATIO_CLAMP, METRIC_KEYS
from policylab.kernels.objectives.fdiv import DIVERGENCES, TOPOLOGIES, fdiv_bounds, fdiv_value, gppo_fdiv
from policylab.kernels.objectives.ggpo import ggpo, gibbs_coefficients
from policylab.kernels.objectives.gppo import gppo
from policylab.kernels.objectives.gspo import gspo, gspo_token
from policylab.kernels.objectives.luspo import luspo
from policylab.kernels.objectives.ppo import ppo_clip
from policylab.kernels.objectives.reinforce import reinforce
from policylab.kernels.objectives.ripo import clip_to_bounds, ripo, ripo_bounds
from policylab.kernels.objectives.tapo import prefix_geometric_ratio, tapo
from policylab.kernels.objectives.terms import entropy_bonus, masked_nll

__all__ = [
    "ppo_clip", "gspo", "gspo_token", "cispo", "gppo", "reinforce",
    "ripo", "ripo_bounds", "clip_to_bounds",
    "gppo_fdiv", "fdiv_bounds", "fdiv_value", "DIVERGENCES", "TOPOLOGIES",
    "tapo", "prefix_geometric_ratio", "luspo", "ggpo", "gibbs_coefficients",
    "masked_nll", "entropy_bonus", "METRIC_KEYS", "DEFAULT_LOG_RATIO_CLAMP",
]
