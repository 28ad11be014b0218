"""Prototype (proposed for policylab.logprobs / update.py): the training forward computes
each distinct prompt ONCE per micro-batch and shares its keys/values with every response
of that prompt, instead of recomputing the same prompt for all G samples.

    .venv/bin/python benchmarks/prefix_share.py          # equivalence + timing on the embedded model

`model_logprobs_shared_prefix` is a drop-in for `policylab.logprobs.model_logprobs` (same
signature, same result up to float rounding, differentiable w.r.t. the model). Rows whose
prompt columns (tokens and mask, i.e. the left-padded prompt block) are identical share one
prefix forward; the expanded keys/values are indexed copies, so the backward sums every
response's gradient into the one prefix graph: mathematically the same gradient as the full
forward of every row. With 4 prompts x 8 samples, 45 prompt tokens and ~30 response tokens
per row, the prompt is ~60% of the tokens: the forward/backward FLOPs drop by ~50%.

The script checks, on a real batch sampled from the embedded model, that log-probs agree
with model_logprobs to 1e-5 and the gradients to float rounding, then times one
forward+backward over the batch (micro-batches as update.optimizer_step forms them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from policylab.logprobs import _chunked, _finish, _split_head, _validate_settings, model_logprobs


def model_logprobs_shared_prefix(model, tokens, attention_mask, prompt_width, *, sampling, chunk_size=None,
                                 with_entropy=False, response_only_logits=True, mask=None):
    """`model_logprobs` with one prefix forward per distinct prompt block (see module doc)."""
    B, L = tokens.shape
    P = prompt_width
    block = torch.cat([tokens[:, :P], attention_mask[:, :P].long()], dim=1)
    uniq, inv = torch.unique(block, dim=0, return_inverse=True)
    if uniq.shape[0] == B or not response_only_logits or L - P < 1:
        return model_logprobs(model, tokens, attention_mask, prompt_width, sampling=sampling, chunk_size=chunk_size,
                              with_entropy=with_entropy, response_only_logits=response_only_logits, mask=mask)
    kv, h_last = _prefix(model, uniq, P)
    return _suffix_logprobs(model, [t[inv] for t in kv], h_last[inv], tokens, attention_mask, P, sampling=sampling,
                            chunk_size=chunk_size, with_entropy=with_entropy, mask=mask)


class SharedPrefix:
    """One prefix forward per distinct prompt for a whole MINIBATCH (not per micro-batch).

    The prompts' keys/values and last hidden state are detached into leaf tensors that
    every micro-batch reads (`logprobs(rows, ...)`); each micro-batch's backward leaves
    their gradient on the leaves, and `backward()`, after the last micro-batch, sends the
    accumulated gradients through the prefix graph once. The summed gradient is the full
    forward's (linearity of the backward); micro-batches then only carry response tokens,
    so they can be small and sorted by length with almost no padding."""

    def __init__(self, model, tokens, attention_mask, prompt_width):
        P = prompt_width
        block = torch.cat([tokens[:, :P], attention_mask[:, :P].long()], dim=1)
        uniq, self.inv = torch.unique(block, dim=0, return_inverse=True)
        kv, h_last = _prefix(model, uniq, P)
        self.outs = kv + [h_last]
        self.leaves = [t.detach().requires_grad_(t.requires_grad) for t in self.outs]
        self.P = P

    def logprobs(self, model, rows, tokens, attention_mask, *, sampling, with_entropy=False, mask=None,
                 chunk_size=None):
        """Micro-batch `rows` (indices into the minibatch) with its tokens [R, P + T'] (the
        minibatch's prompt columns, trailing padding columns may be cut)."""
        inv = self.inv[rows]
        kv, h = self.leaves[:-1], self.leaves[-1]
        return _suffix_logprobs(model, [t[inv] for t in kv], h[inv], tokens, attention_mask, self.P,
                                sampling=sampling, with_entropy=with_entropy, mask=mask, chunk_size=chunk_size)

    def backward(self) -> None:
        pairs = [(o, leaf.grad) for o, leaf in zip(self.outs, self.leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


def _prefix(model, uniq, P):
    """Forward of the distinct prompt blocks [U, P] (tokens then mask columns): per layer
    keys and values [U, kv_heads, P, head_dim] (keys of layer 0, values of layer 0, ...)
    and the final hidden state at the last prompt column [U, H]."""
    decoder, _, _ = _split_head(model)
    u_tok, u_mask = uniq[:, :P], uniq[:, P:].bool()
    u_pos = (u_mask.long().cumsum(-1) - 1).masked_fill(~u_mask, 0)
    pre = decoder(input_ids=u_tok, attention_mask=u_mask.long(), position_ids=u_pos, use_cache=True)
    kv = []
    for layer in pre.cache.layers:  # transformers >= 5 (`past_key_values` before)
        kv += [layer.keys, layer.values]
    return kv, pre.last_hidden_state[:, P - 1]


def _suffix_logprobs(model, kv, h_last, tokens, attention_mask, P, *, sampling, chunk_size=None,
                     with_entropy=False, mask=None):
    """Log-probs of the response tokens given the rows' prefix keys/values and last prompt
    hidden state: one forward over the response tokens but the last, attending to the cache."""
    from transformers import DynamicCache

    s = sampling
    _validate_settings(s.temperature, s.top_k, s.top_p, chunk_size)
    L = tokens.shape[1]
    targets = tokens[:, P:]
    if mask is None:
        mask = attention_mask[:, P:]
    decoder, head, softcap = _split_head(model)
    hidden = h_last[:, None]  # [R, 1, H] predicts response token 0
    if L - P > 1:
        am = attention_mask[:, :-1]
        pos = (am.long().cumsum(-1) - 1).masked_fill(~am, 0)
        cache = DynamicCache(config=model.config)
        for i in range(len(kv) // 2):
            cache.update(kv[2 * i], kv[2 * i + 1], i)
        suf = decoder(input_ids=tokens[:, P:-1], attention_mask=am.long(), position_ids=pos[:, P:],
                      cache=cache, use_cache=True)
        hidden = torch.cat([hidden, suf.last_hidden_state], dim=1)
    H = hidden.shape[-1]

    def row_logits(h):
        z = head(h)
        return z if softcap is None else torch.tanh(z / softcap) * softcap

    flat = hidden.reshape(-1, H)
    lp, ent = _chunked(row_logits, flat, targets.reshape(-1), flat.shape[0], chunk_size,
                       s.temperature, s.top_k, s.top_p, with_entropy)
    settings = f"temperature={s.temperature}, top_k={s.top_k}, top_p={s.top_p}"
    return _finish(lp, ent, targets, mask, with_entropy, settings)


# ------------------------------------------------- the proposed change to update.py
_LOOP_OLD = """    for idx in torch.argsort(lengths, descending=True, stable=True).split(micro_batch_size):
        mb, mb_adv = trim(minibatch.select(idx), adv[idx])
        with _autocast(dtype):
            logp, entropy = model_logprobs(
                model, mb.tokens, mb.attention_mask, mb.prompt_width,
                sampling=mb.sampling, chunk_size=chunk_size, with_entropy=True,
            )
"""
_LOOP_NEW = """    with _autocast(dtype):  # each distinct prompt of the minibatch: one forward, shared
        prefix = SharedPrefix(model, minibatch.tokens, minibatch.attention_mask, minibatch.prompt_width)
    for idx in torch.argsort(lengths, descending=True, stable=True).split(micro_batch_size):
        mb, mb_adv = trim_tail(minibatch.select(idx), adv[idx])
        with _autocast(dtype):
            logp, entropy = prefix.logprobs(
                model, idx, mb.tokens, mb.attention_mask,
                sampling=mb.sampling, chunk_size=chunk_size, with_entropy=True,
            )
"""
_NORM_OLD = """    grad_norm = _grad_norm(model)
"""
_NORM_NEW = """    if not nonfinite:
        prefix.backward()  # the prompts' share of the gradient, through the prefix graph once
    grad_norm = _grad_norm(model)
"""


def trim_tail(mb, adv):
    """`update.trim` without cutting prompt columns (the shared prefix covers all of them):
    drops the trailing response columns that are padding for every row of `mb`."""
    import dataclasses

    from policylab.batch import _BT_FIELDS

    valid_t = mb.loss_mask.any(0).nonzero()
    T_keep = int(valid_t[-1]) + 1 if valid_t.numel() else 1
    P, T_full = mb.prompt_width, mb.loss_mask.shape[1]
    changes = {"tokens": mb.tokens[:, : P + T_keep], "attention_mask": mb.attention_mask[:, : P + T_keep],
               "loss_mask": mb.loss_mask[:, :T_keep]}
    for name in _BT_FIELDS:
        t = getattr(mb, name)
        if t is not None:
            changes[name] = t[:, :T_keep]
    changes["extras"] = {k: (v[:, :T_keep] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == T_full
                             else v) for k, v in mb.extras.items()}
    return dataclasses.replace(mb, **changes), (adv[:, :T_keep] if adv.dim() == 2 else adv)


def proposed_optimizer_step():
    """`policylab.update.optimizer_step` as it is in the tree, with the proposed change
    applied (the prefix once per minibatch; see `proposed_diff()`); refuses if the tree's
    function no longer contains the lines the change replaces."""
    import inspect

    import policylab.update as update

    src = inspect.getsource(update.optimizer_step)
    for old in (_LOOP_OLD, _NORM_OLD):
        if old not in src:
            raise RuntimeError("policylab.update.optimizer_step changed: the prototype patch no longer applies")
    src = src.replace(_LOOP_OLD, _LOOP_NEW).replace(_NORM_OLD, _NORM_NEW)
    ns = dict(vars(update), SharedPrefix=SharedPrefix, trim_tail=trim_tail)
    exec(compile(src, update.__file__ + " (+ shared prefix)", "exec"), ns)
    return ns["optimizer_step"]


def proposed_diff() -> str:
    import difflib
    import inspect

    import policylab.update as update

    old = inspect.getsource(update.optimizer_step)
    new = old.replace(_LOOP_OLD, _LOOP_NEW).replace(_NORM_OLD, _NORM_NEW)
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "update.py", "update.py (proposed)"))


# ------------------------------------------------------------------------------ check
def _fwd_bwd(fn, model, batch, order, mbs):
    from policylab.update import trim

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
    from policylab.models import load_policy
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
    key = batch.extras["prompt_index"] * 10_000 - lengths  # group-contiguous: by prompt, then length
    by_group = torch.argsort(key, stable=True)
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
        variants = [
            ("shared prefix per micro-batch, by length",
             lambda: _fwd_bwd(model_logprobs_shared_prefix, model, batch, by_len, mbs)),
            ("shared prefix per micro-batch, by prompt then length",
             lambda: _fwd_bwd(model_logprobs_shared_prefix, model, batch, by_group, mbs)),
            ("shared prefix once per minibatch (SharedPrefix), by length",
             lambda: _fwd_bwd_minibatch_prefix(model, batch, by_len, mbs)),
        ]
        for name, fn in variants:
            t_new, lp_new, g_new = fn()
            d_lp, rel = compare(lp_new, g_new, lp_ref, g_ref)
            rows.append(dict(mbs=mbs, variant=name, seconds=t_new, dlogp=d_lp, grad=rel))
        for r in rows[-4:]:
            print(f"mbs {r['mbs']:2d} {r['variant']:58s} {r['seconds']:5.1f}s  max|dlogp| {r['dlogp']:.1e}  "
                  f"max rel grad diff {r['grad']:.1e}", flush=True)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(command="python benchmarks/prefix_share.py " + " ".join(argv), batch=head,
                    load_before=round(load_before, 2), load_after=round(os.getloadavg()[0], 2),
                    threads=torch.get_num_threads())
        out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
        lines = ["# Shared-prefix training forward (prototype): time of one forward+backward over a batch", "",
                 f"Command: `{meta['command']}`; load average {meta['load_before']} before, {meta['load_after']} after.  ",
                 f"Model {a.model}, fp32; {head} (4 prompts x 8 samples, <= {a.max_new_tokens} new tokens, T = 1, seed 0).  ",
                 "Differences are against the full forward at the same micro-batch size (rows marked 'vs micro-batch' "
                 "show the fp32 noise floor: the same full forward split differently).", "",
                 "| micro-batch | variant | fwd+bwd (s) | max abs Δlogp | max rel grad diff |", "|---:|---|---:|---:|---:|"]
        lines += [f"| {r['mbs']} | {r['variant']} | {r['seconds']:.1f} | {r['dlogp']:.1e} | {r['grad']:.1e} |" for r in rows]
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
