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
import time

import torch

from policylab.logprobs import _chunked, _finish, _split_head, _validate_settings, model_logprobs


def model_logprobs_shared_prefix(model, tokens, attention_mask, prompt_width, *, sampling, chunk_size=None,
                                 with_entropy=False, response_only_logits=True, mask=None):
    """`model_logprobs` with one prefix forward per distinct prompt block (see module doc)."""
    from transformers import DynamicCache

    B, L = tokens.shape
    P = prompt_width
    block = torch.cat([tokens[:, :P], attention_mask[:, :P].long()], dim=1)
    uniq, inv = torch.unique(block, dim=0, return_inverse=True)
    if uniq.shape[0] == B or not response_only_logits or L - P < 1:
        return model_logprobs(model, tokens, attention_mask, prompt_width, sampling=sampling, chunk_size=chunk_size,
                              with_entropy=with_entropy, response_only_logits=response_only_logits, mask=mask)
    s = sampling
    _validate_settings(s.temperature, s.top_k, s.top_p, chunk_size)
    targets = tokens[:, P:]
    if mask is None:
        mask = attention_mask[:, P:]
    decoder, head, softcap = _split_head(model)
    am = attention_mask[:, :-1]
    pos = (am.long().cumsum(-1) - 1).masked_fill(~am, 0)
    u_tok, u_mask = uniq[:, :P], uniq[:, P:].bool()
    u_pos = (u_mask.long().cumsum(-1) - 1).masked_fill(~u_mask, 0)
    pre = decoder(input_ids=u_tok, attention_mask=u_mask.long(), position_ids=u_pos, use_cache=True)
    pre_cache = pre.past_key_values if getattr(pre, "past_key_values", None) is not None else pre.cache
    hidden0 = pre.last_hidden_state[inv, P - 1 :]  # [B, 1, H] predicts response token 0
    if L - P > 1:
        cache = DynamicCache(config=model.config)
        for i, layer in enumerate(pre_cache.layers):
            cache.update(layer.keys[inv], layer.values[inv], i)
        suf = decoder(input_ids=tokens[:, P:-1], attention_mask=am.long(), position_ids=pos[:, P:],
                      past_key_values=cache, use_cache=True)
        hidden = torch.cat([hidden0, suf.last_hidden_state], dim=1)
    else:
        hidden = hidden0
    H = hidden.shape[-1]

    def row_logits(h):
        z = head(h)
        return z if softcap is None else torch.tanh(z / softcap) * softcap

    flat = hidden.reshape(-1, H)
    lp, ent = _chunked(row_logits, flat, targets.reshape(-1), flat.shape[0], chunk_size,
                       s.temperature, s.top_k, s.top_p, with_entropy)
    settings = f"temperature={s.temperature}, top_k={s.top_k}, top_p={s.top_p}"
    return _finish(lp, ent, targets, mask, with_entropy, settings)


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


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--mbs", default="8,16,32")
    a = ap.parse_args(argv)
    from policylab import SamplingSettings
    from policylab.engines.fast import FastEngine
    from policylab.models import load_policy
    from policylab.tasks.arithmetic import ArithmeticTask

    model, tok = load_policy(a.model)
    ex = ArithmeticTask(ops=("+", "*"), digits=1, seed=0).train_prompts(4)
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": e.prompt}], add_generation_prompt=True,
                                            tokenize=True)["input_ids"]) for e in ex]
    batch = FastEngine(model, tok).generate(prompts, group_size=8, sampling=SamplingSettings(), max_new_tokens=a.max_new_tokens,
                                            policy_version=0, batch_id="x", seed=0)
    model.train()
    lengths = batch.attention_mask.sum(-1)
    by_len = torch.argsort(lengths, descending=True, stable=True)
    # group-contiguous: by prompt, then by length inside the prompt
    key = batch.extras["prompt_index"] * 10_000 - lengths
    by_group = torch.argsort(key, stable=True)
    print(f"batch: {batch.size} rows, prompt width {batch.prompt_width}, response tokens {int(batch.loss_mask.sum())}")
    for mbs in [int(x) for x in a.mbs.split(",")]:
        t_ref, lp_ref, g_ref = _fwd_bwd(model_logprobs, model, batch, by_len, mbs)
        for name, order in (("by length", by_len), ("by prompt, then length", by_group)):
            t_new, lp_new, g_new = _fwd_bwd(model_logprobs_shared_prefix, model, batch, order, mbs)
            d_lp = float((lp_new - lp_ref)[batch.loss_mask].abs().max())
            rel = max(float((g_new[n] - g_ref[n]).norm() / g_ref[n].norm().clamp_min(1e-30)) for n in g_ref)
            print(f"mbs {mbs:2d}: full forward {t_ref:5.1f}s | shared prefix ({name}) {t_new:5.1f}s  "
                  f"max |dlogp| {d_lp:.1e}  max rel grad diff {rel:.1e}", flush=True)


if __name__ == "__main__":
    main()
