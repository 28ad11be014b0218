"""Run log plots: held-out evaluations (base before training, trained after) are placed on
the step axis with the periodic evaluations."""

import json

from policylab.trainer import runlog


def test_base_and_final_evaluations_are_plotted_at_their_steps(tmp_path, monkeypatch):
    log = runlog.RunLog(tmp_path, tensorboard=False)
    log.event(event="start", method="grpo")
    log.event(event="eval", at_step=0, **{"eval/accuracy": 0.13})
    for step in (1, 2, 3):
        row = {"reward/mean": 0.1 * step}
        if step == 2:
            row["eval/accuracy"] = 0.5
        log.log(step, row)
    log.event(event="eval", at_step=3, **{"eval/accuracy": 0.9})
    log.close()
    # the step rows never pick up the events (metrics.jsonl keeps both kinds of line)
    assert [r["step"] for r in runlog.read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(1 for x in lines if x.get("event") == "eval") == 2

    drawn = {}

    class Axis:
        def plot(self, xs, ys, **kw):
            drawn[kw["label"]] = (list(xs), list(ys))

        def __getattr__(self, name):
            return lambda *a, **k: None

    import matplotlib.pyplot as plt

    class Fig:
        def tight_layout(self):
            pass

        def savefig(self, path, **kw):
            open(path, "wb").close()

    monkeypatch.setattr(plt, "subplots", lambda *a, **k: (Fig(), Axis()))
    monkeypatch.setattr(plt, "close", lambda *a: None)
    runlog.write_plots(tmp_path)
    assert drawn["accuracy (held-out)"] == ([0, 2, 3], [0.13, 0.5, 0.9])
    assert drawn["reward (mean)"][0] == [1, 2, 3]


def test_time_and_memory_plots_are_written(tmp_path):
    log = runlog.RunLog(tmp_path, tensorboard=False)
    for step in (1, 2):
        log.log(step, {"reward/mean": 0.5, "time/generate_s": 1.0, "time/train_s": 2.0, "time/step_s": 3.0,
                       "sys/rss_mb": 100.0 * step, "sys/peak_rss_mb": 200.0})
    log.close()
    written = {p.name for p in runlog.write_plots(tmp_path)}
    assert {"reward.png", "time.png", "memory.png"} <= written
    assert "kl.png" not in written  # nothing to draw: no file
    assert (tmp_path / "plots" / "memory.png").stat().st_size > 1000
