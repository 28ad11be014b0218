"""ISO: linear layers with a frozen spectrum, W = U Σ₀ Vᵀ, whose orthonormal frames U
and V are the trained parameters (kept on the Stiefel manifold by a retraction)."""

from __future__ import annotations

import torch
from torch import nn

from policylab.errors import PolicylabError, ShapeError

RETRACTIONS = ("polar", "qr")


class FixedSpectrumLinear(nn.Module):
    """y = x Wᵀ + b with W = U diag(σ₀) Vᵀ.

    U [out, q] and V [in, q] (q = min(out, in)) are parameters with orthonormal columns;
    σ₀ [q] is a buffer (`requires_grad=False`, in no optimizer group, saved with the
    weights and never changed: docs/conventions.md rule 11); the bias, if the original
    layer had one, stays a plain parameter. The forward never forms W: y = ((x V) ⊙ σ₀) Uᵀ + b, so autograd gives the
    frames the gradients G_U = G_W V Σ₀ and G_V = G_Wᵀ U Σ₀ (the frame gradients the
    paper's optimizer steps).

    `weight` is W, recomputed from the frames on every read (what a reader of the layer,
    e.g. a decoder, sees is always the current W). Assigning a weight is refused: an
    unrestricted update of W would change its singular values.
    """

    def __init__(self, U: torch.Tensor, sigma: torch.Tensor, V: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if U.dim() != 2 or V.dim() != 2 or sigma.dim() != 1 or not (U.shape[1] == V.shape[1] == sigma.shape[0]):
            raise ShapeError(f"frames must be U [out, q], V [in, q], sigma [q]; got {tuple(U.shape)}, "
                             f"{tuple(V.shape)}, {tuple(sigma.shape)}")
        self.out_features, self.in_features = U.shape[0], V.shape[0]
        self.U = nn.Parameter(U.detach().clone().contiguous())
        self.V = nn.Parameter(V.detach().clone().contiguous())
        self.register_buffer("sigma", sigma.detach().clone().contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "FixedSpectrumLinear":
        """The layer's own W = U₀ Σ₀ V₀ᵀ (SVD in fp64, cast to the layer's dtype)."""
        W = linear.weight.detach()
        U, S, Vh = torch.linalg.svd(W.to(torch.float64), full_matrices=False)
        dt = W.dtype
        return cls(U.to(dt), S.to(dt), Vh.T.to(dt), None if linear.bias is None else linear.bias)

    @property
    def weight(self) -> torch.Tensor:
        return (self.U * self.sigma) @ self.V.T

    @weight.setter
    def weight(self, value) -> None:
        raise PolicylabError("a fixed-spectrum layer (iso) has W = U Σ₀ Vᵀ with Σ₀ frozen: its weight cannot be "
                             "assigned (that would change the spectrum); update the frames U and V")

    def exported_state(self) -> dict[str, torch.Tensor]:
        """The state of the `nn.Linear` this layer stands for (its current W, and the bias):
        what an engine sends to a rollout engine that loads the model's HF layers by name
        (`policylab.integrations.verl.steps`)."""
        out = {"weight": self.weight}
        if self.bias is not None:
            out["bias"] = self.bias
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ((x @ self.V) * self.sigma) @ self.U.T
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.sigma.numel()}"


def orthonormality_error(X: torch.Tensor) -> float:
    """max |XᵀX − I| (entrywise), computed in fp64."""
    X = X.detach().to(torch.float64)
    return float((X.T @ X - torch.eye(X.shape[1], dtype=X.dtype, device=X.device)).abs().max())


def polar_retraction(X: torch.Tensor, *, tol: float = 1e-12, max_iter: int = 30) -> tuple[torch.Tensor, dict]:
    """The orthonormal factor of the polar decomposition X = Q H (Q [m, q] with QᵀQ = I,
    H symmetric positive definite): the closest matrix with orthonormal columns to X.
    Returns (Q in X's dtype, info): info["error_before"] = max |XᵀX − I|, info["iterations"]
    (Newton–Schulz steps), info["svd"] (True: the SVD route was taken), info["error_after"]
    (of the fp64 result).

    Computed in fp64 by the Newton–Schulz iteration Y ← Y (3I − YᵀY)/2, which converges
    quadratically to Q when the columns are independent and ‖X‖₂ < √3; after an optimizer
    step the frames are within ~lr of orthonormal, so a few matmuls reach ‖YᵀY − I‖ ≤ tol.
    If X is far from orthonormal (max |XᵀX − I| > 0.5) or the iteration has not converged
    after `max_iter` steps, Q = P Rᵀ from the SVD X = P S Rᵀ (the same factor, directly).

    Paper: "ISO: An RLVR-Native Optimization Stack" (arXiv 2607.19331): the frames are
    stepped by a base optimizer, then put back on the Stiefel manifold by a polar
    retraction computed in fp64.
    """
    if X.dim() != 2 or X.shape[0] < X.shape[1]:
        raise ShapeError(f"a frame must be [m, q] with m >= q, got {tuple(X.shape)}")
    Y = X.detach().to(torch.float64)
    eye = torch.eye(Y.shape[1], dtype=Y.dtype, device=Y.device)
    G = Y.T @ Y
    err = before = float((G - eye).abs().max())
    if before <= tol:
        return X.detach().clone(), {"error_before": before, "iterations": 0, "svd": False, "error_after": before}
    if before <= 0.5:
        for it in range(1, max_iter + 1):
            Y = Y @ (1.5 * eye - 0.5 * G)
            G = Y.T @ Y
            err = float((G - eye).abs().max())
            if err <= tol:
                return Y.to(X.dtype), {"error_before": before, "iterations": it, "svd": False, "error_after": err}
    P, _, Rh = torch.linalg.svd(X.detach().to(torch.float64), full_matrices=False)
    Q = P @ Rh
    return Q.to(X.dtype), {"error_before": before, "iterations": 0, "svd": True,
                           "error_after": float((Q.T @ Q - eye).abs().max())}


def qr_retraction(X: torch.Tensor) -> torch.Tensor:
    """Q of the thin QR X = Q R with diag(R) > 0 (computed in fp64): an orthonormal frame
    spanning X's columns, a cheaper retraction than the polar one (a first-order
    agreement with it, not the same point)."""
    if X.dim() != 2 or X.shape[0] < X.shape[1]:
        raise ShapeError(f"a frame must be [m, q] with m >= q, got {tuple(X.shape)}")
    Q, R = torch.linalg.qr(X.detach().to(torch.float64))
    sign = torch.sign(torch.diagonal(R))
    sign[sign == 0] = 1.0
    return (Q * sign).to(X.dtype)


def retract(X: torch.Tensor, method: str) -> torch.Tensor:
    """The frame X put back on the Stiefel manifold by `method` ("polar" or "qr")."""
    if method == "polar":
        return polar_retraction(X)[0]
    if method == "qr":
        return qr_retraction(X)
    raise PolicylabError(f"retraction must be one of {', '.join(RETRACTIONS)}, got {method!r}")
