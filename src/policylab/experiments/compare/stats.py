"""The comparison's statistics: one method's runs averaged over seeds (standard error of
the mean accuracy = the larger of the binomial and the between-seed error), time to the
target accuracy, each method's final accuracy against the first method's, and whether
the runs of a seed saw the same prompts."""

from __future__ import annotations

import math


def time_to(points: list[dict], target: float | None) -> dict | None:
    """Step, seconds and tokens of the first point at or above `target` (None: never)."""
    if target is None:
        return None
    for p in points:
        if p["accuracy"] >= target:
            return {"step": p["step"], "seconds": p["seconds"], "tokens": p["tokens"]}
    return None


def mean_point(step, pts: list[dict]) -> dict:
    """The mean of one accuracy point over seeds; `step` None: the mean of their steps."""
    k = len(pts)
    accs = [p["accuracy"] for p in pts]
    m = sum(accs) / k
    binom = math.sqrt(sum(p["stderr"] ** 2 for p in pts)) / k
    seed_se = math.sqrt(sum((a - m) ** 2 for a in accs) / (k - 1) / k) if k > 1 else 0.0
    return {"step": step if step is not None else sum(p["step"] for p in pts) / k, "accuracy": m,
            "stderr": max(binom, seed_se), "stderr_binomial": binom, "stderr_seeds": seed_se if k > 1 else None,
            "per_seed": accs, "seconds": sum(p["seconds"] for p in pts) / k, "tokens": sum(p["tokens"] for p in pts) / k}


def aggregate(results: list[dict], target: float | None) -> dict:
    """One method over its seeds' results: the mean learning curve (steps every seed
    evaluated), the mean final point, time to target, and the run means of the rest."""
    k = len(results)
    by_step: dict[int, list[dict]] = {}
    for res in results:
        for p in res["points"][:-1]:
            by_step.setdefault(p["step"], []).append(p)
    curve = [mean_point(step, by_step[step]) for step in sorted(by_step) if len(by_step[step]) == k]
    final = mean_point(None, [res["points"][-1] for res in results])
    hit = [x for x in (time_to(res["points"], target) for res in results) if x is not None]

    def avg(key):
        vals = [res[key] for res in results if isinstance(res.get(key), (int, float))]
        return sum(vals) / len(vals) if vals else None

    return {"seeds": [res["seed"] for res in results], "curve": curve, "final": final,
            "time_to_target": {"reached": len(hit), "of": k,
                               "seconds_mean": sum(x["seconds"] for x in hit) / len(hit) if hit else None,
                               "steps_mean": sum(x["step"] for x in hit) / len(hit) if hit else None},
            "tokens_per_s": avg("tokens_per_s"), "peak_rss_mb": max((res["peak_rss_mb"] or 0) for res in results),
            "clip_frac": avg("clip_frac"), "train_seconds": avg("train_seconds"), "steps": avg("steps"),
            "optimizer_steps": avg("optimizer_steps"), "sampled_tokens": avg("sampled_tokens"),
            "diagnostics": _mean_diagnostics(results)}


def _mean_diagnostics(results: list[dict]) -> dict:
    diag = {}
    for key in sorted({k for res in results for k in res["diagnostics"]}):
        vals = [res["diagnostics"][key] for res in results if res["diagnostics"].get(key) is not None]
        if vals:
            diag[key] = sum(vals) / len(vals)
    return diag


def add_vs_first(methods: dict) -> None:
    """Each method's final accuracy minus the first method's, with the standard error of
    the difference and z (None when that error is 0), as `vs_first`."""
    ref = next(iter(methods), None)
    if ref is None:
        return
    f0 = methods[ref]["final"]
    for m in methods.values():
        f = m["final"]
        se = math.sqrt(f["stderr"] ** 2 + f0["stderr"] ** 2)
        d = f["accuracy"] - f0["accuracy"]
        m["vs_first"] = {"reference": ref, "difference": d, "stderr": se, "z": d / se if se > 0 else None}


def same_prompts(results: list[dict]) -> dict:
    """Per seed: do the runs' recorded prompt streams agree on their common prefix?"""
    out = {}
    for seed in sorted({r["seed"] for r in results}):
        streams = [r["prompt_digests"] for r in results if r["seed"] == seed]
        n = min((len(s) for s in streams), default=0)
        agree = all(s[:n] == streams[0][:n] for s in streams)
        out[str(seed)] = {"runs": len(streams), "common_prefix": n, "agree": agree and n > 0}
    return out
