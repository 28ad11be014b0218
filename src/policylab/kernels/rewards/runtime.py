"""code_opt: a correctness-gated reward from calibrated, repeated runtime measurements.

Paper: "Reinforcement Learning for Code Optimization" (arXiv id not confirmed). A
candidate that fails any correctness test never gets a speed reward. For one that passes,
with n ≥ n_min timings t_1..t_n of the candidate and m ≥ n_min timings r_1..r_m of the
reference solution measured under matched conditions (same process, interleaved):

    c      = median(t)                                   the runtime statistic
    band   = [Q_α(r), Q_{1−α}(r)] widened to at least median(r)·(1 ± min_rel_band)
                                                          the calibrated noise band
    speed  = 0 when c lies inside the band (inclusive): no improvement
    "percentile": P = #{j : r_j > c} / m (the share of reference runs slower than c);
                  P > 1 − α: speed = (P − (1 − α)) / α ∈ (0, 1];  P < α: −(α − P) / α ∈ [−1, 0)
    "log_speedup": speed = clip(log(median(r) / c) / log(speedup_cap), −1, 1)

    reward = 1 + w·speed if correct, else incorrect_reward

"correct" is the verifier's: for policylab's code task, every test AND every timed call
returned exactly the reference's value (`tasks.code.CodeVerifier`); timings are the
candidate process's CPU time per call measured by the parent, never by the candidate.

The 1 for a correct candidate is a library decision (without it a correct program as
fast as the reference would score like a wrong one). Unconfirmed (explicit arguments):
the score form, α, min_rel_band, w, incorrect_reward, n_min, speedup_cap.

Every score carries the provenance of its timings: "measured" (the sandbox ran the code)
or "synthetic" (numbers given by hand, e.g. the worked examples); a synthetic score is
never presented as a measured speed-up.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from policylab.errors import PolicylabError

SCORE_FORMS = ("percentile", "log_speedup")
PROVENANCES = ("measured", "synthetic")


class TimingError(PolicylabError):
    """Too few (or non-positive) timings to compute a runtime statistic."""


def runtime_statistic(timings, *, n_min: int) -> float:
    """The median of the repeated timings (for even n the mean of the two middle ones); fewer than n_min (or n_min < 2) raises: a
    single timing sample is never a runtime."""
    t = torch.as_tensor(list(timings), dtype=torch.float64)
    if n_min < 2:
        raise TimingError(f"n_min must be >= 2 (one timing is not a distribution), got {n_min}")
    if t.numel() < n_min:
        raise TimingError(f"{t.numel()} timing(s) given, at least {n_min} needed")
    if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
        raise TimingError("timings must be finite and > 0")
    return float(statistics.median(t.tolist()))


def noise_band(reference, *, alpha: float, min_rel_band: float, n_min: int) -> tuple[float, float]:
    """[low, high] runtimes indistinguishable from the reference: its α and 1 − α
    quantiles (linear interpolation), widened to median·(1 ± min_rel_band)."""
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"`alpha` must be in (0, 0.5), got {alpha}")
    if not 0.0 <= min_rel_band < 1.0:
        raise ValueError(f"`min_rel_band` must be in [0, 1), got {min_rel_band}")
    med = runtime_statistic(reference, n_min=n_min)
    r = torch.as_tensor(list(reference), dtype=torch.float64)
    lo, hi = float(torch.quantile(r, alpha)), float(torch.quantile(r, 1 - alpha))
    return min(lo, med * (1 - min_rel_band)), max(hi, med * (1 + min_rel_band))


@dataclass(frozen=True)
class SpeedScore:
    speed: float  # in [-1, 1]; 0 inside the noise band
    candidate_median: float
    reference_median: float
    band: tuple[float, float]
    percentile: float  # share of reference runs slower than the candidate's median
    provenance: str


def speed_score(candidate, reference, *, form: str, alpha: float, min_rel_band: float, n_min: int,
                speedup_cap: float, provenance: str) -> SpeedScore:
    """The speed score of one correct candidate (see the module docstring)."""
    if form not in SCORE_FORMS:
        raise ValueError(f"`form` must be one of {SCORE_FORMS}, got {form!r}")
    if provenance not in PROVENANCES:
        raise ValueError(f"`provenance` must be one of {PROVENANCES}, got {provenance!r}")
    if not speedup_cap > 1:
        raise ValueError(f"`speedup_cap` must be > 1, got {speedup_cap}")
    c = runtime_statistic(candidate, n_min=n_min)
    ref_med = runtime_statistic(reference, n_min=n_min)
    lo, hi = noise_band(reference, alpha=alpha, min_rel_band=min_rel_band, n_min=n_min)
    r = torch.as_tensor(list(reference), dtype=torch.float64)
    P = float((r > c).double().mean())
    if lo <= c <= hi:
        speed = 0.0
    elif form == "percentile":
        speed = (P - (1 - alpha)) / alpha if P > 1 - alpha else -(alpha - P) / alpha if P < alpha else 0.0
    else:
        speed = max(-1.0, min(1.0, math.log(ref_med / c) / math.log(speedup_cap)))
    return SpeedScore(speed, c, ref_med, (lo, hi), P, provenance)


def code_opt_reward(correct: bool, score: SpeedScore | None, *, speed_weight: float, incorrect_reward: float,
                    timed_out: bool = False) -> float:
    """1 + w·speed for a correct candidate; incorrect_reward for an incorrect one, whatever
    its timings (the gate). `timed_out` with `correct`: speed −1 (1 − w), for a caller that
    verified the outputs some other way; policylab's code verifier never reports it: a
    candidate whose timed calls ran out of the sandbox's limits has unverified timed
    outputs and is reported incorrect (a program that loops only on large inputs would
    otherwise earn 1 − w, more than a wrong one)."""
    if not correct:
        return float(incorrect_reward)
    if timed_out:
        return 1.0 - speed_weight
    if score is None:
        raise TimingError("a correct candidate needs its speed score (or timed_out=True)")
    return 1.0 + speed_weight * score.speed


def code_opt_rewards(correct: list[bool], candidate_timings: list, reference_timings: list, *, timed_out: list[bool],
                     form: str, alpha: float, min_rel_band: float, n_min: int, speedup_cap: float, speed_weight: float,
                     incorrect_reward: float, provenance: str) -> tuple[torch.Tensor, list[SpeedScore | None]]:
    """[B] rewards and the per-candidate SpeedScore (None where there is none: incorrect or
    timed out). Incorrect candidates are never timed into a reward."""
    if not (len(correct) == len(candidate_timings) == len(reference_timings) == len(timed_out)):
        raise ValueError("correct, candidate_timings, reference_timings, timed_out must have one entry per candidate")
    scores, out = [], []
    for ok, ct, rt, to in zip(correct, candidate_timings, reference_timings, timed_out):
        s = None
        if ok and not to:
            s = speed_score(ct, rt, form=form, alpha=alpha, min_rel_band=min_rel_band, n_min=n_min,
                            speedup_cap=speedup_cap, provenance=provenance)
        scores.append(s)
        out.append(code_opt_reward(bool(ok), s, speed_weight=speed_weight, incorrect_reward=incorrect_reward,
                                   timed_out=bool(ok and to)))
    return torch.tensor(out, dtype=torch.float32), scores
