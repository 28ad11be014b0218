"""Learning speed against TRL: held-out accuracy against training wall-clock, TRL 1.16.0's
GRPOTrainer and policylab's GRPO, each for the same wall-clock budget.

    make learn-vs-trl                             # installs trl==1.16.0 into .venv, runs this
    .venv/bin/python benchmarks/learn_vs_trl.py [--task arith2_add] [--budget-s 900] [--eval-every-s 50]
                                                [--seeds 0,1] [--sides trl,policylab,policylab-fast]
                                                [--parts DIR]   # resume: finished side/seed runs are kept there

Both sides: the same model (fp32 weights, fp32 training), the same task and the same
training prompts in the same order (the task's training stream of --seed, as
`policylab train` draws it; TRL reads them from a dataset in that order,
shuffle_dataset=False), the same group size, prompts per step, max new tokens,
temperature 1, learning rate (constant), AdamW betas, grad-norm clip 1.0, no reference
model (TRL beta=0), GRPO with group-standardized advantages, PPO clip 0.2, one optimizer
step per batch, per-sequence token mean, the same micro-batch; the TRL settings are
benchmarks/vs_trl.py's (its docstring says which differ from TRL's defaults, and why).

One held-out evaluator for both: policylab's (`policylab.eval.evaluate`, the task's held-out
split and verifier, one sample per prompt at T = 1, the same seed at every evaluation),
run on each side's current weights with the FastEngine, outside the timed training. The
evaluations happen at the first step end after every --eval-every-s seconds of training
(and at 0 s, and at the end), so both sides are measured at matching wall-clock points;
`--eval-every-steps N` evaluates at every N-th step instead (the time of each point is
still recorded, so the ratio below is computed the same way).
Each side trains until its training wall-clock (evaluations excluded) reaches
--budget-s, in its own subprocess (peak RSS its own). Tasks: the candidates of
benchmarks/base_accuracy.py (--task NAME).

Sides: "trl", "policylab" (exact fp32: the FastEngine in fp32) and "policylab-fast" (the
fast mode, `rollout.engine: fast-bf16`: the bf16 FastEngine samples, TIS on the engine ratio
corrects the mismatch; train.dtype from --fast-train-dtype, by default the fast mode's own
`auto`: bf16-backward on a CPU with native bf16; `--fast-correction none` makes it a
diagnostic instead: the same bf16 sampler and training dtype with the mismatch left
uncorrected, to tell the sampler's draws from TIS's reweighting). Every side
runs once per seed of --seeds (default 0 and 1: the prompt stream, the initial sampling and
the evaluation draws all follow the seed; TRL and policylab share each seed's stream).

Result: accuracy against time for every side and seed, and per seed and policylab side

    A_trl    TRL's accuracy at its last evaluation
    t_trl    the time of TRL's first evaluation at or above A_trl
    t_pl     the time of policylab's first evaluation at or above A_trl
    time_to_trl_accuracy_ratio = t_trl / t_pl   (> 1: policylab reaches TRL's final accuracy sooner)

If policylab never reaches A_trl within the budget, the ratio is bounded: "<t_trl/budget"
is printed. If A_trl is not above the base accuracy (TRL did not learn), the ratio is
"nan". Over the seeds: every seed's ratio, their mean, min and max (the spread). The fast
mode is also compared with exact fp32 at equal steps: each one's held-out accuracy at the
last step both reached (linear between its evaluations), with the binomial standard error.
The last line printed is `time_to_trl_accuracy_ratio=...` (exact fp32; the fast mode's is
the line before, `time_to_trl_accuracy_ratio_fast=...`). Writes
benchmarks/results/learn_vs_trl.{json,md,png}.
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
SIDES = ("trl", "policylab", "policylab-fast")
POLICYLAB_SIDES = ("policylab", "policylab-fast")


def _bench(name: str):
    sys.path.insert(0, str(HERE.parent))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(HERE.parent))


def task_section(name: str) -> tuple[dict, int]:
    cands = _bench("base_accuracy").CANDIDATES
    if name not in cands:
        raise SystemExit(f"unknown --task {name!r}; choose from {', '.join(cands)}")
    return cands[name]


def build(a):
    from policylab.trainer.config import TaskConfig
    from policylab.tasks.source import build_task

    section, _ = task_section(a.task)
    cfg = TaskConfig()
    for k, v in section.items():
        setattr(cfg, k, tuple(v) if isinstance(getattr(cfg, k), tuple) else v)
    return cfg, build_task(cfg, seed=a.seed)


class Clock:
    """Training wall-clock with the evaluations taken out, and the evaluation schedule:
    every `every` seconds of training, or (`every_steps` > 0) every `every_steps` steps."""

    def __init__(self, every: float, every_steps: int = 0):
        self.every, self.t0, self.paused, self.next = every, time.perf_counter(), 0.0, every
        self.every_steps = int(every_steps)

    def train_seconds(self) -> float:
        return time.perf_counter() - self.t0 - self.paused

    def due(self, step: int | None = None) -> bool:
        if self.every_steps > 0:
            return step is not None and step > 0 and step % self.every_steps == 0
        return self.every > 0 and self.train_seconds() >= self.next

    def evaluated(self, seconds: float) -> None:
        self.paused += seconds
        while self.every > 0 and self.next <= self.train_seconds():
            self.next += self.every


def heldout(model, tokenizer, a, task, reward) -> dict:
    from policylab.engines.fast import FastEngine
    from policylab.eval.evaluate import evaluate

    vs = _bench("vs_trl")
    ex = task.heldout(a.eval_n)
    prompts = [vs._encode(tokenizer, e.prompt) for e in ex]
    was = model.training
    model.eval()

    def score(**engine) -> dict:
        return evaluate(FastEngine(model, tokenizer, **engine), prompts, [e.answer for e in ex], reward,
                        temperature=1.0, max_new_tokens=a.max_new_tokens, batch_size=50, seed=a.seed + 999)

    res = score()
    out = {k: res[k] for k in ("accuracy", "accuracy_stderr", "mean_length", "n_prompts")}
    if a.eval_bf16:  # the same prompts and random numbers, sampled by the fast mode's bf16 engine
        import torch

        res = score(dtype=torch.bfloat16)
        out.update(accuracy_bf16=res["accuracy"], accuracy_bf16_stderr=res["accuracy_stderr"])
    model.train(was)
    return out


def _eval_point(points, clock, step, model, tokenizer, a, task, reward, side):
    t_train = clock.train_seconds()
    t0 = time.perf_counter()
    res = heldout(model, tokenizer, a, task, reward)
    clock.evaluated(time.perf_counter() - t0)
    points.append({"seconds": t_train, "step": step, **res, "eval_s": time.perf_counter() - t0})
    print(f"[{side}] {t_train:7.1f} s  step {step:4d}  held-out accuracy {res['accuracy']:.3f} "
          f"± {res['accuracy_stderr']:.3f}" + (f" (bf16 engine {res['accuracy_bf16']:.3f})" if "accuracy_bf16" in res
                                                else ""), flush=True)


# ------------------------------------------------------------------------ workers
def worker_policylab(a) -> dict:
    import torch

    from policylab.trainer.config import config_from_dict
    from policylab.trainer.loop import Trainer

    section, _ = task_section(a.task)
    tcfg, task = build(a)
    fast = a.worker == "policylab-fast"
    uncorrected = fast and a.fast_correction == "none"
    dtype = a.fast_train_dtype if fast else "fp32"
    if uncorrected and dtype == "auto":  # the dtype the fast mode's auto picks, without its correction
        from policylab.methods.fast_mode import train_dtype

        dtype = train_dtype("fast-bf16")
    engine = {"engine": "fast", "engine_dtype": "bf16"} if uncorrected else \
        {"engine": "fast-bf16" if fast else "fast"}
    cfg = config_from_dict({
        "method": "grpo", "model": a.model, "seed": a.seed, "method_params": {"kl_coef": 0.0},
        "task": section,
        "rollout": {"prompts_per_step": a.prompts, "group_size": a.group, "max_new_tokens": a.max_new_tokens,
                    "temperature": 1.0, **engine},
        "train": {"steps": a.max_steps, "lr": a.lr, "micro_batch_size": a.micro_batch, "grad_clip": 1.0,
                  "dtype": dtype},
        "eval": {"before": False, "after": False}, "log": {"tensorboard": False, "progress": False},
        "run_dir": tempfile.mkdtemp(prefix="learn_vs_trl_policylab_"),
    })
    trainer = Trainer(cfg)
    reward = trainer.task.reward_fn
    points: list[dict] = []
    seen: list[str] = []
    next_train = trainer.task.next_train

    def recorded(n):
        out = next_train(n)
        seen.extend(e.prompt for e in out)
        return out

    trainer.task.next_train = recorded
    clock = Clock(a.eval_every_s, a.eval_every_steps)
    _eval_point(points, clock, 0, trainer.model, trainer.tokenizer, a, task, reward, a.worker)
    steps = []
    while clock.train_seconds() < a.budget_s and trainer.step < a.max_steps:
        m = trainer.train_step()
        steps.append({"step_s": m["time/step_s"], "reward": m.get("reward/mean"),
                      **{k: m[k] for k in ("correction/tis/frac_capped", "mismatch/old_vs_behavior_abs_dlogp_mean")
                         if k in m}})
        if clock.due(trainer.step):
            _eval_point(points, clock, trainer.step, trainer.model, trainer.tokenizer, a, task, reward, a.worker)
    if points[-1]["step"] != trainer.step:
        _eval_point(points, clock, trainer.step, trainer.model, trainer.tokenizer, a, task, reward, a.worker)
    vs = _bench("vs_trl")
    return {"side": a.worker, "seed": a.seed, "engine": trainer.engine.engine_name, "train_dtype": cfg.train.dtype,
            "corrections": [st.name for st in trainer.method.corrections], "points": points, "steps": steps,
            "train_seconds": clock.train_seconds(), "peak_rss_mb": vs.peak_rss_mb(),
            "threads": torch.get_num_threads(), "prompts_seen": seen}


def worker_trl(a) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    vs = _bench("vs_trl")
    _, task = build(a)
    reward_fn = task.reward_fn
    _, stream = build(a)  # a second copy of the stream: the training prompts, in order
    examples = stream.next_train(a.prompts * a.max_steps)
    by_prompt = {e.prompt: e.answer for e in examples}  # the task's answers (they may carry the entry)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": e.prompt}], "key": e.prompt} for e in examples])
    seen: list[str] = []
    steps: list[dict] = []
    G = a.group

    def reward(prompts, completions, key, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        if len(key) % G:
            raise RuntimeError(f"TRL scored {len(key)} completions, not whole groups of {G}")
        seen.extend(key[::G])  # completions come in groups of G (one prompt each); a prompt drawn twice in a row counts twice
        r = [float(x) for x in reward_fn(texts, [by_prompt[k] for k in key])]
        steps.append({"reward": sum(r) / len(r)})
        return r

    points: list[dict] = []
    clock_box: dict = {}

    class Timed(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, processing_class=None, **kw):
            clock_box["clock"] = Clock(a.eval_every_s, a.eval_every_steps)

        def on_step_end(self, args, state, control, model=None, **kw):
            clock = clock_box["clock"]
            if clock.train_seconds() >= a.budget_s:
                control.should_training_stop = True
            elif clock.due(state.global_step):
                _eval_point(points, clock, state.global_step, model, trainer.processing_class, a, task, reward_fn,
                            a.worker)
            return control

    B = a.prompts * a.group
    if B % a.micro_batch:
        raise SystemExit(f"--micro-batch {a.micro_batch} must divide {B}")
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="learn_vs_trl_trl_"), use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=a.micro_batch, gradient_accumulation_steps=B // a.micro_batch,
        num_generations=G, max_completion_length=a.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, beta=0.0, loss_type="grpo",
        scale_rewards="group", num_iterations=1, epsilon=0.2, max_steps=a.max_steps, logging_steps=1,
        report_to="none", save_strategy="no", gradient_checkpointing=False,
        seed=a.seed, data_seed=a.seed, shuffle_dataset=False, dataloader_num_workers=0,
        remove_unused_columns=False, disable_tqdm=True, log_completions=False,
    )
    trainer = GRPOTrainer(model=vs.model_dir(a.model), reward_funcs=[reward], args=cfg, train_dataset=ds,
                          callbacks=[Timed()])
    # base accuracy at 0 s, before the clock starts (it starts at on_train_begin)
    base_clock = Clock(0.0)
    _eval_point(points, base_clock, 0, trainer.model, trainer.processing_class, a, task, reward_fn, a.worker)
    points[0]["seconds"] = 0.0
    trainer.train()
    clock = clock_box["clock"]
    step = trainer.state.global_step
    if points[-1]["step"] != step:
        _eval_point(points, clock, step, trainer.model, trainer.processing_class, a, task, reward_fn, a.worker)
    return {"side": a.worker, "seed": a.seed, "engine": "trl-transformers-generate", "points": points, "steps": steps,
            "train_seconds": clock.train_seconds(), "peak_rss_mb": vs.peak_rss_mb(),
            "threads": torch.get_num_threads(), "prompts_seen": seen}


# ------------------------------------------------------------------------ parent
def run_worker(side: str, argv: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               WANDB_DISABLED="true", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    load = os.getloadavg()[0]
    cmd = [sys.executable, str(HERE), "--worker", side, "--worker-out", path, *argv]
    proc = subprocess.run(cmd, env=env)
    if proc.returncode:
        raise SystemExit(f"the {side} worker failed (exit {proc.returncode}): {' '.join(cmd)}")
    res = json.loads(Path(path).read_text())
    Path(path).unlink()
    res["load_before"], res["load_after"] = round(load, 2), round(os.getloadavg()[0], 2)
    return res


def run_part(side: str, argv: list[str], parts: str, seed: int) -> dict:
    """One side and seed: its saved result from --parts when one was recorded with exactly
    these worker arguments, else a fresh run (saved there when --parts is set). A saved part
    with other arguments is an error, not a silent rerun or reuse."""
    if not parts:
        return run_worker(side, argv)
    path = Path(parts) / f"{side}-seed{seed}.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("part_argv") != argv:
            raise SystemExit(f"{path} was recorded with other arguments ({' '.join(saved.get('part_argv') or [])}) "
                             f"than this run's ({' '.join(argv)}); remove it or use another --parts directory")
        print(f"[{side} seed {seed}] reusing the part saved in {path}", flush=True)
        return saved
    res = run_worker(side, argv)
    res["part_argv"] = argv
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    tmp.replace(path)
    return res


def time_to(points: list[dict], level: float) -> float | None:
    for p in points:
        if p["accuracy"] >= level:
            return p["seconds"]
    return None


def ratio(results: dict, budget: float, side: str = "policylab") -> dict:
    """time_to_trl_accuracy_ratio of one seed: `results` maps "trl" and `side` to their runs."""
    trl, pl = results["trl"]["points"], results[side]["points"]
    a_trl, base = trl[-1]["accuracy"], trl[0]["accuracy"]
    out = {"trl_final_accuracy": a_trl, "trl_base_accuracy": base}
    if a_trl <= base:
        return {**out, "value": None, "text": "nan", "why": "TRL's final accuracy is not above its base accuracy"}
    t_trl, t_pl = time_to(trl, a_trl), time_to(pl, a_trl)
    out.update(t_trl=t_trl, t_policylab=t_pl)
    if t_pl is None:
        return {**out, "value": None, "text": f"<{t_trl / budget:.3f}",
                "why": f"{side} did not reach TRL's final accuracy within the budget (upper bound t_trl / budget)"}
    if t_pl == 0:
        return {**out, "value": None, "text": "nan", "why": f"{side}'s base accuracy is already at TRL's final one"}
    return {**out, "value": t_trl / t_pl, "text": f"{t_trl / t_pl:.3f}", "why": ""}


def spread(per_seed: dict) -> dict:
    """Summary of one side's per-seed ratios: every seed's text, and mean / min / max over
    the seeds whose ratio is a number (`text` names the bounded or undefined ones too)."""
    vals = [r["value"] for r in per_seed.values() if r["value"] is not None]
    texts = [r["text"] for r in per_seed.values()]
    out = {"per_seed": {str(k): r["text"] for k, r in per_seed.items()}, "n_values": len(vals)}
    if len(vals) == len(per_seed) and vals:
        mean = sum(vals) / len(vals)
        out.update(mean=mean, min=min(vals), max=max(vals),
                   text=f"{mean:.3f}" + (f" [{min(vals):.3f}, {max(vals):.3f}]" if len(vals) > 1 else ""))
    else:
        out["text"] = ", ".join(texts)
    return out


def accuracy_at_step(points: list[dict], step: float) -> tuple[float, float] | None:
    """(accuracy, its standard error) at `step`, linear between the two evaluations around
    it (None beyond the last one)."""
    for p, q in zip(points, points[1:]):
        if p["step"] <= step <= q["step"]:
            w = 0.0 if q["step"] == p["step"] else (step - p["step"]) / (q["step"] - p["step"])
            acc = (1 - w) * p["accuracy"] + w * q["accuracy"]
            se = ((1 - w) * p["accuracy_stderr"] + w * q["accuracy_stderr"])
            return acc, se
    if points and points[-1]["step"] == step:
        return points[-1]["accuracy"], points[-1]["accuracy_stderr"]
    return None


def equal_steps(exact: dict, fast: dict, names: tuple[str, str] = ("exact", "fast")) -> dict:
    """Run `fast` against run `exact` at the last step both reached (accuracy linear between
    evaluations): the difference fast - exact, its standard error and whether it is within
    2 of them. `names` are the keys of the two accuracies in the result."""
    step = min(exact["points"][-1]["step"], fast["points"][-1]["step"])
    e, f = accuracy_at_step(exact["points"], step), accuracy_at_step(fast["points"], step)
    diff = f[0] - e[0]
    se = (e[1] ** 2 + f[1] ** 2) ** 0.5
    a, b = names
    return {"step": step, a: e[0], f"{a}_se": e[1], b: f[0], f"{b}_se": f[1], "diff": diff,
            "diff_se": se, "within_2se": abs(diff) <= 2 * se}


def add_vs_trl_equal_steps(report: dict) -> None:
    """report["vs_trl_equal_steps"][side][seed]: every policylab side against TRL at the last
    step both reached (`equal_steps`)."""
    runs = report["runs"]
    if "trl" not in runs:
        return
    report["vs_trl_equal_steps"] = {
        side: {seed: equal_steps(runs["trl"][seed], runs[side][seed], ("trl", side))
               for seed in runs["trl"] if seed in runs[side]}
        for side in POLICYLAB_SIDES if side in runs}


def rewrite_report(path: str) -> dict:
    """Rewrites the markdown and the figure of a finished run from its JSON (`--report-from`),
    adding what later versions of this script compute from the same runs."""
    src = Path(path)
    report = json.loads(src.read_text())
    add_vs_trl_equal_steps(report)
    src.write_text(json.dumps(report, indent=2))
    plot(report["runs"], src.with_suffix(".png"), report["config"][:120],
         by_steps=report.get("eval_every_steps", 0) > 0)
    src.with_suffix(".md").write_text(to_markdown(report).replace("learn_vs_trl.png", src.with_suffix(".png").name))
    return report


def plot(runs: dict, path: Path, title: str, by_steps: bool = False) -> None:
    """Held-out accuracy against training wall-clock, or against optimizer steps for a run
    evaluated at fixed step counts (`--eval-every-steps`: it compares steps, and its
    seconds may come from a shared machine)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {}
    for side, by_seed in runs.items():
        for i, (seed, r) in enumerate(by_seed.items()):
            xs = [p["step" if by_steps else "seconds"] for p in r["points"]]
            ys = [p["accuracy"] for p in r["points"]]
            se = [p["accuracy_stderr"] for p in r["points"]]
            line, = ax.plot(xs, ys, marker="o", ms=3, ls="-" if i == 0 else "--", color=colors.get(side),
                            label=f"{side} seed {seed}")
            colors[side] = line.get_color()
            ax.fill_between(xs, [y - s for y, s in zip(ys, se)], [y + s for y, s in zip(ys, se)],
                            color=line.get_color(), alpha=0.1)
    ax.set_xlabel("optimizer steps" if by_steps else "training wall-clock (s, evaluations excluded)")
    ax.set_ylabel("held-out accuracy (T = 1)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def to_markdown(report: dict) -> str:
    runs = report["runs"]
    lines = ["# Learning speed: policylab GRPO vs TRL GRPOTrainer, same wall-clock budget", "",
             f"Command: `{report['command']}`  ", f"Machine: {report['machine']}; trl {report.get('trl_version')}  ",
             f"Configuration: {report['config']}", "", "| side | seed | engine / train dtype / corrections | "
             "training s | steps | held-out accuracy at (s) | peak RSS (MB) | load before / after |",
             "|---|---:|---|---:|---:|---|---:|---|"]
    for side, by_seed in runs.items():
        for seed, r in by_seed.items():
            pts = ", ".join(f"{100 * p['accuracy']:.1f}% ({p['seconds']:.0f})" for p in r["points"])
            eng = f"{r.get('engine')} / {r.get('train_dtype', 'fp32')} / {', '.join(r.get('corrections') or []) or 'none'}"
            lines.append(f"| {side} | {seed} | {eng} | {r['train_seconds']:.0f} | {r['points'][-1]['step']} | {pts} | "
                         f"{r['peak_rss_mb']:.0f} | {r['load_before']} / {r['load_after']} |")
    if "same_prompts" in report:
        lines += ["", f"Same training prompts in the same order per seed (over the prompts every side drew): "
                      f"{report['same_prompts']}."]
    for side, summ in report.get("ratios", {}).items():
        lines += ["", f"### {side}", ""]
        for seed, rt in summ["seeds"].items():
            lines.append(f"- seed {seed}: TRL's final accuracy {100 * rt['trl_final_accuracy']:.1f}% (base "
                         f"{100 * rt['trl_base_accuracy']:.1f}%), reached by TRL at {_secs(rt.get('t_trl'))}, by "
                         f"{side} at {_secs(rt.get('t_policylab'))}: ratio {rt['text']}. {rt['why']}".rstrip())
        key = "time_to_trl_accuracy_ratio" + ("_fast" if side == "policylab-fast" else "")
        lines += ["", f"**{key} = {summ['spread']['text']}** (mean [min, max] over the seeds; t_trl / t_{side}: "
                      f"> 1 means {side} reaches TRL's final accuracy sooner)"]
    for seed, eq in report.get("fast_vs_exact", {}).items():
        lines.append("")
        lines.append(f"Fast mode vs exact fp32 at equal steps (seed {seed}, step {eq['step']}): "
                     f"{100 * eq['fast']:.1f}% ± {100 * eq['fast_se']:.1f} vs {100 * eq['exact']:.1f}% ± "
                     f"{100 * eq['exact_se']:.1f} (difference {100 * eq['diff']:+.1f} ± {100 * eq['diff_se']:.1f} "
                     f"points; {'within' if eq['within_2se'] else 'outside'} 2 standard errors)")
    for side, why in report.get("skipped", {}).items():
        lines += ["", f"{side}: not run, {why}."]
    per_step = report.get("vs_trl_equal_steps", {})
    if per_step:
        lines += ["", "### Per optimizer step against TRL", "",
                  "Held-out accuracy at the last step both sides reached (TRL's, since it takes fewer steps in the "
                  "budget): the same configuration should learn about as much per step on either trainer; the "
                  "difference is policylab - TRL.", ""]
        for side, by_seed in per_step.items():
            for seed, eq in by_seed.items():
                lines.append(f"- {side}, seed {seed}, step {eq['step']}: {100 * eq[side]:.1f}% ± "
                             f"{100 * eq[side + '_se']:.1f} vs TRL {100 * eq['trl']:.1f}% ± {100 * eq['trl_se']:.1f} "
                             f"(difference {100 * eq['diff']:+.1f} ± {100 * eq['diff_se']:.1f} points; "
                             f"{'within' if eq['within_2se'] else 'outside'} 2 standard errors)")
    lines += ["", "![accuracy against wall-clock](learn_vs_trl.png)"]
    return "\n".join(lines) + "\n"


def _secs(t) -> str:
    return "never" if t is None else f"{t:.1f} s"


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="arith2_add", help="a candidate of benchmarks/base_accuracy.py")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # a worker's seed
    ap.add_argument("--seeds", default="0,1", help="comma list: every side runs once per seed")
    ap.add_argument("--budget-s", type=float, default=900.0, help="training wall-clock per side (evaluations excluded)")
    ap.add_argument("--eval-every-s", type=float, default=50.0)
    ap.add_argument("--eval-every-steps", type=int, default=0, help="> 0: evaluate every N steps instead of every "
                                                                    "--eval-every-s seconds")
    ap.add_argument("--fast-train-dtype", default="auto", choices=("auto", "fp32", "bf16", "bf16-backward"),
                    help="train.dtype of the policylab-fast side (auto: the fast mode's own choice, "
                         "bf16-backward on a CPU with native bf16 as measured, policylab.methods.fast_mode)")
    ap.add_argument("--fast-correction", default="tis", choices=("tis", "none"),
                    help="policylab-fast side: tis (the fast mode, rollout.engine=fast-bf16) or none (a diagnostic: "
                         "the same bf16 sampler as rollout.engine=fast with engine_dtype=bf16, the mismatch left "
                         "uncorrected)")
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--eval-bf16", action="store_true",
                    help="also evaluate every point with the bf16 engine on the same prompts and "
                         "random numbers (accuracy_bf16): whether a model does better under its sampler's numerics")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the task candidate's")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--max-steps", type=int, default=2000, help="step cap (the wall-clock budget ends the runs)")
    ap.add_argument("--sides", default="trl,policylab,policylab-fast")
    ap.add_argument("--out", default=str(RESULTS / "learn_vs_trl"), help="results path without suffix ('' = none)")
    ap.add_argument("--parts", default="", help="directory of finished side/seed runs: a run found there with the "
                    "same arguments is reused, a new one is saved there (resume a long measurement in parts)")
    ap.add_argument("--report-from", default="", help="a results JSON of this script: rewrite its .md and .png "
                    "(with the comparisons added since) and run nothing")
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.max_new_tokens is None:
        a.max_new_tokens = task_section(a.task)[1]
    try:
        a.seed_list = [int(x) for x in a.seeds.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--seeds must be comma-separated integers, got {a.seeds!r}") from None
    if not a.seed_list:
        raise SystemExit("--seeds names no seed")
    return a


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse(argv)
    if a.report_from:
        return rewrite_report(a.report_from)
    if a.worker:
        res = (worker_trl if a.worker == "trl" else worker_policylab)(a)
        Path(a.worker_out).write_text(json.dumps(res))
        return res
    import importlib.util

    sys.path.insert(0, str(HERE.parent))
    from vs_trl import worker_args

    passthrough, sides = worker_args(argv, a.sides, SIDES)
    passthrough = _without(passthrough, ("--seeds", "--seed", "--parts"))
    have_trl = importlib.util.find_spec("trl") is not None
    if "trl" in sides and not have_trl:
        print("trl is not installed: skipping the TRL side (make learn-vs-trl installs trl==1.16.0)", flush=True)
        sides = [s for s in sides if s != "trl"]
    vs_mod = _bench("vs_trl")
    sides, skipped = vs_mod.without_fast_side_here(sides)
    runs: dict[str, dict[int, dict]] = {s: {} for s in sides}
    for seed in a.seed_list:  # seed by seed: a seed's sides run back to back, under the same machine state
        for s in sides:
            runs[s][seed] = run_part(s, passthrough + ["--seed", str(seed)], a.parts, seed)
    _, task = build(a)
    vs = _bench("vs_trl")
    every = (f"every {a.eval_every_steps} steps" if a.eval_every_steps > 0 else f"every {a.eval_every_s:g} s")
    report = {
        "command": "python benchmarks/learn_vs_trl.py " + " ".join(argv), "machine": vs.machine(),
        "trl_version": __import__("trl").__version__ if have_trl else None, "task": task.describe,
        "config": (f"task {a.task} ({task.describe}); {a.prompts} prompts x {a.group} samples per step, <= "
                   f"{a.max_new_tokens} new tokens, temperature 1, lr {a.lr} constant, micro-batch {a.micro_batch}, "
                   f"seeds {','.join(map(str, a.seed_list))}, fp32 weights (policylab-fast: "
                   + ("rollout.engine=fast-bf16" if a.fast_correction == "tis" else
                      "the bf16 sampler WITHOUT the correction (rollout.engine=fast, engine_dtype=bf16)")
                   + f", train dtype {a.fast_train_dtype}); budget {a.budget_s:g} s of training per side, evaluated "
                   f"{every} on {a.eval_n} held-out prompts"),
        "runs": runs, "skipped": skipped, "eval_every_steps": a.eval_every_steps,
    }
    if "trl" in runs and any(s in runs for s in POLICYLAB_SIDES):
        same = []
        for seed in a.seed_list:
            seen = [runs[s][seed]["prompts_seen"] for s in runs]
            n = min(len(x) for x in seen)
            same.append(n > 0 and all(x[:n] == seen[0][:n] for x in seen))
        report["same_prompts"] = all(same)
        report["ratios"] = {}
        for side in POLICYLAB_SIDES:
            if side in runs:
                per = {seed: ratio({"trl": runs["trl"][seed], side: runs[side][seed]}, a.budget_s, side)
                       for seed in a.seed_list}
                report["ratios"][side] = {"seeds": per, "spread": spread(per)}
    if all(s in runs for s in POLICYLAB_SIDES):
        report["fast_vs_exact"] = {seed: equal_steps(runs["policylab"][seed], runs["policylab-fast"][seed])
                                   for seed in a.seed_list}
    add_vs_trl_equal_steps(report)
    for s, by_seed in runs.items():
        for seed, r in by_seed.items():
            r["prompts_seen"] = len(r["prompts_seen"])
            print(f"{s:15s} seed {seed} " + "  ".join(f"{p['seconds']:.0f}s:{p['accuracy']:.3f}" for p in r["points"]))
    if a.out and runs:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=2))
        plot(runs, out.with_suffix(".png"), report["config"][:120], by_steps=a.eval_every_steps > 0)
        md = to_markdown(report).replace("learn_vs_trl.png", out.with_suffix(".png").name)
        out.with_suffix(".md").write_text(md)
    for side in ("policylab-fast", "policylab"):  # exact fp32 last: its line is the last one printed
        if side in report.get("ratios", {}):
            summ = report["ratios"][side]
            for seed, rt in summ["seeds"].items():
                print(f"[{side} seed {seed}] time_to_trl_accuracy_s: trl={rt.get('t_trl')} {side}="
                      f"{rt.get('t_policylab')} (TRL final accuracy {rt['trl_final_accuracy']:.3f}) {rt['why']}".rstrip())
            key = "time_to_trl_accuracy_ratio" + ("_fast" if side == "policylab-fast" else "")
            print(f"{key}={summ['spread']['text']}")
    return report


def _without(argv: list[str], names: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in names:
            skip = True
        elif not any(x.startswith(n + "=") for n in names):
            out.append(x)
    return out


if __name__ == "__main__":
    main()
