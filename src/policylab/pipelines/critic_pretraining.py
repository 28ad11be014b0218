"""Training RFPO's critic on the base model's own labelled rollouts, before any RL.

    policylab train-critic CONFIG --out DIR [--prompts 64] [--group-size 4] [--epochs 300]

1. The base model of CONFIG (`model`) samples `group_size` replies to each of `prompts`
   prompts of the task's TRAIN split, with the config's rollout settings (temperature,
   top-p/k, max_new_tokens); the task's verifier labels each reply 0/1.
2. The rollouts are split by prompt: the first (1 − calib_fraction) of the prompts fit the
   head, the rest calibrate it.
3. Every prefix state of a fitted reply (the state before each of its tokens, and the
   state after its last token) is an example with the reply's final label (a Monte Carlo
   value target); the head (`frozen_critic.CriticHead` on the frozen base model's last
   hidden states) minimizes the mean binary cross-entropy, full batch, Adam.
4. On the calibration split: the length-bias line b(L) of the critic's final-state error
   (`rewards.critic_reward.fit_length_bias`), and Brier scores of the critic, the debiased
   critic and the constant base-rate predictor, reported in critic.json.
5. `frozen_critic.save_critic` writes the checkpoint the method `rfpo` loads
   (`method_params.critic_path`).

No gold answer of the held-out split is read; the labels are the train split's verifier.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from policylab.models.frozen_critic import (
    CriticHead,
    hidden_states,
    prefix_positions,
    save_critic,
)
from policylab.models.loading import weights_fingerprint
from policylab.kernels.rewards.critic_reward import debias, fit_length_bias


def _encode(tokenizer, prompt: str, system_prompt: str) -> list[int]:
    msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": prompt}]
    ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


@torch.no_grad()
def collect_labelled(model, tokenizer, engine, task, *, prompts: int, group_size: int, max_new_tokens: int,
                     sampling, system_prompt: str = "", chunk: int = 8) -> list[dict]:
    """Rollouts of the base model on the task's train split, each labelled by the verifier:
    a list of per-prompt dicts {"tokens", "attention_mask", "loss_mask", "prompt_width",
    "labels" [G], "truncated" [G]}."""
    out = []
    done = 0
    while done < prompts:
        n = min(chunk, prompts - done)
        examples = task.next_train(n)
        ids = [_encode(tokenizer, e.prompt, system_prompt) for e in examples]
        batch = engine.generate(ids, group_size=group_size, sampling=sampling, max_new_tokens=max_new_tokens,
                                policy_version=0, batch_id=f"critic-{done}")
        texts = engine.decode_responses(batch)
        labels = torch.tensor(task.reward_fn(texts, [e.answer for e in examples for _ in range(group_size)]),
                              dtype=torch.float32)
        for j in range(n):
            rows = torch.arange(j * group_size, (j + 1) * group_size)
            sub = batch.select(rows)
            out.append({"tokens": sub.tokens, "attention_mask": sub.attention_mask, "loss_mask": sub.loss_mask,
                        "prompt_width": sub.prompt_width, "labels": labels[rows],
                        "truncated": sub.extras["truncated"].bool()})
        done += n
    return out


def _features(model, groups: list[dict]) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor,
                                                   torch.Tensor, torch.Tensor]:
    """Per group: states [n, H] and their labels [n] (every counted prefix state and the
    final state of each reply), plus the final states [R, H], labels [R], lengths [R]."""
    X, Y, finals, flabels, lengths = [], [], [], [], []
    for g in groups:
        h = hidden_states(model, g["tokens"], g["attention_mask"])
        before, last = prefix_positions(g["loss_mask"], g["prompt_width"])
        for i in range(h.shape[0]):
            cols = before[g["loss_mask"][i]].tolist() + [int(last[i].clamp(min=g["prompt_width"] - 1))]
            X.append(h[i, cols])
            Y.append(torch.full((len(cols),), float(g["labels"][i])))
            finals.append(h[i, cols[-1]])
            flabels.append(float(g["labels"][i]))
            lengths.append(int(g["loss_mask"][i].sum()))
    return X, Y, torch.stack(finals), torch.tensor(flabels), torch.tensor(lengths, dtype=torch.float64)


def _brier(p: torch.Tensor, y: torch.Tensor) -> float:
    return float(((p.double() - y.double()) ** 2).mean()) if p.numel() else float("nan")


def fit_head(X: torch.Tensor, Y: torch.Tensor, *, width: int, epochs: int, lr: float, seed: int) -> tuple[CriticHead, list]:
    """Full-batch Adam on the mean BCE of the head over the prefix states; returns the head
    and the loss curve (every 50 epochs)."""
    torch.manual_seed(seed)
    head = CriticHead(X.shape[1], width)
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    curve = []
    for e in range(epochs):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(head(X), Y)
        loss.backward()
        opt.step()
        if e % 50 == 0 or e == epochs - 1:
            curve.append(round(float(loss.detach()), 5))
    return head, curve


@dataclass(frozen=True)
class CriticBudget:
    """How much the critic is trained on: `prompts` train prompts x `group_size` rollouts
    of the base model, `epochs` full-batch epochs of the head (width `width`, learning rate
    `lr`), `calib_fraction` of the prompts held out for the calibration fit, and the
    temperature `tau` of the value target."""

    prompts: int = 64
    group_size: int = 4
    epochs: int = 300
    lr: float = 1e-3
    width: int = 64
    calib_fraction: float = 0.25
    tau: float = 0.5


def train_frozen_critic(cfg, out_dir: str | Path, budget: CriticBudget = CriticBudget(), *, say=print) -> dict:
    """Steps 1-5 of the module docstring for the run config `cfg` (a RunConfig); returns
    the checkpoint's metadata."""
    prompts, group_size, epochs, lr = budget.prompts, budget.group_size, budget.epochs, budget.lr
    width, calib_fraction, tau = budget.width, budget.calib_fraction, budget.tau
    from policylab.models.loading import load_policy
    from policylab.trainer.rollout import sampling_from
    from policylab.tasks.source import build_task
    from policylab.backends.build import build_engine

    if prompts < 2 or group_size < 1 or not 0 < calib_fraction < 1:
        raise ValueError("train-critic needs >= 2 prompts, group_size >= 1 and calib_fraction in (0, 1)")
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    model, tokenizer = load_policy(cfg.model)
    model.eval().requires_grad_(False)
    task = build_task(cfg.task, seed=cfg.seed)
    engine = build_engine(model, tokenizer, cfg.rollout)
    groups = collect_labelled(model, tokenizer, engine, task, prompts=prompts, group_size=group_size,
                              max_new_tokens=cfg.rollout.max_new_tokens, sampling=sampling_from(cfg.rollout),
                              system_prompt=cfg.task.system_prompt)
    n_cal = max(1, int(round(calib_fraction * len(groups))))
    fit, cal = groups[:-n_cal], groups[-n_cal:]
    Xf, Yf, _, fit_labels, _ = _features(model, fit)
    _, _, cal_h, cal_labels, cal_len = _features(model, cal)
    head, curve = fit_head(torch.cat(Xf), torch.cat(Yf), width=width, epochs=epochs, lr=lr, seed=cfg.seed)
    with torch.no_grad():
        cal_v = torch.sigmoid(head(cal_h)).double()
    bias = fit_length_bias(cal_v, cal_labels, cal_len)
    cal_v_deb = debias(cal_v, cal_len, bias)
    base_rate = float(fit_labels.mean())
    stats = {
        "rollouts_fit": int(fit_labels.numel()), "rollouts_calibration": int(cal_labels.numel()),
        "prefix_states_fit": int(sum(x.shape[0] for x in Xf)), "base_rate_fit": base_rate,
        "base_rate_calibration": float(cal_labels.mean()),
        "brier_critic": _brier(cal_v, cal_labels), "brier_critic_debiased": _brier(cal_v_deb.clamp(0, 1), cal_labels),
        "brier_base_rate": _brier(torch.full_like(cal_labels, base_rate), cal_labels),
        "accuracy_at_tau": float(((cal_v_deb >= tau).double() == cal_labels.double()).double().mean()),
        "tau_checked": tau, "bce_curve": curve, "seconds": round(time.perf_counter() - t0, 1),
    }
    local = Path(cfg.model).expanduser()
    meta = {"base_model": str(local.resolve()) if cfg.model != "embedded" and local.is_dir() else cfg.model,
            "base_fingerprint": weights_fingerprint(model), "hidden_size": int(model.config.hidden_size),
            "head_width": width, "length_bias": list(bias), "task": task.describe,
            "rollout": {"prompts": prompts, "group_size": group_size, "max_new_tokens": cfg.rollout.max_new_tokens,
                        "temperature": cfg.rollout.temperature, "seed": cfg.seed},
            "calibration": stats}
    save_critic(out_dir, head, meta)
    say(f"critic written to {out_dir}: {stats['rollouts_fit']} fitted and {stats['rollouts_calibration']} "
        f"calibration rollouts, base rate {base_rate:.3f}; calibration Brier {stats['brier_critic']:.4f} "
        f"(debiased {stats['brier_critic_debiased']:.4f}; the base rate alone {stats['brier_base_rate']:.4f})")
    if not math.isfinite(stats["brier_critic"]):
        raise ValueError("the critic's calibration Brier is not finite")
    return meta
