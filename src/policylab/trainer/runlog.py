"""Run logging: metrics.jsonl (one JSON object per step, appended and flushed), TensorBoard
events, and PNG plots refreshed as the run goes.

On resume the log is appended to, never rewritten: lines of steps after the resumed
checkpoint (work that is being redone) are kept and marked by the `resumed_from` record,
so nothing already written is lost.

A process killed mid-write can leave a cut last line (no newline, not valid JSON). Opening
the log repairs it before anything is appended: the cut text is moved to
`metrics.jsonl.partial` (kept, with a warning) and the log ends at its last complete line,
so the next record never glues onto it. Every reader (`read_records`, `read_metrics`, the
plots) skips a line that is not valid JSON with a warning naming the file and the line.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

from policylab.errors import PolicylabWarning
from policylab.trainer.run_paths import guard, guard_dir, open_file, read_bytes, replace_file

PLOTS = {
    "reward.png": [("reward/mean", "reward (mean)"), ("accuracy", "accuracy (train samples)"), ("eval/accuracy", "accuracy (held-out)")],
    "length.png": [("response/length_mean", "mean response length (tokens)")],
    "entropy.png": [("policy/entropy", "mean token entropy (nats)")],
    "kl.png": [("kl/ref_k3", "KL to reference (k3, sampled tokens)"), ("kl/old_k3", "KL old→new after update (k3)")],
    "clip.png": [("policy/clip_frac", "clipped fraction (gradient-zeroing regions)")],
    "time.png": [("time/generate_s", "sampling (s)"), ("time/train_s", "update (s)"), ("time/step_s", "step (s)")],
    "memory.png": [("sys/rss_mb", "resident memory (MiB)"), ("sys/peak_rss_mb", "peak resident memory (MiB)")],
}
# plots whose series are every logged key with one of these prefixes (one line per source
# or domain: metrics split by provenance, e.g. reward/mean@source=gold)
SPLIT_PLOTS = {
    "by_source.png": ("reward/mean@source=", "accuracy@source="),
    "by_domain.png": ("reward/mean@domain=", "accuracy@domain="),
}


def _jsonable(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class RunLog:
    def __init__(self, run_dir: Path, *, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = guard(self.run_dir, "metrics.jsonl")  # a link or a FIFO is refused, not followed or waited on
        guard(self.run_dir, "metrics.jsonl.partial")
        repair_cut_line(self.path)
        self._fh = open_file(self.path, "a", buffering=1)
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(guard_dir(self.run_dir, "tensorboard")))
            except ImportError:  # tensorboard is an optional extra
                self._tb = None

    def _write(self, line: str) -> None:
        try:
            self._fh.write(line)
        except OSError as exc:  # e.g. a full disk: say which file
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None

    def event(self, **record) -> None:
        """A non-step record (run start, resume, evaluation summary)."""
        self._write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")

    def log(self, step: int, metrics: dict) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError:  # the last buffered line could not be written (reported where it failed)
            pass
        if self._tb is not None:
            self._tb.close()


def repair_cut_line(path: Path) -> str | None:
    """If `path` ends without a newline (a write was cut), move the cut text to
    `<path>.partial` and truncate `path` after its last complete line. Returns the cut text
    (None when the file ends cleanly or does not exist)."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    with open_file(path, "rb") as fh:  # a link or a special file is refused
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return None
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return None
        fh.seek(0)
        data = fh.read()
    cut_at = data.rfind(b"\n") + 1
    fragment = data[cut_at:]
    with open_file(path.with_name(path.name + ".partial"), "ab") as side:
        side.write(fragment + b"\n")
        side.flush()
        os.fsync(side.fileno())
    with open_file(path, "r+b") as fh:
        fh.truncate(cut_at)
        fh.flush()
        os.fsync(fh.fileno())
    text = fragment.decode("utf-8", "replace")
    warnings.warn(f"{path}: its last line was cut ({len(fragment)} bytes, killed mid-write?); moved it to "
                  f"{path.name}.partial so the log stays readable", PolicylabWarning, stacklevel=2)
    return text


def read_records(path: Path) -> list[dict]:
    """Every JSON object of a metrics.jsonl; a line that is not valid JSON (a cut last line
    of a killed run) is skipped with a warning naming the file and the line."""
    out, bad = [], []
    raw = read_bytes(path)  # a link or a FIFO is refused, never followed or waited on
    lines = raw.split(b"\n")
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            bad.append(i)
            continue
        if isinstance(rec, dict):
            out.append(rec)
        else:
            bad.append(i)
    if bad:
        last = len(lines) if lines[-1].strip() else len(lines) - 1
        what = "its last line, which was cut (killed mid-write?)" if bad == [last] else \
            f"line(s) {', '.join(map(str, bad))}, which are not valid JSON"
        warnings.warn(f"{path}: skipped {what}", PolicylabWarning, stacklevel=2)
    return out



def read_metrics(path: Path, records: list[dict] | None = None) -> list[dict]:
    """Step rows of a metrics.jsonl; if a step was redone after a resume, the last row wins."""
    rows: dict[int, dict] = {}
    for rec in read_records(path) if records is None else records:
        if isinstance(rec.get("step"), int) and "event" not in rec:
            rows[rec["step"]] = rec
    return [rows[k] for k in sorted(rows)]


def write_plots(run_dir: Path) -> list[Path]:
    """Refresh the PNG plots from metrics.jsonl. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = guard(run_dir, "metrics.jsonl")
    records = read_records(path) if path.is_file() else []
    rows = read_metrics(path, records)
    out = []
    if not rows:
        return out
    # base / final held-out evaluations are events, placed at the step they describe
    evals = [{**rec, "step": rec["at_step"]} for rec in records
             if rec.get("event") == "eval" and isinstance(rec.get("at_step"), int)]
    plot_dir = guard_dir(run_dir, "plots")
    keys = sorted({k for r in rows for k in r})
    split = {fname: [(k, k) for k in keys if k.startswith(prefixes)] for fname, prefixes in SPLIT_PLOTS.items()}
    for fname, series in {**PLOTS, **split}.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        drawn = False
        for key, label in series:
            src = rows + evals if key.startswith("eval/") else rows
            pts = sorted((r["step"], r[key]) for r in src if isinstance(r.get(key), (int, float)))
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, ms=3, label=label)
                drawn = True
        if drawn:
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            replace_file(plot_dir / fname, write=lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
            out.append(plot_dir / fname)
        plt.close(fig)
    return out
