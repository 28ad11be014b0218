"""The fast mode's numerical error, measured (no timing: valid on a busy machine).

    .venv/bin/python benchmarks/fast_mode_error.py [--batches 3]   # writes results/fast_mode_error.{md,json}

On the embedded SmolLM2-135M-Instruct, a few batches like the quickstart's (4 prompts x 8
samples of single-digit + and x, T = 1, <= 48 new tokens, one seed per batch):

* sampling engines against the fp32 trainer: each engine samples a batch and records
  its log-probs μ; the fp32 trainer recomputes π_old on the same tokens (`model_logprobs`,
  the trainer's old pass). Per engine: mean and max |log π_old − log μ| over counted
  tokens, the fraction with |k − 1| > 0.2 (k = π_old/μ), the fraction TIS truncates
  (k > 2, cap of the fast mode) and the fraction IcePop's band would zero (k outside
  [0.5, 5]);
* training forwards against the fp32 forward on those tokens: bf16 autocast of the whole
  forward (train.dtype: bf16), and bf16 autocast of the decoder body with the output head
  and log-softmax in fp32 (the head's logits computed from the bf16 body's hidden states
  cast to fp32): mean / max |Δ log p| and the fraction of tokens whose policy ratio at
  the sampling weights would already sit outside PPO's clip band (|Δ log p| > log 1.2).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_speed import machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CLIP = math.log(1.2)


def _prompts(tokenizer, n: int, seed: int) -> list[list[int]]:
    from policylab.tasks.arithmetic import ArithmeticTask

    out = []
    for e in ArithmeticTask(ops=("+", "*"), digits=1, seed=seed).train_prompts(n):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": e.prompt}], add_generation_prompt=True,
                                            tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def _stats(d: torch.Tensor, mask: torch.Tensor) -> dict:
    """d = log π_ref − log π_other on counted tokens."""
    x = d[mask].double()
    k = x.exp()
    return {"tokens": int(x.numel()), "mean_abs_dlogp": float(x.abs().mean()), "max_abs_dlogp": float(x.abs().max()),
            "frac_abs_ratio_minus_1_gt_0.2": float(((k - 1).abs() > 0.2).double().mean()),
            "frac_tis_capped_k_gt_2": float((k > 2).double().mean()),
            "frac_icepop_outside_0.5_5": float(((k < 0.5) | (k > 5)).double().mean()),
            "frac_outside_clip_log1.2": float((x.abs() > CLIP).double().mean())}


def _merge(parts: list[dict]) -> dict:
    n = sum(p["tokens"] for p in parts)
    out = {"tokens": n, "max_abs_dlogp": max(p["max_abs_dlogp"] for p in parts)}
    for k in parts[0]:
        if k not in out:
            out[k] = sum(p[k] * p["tokens"] for p in parts) / n
    return out


@torch.no_grad()
def _train_forward(model, batch, mode: str) -> torch.Tensor:
    """[B, T] log-probs of the batch's tokens: mode fp32 | bf16 (autocast everything) |
    bf16-body (autocast the decoder, head + log-softmax in fp32)."""
    from policylab.models.logprobs import model_logprobs
    from policylab.models.vocab import response_hidden

    out = []
    for idx in torch.arange(batch.size).split(8):
        mb = batch.select(idx)
        if mode == "fp32":
            lp = model_logprobs(model, mb.tokens, mb.attention_mask, mb.prompt_width, sampling=mb.sampling)
        elif mode == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                lp = model_logprobs(model, mb.tokens, mb.attention_mask, mb.prompt_width, sampling=mb.sampling)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h, head, _cap = response_hidden(model, mb.tokens, mb.attention_mask, mb.prompt_width)
            logits = torch.nn.functional.linear(h.float(), head.weight.float())
            lsm = torch.log_softmax(logits, -1)
            resp = mb.tokens[:, mb.prompt_width:]
            lp = lsm.gather(-1, resp[..., None]).squeeze(-1)
        out.append(lp.float())
    return torch.cat(out)


def run(a) -> dict:
    from policylab import SamplingSettings
    from policylab.engines.cpu import describe_cpu
    from policylab.engines.fast import FastEngine
    from policylab.models.loading import load_policy
    from policylab.models.logprobs import model_logprobs

    torch.manual_seed(0)
    model, tok = load_policy(a.model, dtype=torch.float32)
    model.eval()
    engines = {"fast-bf16": FastEngine(model, tok, dtype=torch.bfloat16),
               "fast-int8-g32": FastEngine(model, tok, weights="int8", quant_group=32),
               "fast-fp32": FastEngine(model, tok)}
    res: dict = {"engines": {}, "train_forward": {}}
    per_engine: dict[str, list] = {k: [] for k in engines}
    per_train: dict[str, list] = {"bf16": [], "bf16-body": []}
    for b in range(a.batches):
        prompts = _prompts(tok, a.prompts, seed=100 + b)
        for name, eng in engines.items():
            batch = eng.generate(prompts, group_size=a.group, sampling=SamplingSettings(), max_new_tokens=a.max_new,
                                 policy_version=0, batch_id=f"err{b}", seed=b)
            with torch.no_grad():
                lp_old = torch.cat([model_logprobs(model, mb.tokens, mb.attention_mask, mb.prompt_width,
                                                   sampling=mb.sampling)
                                    for mb in (batch.select(i) for i in torch.arange(batch.size).split(8))])
            per_engine[name].append(_stats(lp_old.float() - batch.logp_behavior.float(), batch.loss_mask))
            if name == "fast-bf16":
                ref = _train_forward(model, batch, "fp32")
                for mode in per_train:
                    per_train[mode].append(_stats(ref - _train_forward(model, batch, mode), batch.loss_mask))
        print(f"batch {b + 1}/{a.batches} done", file=sys.stderr, flush=True)
    res["engines"] = {k: _merge(v) for k, v in per_engine.items()}
    res["train_forward"] = {k: _merge(v) for k, v in per_train.items()}
    res["machine"] = machine()
    res["cpu"] = describe_cpu()
    res["threads"] = torch.get_num_threads()
    res["load_avg"] = round(os.getloadavg()[0], 2)
    res["settings"] = {"batches": a.batches, "prompts": a.prompts, "group": a.group, "max_new_tokens": a.max_new,
                       "temperature": 1.0, "model": a.model}
    return res


def to_markdown(r: dict, command: str) -> str:
    s = r["settings"]
    lines = [
        "# Fast mode: log-prob error against the fp32 trainer (SmolLM2-135M-Instruct, CPU)", "",
        f"Command: `{command}`; {s['batches']} batches of {s['prompts']} prompts x {s['group']} samples, "
        f"<= {s['max_new_tokens']} new tokens, T = 1. Machine: {r['machine']}; "
        f"{r['threads']} threads; load average {r['load_avg']} (no timing here: the numbers do not depend on load).",
        "", "## Sampling engines: behavior μ vs the fp32 trainer's π_old on the same tokens", "",
        "| engine | tokens | mean abs Δlogp | max abs Δlogp | abs(k − 1) > 0.2 | TIS capped (k > 2) | "
        "IcePop zeroed (k ∉ [0.5, 5]) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for k, v in r["engines"].items():
        lines.append(f"| {k} | {v['tokens']} | {v['mean_abs_dlogp']:.4f} | {v['max_abs_dlogp']:.4f} | "
                     f"{100 * v['frac_abs_ratio_minus_1_gt_0.2']:.2f}% | {100 * v['frac_tis_capped_k_gt_2']:.3f}% | "
                     f"{100 * v['frac_icepop_outside_0.5_5']:.3f}% |")
    lines += ["", "## Training forward vs the fp32 forward on the fast-bf16 engine's tokens", "",
              "| forward | tokens | mean abs Δlogp | max abs Δlogp | outside the clip band (abs Δ > log 1.2) |",
              "|---|---:|---:|---:|---:|"]
    for k, v in r["train_forward"].items():
        name = {"bf16": "bf16 autocast (train.dtype: bf16)", "bf16-body": "bf16 body, fp32 head + log-softmax"}[k]
        lines.append(f"| {name} | {v['tokens']} | {v['mean_abs_dlogp']:.4f} | {v['max_abs_dlogp']:.4f} | "
                     f"{100 * v['frac_outside_clip_log1.2']:.2f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--out", default=str(RESULTS / "fast_mode_error"), help="output path without suffix ('' = none)")
    a = ap.parse_args(argv)
    t0 = time.time()
    r = run(a)
    r["wall_s"] = round(time.time() - t0, 1)
    if a.out:
        cmd = "python benchmarks/fast_mode_error.py " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(a.out).with_suffix(".json").write_text(json.dumps(r, indent=2))
        Path(a.out).with_suffix(".md").write_text(to_markdown(r, cmd.strip()))
    print(json.dumps({k: r[k] for k in ("engines", "train_forward")}, indent=1))
    return r


if __name__ == "__main__":
    main()
