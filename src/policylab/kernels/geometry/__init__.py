"""Gradient geometry: operations on gradients and weights between backward and the
optimizer step (or right after it), pure functions over tensors.

    cord_combine                                   cord.py      CORD: project one objective's
                                                                gradient off a protected one
    principal_frames, bilateral_complement,        subspace.py  GCPO: updates kept out of the
    project_lora_factors, subspace_overlap,                     base weight's top-k singular
    check_lora_rank, lora_overlap                               spaces, on both sides
    FixedSpectrumLinear, polar_retraction,         spectrum.py  ISO: W = U Σ₀ Vᵀ with Σ₀ frozen,
    qr_retraction, retract, orthonormality_error                orthonormal frames trained
"""

from policylab.kernels.geometry.cord import cord_combine
from policylab.kernels.geometry.spectrum import (
    FixedSpectrumLinear,
    orthonormality_error,
    polar_retraction,
    qr_retraction,
    retract,
)
from policylab.kernels.geometry.subspace import (
    bilateral_complement,
    check_lora_rank,
    lora_overlap,
    principal_frames,
    project_lora_factors,
    project_out_left,
    project_out_right,
    subspace_overlap,
)

__all__ = ["cord_combine", "principal_frames", "bilateral_complement", "project_lora_factors",
           "project_out_left", "project_out_right", "subspace_overlap", "check_lora_rank", "lora_overlap",
           "FixedSpectrumLinear", "polar_retraction", "qr_retraction", "retract", "orthonormality_error"]
