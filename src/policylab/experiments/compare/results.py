"""One finished run as the report sees it, read from its run directory (report.json and
metrics.jsonl only, so a run whose checkpoints were deleted still counts): its accuracy
points, what it spent, and the run means of its clip and correction diagnostics."""

from __future__ import annotations

import math

from policylab.experiments.compare.plan import PlannedRun
from policylab.experiments.compare.states import read_json

# the correction/* keys the report averages (the last part of the key)
_DIAG_SUFFIXES = ("frac_capped", "frac_masked", "ess", "kl_k3", "accepted_frac", "ess_after", "frac_far")
_MISMATCH_KEYS = ("mismatch/old_vs_behavior_abs_dlogp_mean", "staleness/versions_behind_mean")


def run_result(r: PlannedRun) -> dict | None:
    """The run's result, or None when it has not finished (no trained evaluation)."""
    import warnings

    from policylab.trainer.runlog import read_metrics, read_records

    rep = read_json(r.run_dir / "report.json")
    path = r.run_dir / "metrics.jsonl"
    if not rep.get("trained") or not path.is_file():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = read_records(path)
    rows = read_metrics(path, records)
    last = rows[-1] if rows else {}
    seconds = float(last.get("time/elapsed_s", rep.get("train_seconds", 0.0)))
    tokens = int(rep.get("sampled_tokens", last.get("rollout/sampled_tokens_total", 0)))
    peaks = [row["sys/peak_rss_mb"] for row in rows if isinstance(row.get("sys/peak_rss_mb"), (int, float))]
    return {
        "label": r.label, "method": r.method, "seed": r.seed, "run_dir": str(r.run_dir),
        "points": accuracy_points(rep, rows, seconds, tokens),
        "steps": int(rep.get("steps", len(rows))), "optimizer_steps": int(last.get("policy_version", 0)),
        "train_seconds": seconds, "sampled_tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else None, "peak_rss_mb": max(peaks) if peaks else None,
        "clip_frac": _run_mean(rows, "policy/clip_frac"), "train_accuracy_last": last.get("accuracy"),
        "diagnostics": {k: _run_mean(rows, k) for k in _diagnostic_keys(rows)}, "stopped_by": rep.get("stopped_by"),
        "prompt_digests": rep.get("prompt_digests", []),
        "resumed": any(rec.get("event") == "resumed_from" for rec in records),
    }


def accuracy_points(rep: dict, rows: list[dict], seconds: float, tokens: int) -> list[dict]:
    """Held-out accuracy over the run: the base (step 0), every logged evaluation, and the
    final (trained) evaluation at the run's last step, `seconds` and `tokens`."""
    points = [{"step": 0, "seconds": 0.0, "tokens": 0, "accuracy": rep["base"]["accuracy"],
               "stderr": rep["base"]["accuracy_stderr"]}]
    for row in rows:
        if isinstance(row.get("eval/accuracy"), (int, float)):
            points.append({"step": row["step"], "seconds": float(row.get("time/elapsed_s", 0.0)),
                           "tokens": int(row.get("rollout/sampled_tokens_total", 0)),
                           "accuracy": row["eval/accuracy"], "stderr": row.get("eval/accuracy_stderr", 0.0)})
    points.append({"step": int(rep.get("steps", len(rows))), "seconds": seconds, "tokens": tokens,
                   "accuracy": rep["trained"]["accuracy"], "stderr": rep["trained"]["accuracy_stderr"]})
    return points


def _run_mean(rows: list[dict], key: str) -> float | None:
    vals = [row[key] for row in rows if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]
    return sum(vals) / len(vals) if vals else None


def _diagnostic_keys(rows: list[dict]) -> list[str]:
    return sorted({k for row in rows for k in row
                   if (k.startswith("correction/") and k.rsplit("/", 1)[-1] in _DIAG_SUFFIXES)
                   or k in _MISMATCH_KEYS})
