"""Run the evidence table in parts: one `policylab evidence NAME --seeds S` per (method, seed),
taken from one queue by a few worker processes, so that a 2-core machine can fill it over
hours and any interruption loses at most the runs in flight (which resume from their last
checkpoint when taken again).

    .venv/bin/python benchmarks/evidence_parts.py --workers 2 --threads 1 --seeds 0,1,2 \\
        -- --out runs/evidence --steps 4 --eval-n 40 --set rollout.prompts_per_step=4 ...

The arguments after `--` are passed to every `policylab evidence` call (they must be the
same for every part: the table reads the runs that match them). Items run seed by seed in
the order of `--order` (default: methods whose control is plain GRPO on the shared task
first, so one control run serves many); two workers never take the same (method, seed).
A part that fails (for instance because another worker holds a shared control run's lock)
goes back to the end of the queue, at most `--retries` times; its log is kept in
`<out>/parts/`. At the end (or with --report-only) the table is written once from every
finished run.

Run logs travel with the repository: with `--archive DIR` (default
benchmarks/results/evidence_runs) every finished run's small files (report.json,
metrics.jsonl, config.yaml; never checkpoints or plots) are copied there after each part, and
copied back into `--out` before the first part, so a fresh checkout on another machine resumes
the table where the last one stopped (a restored run counts as finished and is skipped).
`--archive-only` copies and exits."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ORDER = ("gspo cispo dapo dr_grpo gppo gppo_fdiv ripo tapo reco conspo ggpo gprl grpo_process reinforce_pp "
         "reinforce_pp_baseline zcpo erpo luspo range_grpo stare rlcpr luffy grin graft erils moer off_context_grpo "
         "grpo probe_erpo ttrl ttpo tasco tis icepop kpop minirl mis online_icepop missing_old_logits gmc sis remax "
         "rloo rlid tlm_dre mad_rl code_opt rlcr").split()


KEPT = ("report.json", "metrics.jsonl", "config.yaml")
STATE = "evidence_state.json"


def _finished_runs(root: Path):
    """Run directories under `root` (<group>/runs/<label>-seed<s>) whose report says they finished."""
    import json

    for rep in sorted(root.glob("*/runs/*/report.json")):
        try:
            data = json.loads(rep.read_text())
        except (OSError, ValueError):
            continue
        if data.get("trained") and data.get("stopped_by") and (rep.parent / "metrics.jsonl").is_file():
            yield rep.parent


def copy_finished(src: Path, dest: Path, as_out: str | None = None) -> int:
    """Copy the kept files of every finished run under `src` that `dest` lacks (or holds older); returns the count.
    With `as_out`, the out directory's path in the copied files (config run_dir, commands) is written as
    `as_out` (the archive holds no machine's absolute paths)."""
    import shutil

    def relocate(text: str) -> str:
        for prefix in sorted({str(src), str(src.resolve())}, key=len, reverse=True):
            text = text.replace(prefix, as_out)
        return text

    def put(a: Path, b: Path) -> None:
        if as_out is None:
            shutil.copyfile(a, b)
        else:
            b.write_text(relocate(a.read_text()))

    n = 0
    for run in _finished_runs(src):
        to = dest / run.relative_to(src)
        if (to / "report.json").is_file() and (to / "report.json").read_bytes() == (run / "report.json").read_bytes():
            continue
        to.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            if (run / name).is_file():
                put(run / name, to / name)
        n += 1
    if (src / STATE).is_file() and not (dest / STATE).is_file():
        put(src / STATE, dest / STATE)
    elif (src / STATE).is_file():  # the union of the commands, in order
        import json

        have = json.loads((dest / STATE).read_text()).get("commands", [])
        theirs = json.loads((src / STATE).read_text()).get("commands", [])
        if as_out is not None:
            theirs = [relocate(c) for c in theirs]
        new = [c for c in theirs if c not in have]
        if new:
            (dest / STATE).write_text(json.dumps({"commands": have + new}, indent=2))
    return n


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="POLICYLAB_THREADS of each worker's runs")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--order", default=" ".join(ORDER), help="methods, space-separated, in the order to run")
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--report-dir", default=None, help="passed to the final `--all --report-only` call")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--archive", default=str(Path(__file__).resolve().parent / "results" / "evidence_runs"),
                    help="where finished runs' logs are kept with the repository ('' for nowhere)")
    ap.add_argument("--archive-only", action="store_true", help="copy finished runs' logs to --archive and exit")
    ap.add_argument("--as-out", default="runs/evidence", help="the out directory as the archived files name it")
    a = ap.parse_args(own)
    if "--out" not in rest:
        ap.error("pass the evidence settings after `--`, at least --out DIR")
    out = Path(rest[rest.index("--out") + 1])
    archive = Path(a.archive) if a.archive else None
    if archive is not None:
        archive.mkdir(parents=True, exist_ok=True)
        if a.archive_only:
            print(f"archived {copy_finished(out, archive, a.as_out)} finished run(s) to {archive}")
            return 0
        out.mkdir(parents=True, exist_ok=True)
        print(f"restored {copy_finished(archive, out)} finished run(s) from {archive}", flush=True)
    exe = str(Path(sys.executable).with_name("policylab"))
    seeds = [s.strip() for s in a.seeds.split(",") if s.strip()]
    queue = [(m, s) for s in seeds for m in a.order.split()]
    lock, tries = threading.Lock(), {}
    logs = out / "parts"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "POLICYLAB_THREADS": str(a.threads)}

    def take():  # an item leaves the queue while it runs, so two workers never hold the same one
        with lock:
            return queue.pop(0) if queue else None

    def worker(k: int) -> None:
        while not a.report_only:
            item = take()
            if item is None:
                return
            m, s = item
            t0 = time.time()
            with open(logs / f"{m}-seed{s}.log", "a") as log:
                rc = subprocess.call([exe, "evidence", m, "--seeds", s, *rest], env=env, stdout=log,
                                     stderr=subprocess.STDOUT)
            with lock:
                if archive is not None:
                    copy_finished(out, archive, a.as_out)
                print(f"[worker {k}] {m} seed {s}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
                if rc != 0:
                    tries[item] = tries.get(item, 0) + 1
                    if tries[item] <= a.retries:
                        queue.append(item)
                    else:
                        print(f"[worker {k}] {m} seed {s}: gave up (log {logs / f'{m}-seed{s}.log'})", flush=True)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(a.workers)]
    for t in threads:
        t.start()
        time.sleep(20)  # the first run loads the model into the cache; do not race it
    for t in threads:
        t.join()
    final = [exe, "evidence", "--all", "--report-only", "--seeds", ",".join(seeds), *rest]
    if a.report_dir:
        final += ["--report-dir", a.report_dir]
    return subprocess.call(final, env=env)


if __name__ == "__main__":
    sys.exit(main())
