"""Verdict polarity: ±1 per response from the verifier's raw outcome.

Used where a method reads a binary verdict rather than a centred reward: ConSPO's positives
and negatives (arXiv 2605.12969) and tlm-DRE's trajectory polarity.
"""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_finite


def verdict_polarity(outcome: torch.Tensor, threshold: float) -> torch.Tensor:
    """Polarity per sequence, `[B]` float32.

        v_i = +1  if outcome_i >= threshold   (inclusive)
        v_i = −1  otherwise

    `outcome` is the verifier's raw outcome per response (e.g. 1 = correct, 0 = wrong; a
    partial score in [0, 1] works the same way). No group statistic enters: a response's
    polarity does not depend on the others. Detached; NaN/inf outcomes raise
    NonFiniteError naming the index.
    """
    check_finite(outcome.double(), "outcome")
    return torch.where(outcome.detach().double() >= threshold, 1.0, -1.0).to(torch.float32)
