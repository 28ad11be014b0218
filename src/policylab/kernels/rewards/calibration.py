"""RLCR: correctness plus a proper scoring rule on a verbalized confidence.

Paper: "Beyond Binary Rewards: Training LMs to Reason About Their Uncertainty", arXiv
2507.16806, the RLCR reward (Sec. 3):

    R(y, q, y*) = 1[y ≡ y*] − (q − 1[y ≡ y*])²

c = 1[y ≡ y*] is the verifier's correctness and q ∈ [0, 1] the confidence the model wrote.
The second term is the negative Brier score, bounded and proper: for a fixed answer that is
right with probability p the expected reward p − p(1 − q)² − (1 − p)q² is maximized at
q = p (`expected_reward`).

Parsing (library decision, strict): the reply must end with one field
`confidence: <q>` (case-insensitive; `<q>` a decimal such as 0.8, .8, 1 or 0, or a
percentage such as 80%), with nothing after it but whitespace. The answer is the text
before the field. Anything else is not a confidence: a missing field, two fields, text
after the number, a number outside [0, 1] (or outside [0%, 100%]). No value is ever
clamped into range. Those replies take the explicit penalty path of `rlcr_rewards`:
R = c − `invalid_penalty` (default 1.0, the largest Brier term a parsed confidence can
get, so omitting or garbling the confidence never beats stating one).

The multi-class kernel (the same score over a softmax, for a model that outputs a
distribution over K classes) is `brier_score` and `brier_ce`; every class's probability
receives gradient, not only the target's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from policylab.kernels.checks import check_finite
from policylab.errors import NonFiniteError, ShapeError
from policylab.kernels.rewards.verifiers import exact_numeric_reward

CONFIDENCE_STATUSES = ("ok", "missing", "ambiguous", "malformed", "out_of_range")
_FIELD = re.compile(r"confidence\s*[:=]", re.IGNORECASE)
_VALUE = re.compile(r"\s*(?P<num>(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<pct>%?)\s*\Z")


@dataclass(frozen=True)
class ParsedConfidence:
    """`answer`: the text before the confidence field (the whole reply when there is no
    field); `q`: the confidence in [0, 1], or None; `status`: one of CONFIDENCE_STATUSES."""

    answer: str
    q: float | None
    status: str


def parse_confidence(reply: str) -> ParsedConfidence:
    """Strict parse of "<answer> ... confidence: <q>" (see the module docstring)."""
    if not isinstance(reply, str):
        raise TypeError(f"reply must be a str, got {type(reply).__name__}")
    fields = list(_FIELD.finditer(reply))
    if not fields:
        return ParsedConfidence(reply, None, "missing")
    if len(fields) > 1:
        return ParsedConfidence(reply[: fields[0].start()], None, "ambiguous")
    f = fields[0]
    answer = reply[: f.start()]
    m = _VALUE.match(reply[f.end():])
    if m is None:
        return ParsedConfidence(answer, None, "malformed")
    value = float(m.group("num"))
    if m.group("pct"):
        if not 0.0 <= value <= 100.0:
            return ParsedConfidence(answer, None, "out_of_range")
        return ParsedConfidence(answer, value / 100.0, "ok")
    if not 0.0 <= value <= 1.0:
        return ParsedConfidence(answer, None, "out_of_range")
    return ParsedConfidence(answer, value, "ok")


def confidence_answer_reward(completions, answers, **context) -> list[float]:
    """Verifier of the confidence task: the last number of the answer part (the text
    before the confidence field) must equal the gold answer. A number in the confidence
    field is never read as the answer."""
    return exact_numeric_reward([parse_confidence(c).answer for c in completions], answers)


confidence_answer_reward.__name__ = "confidence_answer"


def rlcr_rewards(correct: torch.Tensor, confidence: torch.Tensor, valid: torch.Tensor, *,
                 invalid_penalty: float) -> torch.Tensor:
    """R_i = c_i − (q_i − c_i)² where `valid`, else c_i − invalid_penalty. [B].

    correct     [B] 0/1 (float or bool): the verifier's correctness
    confidence  [B] q in [0, 1] where valid (values elsewhere are ignored, NaN allowed)
    valid       [B] bool, True = the confidence parsed
    invalid_penalty  the Brier-term replacement for an unparseable or out-of-range q
                (library decision; conventions rule 13: no clamp, an explicit path)
    Detached (a reward). A valid q outside [0, 1] raises: the parser never produces one.
    """
    if correct.dim() != 1 or confidence.shape != correct.shape or valid.shape != correct.shape:
        raise ShapeError(f"correct, confidence, valid must be [B]; got {tuple(correct.shape)}, "
                         f"{tuple(confidence.shape)}, {tuple(valid.shape)}")
    if valid.dtype != torch.bool:
        raise ShapeError(f"`valid` must be bool, got {valid.dtype}")
    if not math.isfinite(invalid_penalty) or invalid_penalty < 0:
        raise ValueError(f"`invalid_penalty` must be finite and >= 0, got {invalid_penalty}")
    c = correct.to(confidence.dtype if confidence.is_floating_point() else torch.get_default_dtype())
    if bool(((c != 0) & (c != 1)).any()):
        raise ValueError("`correct` must be 0 or 1")
    check_finite(confidence, "confidence", valid)
    q = torch.where(valid, confidence.to(c.dtype), torch.zeros((), dtype=c.dtype))
    if bool(((q < 0) | (q > 1))[valid].any()):
        raise ValueError("`confidence` has a valid entry outside [0, 1]: a confidence is never clamped")
    brier = (q - c) ** 2
    return torch.where(valid, c - brier, c - invalid_penalty).detach()


def expected_reward(p: torch.Tensor | float, q: torch.Tensor | float) -> torch.Tensor:
    """E[R] for an answer right with probability p stated with confidence q:
    p·(1 − (1 − q)²) + (1 − p)·(0 − q²) = p − p(1 − q)² − (1 − p)q²."""
    p, q = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    return p - p * (1 - q) ** 2 - (1 - p) * q**2


def brier_score(probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Σ_k (p_k − y_k)² per row, [B], over the whole distribution (y one-hot of target).

    probs [B, K] rows on the simplex (checked to 1e-6); target [B] long class ids.
    ∂/∂p_k = 2(p_k − y_k): every class gets gradient."""
    _check_probs(probs, target)
    y = torch.nn.functional.one_hot(target, probs.shape[1]).to(probs.dtype)
    return ((probs - y) ** 2).sum(-1)


def brier_ce(logits: torch.Tensor, target: torch.Tensor, *, ce_weight: float) -> torch.Tensor:
    """Hybrid loss per row: Brier(softmax(logits)) + ce_weight · CE(logits, target), [B]
    (log-softmax in fp32 or higher, conventions rule 13)."""
    if logits.dim() != 2:
        raise ShapeError(f"`logits` must be [B, K], got {tuple(logits.shape)}")
    lf = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logp = torch.log_softmax(lf, dim=-1)
    ce = -logp.gather(-1, target.long().unsqueeze(-1)).squeeze(-1)
    return brier_score(logp.exp(), target) + ce_weight * ce


def _check_probs(probs: torch.Tensor, target: torch.Tensor) -> None:
    if probs.dim() != 2 or target.shape != probs.shape[:1]:
        raise ShapeError(f"probs must be [B, K] and target [B]; got {tuple(probs.shape)}, {tuple(target.shape)}")
    if target.dtype != torch.long or bool(((target < 0) | (target >= probs.shape[1])).any()):
        raise ShapeError(f"`target` must be long class ids in [0, {probs.shape[1]})")
    if not bool(torch.isfinite(probs).all()):
        raise NonFiniteError("`probs` has NaN or inf")
    if bool((probs < 0).any()) or not torch.allclose(probs.sum(-1).double(), torch.ones(probs.shape[0], dtype=torch.float64),
                                                     atol=1e-6):
        raise ValueError("`probs` rows must be non-negative and sum to 1")


def calibration_summary(correct: torch.Tensor, confidence: torch.Tensor, valid: torch.Tensor,
                        n_bins: int = 10) -> dict:
    """Accuracy and calibration, reported apart: accuracy over every reply; Brier, mean
    confidence and a binned ECE over the replies whose confidence parsed; parsed fraction."""
    c = correct.double()
    out = {"accuracy": float(c.mean()) if c.numel() else float("nan"),
           "parsed_frac": float(valid.double().mean()) if valid.numel() else float("nan")}
    if bool(valid.any()):
        q, cv = confidence[valid].double(), c[valid]
        out["brier"] = float(((q - cv) ** 2).mean())
        out["confidence_mean"] = float(q.mean())
        bins = torch.clamp((q * n_bins).long(), max=n_bins - 1)
        ece = 0.0
        for b in range(n_bins):
            sel = bins == b
            if bool(sel.any()):
                ece += float(sel.double().mean()) * abs(float(q[sel].mean()) - float(cv[sel].mean()))
        out["ece"] = ece
    return out
