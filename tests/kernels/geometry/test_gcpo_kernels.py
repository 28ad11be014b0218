"""GCPO's kernels (geometry/subspace.py): principal frames and the bilateral complement projection."""

import pytest
import torch
from torch.testing import assert_close

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.geometry import (
    bilateral_complement,
    check_lora_rank,
    lora_overlap,
    principal_frames,
    project_lora_factors,
    project_out_left,
    subspace_overlap,
)

F64 = torch.float64


def naive_complement(delta, U, V):
    """(I − Σ_j u_j u_jᵀ) Δ (I − Σ_j v_j v_jᵀ) with the projectors built column by column."""
    m, n = delta.shape
    PL, PR = torch.eye(m, dtype=F64), torch.eye(n, dtype=F64)
    for j in range(U.shape[1]):
        PL = PL - torch.outer(U[:, j], U[:, j])
        PR = PR - torch.outer(V[:, j], V[:, j])
    return PL @ delta @ PR


def test_hand_case_diagonal_weight():
    # W_0 = diag(3, 2, 1), k = 1: u_1 = v_1 = e_1 (up to a shared sign).
    # ΔW = ones(3, 3): P_L ΔW P_R clears the first row and the first column → [[0,0,0],[0,1,1],[0,1,1]]
    W = torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=F64))
    U, V, rank = principal_frames(W, 1)
    assert rank == 3
    assert_close(U.abs(), torch.tensor([[1.0], [0.0], [0.0]], dtype=F64))
    out = bilateral_complement(torch.ones(3, 3, dtype=F64), U, V)
    assert_close(out, torch.tensor([[0.0, 0, 0], [0, 1, 1], [0, 1, 1]], dtype=F64), rtol=0, atol=1e-15)
    # overlap: total energy 9, OO block 4 → 1 − 4/9 = 5/9; isotropic null 1 − (2·2)/(3·3) = 5/9 → excess 0;
    # left = ‖e_1ᵀ ΔW‖ / ‖ΔW‖ = √3 / 3
    ov = subspace_overlap(torch.ones(3, 3, dtype=F64), U, V)
    assert ov["overlap"] == pytest.approx(5 / 9) and ov["null"] == pytest.approx(5 / 9)
    assert ov["excess"] == pytest.approx(0.0, abs=1e-15) and ov["left"] == pytest.approx(3 ** 0.5 / 3)


def test_projected_update_is_orthogonal_to_both_principal_spaces():
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(12, 7, generator=gen, dtype=F64)
    delta = torch.randn(12, 7, generator=gen, dtype=F64)
    U, V, _ = principal_frames(W, 3)
    Uf, S, Vh = torch.linalg.svd(W, full_matrices=False)
    assert_close(U @ U.T, Uf[:, :3] @ Uf[:, :3].T)  # the top-3 spaces (frames up to sign)
    out = bilateral_complement(delta, U, V)
    assert float((U.T @ out).abs().max()) < 1e-13
    assert float((out @ V).abs().max()) < 1e-13
    assert_close(out, naive_complement(delta, U, V), rtol=1e-12, atol=1e-13)
    assert_close(bilateral_complement(out, U, V), out, rtol=1e-12, atol=1e-13)  # idempotent
    assert float((delta - out).abs().max()) > 0.1  # and it did remove something


def test_zero_rank_is_the_identity_and_one_sided_is_not_bilateral():
    gen = torch.Generator().manual_seed(1)
    W, delta = torch.randn(8, 6, generator=gen, dtype=F64), torch.randn(8, 6, generator=gen, dtype=F64)
    U0, V0, _ = principal_frames(W, 0)
    assert U0.shape == (8, 0) and V0.shape == (6, 0)
    assert_close(bilateral_complement(delta, U0, V0), delta, rtol=0, atol=0)
    U, V, _ = principal_frames(W, 2)
    left_only = project_out_left(delta, U)
    assert float((U.T @ left_only).abs().max()) < 1e-13
    assert float((left_only @ V).abs().max()) > 1e-3  # a one-sided projection fails the right-side test


def test_factor_projection_equals_the_projected_product():
    gen = torch.Generator().manual_seed(2)
    W = torch.randn(10, 9, generator=gen, dtype=F64)
    B, A = torch.randn(10, 3, generator=gen, dtype=F64), torch.randn(3, 9, generator=gen, dtype=F64)
    U, V, _ = principal_frames(W, 4)
    pB, pA = project_lora_factors(B, A, U, V)
    assert_close(pB @ pA, bilateral_complement(B @ A, U, V), rtol=1e-12, atol=1e-13)
    left, right = lora_overlap(B, A, U, V)
    ov = subspace_overlap(B @ A, U, V)
    assert left == pytest.approx(ov["left"], rel=1e-10) and right == pytest.approx(ov["right"], rel=1e-10)
    assert max(lora_overlap(pB, pA, U, V)) < 1e-7
    assert lora_overlap(torch.zeros(10, 3, dtype=F64), A, U, V) == (0.0, 0.0)


def test_bad_input_is_refused():
    W = torch.randn(5, 4, dtype=F64)
    with pytest.raises(PolicylabError, match="leaves no direction to train"):
        principal_frames(W, 4)
    low_rank = torch.outer(torch.arange(1.0, 6.0, dtype=F64), torch.ones(4, dtype=F64))  # rank 1
    with pytest.raises(PolicylabError, match="has rank 1, below the protected rank k = 2"):
        principal_frames(low_rank, 2, name="w")
    with pytest.raises(PolicylabError, match="int >= 0"):
        principal_frames(W, -1)
    with pytest.raises(ShapeError, match="2-D"):
        principal_frames(torch.ones(3), 1)
    # a 32×64 weight (rank <= 32) with k = 8 leaves room for rank 24: a LoRA rank of 30 is refused
    with pytest.raises(PolicylabError, match="LoRA rank r = 30 .* min\\(out, in\\) − k = 24.*train.lora_rank"):
        check_lora_rank(30, (32, 64), 8, "layers.0.self_attn.k_proj")
    check_lora_rank(24, (32, 64), 8, "ok")
    U, V, _ = principal_frames(W, 1)
    with pytest.raises(ShapeError, match="LoRA factors"):
        project_lora_factors(torch.ones(5, 2, dtype=F64), torch.ones(3, 4, dtype=F64), U, V)
    with pytest.raises(ShapeError, match="needs U"):
        bilateral_complement(torch.ones(4, 4, dtype=F64), U, V)
