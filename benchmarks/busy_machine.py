"""Graceful under load: one training step alone and under a synthetic CPU load, against
the slowdown a fair share of the CPU predicts.

    .venv/bin/python benchmarks/busy_machine.py                 # writes results/busy_machine.{md,json}
    .venv/bin/python benchmarks/busy_machine.py --loads 0,2,8 --policies openmp,spin:1000,passive,one --steps 3

Run it on an otherwise idle machine (the script records the load average before each
measurement and the CPU's busy fraction over 2 s before the run, and says when the machine
was not idle: more than 25% busy then; the load average lags by minutes after a busy job).

Each thread policy (--policies) runs in its own worker process, because OpenMP reads
its wait policy when torch is imported:

    openmp   threads = the cores available to the process
             (policylab.trainer.runtime.available_cores: affinity and cgroup quota),
             OpenMP's own wait policy (GNU OpenMP, torch's: spin 300,000 rounds, then
             sleep): what a program that imports torch before policylab gets
    passive  the same thread count, OMP_WAIT_POLICY=PASSIVE (a waiting thread sleeps)
    one      one thread (no barrier between threads at all)
    spin:N   the same thread count, GOMP_SPINCOUNT=N (a waiting thread spins N rounds,
             then sleeps); the `policylab` command's default is one of these
             (policylab.trainer.runtime.DEFAULT_WAIT)

The workers start once, one after another (each builds the trainer: the embedded model,
the quickstart's task and batch, 4 prompts x 8 samples, <= 16 new tokens, GRPO, and takes
--warmup untimed steps), and stay alive, waiting on their stdin without using the CPU.
For each load level N of --loads the script starts N busy processes itself (each one
spinning Python thread at the workers' priority), times --steps training steps
(sampling + update) of every policy in turn (step 1 of each policy, then step 2 of each,
...: the host's speed drifts by tens of percent over minutes here, and in turn a drift
reaches every policy alike), and stops them. Steps are timed with the wall clock. Memory:
one trainer per policy at once (~3.5 GB each for the embedded model).

The share-proportional expectation: with T compute threads on C cores and N busy
processes, a fair scheduler gives each of the N + T runnable threads C / (N + T) of a core
once N + T > C, so the worker has T·C/(N + T) cores instead of T, and its step should
take (N + T)/C times as long as alone (1 when N + T <= C). Reported per policy and load:
the mean step time, slowdown = step time / the policy's own step time alone, the
expectation, and slowdown / expectation (the issue's target: within 2x). A step time
is also compared across policies at each load (which policy is fastest there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
RESULTS = HERE.parent / "results"
POLICIES = ("openmp", "passive", "one")
SPIN = "while True:\n    pass\n"  # one runnable thread, at the priority of this script


def expectation(n_busy: int, threads: int, cores: int) -> float:
    """Step-time factor a fair share predicts: (N + T) / C when N + T > C, else 1."""
    return (n_busy + threads) / cores if n_busy + threads > cores else 1.0


def spin_count(policy: str) -> int | None:
    """N of a "spin:N" policy (None for the other policies)."""
    if not policy.startswith("spin:"):
        return None
    raw = policy.removeprefix("spin:")
    if not raw.isdigit():
        raise SystemExit(f"policy {policy!r}: spin:N needs an integer N >= 0 (GOMP_SPINCOUNT)")
    return int(raw)


def check_policy(policy: str) -> str:
    if policy not in POLICIES and spin_count(policy) is None:
        raise SystemExit(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)} or spin:N")
    return policy


def policy_env(policy: str, cores: int, base=None) -> dict[str, str]:
    """The worker's environment for a policy (threads and wait policy set before torch loads)."""
    from policylab.trainer.runtime import thread_env

    check_policy(policy)
    if policy == "one":
        return thread_env(1, passive=False, base=base)
    env = thread_env(None, passive=policy == "passive", spincount=spin_count(policy), base=base)
    env.pop("OMP_NUM_THREADS", None)
    env.pop("POLICYLAB_THREADS", None)
    return env


def cpu_busy_fraction(seconds: float = 2.0) -> float | None:
    """The fraction of all CPUs' time spent busy over the next `seconds` (/proc/stat: every
    state but idle and iowait), None where /proc/stat is missing. Unlike the load average,
    which lags by minutes, this tells whether the machine is busy now."""
    def snap():
        try:
            with open("/proc/stat") as f:
                vals = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        return sum(vals), vals[3] + (vals[4] if len(vals) > 4 else 0)

    a = snap()
    time.sleep(seconds)
    b = snap()
    if a is None or b is None or b[0] == a[0]:
        return None
    return 1.0 - (b[1] - a[1]) / (b[0] - a[0])


class Busy:
    """N spinning processes started and stopped by this script (by their own pids)."""

    def __init__(self, n: int):
        self.procs = [subprocess.Popen([sys.executable, "-S", "-c", SPIN], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def __enter__(self):
        time.sleep(0.5 if self.procs else 0.0)  # let them get scheduled
        return self

    def __exit__(self, *exc):
        self.stop()


MARK = "@@busy_machine@@ "  # prefix of the worker's protocol lines on its stdout


def worker(a) -> None:
    """A worker process: builds the trainer, takes the warm-up steps, says READY, then
    times one training step per "step" line on stdin until "quit"."""
    import torch

    from policylab.trainer import runtime
    from policylab.trainer.config import config_from_dict
    from policylab.trainer.loop import Trainer

    cfg = config_from_dict({
        "method": "grpo", "model": a.model, "seed": 0, "method_params": {"kl_coef": 0.0},
        "task": json.loads(a.task),
        "rollout": {"prompts_per_step": a.prompts, "group_size": a.group, "max_new_tokens": a.max_new_tokens,
                    "engine": a.engine},
        "train": {"steps": 10_000, "lr": 1e-5, "micro_batch_size": a.micro_batch},
        "eval": {"before": False, "after": False}, "log": {"tensorboard": False, "progress": False},
        "run_dir": tempfile.mkdtemp(prefix="busy_machine_"),
    })
    trainer = Trainer(cfg)
    choice = runtime.thread_choice()
    for _ in range(a.warmup):
        trainer.train_step()
    say = lambda obj: print(MARK + json.dumps(obj), flush=True)  # noqa: E731
    say({"policy": a.worker, "threads": torch.get_num_threads(), "thread_reason": choice.reason if choice else "",
         "wait_policy": runtime.wait_policy(), "cores": runtime.available_cores().cores})
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        t0 = time.perf_counter()
        m = trainer.train_step()
        say({"wall_s": time.perf_counter() - t0, "generate_s": m.get("time/generate_s"),
             "train_s": m.get("time/train_s"), "tokens": m.get("rollout/response_tokens")})


class Worker:
    """One policy's worker process (its environment fixed before it imports torch), kept
    alive between steps so that the policies' steps can be timed in turn. A worker that is
    not stepping waits on its stdin and uses no CPU."""

    def __init__(self, policy: str, argv: list[str], cores: int):
        env = policy_env(policy, cores)
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        self.policy = policy
        self.cmd = [sys.executable, str(HERE), "--worker", policy, *argv]
        self.proc = subprocess.Popen(self.cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1)
        self.info = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
            sys.stdout.write(line)
        raise SystemExit(f"the {self.policy} worker failed (exit {self.proc.wait()}): {' '.join(self.cmd)}")

    def step(self) -> dict:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def measure(pols: list[str], argv: list[str], cores: int, loads: list[int], steps: int) -> dict:
    """Every policy's step times at every load level: the workers are started once, and at
    each level the policies step in turn (step 1 of each, then step 2 of each, ...), so a
    drift of the host's speed reaches every policy alike."""
    workers: dict[str, Worker] = {}
    try:
        for p in pols:
            workers[p] = Worker(p, argv, cores)
        levels: dict[str, dict] = {p: {} for p in pols}
        for n in loads:
            load_before = round(os.getloadavg()[0], 2)
            times: dict[str, list] = {p: [] for p in pols}
            with Busy(n):
                for _ in range(steps):
                    for p in pols:
                        times[p].append(workers[p].step())
            for p in pols:
                lv = {"steps": times[p], "mean_step_s": sum(s["wall_s"] for s in times[p]) / steps,
                      "load_before": load_before}
                levels[p][str(n)] = lv
                print(f"[{p}] {n} busy: mean step {lv['mean_step_s']:.2f} s", flush=True)
        return {p: {**workers[p].info, "levels": levels[p]} for p in pols}
    finally:
        for w in workers.values():
            w.close()


def summarize(res: dict, cores: int) -> None:
    """Adds slowdown, expectation and their ratio to every load level of a worker's result."""
    alone = res["levels"].get("0", {}).get("mean_step_s")
    for n, lv in res["levels"].items():
        exp = expectation(int(n), res["threads"], cores)
        lv["expected_slowdown"] = exp
        if alone:
            lv["slowdown"] = lv["mean_step_s"] / alone
            lv["slowdown_over_expected"] = lv["slowdown"] / exp


def to_markdown(report: dict) -> str:
    lines = ["# One training step alone and under a synthetic CPU load", "",
             f"Command: `{report['command']}`  ", f"Machine: {report['machine']}  ",
             f"Configuration: {report['config']}", "",
             "Expected slowdown: (N + T) / C with N busy processes, T compute threads, C cores (a fair share per "
             "runnable thread), 1 when N + T <= C. Target: slowdown / expected <= 2.", "",
             "The last column compares policies: the step time over the fastest policy's step alone.", "",
             "| policy | threads | wait policy | busy processes | mean step (s) | slowdown | expected | "
             "slowdown / expected | load avg before | step / fastest alone |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    alone = [r["levels"]["0"]["mean_step_s"] for r in report["policies"].values() if "0" in r["levels"]]
    best = min(alone) if alone else None
    for pol, r in report["policies"].items():
        for n, lv in r["levels"].items():
            sd = f"{lv['slowdown']:.2f}" if "slowdown" in lv else "-"
            so = f"**{lv['slowdown_over_expected']:.2f}**" if "slowdown_over_expected" in lv else "-"
            vs = f"{lv['mean_step_s'] / best:.2f}" if best else "-"
            lines.append(f"| {pol} | {r['threads']} | {r['wait_policy']} | {n} | {lv['mean_step_s']:.2f} | {sd} | "
                         f"{lv['expected_slowdown']:.2f} | {so} | {lv['load_before']} | {vs} |")
    lines += ["", "Fastest policy at each load: " + ", ".join(f"{n} busy: {p}" for n, p in report["fastest"].items())]
    if report.get("not_idle"):
        lines += ["", f"**The machine was not idle** ({_pct(report.get('cpu_busy_start'))} of the CPU busy and load "
                      f"average {report['load_start']} before the run, "
                      f"{report['cores']} cores): other processes share the CPU and the numbers overstate the slowdown."]
    return "\n".join(lines) + "\n"


def _pct(x) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--task", default=json.dumps({"name": "arithmetic", "ops": ["+", "*"], "digits": 1}),
                    help="the run's task section as JSON")
    ap.add_argument("--engine", default="auto", help="rollout.engine (auto | fast | hf | fast-bf16)")
    ap.add_argument("--loads", default="0,2,8", help="comma list of busy-process counts; 0 (alone) first")
    ap.add_argument("--policies", default="openmp,spin:1000,passive,one")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per load level")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--out", default=str(RESULTS / "busy_machine"), help="results path without suffix ('' = none)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    loads = [x for x in a.loads.split(",") if x.strip()]
    if not loads or not all(x.strip().isdigit() for x in loads) or int(loads[0]) != 0:
        raise SystemExit(f"--loads must be a comma list of counts >= 0 starting with 0 (alone), got {a.loads!r}")
    a.loads = ",".join(x.strip() for x in loads)
    if a.steps < 1 or a.warmup < 0:
        raise SystemExit("--steps must be >= 1 and --warmup >= 0")
    return a


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse(argv)
    if a.worker:
        worker(a)
        return {}
    sys.path.insert(0, str(HERE.parent))
    from kernel_speed import machine

    from policylab.trainer.runtime import available_cores

    pols = [check_policy(p) for p in a.policies.split(",") if p]
    passthrough, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in ("--out", "--policies"):
            skip = True
        elif not x.startswith(("--out=", "--policies=")):
            passthrough.append(x)
    cores = available_cores().cores
    load_start = round(os.getloadavg()[0], 2)
    busy_start = cpu_busy_fraction()
    results = measure(pols, passthrough, cores, [int(x) for x in a.loads.split(",")], a.steps)
    for p in pols:
        summarize(results[p], cores)
    fastest = {}
    for n in a.loads.split(","):
        fastest[n] = min(results, key=lambda p: results[p]["levels"][n]["mean_step_s"])
    report = {
        "command": "python benchmarks/busy_machine.py " + " ".join(argv), "machine": machine(), "cores": cores,
        "load_start": load_start, "cpu_busy_start": busy_start,
        "not_idle": busy_start > 0.25 if busy_start is not None else load_start > 0.5 * cores,
        "config": (f"model {a.model}, task {a.task}, engine {a.engine}, {a.prompts} prompts x {a.group} samples, <= "
                   f"{a.max_new_tokens} new tokens, micro-batch {a.micro_batch}; {a.warmup} warm-up + {a.steps} timed "
                   f"steps per load; busy processes: one spinning Python thread each"),
        "policies": results, "fastest": fastest,
    }
    worst = {p: max(lv.get("slowdown_over_expected", 0.0) for lv in r["levels"].values()) for p, r in results.items()}
    report["worst_slowdown_over_expected"] = worst
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=2))
        out.with_suffix(".md").write_text(to_markdown(report))
    for p, r in results.items():
        print(f"{p:8s} threads {r['threads']} ({r['wait_policy']}): " + "  ".join(
            f"{n} busy {lv['mean_step_s']:.2f}s x{lv.get('slowdown', float('nan')):.2f} (expected "
            f"x{lv['expected_slowdown']:.2f})" for n, lv in r["levels"].items()))
    print("worst_slowdown_over_expected=" + ",".join(f"{p}:{v:.2f}" for p, v in worst.items()))
    return report


if __name__ == "__main__":
    main()
