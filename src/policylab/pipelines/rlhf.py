"""InstructGPT's three stages as one pipeline: `policylab pipeline ppo_rlhf CONFIG`.

"Training language models to follow instructions with human feedback" (Ouyang et al.,
arXiv 2203.02155). Each stage writes a checkpoint the next one loads:

    1. sft/            SFT on demonstrations (the task solver's replies, train split only,
                       `tasks.guidance.demonstration`): NLL of the reply tokens and eos
                       given the chat-templated prompt; save_pretrained
    2. reward_model/   pairwise RM on ranked comparisons of the procedural preference set
                       (`pipelines.preferences`: the true preference is known), started from
                       sft/ as in the paper; trained on train-split prompts, its held-out
                       pair accuracy measured on prompts of the held-out split
    3. ppo/            `policylab train` with method ppo_rlhf: model = sft/ (policy, critic
                       backbone and the KL reference), method_params.reward_model =
                       reward_model/; reward = RM score once at the last token minus
                       β·(lp_old − lp_ref) per token
    report.json/.md    RM held-out pair accuracy; on held-out prompts before (SFT) and after
                       PPO: the policy's mean RM score, its mean true-preference score, its
                       true-preference win rate against the SFT policy's samples (ties
                       count one half), the RM's agreement with the true preference on the
                       policy's own replies, and verifier accuracy

The config (YAML): run_dir, model, seed, threads, and the sections task (the arithmetic
split every stage uses), sft, reward_model, ppo (a run config's rollout, train,
method_params, eval and log sections) and eval. Unknown keys are refused with the valid
names.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from policylab.errors import ConfigError
from policylab.errors import RunDirError
from policylab.trainer.config import Range
from policylab.tasks import guidance
from policylab.tasks.arithmetic import ArithmeticTask
import policylab.pipelines.common as common
from policylab.pipelines.rlhf_eval import policy_eval, policy_summary, report_markdown
from policylab.tasks import preferences
from policylab.models.reward_model import RewardModel, encode_pairs, pairwise_loss

TOP = {"run_dir": "runs/ppo_rlhf", "model": "embedded", "seed": 0, "threads": 0}
SECTIONS = {
    "task": {"ops": ["+", "*"], "digits": 1, "heldout_fraction": 0.5, "split_seed": 0},
    "sft": {"steps": 30, "batch_size": 16, "lr": 2e-5},
    "reward_model": {"steps": 40, "prompts_per_step": 8, "lr": 1e-5, "heldout_prompts": 40},
    "ppo": None,
    "eval": {"prompts": 40, "samples": 2, "max_new_tokens": 12},
}
_COUNT = Range(lo=1, integer=True)
# every number of the pipeline's own sections and its accepted values (checked at load)
RULES = {"sft.steps": _COUNT, "sft.batch_size": _COUNT, "sft.lr": Range(lo=0, lo_open=True, why="SFT learning rate"),
         "reward_model.steps": _COUNT, "reward_model.prompts_per_step": _COUNT, "reward_model.heldout_prompts": _COUNT,
         "reward_model.lr": Range(lo=0, lo_open=True, why="reward model learning rate"),
         "eval.prompts": _COUNT, "eval.samples": _COUNT, "eval.max_new_tokens": _COUNT,
         "task.digits": Range(lo=1, hi=18, integer=True), "task.heldout_fraction": Range(lo=0, hi=1, lo_open=True,
                                                                                          hi_open=True),
         "task.split_seed": Range(lo=0, hi=2**32 - 1, integer=True)}
# a PPO section is a run config's sections; what the pipeline sets itself is refused there
PPO_SECTIONS = ("rollout", "train", "method_params", "eval", "log")
STAGE_DIRS = ("sft", "reward_model", "ppo")


def load_config(path, overrides=()) -> dict:
    """The pipeline config (see the module docstring), checked before anything runs."""
    cfg = common.load_pipeline_config(path, overrides, top=TOP, sections=SECTIONS, name="ppo_rlhf", rules=RULES)
    extra = sorted(set(cfg["ppo"]) - set(PPO_SECTIONS))
    if extra:
        raise ConfigError(f"{path}: ppo.{extra[0]} cannot be set: the pipeline sets the PPO stage's method, model, "
                          f"task, seed and run_dir itself; ppo takes {', '.join(PPO_SECTIONS)}")
    for name, section in cfg["ppo"].items():
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: ppo.{name} must be a mapping")
    if "reward_model" in cfg["ppo"].get("method_params", {}):
        raise ConfigError(f"{path}: ppo.method_params.reward_model is set by the pipeline (its stage 2)")
    ops = cfg["task"]["ops"]
    if not isinstance(ops, list) or not ops:
        raise ConfigError(f"{path}: task.ops must be a non-empty list of operations (+, -, *)")
    _task(cfg)  # the split itself is checked by the task
    cfg["_source"] = str(path)
    return cfg


def _task(cfg: dict) -> ArithmeticTask:
    from policylab.errors import PolicylabError

    t = cfg["task"]
    try:
        return ArithmeticTask(ops=tuple(t["ops"]), digits=int(t["digits"]), seed=int(cfg["seed"]),
                              heldout_fraction=float(t["heldout_fraction"]), split_seed=int(t["split_seed"]))
    except PolicylabError as exc:
        raise ConfigError(f"task: {exc}") from None


def _say(console, text: str) -> None:
    if console is not None:
        console.print(text, soft_wrap=True)


def sft(model, tokenizer, task: ArithmeticTask, *, steps: int, batch_size: int, lr: float) -> dict:
    """Supervised fine-tuning on the solver's demonstrations (train split only: the
    demonstration refuses any other example): mean NLL of the reply tokens (and the final
    eos) given the chat-templated prompt. Returns {"losses": per step, "prompts": every
    prompt trained on}."""
    from policylab.backends.build import adamw

    encode = common.chat_encoder(tokenizer)
    opt = adamw([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    losses, seen = [], []
    for _ in range(steps):
        exs = task.train_prompts(batch_size)
        seen += [e.prompt for e in exs]
        rows, starts = [], []
        for e in exs:
            p = encode(e.prompt)
            r = tokenizer(guidance.demonstration(e, "answer"), add_special_tokens=False)["input_ids"]
            rows.append(p + r + [int(tokenizer.eos_token_id)])
            starts.append(len(p))
        L = max(len(r) for r in rows)
        ids = torch.full((len(rows), L), int(tokenizer.pad_token_id), dtype=torch.long)
        att = torch.zeros((len(rows), L), dtype=torch.bool)
        target = torch.zeros((len(rows), L), dtype=torch.bool)
        for i, (r, s) in enumerate(zip(rows, starts)):
            ids[i, :len(r)] = torch.tensor(r)
            att[i, :len(r)] = True
            target[i, s:len(r)] = True  # reply tokens (and eos) are predicted
        logits = model(input_ids=ids, attention_mask=att.long()).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        m = target[:, 1:]
        loss = -(lp * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return {"losses": losses, "prompts": seen}


def rm_pairs(rm: RewardModel, tokenizer, examples, *, heldout: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [P, K] differentiable, ranks [P, K]) of the ranked candidates of `examples`
    (train examples; `heldout=True` to measure on held-out ones)."""
    ranked = [preferences.ranked(e, heldout=heldout) for e in examples]
    tokens, att = encode_pairs(tokenizer, common.chat_encoder(tokenizer), examples, [c for c, _ in ranked])
    K = len(ranked[0][0])
    scores = rm(tokens, att).view(len(examples), K)
    return scores, torch.tensor([r for _, r in ranked], dtype=scores.dtype)


@torch.no_grad()
def rm_pair_accuracy(rm: RewardModel, tokenizer, examples, batch: int = 8) -> dict:
    """Held-out pair accuracy (and loss) of the RM over all ordered pairs of `examples`."""
    was = rm.training
    rm.eval()
    hits = pairs = 0.0
    loss_sum = 0.0
    for i in range(0, len(examples), batch):
        s, r = rm_pairs(rm, tokenizer, examples[i:i + batch], heldout=True)
        loss, m = pairwise_loss(s, r)
        hits += m["pair_accuracy"] * m["pairs"]
        pairs += m["pairs"]
        loss_sum += float(loss) * s.shape[0]
    rm.train(was)
    return {"pair_accuracy": hits / pairs, "pairs": int(pairs), "loss": loss_sum / len(examples)}


def train_reward_model(rm: RewardModel, tokenizer, task: ArithmeticTask, *, steps: int, prompts_per_step: int,
                       lr: float) -> dict:
    """Adam steps on the pairwise loss, `prompts_per_step` train prompts (K = 4 ranked
    replies, 6 pairs each) per step. Returns {"log": per step, "prompts": every prompt}."""
    from policylab.backends.build import adamw

    opt = adamw([p for p in rm.parameters() if p.requires_grad], lr=lr)
    rm.train()
    log, seen = [], []
    for _ in range(steps):
        exs = task.train_prompts(prompts_per_step)
        seen += [e.prompt for e in exs]
        s, r = rm_pairs(rm, tokenizer, exs)
        loss, m = pairwise_loss(s, r)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(rm.parameters(), 1.0)
        opt.step()
        log.append({"loss": float(loss.detach()), "pair_accuracy": m["pair_accuracy"]})
    rm.eval()
    return {"log": log, "prompts": seen}


def ppo_run_config(cfg: dict, sft_dir: Path, rm_dir: Path, run_dir: Path) -> dict:
    """The PPO stage's run config: the user's rollout/train/method_params/eval/log, with
    the method, model, task, seed and run_dir the pipeline sets."""
    ppo = dict(cfg["ppo"])
    t = cfg["task"]
    return {**{k: dict(v) for k, v in ppo.items()}, "method": "ppo_rlhf", "model": str(sft_dir),
            "run_dir": str(run_dir / "ppo"), "seed": int(cfg["seed"]), "threads": int(cfg["threads"]),
            "task": {"name": "arithmetic", "ops": list(t["ops"]), "digits": int(t["digits"]),
                     "heldout_fraction": float(t["heldout_fraction"]), "split_seed": int(t["split_seed"])},
            "method_params": {**ppo.get("method_params", {}), "reward_model": str(rm_dir)},
            "eval": {"n": 0, "before": False, "after": False, **ppo.get("eval", {})},
            "log": {"tensorboard": False, "progress": False, **ppo.get("log", {})}}


@dataclass
class _Run:
    """One pipeline run in progress: its config, directory, task, console and report."""
    cfg: dict
    run_dir: Path
    task: ArithmeticTask
    console: Any
    report: dict
    trained_on: set = field(default_factory=set)  # every prompt SFT or the RM trained on

    @property
    def seed(self) -> int:
        return int(self.cfg["seed"])

    def finished(self, stage: str, summary: dict) -> None:
        self.report["stages"][stage] = summary
        common.stage_finished(self.run_dir, stage)
        common.write_progress(self.run_dir, self.report)


def run(cfg: dict, *, console=None, overwrite: bool = False) -> dict:
    """The whole pipeline (see the module docstring); returns the report. Every value and
    the model are checked, and the run directory locked, before anything is written or
    deleted (`common.prepare_run_dir`)."""
    run_dir = Path(cfg["run_dir"])
    # the PPO stage's config and method parameters are checked before any stage runs
    # (the model and RM paths are placeholders here)
    common.check_run_config(ppo_run_config(cfg, run_dir / "sft", run_dir / "reward_model", run_dir))
    common.check_model(cfg["model"], cfg.get("_source", "config"))
    with common.locked(run_dir) as lock:
        if lock.stale:
            _say(console, f"policylab: {common.stale_note(run_dir, lock.stale)}")
        common.prepare_run_dir(run_dir, STAGE_DIRS, overwrite=overwrite, pipeline="ppo_rlhf")
        return _run_stages(cfg, run_dir, console)


def _run_stages(cfg: dict, run_dir: Path, console) -> dict:
    t0 = time.perf_counter()
    seed = int(cfg["seed"])
    if cfg["threads"]:
        torch.set_num_threads(int(cfg["threads"]))
    torch.manual_seed(seed)
    r = _Run(cfg, run_dir, _task(cfg), console, {"pipeline": "ppo_rlhf", "model": cfg["model"], "seed": seed,
                                                  "task": dict(cfg["task"]), "stages": {}})
    sft_dir = _sft_stage(r)
    rm_dir, rm_summary = _reward_model_stage(r, sft_dir)
    ckpt = _ppo_stage(r, sft_dir, rm_dir)
    _say(console, "[bold]ppo_rlhf[/] evaluation on held-out prompts")
    r.report["evaluation"] = _evaluation(r, sft_dir, rm_dir, ckpt)
    r.report["rm_heldout_pair_accuracy"] = rm_summary["heldout_pair_accuracy"]
    r.report["seconds"] = time.perf_counter() - t0
    common.write_report(run_dir, r.report, report_markdown(r.report))
    _say(console, report_markdown(r.report))
    return r.report


def run_config_file(path, overrides=(), *, console=None, overwrite: bool = False) -> Path:
    """`policylab pipeline ppo_rlhf PATH`: the config read and checked, the pipeline run;
    returns the run directory (its report.json and report.md)."""
    cfg = load_config(path, overrides)
    run(cfg, console=console, overwrite=overwrite)
    return Path(cfg["run_dir"])


def _sft_stage(r: _Run) -> Path:
    """1. SFT on demonstrations; returns the saved model directory."""
    from policylab.models.loading import load_policy

    _say(r.console, "[bold]ppo_rlhf[/] 1/3 SFT on demonstrations (train split)")
    t = time.perf_counter()
    policy, tok = load_policy(r.cfg["model"])
    s = r.cfg["sft"]
    out = sft(policy, tok, r.task, steps=int(s["steps"]), batch_size=int(s["batch_size"]), lr=float(s["lr"]))
    losses = out["losses"]
    sft_dir = common.save_model_dir(policy, tok, r.run_dir / "sft")
    r.trained_on |= set(out["prompts"])
    r.finished("sft", {"dir": str(sft_dir), "steps": s["steps"], "demonstrations": len(out["prompts"]),
                       "loss_first": losses[0], "loss_last": losses[-1], "seconds": time.perf_counter() - t})
    _say(r.console, f"  SFT loss {losses[0]:.3f} -> {losses[-1]:.3f} ({time.perf_counter() - t:.0f} s)")
    return sft_dir


def _reward_model_stage(r: _Run, sft_dir: Path) -> tuple[Path, dict]:
    """2. the pairwise reward model, from the SFT model; returns its directory and summary."""
    from policylab.models.loading import load_policy

    _say(r.console, "[bold]ppo_rlhf[/] 2/3 reward model on ranked comparisons (train split)")
    t = time.perf_counter()
    backbone, tok = load_policy(str(sft_dir))
    rm = RewardModel(backbone, seed=r.seed)
    c = r.cfg["reward_model"]
    held = r.task.heldout(int(c["heldout_prompts"]), repeat=True)
    before_rm = rm_pair_accuracy(rm, tok, held)
    out = train_reward_model(rm, tok, r.task, steps=int(c["steps"]), prompts_per_step=int(c["prompts_per_step"]),
                             lr=float(c["lr"]))
    log = out["log"]
    r.trained_on |= set(out["prompts"])
    after_rm = rm_pair_accuracy(rm, tok, held)
    summary = {"steps": c["steps"], "train_prompts": len(out["prompts"]), "train_pairs": 6 * len(out["prompts"]),
               "heldout_prompts": len({e.prompt for e in held}),
               "heldout_pair_accuracy": after_rm["pair_accuracy"], "heldout_pairs": after_rm["pairs"],
               "heldout_pair_accuracy_untrained": before_rm["pair_accuracy"], "heldout_loss": after_rm["loss"],
               "train_loss_first": log[0]["loss"], "train_loss_last": log[-1]["loss"]}
    from policylab.trainer.run_paths import guard_dir

    rm_dir = rm.save(guard_dir(r.run_dir, "reward_model"), tok, summary)
    r.finished("reward_model", {"dir": str(rm_dir), **summary, "seconds": time.perf_counter() - t})
    _say(r.console, f"  RM held-out pair accuracy {before_rm['pair_accuracy']:.3f} -> "
                    f"{after_rm['pair_accuracy']:.3f} ({time.perf_counter() - t:.0f} s)")
    return rm_dir, summary


def _ppo_stage(r: _Run, sft_dir: Path, rm_dir: Path) -> Path:
    """3. PPO from the SFT model against the frozen RM; returns its latest checkpoint."""
    _say(r.console, "[bold]ppo_rlhf[/] 3/3 PPO against the frozen reward model, per-token KL to the SFT policy")
    t = time.perf_counter()
    ckpt = common.train_run(ppo_run_config(r.cfg, sft_dir, rm_dir, r.run_dir))
    r.finished("ppo", {"dir": str(r.run_dir / "ppo"), "checkpoint": str(ckpt), "seconds": time.perf_counter() - t,
                       **_ppo_log_summary(r.run_dir / "ppo")})
    return ckpt


def _evaluation(r: _Run, sft_dir: Path, rm_dir: Path, ckpt: Path) -> dict:
    """Before (SFT) and after PPO on held-out prompts, against a third set of SFT samples."""
    from policylab.models.loading import load_model_or_checkpoint as load_model
    from policylab.models.loading import load_policy
    from policylab.models.reward_model import load_reward_model

    e, task = r.cfg["eval"], r.task
    examples = task.heldout(int(e["prompts"]), repeat=True)
    heldout_prompts = {x.prompt for x in task.heldout(task.heldout_size() or len(examples), repeat=True)}
    leaked = sorted(r.trained_on & heldout_prompts)
    if leaked:  # the split makes this impossible; checked anyway, never reported around
        raise RunDirError(f"held-out prompts reached SFT or RM training: {leaked[:3]}")
    rm, _, _ = load_reward_model(rm_dir)
    sft_model, tok = load_policy(str(sft_dir))
    samples, max_new = int(e["samples"]), int(e["max_new_tokens"])
    # a third set of SFT samples, the one the win rates compare to
    comparison = policy_eval(sft_model, tok, rm, examples, common.Sampling(samples, max_new, r.seed + 101))
    how = common.Sampling(samples, max_new, r.seed + 202)
    before = policy_eval(sft_model, tok, rm, examples, how)
    ppo_model, _, _ = load_model(str(ckpt))
    after = policy_eval(ppo_model, tok, rm, examples, how)
    n = len(before["true_score"])
    return {"heldout_prompts": len(examples), "samples_per_prompt": samples, "n": n,
            "max_new_tokens": max_new, "temperature": how.temperature,
            "before_ppo": policy_summary(before, comparison), "after_ppo": policy_summary(after, comparison),
            "win_rate_stderr": math.sqrt(0.25 / n), "heldout_prompts_in_sft_or_rm_training": len(leaked)}


def _ppo_log_summary(ppo_dir: Path) -> dict:
    """Steps, first and last logged RM score, KL penalty and accuracy of the PPO run."""
    from policylab.trainer.runlog import read_metrics

    path = ppo_dir / "metrics.jsonl"
    rows = [r for r in read_metrics(path) if "rlhf/rm_score_mean" in r] if path.is_file() else []
    if not rows:
        return {"steps": 0}
    keys = ("rlhf/rm_score_mean", "rlhf/true_score_mean", "kl/reward_penalty_mean", "accuracy")
    return {"steps": len(rows), "first": {k: rows[0].get(k) for k in keys}, "last": {k: rows[-1].get(k) for k in keys}}
