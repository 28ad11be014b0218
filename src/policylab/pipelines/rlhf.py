"""InstructGPT's three stages as one pipeline: `policylab pipeline ppo_rlhf CONFIG`.

"Training language models to follow instructions with human feedback" (Ouyang et al.,
arXiv 2203.02155). Each stage writes a checkpoint the next one loads:

    1. sft/            SFT on demonstrations (the task solver's replies, train split):
                       NLL of the reply tokens given the prompt; save_pretrained
    2. reward_model/   pairwise RM on ranked comparisons of the procedural preference set
                       (`pipelines.preferences`: the true preference is known), started from
                       sft/ as in the paper; held-out pair accuracy measured on prompts of
                       the held-out split
    3. ppo/            `policylab train` with method ppo_rlhf: model = sft/ (policy and the
                       KL reference), method_params.reward_model = reward_model/; reward =
                       RM score once at the last token minus β·(lp_old − lp_ref) per token
    report.json/.md    RM held-out pair accuracy; on held-out prompts before (SFT) and after
                       PPO: the policy's mean RM score, its mean true-preference score and
                       its true-preference win rate against the SFT policy's samples (ties
                       count one half), plus verifier accuracy

The config (YAML): run_dir, model, seed, threads, and the sections sft, reward_model, ppo
(a run config's sections: rollout, train, method_params, eval, log) and eval.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from ..tasks import ArithmeticTask, guidance
from . import common, preferences
from .reward_model import RewardModel, encode_pairs, pairwise_loss

TOP = {"run_dir": "runs/ppo_rlhf", "model": "embedded", "seed": 0, "threads": 0}
SECTIONS = {
    "sft": {"steps": 30, "batch_size": 16, "lr": 2e-5},
    "reward_model": {"steps": 40, "prompts_per_step": 8, "lr": 1e-5, "heldout_prompts": 40},
    "ppo": None,
    "eval": {"prompts": 40, "samples": 2, "max_new_tokens": 12},
}


def _say(console, text: str) -> None:
    if console is not None:
        console.print(text)


def sft(model, tokenizer, task: ArithmeticTask, *, steps: int, batch_size: int, lr: float) -> list[float]:
    """Supervised fine-tuning on the solver's demonstrations: mean NLL of the reply tokens
    (and the final eos) given the chat-templated prompt. Returns the loss per step."""
    from ..trainer_support import _adamw

    encode = common.chat_encoder(tokenizer)
    opt = _adamw([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        exs = task.train_prompts(batch_size)
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
        losses.append(float(loss))
    model.eval()
    return losses


def rm_pairs(rm: RewardModel, tokenizer, examples) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [P, K] differentiable, ranks [P, K]) of the ranked candidates of `examples`."""
    ranked = [preferences.ranked(e) for e in examples]
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
        s, r = rm_pairs(rm, tokenizer, examples[i:i + batch])
        loss, m = pairwise_loss(s, r)
        hits += m["pair_accuracy"] * m["pairs"]
        pairs += m["pairs"]
        loss_sum += float(loss) * s.shape[0]
    rm.train(was)
    return {"pair_accuracy": hits / pairs, "pairs": int(pairs), "loss": loss_sum / len(examples)}


def train_reward_model(rm: RewardModel, tokenizer, task: ArithmeticTask, *, steps: int, prompts_per_step: int,
                       lr: float) -> list[dict]:
    from ..trainer_support import _adamw

    opt = _adamw([p for p in rm.parameters() if p.requires_grad], lr=lr)
    rm.train()
    log = []
    for _ in range(steps):
        s, r = rm_pairs(rm, tokenizer, task.train_prompts(prompts_per_step))
        loss, m = pairwise_loss(s, r)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(rm.parameters(), 1.0)
        opt.step()
        log.append({"loss": float(loss), "pair_accuracy": m["pair_accuracy"]})
    rm.eval()
    return log


def win_rate(a: list[float], b: list[float]) -> float:
    """P(a_i > b_i) + ½·P(a_i = b_i) over paired samples."""
    if len(a) != len(b) or not a:
        raise ValueError("win_rate needs two non-empty lists of the same length")
    return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x, y in zip(a, b)) / len(a)


def policy_eval(model, tokenizer, rm: RewardModel, examples, *, samples: int, max_new_tokens: int, seed: int) -> dict:
    """A policy's samples on held-out prompts: RM scores, true-preference scores, accuracy."""
    from ..rewards.verifiers import exact_numeric_reward

    b, texts = common.sample(model, tokenizer, examples, samples=samples, max_new_tokens=max_new_tokens, seed=seed)
    rows = [e for e in examples for _ in range(samples)]
    rm_scores = rm.score(b.tokens, b.attention_mask).tolist()
    true = [preferences.true_score(e, t) for e, t in zip(rows, texts)]
    acc = exact_numeric_reward(texts, [e.answer for e in rows])
    return {"rm_score": rm_scores, "true_score": true, "accuracy": sum(acc) / len(acc), "texts": texts[:8]}


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def run(cfg: dict, *, console=None, overwrite: bool = False) -> dict:
    """The whole pipeline (see the module docstring); returns the report."""
    from ..mixedpolicy.state import load_model
    from ..models import load_policy
    from .reward_model import load_reward_model

    t0 = time.perf_counter()
    run_dir = Path(cfg["run_dir"])
    common.prepare_run_dir(run_dir, overwrite=overwrite)
    if cfg["threads"]:
        torch.set_num_threads(int(cfg["threads"]))
    seed = int(cfg["seed"])
    torch.manual_seed(seed)
    task = ArithmeticTask(seed=seed)
    report: dict = {"pipeline": "ppo_rlhf", "model": cfg["model"], "seed": seed, "stages": {}}

    # 1. SFT -------------------------------------------------------------------------
    _say(console, "[bold]ppo_rlhf[/] 1/3 SFT on demonstrations")
    t = time.perf_counter()
    policy, tok = load_policy(cfg["model"])
    s = cfg["sft"]
    losses = sft(policy, tok, task, steps=s["steps"], batch_size=s["batch_size"], lr=s["lr"])
    sft_dir = common.save_model_dir(policy, tok, run_dir / "sft")
    report["stages"]["sft"] = {"dir": str(sft_dir), "steps": s["steps"], "loss_first": losses[0] if losses else None,
                               "loss_last": losses[-1] if losses else None, "seconds": time.perf_counter() - t}
    del policy

    # 2. reward model ------------------------------------------------------------------
    _say(console, "[bold]ppo_rlhf[/] 2/3 reward model on ranked comparisons")
    t = time.perf_counter()
    backbone, tok = load_policy(str(sft_dir))
    rm = RewardModel(backbone, seed=seed)
    r = cfg["reward_model"]
    held = task.heldout(int(r["heldout_prompts"]))
    before_rm = rm_pair_accuracy(rm, tok, held)
    log = train_reward_model(rm, tok, task, steps=r["steps"], prompts_per_step=r["prompts_per_step"], lr=r["lr"])
    after_rm = rm_pair_accuracy(rm, tok, held)
    rm_summary = {"steps": r["steps"], "train_pairs": r["steps"] * r["prompts_per_step"] * 6,
                  "heldout_pair_accuracy": after_rm["pair_accuracy"], "heldout_pairs": after_rm["pairs"],
                  "heldout_pair_accuracy_untrained": before_rm["pair_accuracy"], "heldout_loss": after_rm["loss"],
                  "train_loss_first": log[0]["loss"] if log else None, "train_loss_last": log[-1]["loss"] if log else None}
    rm_dir = rm.save(run_dir / "reward_model", tok, rm_summary)
    report["stages"]["reward_model"] = {"dir": str(rm_dir), **rm_summary, "seconds": time.perf_counter() - t}
    del rm, backbone

    # 3. PPO -------------------------------------------------------------------------
    _say(console, "[bold]ppo_rlhf[/] 3/3 PPO against the reward model, KL to the SFT reference")
    t = time.perf_counter()
    ppo = dict(cfg["ppo"])
    ppo_cfg = {**ppo, "method": "ppo_rlhf", "model": str(sft_dir), "run_dir": str(run_dir / "ppo"), "seed": seed,
               "threads": int(cfg["threads"]),
               "method_params": {**ppo.get("method_params", {}), "reward_model": str(rm_dir)},
               "eval": {"n": 0, **ppo.get("eval", {})},
               "log": {"tensorboard": False, "progress": False, **ppo.get("log", {})}}
    ckpt = common.train_run(ppo_cfg)
    report["stages"]["ppo"] = {"dir": str(run_dir / "ppo"), "checkpoint": str(ckpt), "seconds": time.perf_counter() - t}

    # evaluation: before (SFT) and after PPO, on held-out prompts ---------------------------
    _say(console, "[bold]ppo_rlhf[/] evaluation on held-out prompts")
    e = cfg["eval"]
    examples = task.heldout(int(e["prompts"]), repeat=True)
    rm, _, _ = load_reward_model(rm_dir)
    sft_model, tok = load_policy(str(sft_dir))
    kw = dict(samples=int(e["samples"]), max_new_tokens=int(e["max_new_tokens"]))
    base_ref = policy_eval(sft_model, tok, rm, examples, seed=seed + 101, **kw)  # the comparison samples
    before = policy_eval(sft_model, tok, rm, examples, seed=seed + 202, **kw)
    ppo_model, _, _ = load_model(str(ckpt))
    after = policy_eval(ppo_model, tok, rm, examples, seed=seed + 202, **kw)
    n = len(before["true_score"])

    def summary(x):
        return {"rm_score_mean": _mean(x["rm_score"]), "true_score_mean": _mean(x["true_score"]),
                "true_preference_win_rate_vs_sft": win_rate(x["true_score"], base_ref["true_score"]),
                "accuracy": x["accuracy"], "examples": x["texts"]}

    report["evaluation"] = {"heldout_prompts": len(examples), "samples_per_prompt": kw["samples"], "n": n,
                            "before_ppo": summary(before), "after_ppo": summary(after),
                            "win_rate_stderr": math.sqrt(0.25 / n)}
    report["rm_heldout_pair_accuracy"] = rm_summary["heldout_pair_accuracy"]
    report["seconds"] = time.perf_counter() - t0
    common.write_report(run_dir, report, report_markdown(report))
    _say(console, report_markdown(report))
    return report


def report_markdown(r: dict) -> str:
    ev, st = r["evaluation"], r["stages"]
    b, a = ev["before_ppo"], ev["after_ppo"]
    lines = [
        f"# ppo_rlhf pipeline ({r['model']}, seed {r['seed']}, {r['seconds']:.0f} s)", "",
        f"- SFT: {st['sft']['steps']} steps, loss {st['sft']['loss_first']:.3f} -> {st['sft']['loss_last']:.3f}",
        f"- reward model: {st['reward_model']['steps']} steps on {st['reward_model']['train_pairs']} ranked pairs; "
        f"held-out pair accuracy {st['reward_model']['heldout_pair_accuracy']:.3f} over "
        f"{st['reward_model']['heldout_pairs']} pairs (untrained head: "
        f"{st['reward_model']['heldout_pair_accuracy_untrained']:.3f})",
        f"- PPO: {st['ppo']['checkpoint']}", "",
        f"held-out prompts: {ev['heldout_prompts']} x {ev['samples_per_prompt']} samples (T = 1); win rate against "
        f"the SFT policy's own samples, ties 1/2 (standard error about {ev['win_rate_stderr']:.3f})", "",
        "| policy | RM score | true-preference score | true-preference win rate vs SFT | accuracy |",
        "|---|---|---|---|---|",
        f"| before PPO (SFT) | {b['rm_score_mean']:.3f} | {b['true_score_mean']:.3f} | "
        f"{b['true_preference_win_rate_vs_sft']:.3f} | {b['accuracy']:.3f} |",
        f"| after PPO | {a['rm_score_mean']:.3f} | {a['true_score_mean']:.3f} | "
        f"{a['true_preference_win_rate_vs_sft']:.3f} | {a['accuracy']:.3f} |",
    ]
    return "\n".join(lines) + "\n"
