"""Time and check `policylab.models.prefix.SharedPrefix` (train.shared_prefix, on by default)
on a real batch: one prefix forward per distinct prompt vs the full forward of every row.

    .venv/bin/python benchmarks/prefix_share.py          # embedded model; writes results/prefix_share.{json,md}

The batch is sampled from the model (4 prompts x 8 samples, <= 48 new tokens, T = 1,
seed 0). For each micro-batch size it times one forward+backward over the batch the way
update.optimizer_step runs it (micro-batches sorted by length), full forward vs shared
prefix, and reports the largest log-prob difference and the largest gradient difference
relative to each tensor's scale (fp32 rounding level expected; the full forward split
differently shows the noise floor).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from policylab.models.logprobs import model_logprobs
from policylab.models.prefix import SharedPrefix


# ------------------------------------------------------------------------------ check
def _fwd_bwd(fn, model, batch, order, mbs):
    from policylab.backends.update import trim

    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    out = torch.zeros(batch.loss_mask.shape)
    adv = torch.zeros(batch.size)
    for idx in order.split(mbs):
        mb, _ = trim(batch.select(idx), adv[idx])
        lp, ent = fn(model, mb.tokens, mb.attention_mask, mb.prompt_width, sampling=mb.sampling, with_entropy=True)
        (lp.sum() / 1000.0).backward()
        out[idx, : lp.shape[1]] = lp.detach()
    dt = time.perf_counter() - t0
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return dt, out, grads


def _fwd_bwd_minibatch_prefix(model, batch, order, mbs):
    """SharedPrefix: the prefix once for the whole batch, micro-batches of response tokens."""
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    out = torch.zeros(batch.loss_mask.shape)
    P = batch.prompt_width
    sp = SharedPrefix(model, batch.tokens, batch.attention_mask, P)
    for idx in order.split(mbs):
        valid = batch.loss_mask[idx].any(0).nonzero()
        cols = P + (int(valid[-1]) + 1 if valid.numel() else 1)
        lp, ent = sp.logprobs(model, idx, batch.tokens[idx, :cols], batch.attention_mask[idx, :cols],
                              sampling=batch.sampling, with_entropy=True)
        (lp.sum() / 1000.0).backward()
        out[idx, : lp.shape[1]] = lp.detach()
    sp.backward()
    dt = time.perf_counter() - t0
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return dt, out, grads


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--mbs", default="8,16,32")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "prefix_share"),
                    help="results path without suffix ('' = none)")
    argv = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(argv)
    from policylab import SamplingSettings
    from policylab.engines.fast import FastEngine
    from policylab.models.loading import load_policy
    from policylab.tasks.arithmetic import ArithmeticTask

    load_before = os.getloadavg()[0]
    model, tok = load_policy(a.model)
    ex = ArithmeticTask(ops=("+", "*"), digits=1, seed=0).train_prompts(4)
    prompts = []
    for e in ex:
        ids = tok.apply_chat_template([{"role": "user", "content": e.prompt}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    batch = FastEngine(model, tok).generate(prompts, group_size=8, sampling=SamplingSettings(),
                                            max_new_tokens=a.max_new_tokens, policy_version=0, batch_id="x", seed=0)
    model.train()
    lengths = batch.attention_mask.sum(-1)
    by_len = torch.argsort(lengths, descending=True, stable=True)
    by_resp = torch.argsort(batch.loss_mask.sum(-1), descending=True, stable=True)
    head = (f"batch: {batch.size} rows, prompt width {batch.prompt_width}, "
            f"response tokens {int(batch.loss_mask.sum())}, real tokens {int(batch.attention_mask.sum())}")
    print(head, flush=True)
    rows = []

    def compare(lp_new, g_new, lp_ref, g_ref):
        d_lp = float((lp_new - lp_ref)[batch.loss_mask].abs().max())
        rel = max(float((g_new[n] - g_ref[n]).norm() / g_ref[n].norm().clamp_min(1e-30)) for n in g_ref)
        return d_lp, rel

    ref8 = None
    for mbs in [int(x) for x in a.mbs.split(",")]:
        t_ref, lp_ref, g_ref = _fwd_bwd(model_logprobs, model, batch, by_len, mbs)
        if ref8 is None:
            ref8 = (mbs, lp_ref, g_ref)
            rows.append(dict(mbs=mbs, variant="full forward (reference)", seconds=t_ref, dlogp=0.0, grad=0.0))
        else:  # the fp32 noise floor: the same full forward, split differently
            d_lp, rel = compare(lp_ref, g_ref, ref8[1], ref8[2])
            rows.append(dict(mbs=mbs, variant=f"full forward (vs micro-batch {ref8[0]})", seconds=t_ref,
                             dlogp=d_lp, grad=rel))
        variants = [("shared prefix once per minibatch (SharedPrefix), by response length",
                     lambda: _fwd_bwd_minibatch_prefix(model, batch, by_resp, mbs))]
        for name, fn in variants:
            t_new, lp_new, g_new = fn()
            d_lp, rel = compare(lp_new, g_new, lp_ref, g_ref)
            rows.append(dict(mbs=mbs, variant=name, seconds=t_new, dlogp=d_lp, grad=rel))
        for r in rows[-2:]:
            print(f"mbs {r['mbs']:2d} {r['variant']:58s} {r['seconds']:5.1f}s  max|dlogp| {r['dlogp']:.1e}  "
                  f"max rel grad diff {r['grad']:.1e}", flush=True)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(command="python benchmarks/prefix_share.py " + " ".join(argv), batch=head,
                    load_before=round(load_before, 2), load_after=round(os.getloadavg()[0], 2),
                    threads=torch.get_num_threads())
        out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
        lines = ["# Shared-prefix training forward (policylab.models.prefix.SharedPrefix): one forward+backward over a batch", "",
                 f"Command: `{meta['command']}`; load average {meta['load_before']} before, {meta['load_after']} after.  ",
                 f"Model {a.model}, fp32; {head} (4 prompts x 8 samples, <= {a.max_new_tokens} new tokens, T = 1, seed 0).  ",
                 "Differences are against the full forward at the same micro-batch size (rows marked 'vs micro-batch' "
                 "show the fp32 noise floor: the same full forward split differently).", "",
                 "| micro-batch | variant | fwd+bwd (s) | max abs Δlogp | max rel grad diff |", "|---:|---|---:|---:|---:|"]
        lines += [f"| {r['mbs']} | {r['variant']} | {r['seconds']:.1f} | {r['dlogp']:.1e} | {r['grad']:.1e} |" for r in rows]
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
