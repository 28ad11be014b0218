"""policylab vs TRL's GRPOTrainer, side by side, on the same work.

    make bench                                   # installs trl==1.16.0 into .venv, runs this
    .venv/bin/python benchmarks/vs_trl.py        # 5 steps each, writes benchmarks/results/vs_trl.{json,md}

Both sides: the embedded SmolLM2-135M-Instruct (fp32 weights, fp32 training), the same
arithmetic prompts in the same order (policylab.tasks.arithmetic.ArithmeticTask, seed
--seed, single-digit + and x, chat template, no system prompt), the same reward
(policylab.kernels.rewards.exact_numeric_reward on the reply text), 4 prompts x 8 samples per
step, at most 48 new tokens, temperature 1 (no top-k / top-p), learning rate 5e-6 constant,
AdamW (0.9, 0.999), no weight decay, grad-norm clip 1.0, no reference model (TRL beta=0),
GRPO: group-standardized advantages, PPO clip 0.2, one optimizer step per batch,
per-sequence token mean (TRL loss_type="grpo"), the same micro-batch size for the
gradient accumulation (--micro-batch), the same seed.

TRL settings that are not its defaults, and why: bf16=False (fp32 weights, as asked),
gradient_checkpointing=False (policylab does not checkpoint; TRL's default True costs
TRL ~20% more compute), lr_scheduler_type="constant" (TRL/HF default is linear decay),
loss_type="grpo" (TRL's default "dapo" normalizes over all tokens), shuffle_dataset=False
(so it reads the prompts in the same order), use_cpu, report_to="none".

Each side runs in its own subprocess (`--worker <side>`), so the peak RSS of each is its own.
The fast mode: "policylab-fast" is policylab with `rollout.engine: fast-bf16` (the bf16
FastEngine samples, its log-probs are μ, TIS on the engine ratio corrects the mismatch;
training in --fast-train-dtype, by default the fast mode's own `train.dtype: auto`:
bf16-backward, the fp32 forward with bf16 backward products, on a CPU with native bf16;
one optimizer step per batch, so π_old is
the training forward and no old pass runs); its ratio is printed as
`ratio_vs_trl_fast=`, beside the exact-fp32 `ratio_vs_trl=`.
The policylab sides run in the environment the `policylab` command gives itself
(`policylab.trainer.allocator`: glibc's tcache and fast bins off, GLIBC_TUNABLES); TRL's in
its own. Ablation sides: "policylab-plain" (HF generate, no shared prompt prefix),
"policylab-system" (policylab with `keep_freed_memory: false` and no tunables, i.e. glibc's
default allocator behaviour) and
"trl-keep" (TRL after the same `policylab.trainer.runtime.keep_freed_memory()` call the policylab
trainer makes at start-up: how much of the gap that process setting explains).
Peak RSS (resource.getrusage ru_maxrss at the end of training). Step time: TRL from
on_step_begin to on_step_end of a TrainerCallback (generation, reward, forward/backward,
optimizer); policylab: Trainer.train_step() (the same work). completions/s = completions
trained / sum of step times. The last line printed is `ratio_vs_trl=<policylab/TRL>`.

`--eval-n N` (default 0 = off) also scores each side's trained weights on N held-out
prompts with one evaluator (policylab's, T = 1, seed fixed), outside the timed steps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
HERE = Path(__file__).resolve()
SIDES = ("trl", "trl-keep", "policylab", "policylab-fast", "policylab-system", "policylab-plain")


# ------------------------------------------------------------------------ shared setup
def shared_prompts(n: int, seed: int):
    from policylab.tasks.arithmetic import ArithmeticTask

    return ArithmeticTask(ops=("+", "*"), digits=1, seed=seed).train_prompts(n)


def model_dir(model: str) -> str:
    from policylab.models.loading import materialize_embedded

    return str(materialize_embedded()) if model == "embedded" else model


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def heldout_eval(model, tokenizer, n: int, seed: int) -> dict:
    """Sampled (T=1) accuracy on n held-out prompts, policylab's evaluator and FastEngine."""
    from policylab.engines.fast import FastEngine
    from policylab.eval.evaluate import evaluate
    from policylab.kernels.rewards import exact_numeric_reward
    from policylab.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask(ops=("+", "*"), digits=1, seed=seed)
    ex = task.heldout(n, repeat=True)
    prompts = [_encode(tokenizer, e.prompt) for e in ex]
    was = model.training
    model.eval()
    res = evaluate(FastEngine(model, tokenizer), prompts, [e.answer for e in ex], exact_numeric_reward,
                   temperature=1.0, max_new_tokens=48, batch_size=64, seed=seed + 999)
    model.train(was)
    return {k: res[k] for k in ("accuracy", "accuracy_stderr", "mean_length", "n_prompts")}


def _encode(tokenizer, prompt: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


# ------------------------------------------------------------------------ workers
def worker_policylab(a) -> dict:
    import torch

    from policylab.trainer.config import config_from_dict
    from policylab.trainer.loop import Trainer

    plain = a.worker == "policylab-plain"  # ablation: HF generate, no shared prompt prefix
    fast = a.worker == "policylab-fast"  # the fast mode: bf16 sampler + TIS
    cfg = {
        "method": "grpo", "model": a.model, "seed": a.seed, "method_params": {"kl_coef": 0.0},
        "keep_freed_memory": a.worker != "policylab-system",
        "task": {"name": "arithmetic", "ops": ["+", "*"], "digits": 1},
        "rollout": {"prompts_per_step": a.prompts, "group_size": a.group, "max_new_tokens": a.max_new_tokens,
                    "temperature": 1.0, "engine": "hf" if plain else "fast-bf16" if fast else a.engine,
                    "engine_dtype": "fp32" if fast else a.engine_dtype},
        "train": {"steps": a.steps, "lr": a.lr, "dtype": a.fast_train_dtype if fast else a.train_dtype,
                  "micro_batch_size": a.micro_batch,
                  "grad_clip": 1.0, "shared_prefix": not plain},
        "eval": {"before": False, "after": False}, "log": {"tensorboard": False, "progress": False},
        "run_dir": tempfile.mkdtemp(prefix="vs_trl_policylab_"),
    }
    t0 = time.perf_counter()
    trainer = Trainer(config_from_dict(cfg))
    setup_s = time.perf_counter() - t0
    steps = []
    t_train = time.perf_counter()
    for _ in range(a.steps):
        m = trainer.train_step()
        steps.append({
            "step_s": m["time/step_s"], "generate_s": m["time/generate_s"], "train_s": m.get("time/train_s"),
            "reward": m.get("reward/mean"), "completion_len": m.get("response/length_mean"),
            "completions": m.get("rollout/sequences", 0),
        })
        print(f"[{a.worker}] step {len(steps)}: {m['time/step_s']:.1f}s (generate {m['time/generate_s']:.1f}s, "
              f"train {m.get('time/train_s', 0):.1f}s) reward {m.get('reward/mean', float('nan')):.3f} "
              f"len {m.get('response/length_mean', float('nan')):.1f}", flush=True)
    train_wall = time.perf_counter() - t_train
    out = {"side": a.worker, "engine": trainer.engine.engine_name, "allocator": _allocator(), "shared_prefix": trainer.cfg.train.shared_prefix,
           "train_dtype": trainer.cfg.train.dtype,
           "corrections": [st.name for st in trainer.method.corrections],
           "micro_batch": trainer.cfg.train.micro_batch_size,
           "setup_s": setup_s, "train_wall_s": train_wall, "steps": steps, "peak_rss_mb": peak_rss_mb(),
           "threads": torch.get_num_threads()}
    if a.eval_n:
        out["heldout"] = heldout_eval(trainer.model, trainer.tokenizer, a.eval_n, a.seed)
    out["prompts_seen"] = None  # the trainer draws them from the same ArithmeticTask stream
    return out


def worker_trl(a) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from policylab.trainer import runtime
    from policylab.kernels.rewards import exact_numeric_reward

    if a.worker == "trl-keep":
        runtime.keep_freed_memory()  # the process setting the policylab trainer applies
    examples = shared_prompts(a.prompts * a.steps, a.seed)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": e.prompt}], "answer": e.answer}
                            for e in examples])
    seen: list[str] = []
    rewards: list[float] = []

    def reward(prompts, completions, answer, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        for p in prompts:
            text = p[-1]["content"] if isinstance(p, list) else p
            if not seen or seen[-1] != text:
                seen.append(text)
        r = exact_numeric_reward(texts, list(answer))
        rewards.append(sum(r) / len(r))
        return r

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)
            print(f"[{a.worker}] step {len(self.times)}: {self.times[-1]:.1f}s", flush=True)

    G = a.group
    B = a.prompts * G
    if B % a.micro_batch:
        raise SystemExit(f"--micro-batch {a.micro_batch} must divide {B}")
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="vs_trl_trl_"), use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=a.micro_batch, gradient_accumulation_steps=B // a.micro_batch,
        num_generations=G, max_completion_length=a.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, beta=0.0, loss_type="grpo",
        scale_rewards="group", num_iterations=1, epsilon=0.2, max_steps=a.steps, logging_steps=1,
        report_to="none", save_strategy="no", gradient_checkpointing=a.trl_gradient_checkpointing,
        seed=a.seed, data_seed=a.seed, shuffle_dataset=False, dataloader_num_workers=0,
        remove_unused_columns=False, disable_tqdm=True, log_completions=False,
    )
    t0 = time.perf_counter()
    timer = StepTimer()
    trainer = GRPOTrainer(model=model_dir(a.model), reward_funcs=[reward], args=cfg, train_dataset=ds,
                          callbacks=[timer])
    setup_s = time.perf_counter() - t0
    t_train = time.perf_counter()
    trainer.train()
    train_wall = time.perf_counter() - t_train
    rss = peak_rss_mb()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    steps = [{"step_s": t, "reward": (logs[i]["reward"] if i < len(logs) else None),
              "completion_len": (logs[i].get("completions/mean_length") if i < len(logs) else None),
              "completions": B} for i, t in enumerate(timer.times)]
    out = {"side": a.worker, "engine": "trl-transformers-generate", "allocator": _allocator(), "setup_s": setup_s, "train_wall_s": train_wall,
           "steps": steps, "peak_rss_mb": rss, "threads": torch.get_num_threads(),
           "prompts_seen": seen, "reward_fn_means": rewards}
    if a.eval_n:
        out["heldout"] = heldout_eval(trainer.model, trainer.processing_class, a.eval_n, a.seed)
    return out


def _allocator() -> str:
    from policylab.trainer import runtime
    from policylab.trainer.allocator import in_force

    lim = runtime.applied_limit()
    parts = [] if lim is None else [f"keep freed blocks <= {lim >> 20} MiB"]
    return ", ".join(parts + [t for t in [in_force()] if t]) or "glibc default"


# ------------------------------------------------------------------------ parent
def run_worker(side: str, a, passthrough: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               WANDB_DISABLED="true", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    if side.startswith("policylab") and side != "policylab-system":
        # the environment the `policylab` command runs in (policylab.trainer.allocator):
        # glibc's tcache and fast bins off; TRL and the glibc-defaults ablation as they are
        from policylab.trainer.allocator import tunables_env

        env = tunables_env(env)
    load = os.getloadavg()[0]
    cmd = [sys.executable, str(HERE), "--worker", side, "--worker-out", path, *passthrough]
    proc = subprocess.run(cmd, env=env)
    if proc.returncode:
        raise SystemExit(f"the {side} worker failed (exit {proc.returncode}): {' '.join(cmd)}")
    res = json.loads(Path(path).read_text())
    Path(path).unlink()
    res["load_before"] = round(load, 2)
    res["load_after"] = round(os.getloadavg()[0], 2)
    return res


def summarize(res: dict) -> dict:
    steps = res["steps"]
    n = sum(s["completions"] for s in steps)
    total = sum(s["step_s"] for s in steps)
    return {"completions": n, "total_step_s": total, "completions_per_s": n / total if total else 0.0,
            "mean_step_s": total / max(len(steps), 1), "last_reward": steps[-1]["reward"] if steps else None,
            "mean_len": sum((s["completion_len"] or 0.0) for s in steps) / max(len(steps), 1),
            "mean_reward": (sum(s["reward"] for s in steps if s["reward"] is not None) / len(steps)) if steps else None}


def t_interval(values: list[float]) -> dict:
    """Mean of `values` with a two-sided 95% Student t interval from their spread (n − 1
    degrees of freedom); `lower` when the interval lies entirely below 0. One value: no
    interval (lo, hi None)."""
    from policylab.experiments.evidence.verdict import mean_se, t_crit

    m, se = mean_se(values)
    if se is None:
        return {"n": 1, "mean": m, "se": None, "lo": None, "hi": None, "lower": False}
    half = t_crit(len(values) - 1) * se
    return {"n": len(values), "mean": m, "se": se, "lo": m - half, "hi": m + half, "lower": m + half < 0}


def reward_vs_trl(side: dict, trl: dict) -> dict:
    """policylab's reward minus TRL's, with a 95% interval, two ways.

    training: per step, over the same prompts on both sides (paired by step; a step's
    reward is the mean over its prompts x samples), mean of the differences and a t
    interval over the steps. held-out (when both sides ran `--eval-n`): accuracy
    difference on the same held-out prompts, normal interval from the two standard errors.
    `lower` is True only when the interval lies entirely below 0 (TRL's reward is higher
    beyond noise)."""
    pairs = [(a["reward"], b["reward"]) for a, b in zip(side["steps"], trl["steps"])
             if a["reward"] is not None and b["reward"] is not None]
    out: dict = {}
    if len(pairs) >= 2:
        iv = t_interval([a - b for a, b in pairs])
        out["training"] = {"diff": iv["mean"], "lo": iv["lo"], "hi": iv["hi"], "steps": iv["n"], "lower": iv["lower"]}
    if "heldout" in side and "heldout" in trl:
        a, b = side["heldout"], trl["heldout"]
        diff = a["accuracy"] - b["accuracy"]
        half = 1.96 * (a["accuracy_stderr"] ** 2 + b["accuracy_stderr"] ** 2) ** 0.5
        out["heldout"] = {"diff": diff, "lo": diff - half, "hi": diff + half, "n": a["n_prompts"],
                          "lower": diff + half < 0}
    return out


def _fmt_vs_trl(c: dict | None) -> str:
    if not c:
        return "-"
    return (f"{c['diff']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}]"
            + (" lower" if c["lower"] else " within noise or higher"))


def machine() -> str:
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from policylab.engines.cpu import cpu_flags, describe_cpu

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    flags = describe_cpu(cpu_flags()).split("; ", 1)[-1]  # the CPU features the run had
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, {platform.system()} {platform.release()}; {flags}"


def to_markdown(report: dict) -> str:
    sides = [s for s in SIDES if report["sides"].get(s)]
    R = report["sides"]
    lines = [
        "# policylab vs TRL GRPOTrainer: same work, side by side",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']}; torch {report['torch']}, transformers {report['transformers']}, "
        f"trl {report.get('trl_version')}  ",
        f"Configuration: {report['config']}",
        "",
        "| | " + " | ".join(sides) + " |",
        "|---|" + "---:|" * len(sides),
    ]

    def row(name, fn):
        lines.append(f"| {name} | " + " | ".join(fn(R[s]) for s in sides) + " |")

    row("engine", lambda r: r["engine"])
    row("train dtype / corrections", lambda r: f"{r.get('train_dtype', 'fp32')} / {', '.join(r.get('corrections') or []) or 'none'}")
    row("allocator", lambda r: r.get("allocator", "glibc default"))
    row("micro-batch", lambda r: str(r.get("micro_batch", report["micro_batch"])))
    row("per-step time (s)", lambda r: ", ".join(f"{x['step_s']:.1f}" for x in r["steps"]))
    row("mean step (s)", lambda r: f"{r['summary']['mean_step_s']:.1f}")
    row("completions/s", lambda r: f"**{r['summary']['completions_per_s']:.2f}**")
    row("ratio vs TRL (completions/s)", lambda r: f"{r.get('ratio_vs_trl', float('nan')):.2f}")
    row("reward per step (training batch)",
        lambda r: ", ".join(f"{x['reward']:.3f}" for x in r["steps"] if x["reward"] is not None))
    row("reward after the last step", lambda r: f"{r['summary']['last_reward']:.3f}")
    row("mean reward over the steps", lambda r: f"{r['summary']['mean_reward']:.3f}")
    row("mean completion length", lambda r: f"{r['summary']['mean_len']:.1f}")
    row("peak RSS (MB)", lambda r: f"{r['peak_rss_mb']:.0f}")
    row("setup: load model etc. (s, untimed)", lambda r: f"{r['setup_s']:.1f}")
    row("load average before / after", lambda r: f"{r['load_before']} / {r['load_after']}")
    if any("heldout" in R[s] for s in sides):
        row("held-out sampled accuracy after training",
            lambda r: (f"{r['heldout']['accuracy']:.3f} ± {r['heldout']['accuracy_stderr']:.3f} "
                       f"(n={r['heldout']['n_prompts']})") if "heldout" in r else "-")
    if any("reward_vs_trl" in R[s] for s in sides):
        row("training reward − TRL's, 95% CI (paired by step)",
            lambda r: _fmt_vs_trl(r.get("reward_vs_trl", {}).get("training")))
        if any("heldout" in R[s].get("reward_vs_trl", {}) for s in sides):
            row("held-out accuracy − TRL's, 95% CI",
                lambda r: _fmt_vs_trl(r.get("reward_vs_trl", {}).get("heldout")))
    for s in sides:
        if s.startswith("policylab"):
            st = R[s]["steps"]
            lines += ["", f"{s}: generate {sum(x['generate_s'] for x in st):.1f} s + train "
                          f"{sum((x['train_s'] or 0.0) for x in st):.1f} s over {len(st)} steps; "
                          f"engine {R[s]['engine']}, shared prompt prefix {'on' if R[s]['shared_prefix'] else 'off'}"]
    if "same_prompts" in report:
        lines += ["", f"Same prompts in the same order on every side: {report['same_prompts']}."]
    if "ratio_vs_trl_keep" in report:
        lines += ["", f"ratio vs TRL with the same allocator setting (trl-keep): {report['ratio_vs_trl_keep']:.2f}"]
    if "ratio_vs_trl_fast" in report:
        lines += ["", f"**ratio_vs_trl_fast = {report['ratio_vs_trl_fast']:.2f}** (the fast mode, "
                      "rollout.engine=fast-bf16 with TIS, completions/s / TRL completions/s)"]
    if "ratio_vs_trl" in report:
        lines += ["", f"**ratio_vs_trl = {report['ratio_vs_trl']:.2f}** (policylab completions/s / TRL completions/s)"]
    for side, why in report.get("skipped", {}).items():
        lines += ["", f"{side}: not run, {why}."]
    return "\n".join(lines) + "\n"


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--model", default="embedded", help="'embedded' or a local HF model directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=5e-6)
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward, both sides")
    ap.add_argument("--engine", default="fast", choices=("fast", "hf", "auto"), help="policylab rollout engine")
    ap.add_argument("--engine-dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--train-dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--fast-train-dtype", default="auto", choices=("auto", "fp32", "bf16", "bf16-backward"),
                    help="train.dtype of the policylab-fast side (auto: the fast mode's own choice, "
                         "bf16-backward on a CPU with native bf16 as measured, policylab.methods.fast_mode)")
    ap.add_argument("--trl-gradient-checkpointing", action="store_true")
    ap.add_argument("--eval-n", type=int, default=0)
    ap.add_argument("--sides", default="trl,policylab,policylab-fast", help="comma list: which sides to run, in order")
    ap.add_argument("--out", default=str(RESULTS / "vs_trl"), help="results path without suffix ('' = none)")
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def worker_args(argv: list[str], sides_arg: str, choices: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the arguments every side's worker gets: all but --out / --sides and their values,
    the sides asked for); an unknown side is refused naming the choices."""
    passthrough, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in ("--out", "--sides"):
            skip = True
        elif not x.startswith(("--out=", "--sides=")):
            passthrough.append(x)
    sides = [s for s in sides_arg.split(",") if s]
    bad = [s for s in sides if s not in choices]
    if bad:
        raise SystemExit(f"unknown side(s) {bad}; choose from {choices}")
    return passthrough, sides


def without_fast_side_here(sides: list[str]) -> tuple[list[str], dict[str, str]]:
    """(the sides this host can run, {side: why} for the ones it cannot): the fast mode's
    side (rollout.engine=fast-bf16) needs native bf16, which the trainer refuses to emulate."""
    from policylab.engines import cpu

    if "policylab-fast" not in sides or cpu.native_bf16(cpu.cpu_flags()):
        return sides, {}
    why = (f"this CPU has no native bf16 ({cpu.describe_cpu()}): the trainer refuses rollout.engine=fast-bf16 "
           "here, so the fast mode's side was not run")
    print(f"policylab-fast skipped: {why}", flush=True)
    return [s for s in sides if s != "policylab-fast"], {"policylab-fast": why}


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse(argv)
    if a.worker:
        sys.path.insert(0, str(HERE.parent))
        res = (worker_trl if a.worker.startswith("trl") else worker_policylab)(a)
        Path(a.worker_out).write_text(json.dumps(res))
        return res
    import importlib.util

    import torch
    import transformers

    passthrough, sides = worker_args(argv, a.sides, SIDES)
    have_trl = importlib.util.find_spec("trl") is not None
    if any(s.startswith("trl") for s in sides) and not have_trl:
        print("trl is not installed: skipping the TRL sides (make bench installs trl==1.16.0)", flush=True)
        sides = [s for s in sides if not s.startswith("trl")]
    sides, skipped = without_fast_side_here(sides)
    results = {s: run_worker(s, a, passthrough) for s in sides}
    for r in results.values():
        r["summary"] = summarize(r)
    report = {
        "command": "python benchmarks/vs_trl.py " + " ".join(argv),
        "machine": machine(), "torch": torch.__version__, "transformers": transformers.__version__,
        "trl_version": __import__("trl").__version__ if have_trl else None,
        "config": (f"{a.prompts} prompts x {a.group} samples per step, <= {a.max_new_tokens} new tokens, "
                   f"temperature 1, lr {a.lr}, {a.steps} steps, micro-batch {a.micro_batch}, seed {a.seed}, "
                   f"fp32 weights, train dtype {a.train_dtype}, policylab engine {a.engine}-{a.engine_dtype}"
                   + (", TRL gradient checkpointing ON (its default)" if a.trl_gradient_checkpointing
                      else ", TRL gradient checkpointing OFF")),
        "sides": results, "micro_batch": a.micro_batch, "skipped": skipped,
    }
    trl = results.get("trl")
    if trl:
        want = [e.prompt for e in shared_prompts(a.prompts * a.steps, a.seed)]
        report["same_prompts"] = trl["prompts_seen"] == want
        for name, r in results.items():
            r["ratio_vs_trl"] = r["summary"]["completions_per_s"] / trl["summary"]["completions_per_s"]
            if name.startswith("policylab"):
                r["reward_vs_trl"] = reward_vs_trl(r, trl)
        if "policylab" in results:
            report["ratio_vs_trl"] = results["policylab"]["ratio_vs_trl"]
        if "policylab-fast" in results:
            report["ratio_vs_trl_fast"] = results["policylab-fast"]["ratio_vs_trl"]
    if "trl-keep" in results and "policylab" in results:
        report["ratio_vs_trl_keep"] = (results["policylab"]["summary"]["completions_per_s"]
                                       / results["trl-keep"]["summary"]["completions_per_s"])
    for s, r in results.items():
        sm = r["summary"]
        print(f"{s:17s} per-step s: " + ", ".join(f"{x['step_s']:.1f}" for x in r["steps"]))
        print(f"{s:17s} completions/s {sm['completions_per_s']:.3f}   reward after last step {sm['last_reward']:.3f}"
              f"   mean reward {sm['mean_reward']:.3f}   peak RSS {r['peak_rss_mb']:.0f} MB"
              + (f"   held-out acc {r['heldout']['accuracy']:.3f}" if "heldout" in r else ""))
    if a.out and results:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=2))
        out.with_suffix(".md").write_text(to_markdown(report))
    if "ratio_vs_trl_keep" in report:
        print(f"ratio_vs_trl_keep={report['ratio_vs_trl_keep']:.3f}  (TRL with the same allocator setting)")
    if "ratio_vs_trl_fast" in report:
        print(f"ratio_vs_trl_fast={report['ratio_vs_trl_fast']:.3f}  (the fast mode: rollout.engine=fast-bf16, "
              f"train dtype {results['policylab-fast'].get('train_dtype', a.fast_train_dtype)})")
    if "ratio_vs_trl" in report:
        print(f"ratio_vs_trl={report['ratio_vs_trl']:.3f}")
    return report


if __name__ == "__main__":
    main()
