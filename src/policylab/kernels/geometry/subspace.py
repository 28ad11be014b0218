"""GCPO: keep a low-rank update out of the base weight's top-k singular spaces, on both
sides (bilateral complement projection)."""

from __future__ import annotations

import torch

from policylab.errors import PolicylabError, ShapeError


def principal_frames(weight: torch.Tensor, k: int, *, name: str = "weight") -> tuple[torch.Tensor, torch.Tensor, int]:
    """Top-k left and right singular vectors of a frozen base weight: (U_k [m, k],
    V_k [n, k], numerical rank of W), in fp64.

        W_0 = U S Vᵀ (SVD in fp64),  U_k = U[:, :k],  V_k = V[:, :k]

    The numerical rank counts singular values above max(m, n) · eps64 · s_max. Refused:
    k < 0; k larger than the rank (the "principal" directions would include arbitrary
    null-space ones); k ≥ min(m, n) (no direction left to train). k = 0 gives empty frames
    (the projection is the identity). Computed once per layer and kept frozen (buffers,
    outside every optimizer group: docs/conventions.md rule 11).
    """
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ShapeError(f"`{name}` must be a 2-D weight [out, in], got {getattr(weight, 'shape', type(weight))}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise PolicylabError(f"protected rank k must be an int >= 0, got {k!r}")
    m, n = weight.shape
    W = weight.detach().to(torch.float64)
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    tol = max(m, n) * torch.finfo(torch.float64).eps * (float(S[0]) if S.numel() else 0.0)
    rank = int((S > tol).sum())
    if k >= min(m, n):
        raise PolicylabError(
            f"`{name}` is {m}×{n}: protecting its top-{k} singular spaces leaves no direction to train "
            f"(k must be < min(out, in) = {min(m, n)}); lower gcpo's protected_rank")
    if k > rank:
        raise PolicylabError(
            f"`{name}` has rank {rank}, below the protected rank k = {k}: its top-{k} singular spaces are not "
            "defined by the weight; lower gcpo's protected_rank")
    return U[:, :k].contiguous(), Vh[:k].T.contiguous(), rank


def project_out_left(x: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """P_L x = (I − U Uᵀ) x for x [m, ·] and orthonormal U [m, k] (in x's dtype)."""
    U = U.to(x.dtype)
    return x - U @ (U.T @ x)


def project_out_right(x: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """x P_R = x (I − V Vᵀ) for x [·, n] and orthonormal V [n, k] (in x's dtype)."""
    V = V.to(x.dtype)
    return x - (x @ V) @ V.T


def bilateral_complement(delta: torch.Tensor, U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """ΔW' = P_L · ΔW · P_R, P_L = I − U_k U_kᵀ, P_R = I − V_k V_kᵀ.

    Paper: "GCPO: Diagnosing and Constraining Subspace Geometry in Rollout RL for LLMs"
    (arXiv 2608.11674), the constrained update δW = α · Π_Φ^⊥ L R Π_Ψ^⊥ with Φ, Ψ the
    top-k left and right singular vectors of the pretrained weight. Then U_kᵀ ΔW' = 0
    and ΔW' V_k = 0: the top-k input and output directions of W_0 are mapped exactly as
    before. Idempotent; k = 0 is the identity. For LoRA factors ΔW = B A this is
    (P_L B)(A P_R) (`project_lora_factors`). A one-sided projection is not this method
    (it leaves one of the two products nonzero: tested).
    """
    if delta.dim() != 2 or U.shape[0] != delta.shape[0] or V.shape[0] != delta.shape[1]:
        raise ShapeError(f"`delta` {tuple(delta.shape)} needs U [{delta.shape[0]}, k] and V [{delta.shape[-1]}, k]; "
                         f"got U {tuple(U.shape)}, V {tuple(V.shape)}")
    return project_out_right(project_out_left(delta, U), V)


def project_lora_factors(B: torch.Tensor, A: torch.Tensor, U: torch.Tensor,
                         V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(P_L B, A P_R) for LoRA factors B [m, r], A [r, n]: their product is
    `bilateral_complement(B @ A, U, V)`. Applied to the factors after every optimizer
    step (and to their gradients before it), so the effective update of the adapted
    layer stays in the complements."""
    if B.dim() != 2 or A.dim() != 2 or B.shape[1] != A.shape[0]:
        raise ShapeError(f"LoRA factors must be B [m, r] and A [r, n], got {tuple(B.shape)} and {tuple(A.shape)}")
    if U.shape[0] != B.shape[0] or V.shape[0] != A.shape[1]:
        raise ShapeError(f"frames U {tuple(U.shape)} / V {tuple(V.shape)} do not fit B {tuple(B.shape)} / "
                         f"A {tuple(A.shape)}")
    return project_out_left(B, U), project_out_right(A, V)


def subspace_overlap(delta: torch.Tensor, U: torch.Tensor, V: torch.Tensor) -> dict:
    """How much of an update touches the protected spaces (detached floats):

        left   = ‖U_kᵀ ΔW‖_F / ‖ΔW‖_F        right = ‖ΔW V_k‖_F / ‖ΔW‖_F
        overlap = 1 − ‖P_L ΔW P_R‖²_F / ‖ΔW‖²_F       (the energy outside the OO block)
        null    = 1 − (m − k)(n − k) / (m n)          (the overlap of an isotropic update)
        excess  = overlap − null

    (the paper's principal-subspace overlap and its dimension correction). An update of
    zero norm has all four at 0.
    """
    d = delta.detach().to(torch.float64)
    m, n = d.shape
    k = U.shape[1]
    total = float(d.pow(2).sum())
    null = 1.0 - (m - k) * (n - k) / (m * n)
    if total == 0.0:
        return {"left": 0.0, "right": 0.0, "overlap": 0.0, "excess": 0.0, "null": null}
    Ud, Vd = U.to(torch.float64), V.to(torch.float64)
    oo = float(bilateral_complement(d, Ud, Vd).pow(2).sum())
    overlap = 1.0 - oo / total
    return {"left": float((Ud.T @ d).norm()) / total ** 0.5, "right": float((d @ Vd).norm()) / total ** 0.5,
            "overlap": overlap, "excess": overlap - null, "null": null}


def lora_overlap(B: torch.Tensor, A: torch.Tensor, U: torch.Tensor, V: torch.Tensor) -> tuple[float, float]:
    """(‖U_kᵀ B A‖_F / ‖B A‖_F, ‖B A V_k‖_F / ‖B A‖_F) from the factors, without forming
    the [m, n] product: ‖X A‖²_F = tr((XᵀX)(A Aᵀ)) with r × r matrices (fp64). (0, 0) for
    a zero update. The same numbers as `subspace_overlap(B @ A, U, V)`'s left and right."""
    B, A = B.detach().to(torch.float64), A.detach().to(torch.float64)
    U, V = U.to(torch.float64), V.to(torch.float64)
    AAt, BtB = A @ A.T, B.T @ B
    total = float((BtB * AAt).sum())  # tr(BᵀB · A Aᵀ), both symmetric
    if total <= 0.0:
        return 0.0, 0.0
    UB = U.T @ B
    AV = A @ V
    left = float(((UB.T @ UB) * AAt).sum())
    right = float((BtB * (AV @ AV.T)).sum())
    return max(left, 0.0) ** 0.5 / total ** 0.5, max(right, 0.0) ** 0.5 / total ** 0.5


def check_lora_rank(rank: int, shape: tuple[int, int], k: int, name: str) -> None:
    """Refuse a LoRA rank the complements cannot hold: the projected update has rank at
    most min(m, n) − k, so r > min(m, n) − k adds factors that can only carry zero."""
    m, n = shape
    room = min(m, n) - k
    if rank > room:
        raise PolicylabError(
            f"gcpo: LoRA rank r = {rank} (train.lora_rank) is larger than what layer `{name}` ({m}×{n}, weight rank "
            f"at most {min(m, n)}) leaves outside its top-{k} singular spaces: min(out, in) − k = {room}. Lower "
            f"train.lora_rank to <= {room} or gcpo's protected_rank")
