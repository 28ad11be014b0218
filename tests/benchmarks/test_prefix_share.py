"""benchmarks/prefix_share.py (proposed for policylab.logprobs): one prefix forward per
distinct prompt gives the same log-probs, entropies and gradients as the full forward."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from policylab import SamplingSettings
from policylab.engines.fast import FastEngine
from policylab.logprobs import model_logprobs

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 300], [1, 40, 41, 42]]


@pytest.fixture(scope="module")
def shared():
    spec = importlib.util.spec_from_file_location("bench_prefix_share", BENCH / "prefix_share.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.model_logprobs_shared_prefix


def _batch(model, tokenizer, sampling, T=8, G=3, seed=0):
    with torch.no_grad():
        model.model.norm.weight.mul_(20.0)
    return FastEngine(model, tokenizer).generate(PROMPTS, group_size=G, sampling=sampling, max_new_tokens=T,
                                                 policy_version=0, batch_id="b", seed=seed)


def _grads(model, fn, batch, **kw):
    model.zero_grad(set_to_none=True)
    lp, ent = fn(model, batch.tokens, batch.attention_mask, batch.prompt_width, sampling=batch.sampling,
                 with_entropy=True, **kw)
    # a loss that uses both outputs, weights differing by row so a swapped row would show
    w = torch.arange(1, lp.shape[0] + 1, dtype=lp.dtype)[:, None]
    ((w * lp).sum() + 0.1 * ent.sum()).backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("sampling", [SamplingSettings(), SamplingSettings(temperature=0.8, top_k=30)], ids=["t1", "topk"])
def test_same_logprobs_entropy_and_gradients(tiny_model, tokenizer, shared, sampling):
    batch = _batch(tiny_model, tokenizer, sampling)
    model = tiny_model.double()
    # rows of one prompt are not adjacent in a micro-batch sorted by length: shuffle them
    perm = torch.randperm(batch.size, generator=torch.Generator().manual_seed(1))
    batch = batch.select(perm)
    model.train()
    lp0, ent0, g0 = _grads(model, model_logprobs, batch)
    lp1, ent1, g1 = _grads(model, shared, batch)
    assert batch.loss_mask.sum() >= 20 and len(g0) == len(g1)
    assert_close(lp1, lp0, rtol=0, atol=1e-10)
    assert_close(ent1, ent0, rtol=0, atol=1e-10)
    # gradients: fp64 except HF's LlamaRMSNorm, which computes in fp32 whatever the model
    # dtype; summing the G copies' gradients before that fp32 step (shared prefix) or after
    # it (full forward) then differs at fp32 rounding: ~1e-7 of each tensor's scale (an
    # element with cancellation can be off by more relative to itself)
    for name in g0:
        err = float((g1[name] - g0[name]).abs().max() / g0[name].abs().max())
        assert err < 1e-6, (name, err)


def test_fp32_chunks_and_mask(tiny_model, tokenizer, shared):
    batch = _batch(tiny_model, tokenizer, SamplingSettings(), seed=2)
    mask = batch.loss_mask.clone()
    mask[:, 0] = False  # score only some tokens
    with torch.no_grad():
        a = model_logprobs(tiny_model, batch.tokens, batch.attention_mask, batch.prompt_width,
                           sampling=batch.sampling, mask=mask)
        b = shared(tiny_model, batch.tokens, batch.attention_mask, batch.prompt_width, sampling=batch.sampling,
                   mask=mask, chunk_size=5)
    assert_close(b, a, rtol=0, atol=1e-5)
    assert bool((b[~mask] == 0).all())


def test_one_response_token_and_no_shared_prompt(tiny_model, tokenizer, shared):
    batch = _batch(tiny_model, tokenizer, SamplingSettings(), T=1)
    assert batch.loss_mask.shape[1] == 1
    with torch.no_grad():
        args = (batch.tokens, batch.attention_mask, batch.prompt_width)
        assert_close(shared(tiny_model, *args, sampling=batch.sampling),
                     model_logprobs(tiny_model, *args, sampling=batch.sampling), rtol=0, atol=1e-5)
        one = batch.select(torch.tensor([0, 3, 6]))  # one row per prompt: the plain path
        args = (one.tokens, one.attention_mask, one.prompt_width)
        assert torch.equal(shared(tiny_model, *args, sampling=one.sampling),
                           model_logprobs(tiny_model, *args, sampling=one.sampling))


def test_shared_prefix_once_per_minibatch(tiny_model, tokenizer):
    """SharedPrefix: prefix leaves read by several micro-batches, one backward through the
    prefix at the end: the same gradient as full forwards of every micro-batch."""
    spec = importlib.util.spec_from_file_location("bench_prefix_share2", BENCH / "prefix_share.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    batch = _batch(tiny_model, tokenizer, SamplingSettings(), seed=3)
    model = tiny_model.double().train()
    order = torch.randperm(batch.size, generator=torch.Generator().manual_seed(2))
    P = batch.prompt_width
    weights = torch.arange(1, batch.size + 1, dtype=torch.float64)

    def run(shared):
        model.zero_grad(set_to_none=True)
        sp = mod.SharedPrefix(model, batch.tokens, batch.attention_mask, P) if shared else None
        out = torch.zeros(batch.loss_mask.shape, dtype=torch.float64)
        for idx in order.split(4):
            valid = batch.loss_mask[idx].any(0).nonzero()
            cols = P + int(valid[-1]) + 1
            tok, am = batch.tokens[idx, :cols], batch.attention_mask[idx, :cols]
            if shared:
                lp = sp.logprobs(model, idx, tok, am, sampling=batch.sampling)
            else:
                lp = model_logprobs(model, tok, am, P, sampling=batch.sampling)
            (weights[idx, None] * lp).sum().backward()
            out[idx, : lp.shape[1]] = lp.detach()
        if shared:
            sp.backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    lp0, g0 = run(False)
    lp1, g1 = run(True)
    assert_close(lp1, lp0, rtol=0, atol=1e-10)
    for name in g0:  # fp32 RMSNorm inside the fp64 model: see the test above
        err = float((g1[name] - g0[name]).abs().max() / g0[name].abs().max())
        assert err < 1e-6, (name, err)
    # without the final backward the prefix's share of the gradient is missing: far off
    model.zero_grad(set_to_none=True)
    sp = mod.SharedPrefix(model, batch.tokens, batch.attention_mask, P)
    (weights[:, None] * sp.logprobs(model, torch.arange(batch.size), batch.tokens, batch.attention_mask,
                                    sampling=batch.sampling)).sum().backward()
    g_missing = model.model.layers[0].self_attn.q_proj.weight.grad
    assert g_missing is None or float((g_missing - g0["model.layers.0.self_attn.q_proj.weight"]).abs().max()) > 1e-3


def test_proposed_optimizer_step_equals_the_tree_version(tmp_path, tiny_model_dir):
    """The proposed update.optimizer_step (prefix once per minibatch) gives the same loss,
    metrics and gradients as the one in the tree on a real GRPO batch (fp64 model)."""
    from policylab.config import config_from_dict
    from policylab.methods import stages
    from policylab.trainer import Trainer
    from policylab.update import optimizer_step

    spec = importlib.util.spec_from_file_location("bench_prefix_share3", BENCH / "prefix_share.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = config_from_dict({
        "method": "grpo", "model": str(tiny_model_dir), "seed": 0, "method_params": {"kl_coef": 0.0},
        "rollout": {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 6},
        "train": {"steps": 1, "micro_batch_size": 5, "dtype": "fp64"},
        "eval": {"before": False, "after": False}, "log": {"tensorboard": False, "progress": False},
        "run_dir": str(tmp_path / "run"),
    })
    tr = Trainer(cfg)
    with torch.no_grad():
        tr.model.model.norm.weight.mul_(20.0)  # peaked distributions: rewards/advantages vary less trivially
    batch, _ = tr.collect()
    batch = tr.prepare(batch)
    adv, _ = stages.compute_advantages(tr.recipe, batch, {})
    adv = adv + 0.1 * torch.randn(adv.shape, generator=torch.Generator().manual_seed(0), dtype=adv.dtype)
    opt = torch.optim.SGD(tr.model.parameters(), lr=0.0)  # keeps the weights: compare the gradients
    kw = dict(micro_batch_size=5, dtype="fp64", grad_clip=0.0, old_from_same_forward=True, L_norm=None)
    tr.model.train()
    m0 = optimizer_step(tr.model, opt, None, tr.recipe, batch, adv, **kw)
    g0 = {n: p.grad.clone() for n, p in tr.model.named_parameters()}
    m1 = mod.proposed_optimizer_step()(tr.model, opt, None, tr.recipe, batch, adv, **kw)
    g1 = {n: p.grad.clone() for n, p in tr.model.named_parameters()}
    assert m0.keys() == m1.keys()
    for k in m0:
        assert m1[k] == pytest.approx(m0[k], rel=1e-6, abs=1e-9), k
    for name in g0:  # fp32 RMSNorm inside the fp64 model: relative to each tensor's scale
        err = float((g1[name] - g0[name]).abs().max() / g0[name].abs().max().clamp_min(1e-300))
        assert err < 1e-6, (name, err)
