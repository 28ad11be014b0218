"""The signature's size across seeds and its verdict: the paired difference of the
method's and the control's quantity, seed by seed (the two arms of a seed see the same
prompts), its mean ± standard error, and whether it is significant in the direction the
paper claims (two-sided 5% Student t on the seed differences)."""

from __future__ import annotations

import math

# two-sided 5% critical values of Student's t, by degrees of freedom: every df from 1 to 30,
# then 40, 60, 120; a df between two entries takes the lower entry's (a slightly wider,
# conservative interval), beyond 120 the normal 1.96
T_CRIT = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
          11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
          20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
          29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
OBSERVED, NOT_OBSERVED, NOT_MEASURABLE, NOT_RUN, REFUSED = (
    "observed", "not observed", "not measurable here", "not run", "refused")


MIN_SEEDS_FOR_CLAIM = 3


def t_crit(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df > 120:
        return 1.96
    return T_CRIT[max(k for k in T_CRIT if k <= df)]


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and standard error of the mean (sample std with n − 1); None for one value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_se of no values")
    m = sum(values) / n
    if n == 1:
        return m, None
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


# relative size below which a mean difference is the float rounding of an exact zero: the
# runs record accuracies (k / n) and metrics in float32, whose rounding is ~6e-8 of the value
_ROUNDING = 1e-6


def paired(method: dict[int, float | None], control: dict[int, float | None]) -> dict:
    """The paired difference method − control over the seeds where both arms have a value."""
    seeds = sorted(s for s in method if s in control and method[s] is not None and control[s] is not None)
    if not seeds:
        return {"seeds": [], "n": 0}
    d = [method[s] - control[s] for s in seeds]
    mean, se = mean_se(d)
    if abs(mean) <= _ROUNDING * max(1.0, *(abs(v) for v in d)):
        mean = 0.0  # differences that cancel exactly (e.g. accuracies k/n): their rounding is no effect
    m_mean, m_se = mean_se([method[s] for s in seeds])
    c_mean, c_se = mean_se([control[s] for s in seeds])
    out = {"seeds": seeds, "n": len(seeds), "method": m_mean, "method_se": m_se, "control": c_mean,
           "control_se": c_se, "differences": d, "difference": mean, "difference_se": se, "t": None,
           "seeds_needed": None}
    if se is not None:
        out["t"] = mean / se if se > 0 else (math.copysign(math.inf, mean) if mean != 0 else 0.0)
        sd = se * math.sqrt(len(d))
        if sd > 0 and mean != 0:
            # seeds for |mean| / (sd / √n) >= 1.96 at this effect and spread (normal approximation)
            out["seeds_needed"] = max(2, math.ceil((1.96 * sd / abs(mean)) ** 2))
    return out


def verdict(stats: dict, direction: int) -> tuple[str, str]:
    """(verdict, why) of a paired difference for a claim that predicts sign(`direction`)."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction!r}")
    n = stats.get("n", 0)
    if n < 2:
        return NOT_OBSERVED, f"{n} seed(s) with both arms measured: no uncertainty, so no claim"
    mean, t = stats["difference"], stats["t"]
    crit = t_crit(n - 1)
    want = "larger" if direction > 0 else "smaller"
    if mean * direction > 0 and abs(t) >= crit:
        if n < MIN_SEEDS_FOR_CLAIM:
            # two seeds of a coarse quantity (a reward mean over 16 samples) agree exactly by chance
            # often enough: their s.e. of 0 makes |t| infinite; no claim below three seeds
            return NOT_OBSERVED, (f"in the claimed direction, |t| = {abs(t):.2f} >= {crit:.2f}, but {n} seeds are too "
                                  f"few for a claim (at least {MIN_SEEDS_FOR_CLAIM})")
        return OBSERVED, f"the method's value is {want}: |t| = {abs(t):.2f} >= {crit:.2f} ({n} seeds)"
    if mean * direction < 0 and abs(t) >= crit:
        return NOT_OBSERVED, (f"significant in the opposite direction: |t| = {abs(t):.2f} >= {crit:.2f} ({n} seeds)")
    return NOT_OBSERVED, (f"difference within noise: |t| = {abs(t):.2f} < {crit:.2f} ({n} seeds)" if mean != 0
                          else f"no difference at all ({n} seeds)")
