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
* training forwards against the fp32 forward on those tokens: the trainer's own bf16
  forward (`train.dtype: bf16` through `backends.update.autocast` and `model_logprobs`:
  the decoder body in bf16, the output head and log-softmax in fp32), the same computed
  by hand here (a cross-check), and bf16 autocast of everything including the head
  (what `train.dtype: bf16` did before the head was kept in fp32): mean / max |Δ log p|
  and the fraction of tokens whose policy ratio at the sampling weights would already
  sit outside PPO's clip band (|Δ log p| > log 1.2).

* the step's gradient against the fp32 gradient (`train.dtype: bf16-backward`, fp32
  forward with bf16 backward products, and `train.dtype: bf16`), on the fast-bf16
  engine's batch: the gradient of GRPO's token-mean loss at ratio 1,
  −Σ A_i log π(y_it) / N (group-normalized exact-answer rewards, the trainer's
  micro-batches of 8 rows), its relative L2 error ‖g − g_fp32‖ / ‖g_fp32‖ and cosine,
  beside the gradient's own sampling noise: ‖g_fp32(A) − g_fp32(B)‖ / ‖g_fp32(A)‖ for a
  second batch B of the same prompts sampled with another seed at the same weights; and
  the same for AdamW's first update direction g / (|g| + ε), where every element weighs
  alike (with the share of elements whose sign flips).

The verdicts the fast mode's `train.dtype: auto` follows (`policylab.methods.fast_mode`),
each fixed before its measurement:
bf16 training is allowed when the trainer's bf16 forward is no further from the fp32
forward than the fast-bf16 sampler already is (mean and max |Δ log p|, which the TIS
correction is there for) and fewer than 1% of the tokens sit outside the clip band.
bf16-backward training is allowed when its forward's log-probs equal the fp32 forward's
on every token (max |Δ log p| = 0) and, on every batch, its gradient's relative error is
at most a tenth of the gradient's sampling noise (so it adds at most 1% to the variance
of the step direction the sampling already has).
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


def _prompts(tokenizer, examples) -> list[list[int]]:
    """The chat-templated token ids of each example's prompt."""
    out = []
    for e in examples:
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
    """[B, T] log-probs of the batch's tokens: mode fp32 | trainer-bf16 (the trainer's
    train.dtype=bf16 forward) | bf16-backward (its fp32 forward) | bf16-body (by hand: autocast the decoder, head +
    log-softmax in fp32) | bf16-all (autocast everything, the head's logits in bf16)."""
    from policylab.backends.update import autocast
    from policylab.models.logprobs import model_logprobs
    from policylab.models.vocab import response_hidden

    out = []
    for idx in torch.arange(batch.size).split(8):
        mb = batch.select(idx)
        resp = mb.tokens[:, mb.prompt_width:]
        if mode in ("fp32", "trainer-bf16", "bf16-backward"):
            with autocast({"trainer-bf16": "bf16"}.get(mode, mode)):
                lp = model_logprobs(model, mb.tokens, mb.attention_mask, mb.prompt_width, sampling=mb.sampling)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h, head, _cap = response_hidden(model, mb.tokens, mb.attention_mask, mb.prompt_width)
                if mode == "bf16-all":
                    logits = head(h)  # bf16 under autocast
            if mode == "bf16-body":
                logits = torch.nn.functional.linear(h.float(), head.weight.float())
            lp = torch.log_softmax(logits.float(), -1).gather(-1, resp[..., None]).squeeze(-1)
        out.append(torch.where(mb.attention_mask[:, mb.prompt_width:], lp.float(), torch.zeros(())))
    return torch.cat(out)


def _examples(n: int, seed: int):
    from policylab.tasks.arithmetic import ArithmeticTask

    return ArithmeticTask(ops=("+", "*"), digits=1, seed=seed).train_prompts(n)


def _advantages(tok, batch, answers: list[str], group: int) -> torch.Tensor:
    """GRPO's group-normalized advantages of the exact-answer rewards, one per row."""
    from policylab import advantages
    from policylab.kernels.rewards import exact_numeric_reward

    texts = [tok.decode(batch.tokens[i, batch.prompt_width:][batch.loss_mask[i]], skip_special_tokens=True)
             for i in range(batch.size)]
    r = torch.tensor(exact_numeric_reward(texts, [answers[i // group] for i in range(batch.size)]))
    return advantages.grpo(r, batch.group, std="unbiased")


def _step_grad(model, batch, adv: torch.Tensor, mode: str) -> torch.Tensor:
    """The flattened fp64 copy of the gradient of −Σ A_i log π(y_it) / N (GRPO's token
    mean at ratio 1) accumulated over micro-batches of 8 rows, under train.dtype `mode`
    with the trainer's region (`backends.update.autocast`; backwards with autocast off)."""
    from policylab.backends.update import autocast
    from policylab.models.logprobs import model_logprobs

    model.zero_grad(set_to_none=True)
    n = batch.loss_mask.sum()
    with autocast(mode):
        for idx in torch.arange(batch.size).split(8):
            mb = batch.select(idx)
            lp = model_logprobs(model, mb.tokens, mb.attention_mask, mb.prompt_width, sampling=mb.sampling)
            loss = -(adv[idx, None] * lp.float() * mb.loss_mask).sum() / n
            with torch.autocast("cpu", enabled=False):
                loss.backward()
    g = torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return g


ADAM_EPS = 1e-8


def _adam_first(g: torch.Tensor) -> torch.Tensor:
    """AdamW's first update direction from gradient g (bias-corrected moments m = g,
    v = g², so m / (√v + ε) = g / (|g| + ε): about the sign of each element)."""
    return g / (g.abs() + ADAM_EPS)


def _grad_stats(g: torch.Tensor, ref: torch.Tensor) -> dict:
    """Relative L2 error and cosine of gradient g against ref, and the same for AdamW's
    first update direction, where every element counts alike (a small element's error
    weighs as much as a large one's), with the share of elements whose sign flips."""
    u, u_ref = _adam_first(g), _adam_first(ref)
    return {"rel_err": float((g - ref).norm() / ref.norm()),
            "cosine": float(torch.dot(g, ref) / (g.norm() * ref.norm())),
            "adam_rel_err": float((u - u_ref).norm() / u_ref.norm()),
            "sign_flips": float(((g > 0) != (ref > 0)).double().mean())}


def bf16_backward_allowed(res: dict) -> dict:
    """The rule for `train.dtype: bf16-backward` (module doc): log-probs bit-identical to
    fp32, gradient error at most a tenth of the sampling noise on every batch."""
    grads = [b for b in res["gradients"]["batches"] if "skipped" not in b]  # no batch with signal: not allowed
    checks = {"logprobs_identical": res["train_forward"]["bf16-backward"]["max_abs_dlogp"] == 0.0,
              "error_below_tenth_of_noise": bool(grads) and all(
                  b["bf16-backward"]["rel_err"] <= 0.1 * b["noise_rel"] for b in grads)}
    return {**checks, "allowed": all(checks.values())}


def bf16_training_allowed(res: dict) -> dict:
    """The fast mode's rule (module doc): the trainer's bf16 forward against the fp32 one
    is within the fast-bf16 sampler's own mismatch, and < 1% of tokens leave the clip band."""
    eng, tr = res["engines"]["fast-bf16"], res["train_forward"]["trainer-bf16"]
    checks = {"mean_within_sampler": tr["mean_abs_dlogp"] <= eng["mean_abs_dlogp"],
              "max_within_sampler": tr["max_abs_dlogp"] <= eng["max_abs_dlogp"],
              "outside_clip_below_1pct": tr["frac_outside_clip_log1.2"] < 0.01}
    return {**checks, "allowed": all(checks.values())}


def _batch_gradients(model, tok, eng, batch, prompts, answers, a, b: int) -> dict:
    """The gradients of one fast-bf16 batch under each train.dtype, and the sampling noise
    from a second batch of the same prompts (seed + 1000) at the same weights."""
    from policylab import SamplingSettings

    adv = _advantages(tok, batch, answers, a.group)
    out = {"batch": b, "rows_with_signal": int((adv != 0).sum())}
    if not bool((adv != 0).any()):
        return {**out, "skipped": "every group all-equal: no gradient"}
    ref = _step_grad(model, batch, adv, "fp32")
    for mode in ("bf16-backward", "bf16"):
        out[mode] = _grad_stats(_step_grad(model, batch, adv, mode), ref)
    other = eng.generate(prompts, group_size=a.group, sampling=SamplingSettings(), max_new_tokens=a.max_new,
                         policy_version=0, batch_id=f"noise{b}", seed=b + 1000)
    adv_b = _advantages(tok, other, answers, a.group)
    g_b = _step_grad(model, other, adv_b, "fp32")
    noise = _grad_stats(g_b, ref)
    out["noise_rel"], out["noise_cosine"] = noise["rel_err"], noise["cosine"]
    out["noise_adam_rel"], out["noise_sign_flips"] = noise["adam_rel_err"], noise["sign_flips"]
    out["grad_norm_fp32"] = float(ref.norm())
    return out


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
    per_train: dict[str, list] = {"trainer-bf16": [], "bf16-backward": [], "bf16-body": [], "bf16-all": []}
    grads = []
    for b in range(a.batches):
        examples = _examples(a.prompts, seed=100 + b)
        prompts, answers = _prompts(tok, examples), [e.answer for e in examples]
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
                if not a.no_gradients:
                    grads.append(_batch_gradients(model, tok, eng, batch, prompts, answers, a, b))
        print(f"batch {b + 1}/{a.batches} done", file=sys.stderr, flush=True)
    res["engines"] = {k: _merge(v) for k, v in per_engine.items()}
    res["train_forward"] = {k: _merge(v) for k, v in per_train.items()}
    res["bf16_training"] = bf16_training_allowed(res)
    if not a.no_gradients:
        res["gradients"] = {"batches": grads, "loss": "GRPO token mean at ratio 1, -sum(A_i log p_it) / N",
                            "micro_batch_rows": 8}
        res["bf16_backward"] = bf16_backward_allowed(res)
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
        name = {"trainer-bf16": "the trainer's train.dtype: bf16 (bf16 body; head + log-softmax in fp32)",
                "bf16-backward": "the trainer's train.dtype: bf16-backward (fp32 forward)",
                "bf16-body": "the same by hand (cross-check)",
                "bf16-all": "bf16 autocast of everything, head included (not used)"}[k]
        lines.append(f"| {name} | {v['tokens']} | {v['mean_abs_dlogp']:.4f} | {v['max_abs_dlogp']:.4f} | "
                     f"{100 * v['frac_outside_clip_log1.2']:.2f}% |")
    v = r.get("bf16_training")
    if v:
        lines += ["", "## The fast mode's bf16 training rule", "",
                  "bf16 training is allowed when the trainer's bf16 forward is within the fast-bf16 sampler's own "
                  "mismatch (mean and max abs Δlogp) and fewer than 1% of tokens leave the clip band: "
                  + ", ".join(f"{k} {'yes' if ok else 'no'}" for k, ok in v.items() if k != "allowed")
                  + f". **Allowed: {'yes' if v['allowed'] else 'no'}**."]
    g = r.get("gradients")
    if g:
        lines += ["", "## The step's gradient against fp32's, beside the gradient's sampling noise", "",
                  f"Loss: {g['loss']}, micro-batches of {g['micro_batch_rows']} rows. Noise: the relative L2 "
                  "distance between the fp32 gradients of two batches of the same prompts sampled with different "
                  "seeds at the same weights.", "",
                  "| batch | rows with signal | bf16-backward rel. error (cosine) | bf16 autocast rel. error (cosine) "
                  "| sampling noise (cosine of the two batches) | bf16-backward error / noise |",
                  "|---:|---:|---|---|---|---:|"]
        for b in g["batches"]:
            if "skipped" in b:
                lines.append(f"| {b['batch']} | {b['rows_with_signal']} | {b['skipped']} | | | |")
                continue
            bb, ac = b["bf16-backward"], b["bf16"]
            lines.append(f"| {b['batch']} | {b['rows_with_signal']} | {bb['rel_err']:.4f} ({bb['cosine']:.6f}) | "
                         f"{ac['rel_err']:.4f} ({ac['cosine']:.6f}) | {b['noise_rel']:.3f} "
                         f"({b['noise_cosine']:.3f}) | {bb['rel_err'] / b['noise_rel']:.4f} |")
        lines += ["", "The same under AdamW, whose first update is g / (abs(g) + ε) element by element (about the "
                  "sign of each element, so a small element's error weighs as much as a large one's): relative L2 "
                  "error of that update direction and the share of elements whose sign flips. (Reported beside the "
                  "rule, which is on the gradient.)", "",
                  "| batch | bf16-backward: update error (sign flips) | bf16 autocast: update error (sign flips) | "
                  "sampling noise: update distance (sign flips) | bf16-backward / noise |", "|---:|---|---|---|---:|"]
        for b in g["batches"]:
            if "skipped" in b or "adam_rel_err" not in b["bf16-backward"]:
                continue
            bb, ac = b["bf16-backward"], b["bf16"]
            lines.append(f"| {b['batch']} | {bb['adam_rel_err']:.4f} ({100 * bb['sign_flips']:.2f}%) | "
                         f"{ac['adam_rel_err']:.4f} ({100 * ac['sign_flips']:.2f}%) | {b['noise_adam_rel']:.3f} "
                         f"({100 * b['noise_sign_flips']:.1f}%) | {bb['adam_rel_err'] / b['noise_adam_rel']:.3f} |")
        v = r["bf16_backward"]
        lines += ["", "## The fast mode's bf16-backward rule", "",
                  "bf16-backward training is allowed when its forward's log-probs equal fp32's on every token and, "
                  "on every batch, its gradient's relative error is at most a tenth of the sampling noise: "
                  + ", ".join(f"{k} {'yes' if ok else 'no'}" for k, ok in v.items() if k != "allowed")
                  + f". **Allowed: {'yes' if v['allowed'] else 'no'}**."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--no-gradients", action="store_true", help="leave out the gradient comparison")
    ap.add_argument("--out", default=str(RESULTS / "fast_mode_error"), help="output path without suffix ('' = none)")
    a = ap.parse_args(argv)
    t0 = time.time()
    r = run(a)
    r["wall_s"] = round(time.time() - t0, 1)
    if a.out:
        cmd = "python benchmarks/fast_mode_error.py " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(a.out).with_suffix(".json").write_text(json.dumps(r, indent=2))
        Path(a.out).with_suffix(".md").write_text(to_markdown(r, cmd.strip()))
    print(json.dumps({k: r[k] for k in ("engines", "train_forward", "bf16_training", "bf16_backward") if k in r},
                     indent=1))
    return r


if __name__ == "__main__":
    main()
