"""The comparison's learning curves (curves.png): held-out accuracy ± standard error of
every method against training wall-clock and against rollout steps."""

from __future__ import annotations

from pathlib import Path


def plot_curves(report: dict, path: Path) -> Path | None:
    """Draw the report's curves into `path`; None (nothing drawn) when no run finished."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not report["methods"]:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for lab, m in report["methods"].items():
        pts = m["curve"] + [m["final"]]
        for ax, key in zip(axes, ("seconds", "step")):
            xs = [p[key] for p in pts]
            ys = [p["accuracy"] for p in pts]
            se = [p["stderr"] for p in pts]
            line, = ax.plot(xs, ys, marker="o", ms=3, label=f"{lab} ({len(m['seeds'])} seed(s))")
            ax.fill_between(xs, [y - s for y, s in zip(ys, se)], [y + s for y, s in zip(ys, se)],
                            color=line.get_color(), alpha=0.12)
    for ax, name in zip(axes, ("training wall-clock (s, evaluations excluded)", "rollout step")):
        ax.set_xlabel(name)
        ax.set_ylabel("held-out accuracy (T = 1)")
        ax.grid(alpha=0.3)
    if report.get("target_accuracy"):
        for ax in axes:
            ax.axhline(report["target_accuracy"], color="grey", ls="--", lw=0.8)
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{report['task']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
