"""The memory-lean parts of the log-prob path (policylab.models.logprobs): the target
log-prob's own backward, the detached entropy in row blocks, and the tied head whose
gradient autograd can sum in place. Each is checked against autograd's plain graph, bit
for bit where the module promises it, and by hand on a small case."""

from __future__ import annotations

import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from policylab import SamplingSettings
from policylab.models import logprob_rows as LR
from policylab.models import logprobs as LP
from policylab.models.logprobs import model_logprobs, token_logprobs


def test_target_logprob_hand_worked():
    # p = (1/4, 1/2, 1/4); target 1: logp = ln 1/2, d logp / dz = onehot - p = (-1/4, 1/2, -1/4)
    z = torch.tensor([[[0.0, math.log(2.0), 0.0]]], dtype=torch.float64, requires_grad=True)
    lp = token_logprobs(z, torch.tensor([[1]]))
    assert lp.item() == pytest.approx(math.log(0.5), abs=1e-15)
    (g,) = torch.autograd.grad(lp.sum(), z)
    assert g[0, 0].tolist() == pytest.approx([-0.25, 0.5, -0.25], abs=1e-15)


def _naive(z, targets, temperature=1.0, top_k=0, top_p=1.0, allowed_ids=()):
    """autograd's plain graph: scale, restrict, truncate, log_softmax, gather."""
    x = LP.restrict_to(z / temperature if temperature != 1.0 else z, allowed_ids)
    if top_k or top_p < 1.0:
        x = x.masked_fill(~LP.kept_set(x, top_k=top_k, top_p=top_p), float("-inf"))
    return torch.log_softmax(x, -1).gather(-1, targets[..., None]).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kw", [{}, {"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.9},
                                {"allowed_ids": (1, 4, 9, 30)}])
def test_target_logprob_bit_identical_to_the_autograd_graph(dtype, kw):
    gen = torch.Generator().manual_seed(3)
    z = (torch.randn(4, 6, 40, generator=gen, dtype=dtype) * 2).requires_grad_()
    ids = kw.get("allowed_ids")
    targets = torch.tensor(ids)[torch.randint(0, len(ids), (4, 6), generator=gen)] if ids else \
        torch.randint(0, 40, (4, 6), generator=gen)
    ref = _naive(z, targets, **kw)
    keep = torch.isfinite(ref)  # score only tokens the sampler could have drawn
    assert keep.any()
    w = torch.randn(4, 6, generator=gen, dtype=dtype) * keep
    (g_ref,) = torch.autograd.grad((ref.masked_fill(~keep, 0.0) * w).sum(), z)
    for entropy in (False, "detached"):
        out = token_logprobs(z, targets, mask=keep, with_entropy=entropy, **kw)
        lp = out[0] if entropy else out
        assert torch.equal(lp[keep], ref[keep])
        (g,) = torch.autograd.grad((lp * w).sum(), z)
        assert torch.equal(g, g_ref)


def test_target_logprob_second_backward_and_no_double_backward():
    z = torch.randn(3, 17, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([[0, 5, 16]]).reshape(3)
    lp = LR.TargetLogProb.apply(z, t, False)[0]
    (g1,) = torch.autograd.grad(lp.sum(), z, retain_graph=True)
    (g2,) = torch.autograd.grad(lp.sum(), z)  # the kept log-softmax is unchanged by the first
    assert torch.equal(g1, g2)
    lp = LR.TargetLogProb.apply(z, t, False)[0]
    (g,) = torch.autograd.grad(lp.sum(), z, create_graph=True)
    assert not g.requires_grad  # the backward is not differentiable: no graph to go through twice
    with pytest.raises(RuntimeError, match="does not require grad"):
        g.sum().backward()


def test_detached_entropy_in_blocks_equals_one_block(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    logp_all = torch.log_softmax(torch.randn(37, 50, generator=gen, dtype=torch.float64), -1)
    logp_all[3, :10] = float("-inf")  # dropped tokens (top-k / top-p) weigh 0
    whole = LR.entropy(logp_all)
    monkeypatch.setattr(LR, "ENTROPY_BLOCK", 50 * 4)  # 4 rows per block, the last one short
    blocks = LR.entropy_in_blocks(logp_all)
    torch.testing.assert_close(blocks, whole, rtol=0, atol=1e-14)
    p = logp_all.exp()  # naive reference: -Σ p log p over the kept entries
    ref = torch.stack([-(p[i][p[i] > 0] * logp_all[i][p[i] > 0]).sum() for i in range(37)])
    torch.testing.assert_close(blocks, ref)


def _backward_ops(model, plain_graph: bool, monkeypatch):
    """(embedding-weight gradient, [V, H]-sized aten::add calls in the backward);
    `plain_graph`: the head called as the module it is (autograd's own graph)."""
    torch.manual_seed(0)
    B, P, T = 3, 4, 5
    V = model.config.vocab_size
    tokens = torch.randint(3, V, (B, P + T))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    decoder, head, softcap = LP.split_head(model)
    with monkeypatch.context() as mp:
        if plain_graph:
            mp.setattr(LP, "_head", lambda head, h: head(h))
        hidden = decoder(input_ids=tokens[:, :-1], attention_mask=mask[:, :-1].long()).last_hidden_state[:, P - 1:]
        lp = LP.logprobs_from_hidden(hidden, head, softcap, tokens[:, P:], mask[:, P:],
                                     sampling=SamplingSettings(temperature=1.0))
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        lp.sum().backward()
    weight = model.get_input_embeddings().weight
    shape = list(weight.shape)
    adds = [e for e in prof.events() if e.name == "aten::add" and e.input_shapes and e.input_shapes[0] == shape]
    return weight.grad.clone(), len(adds)


def test_tied_head_gradient_is_summed_in_place(tiny_model, monkeypatch):
    assert tiny_model.get_output_embeddings().weight is tiny_model.get_input_embeddings().weight
    g_plain, adds_plain = _backward_ops(tiny_model, True, monkeypatch)
    g_tied, adds_tied = _backward_ops(tiny_model, False, monkeypatch)
    assert adds_plain == 1  # negative control: autograd's own graph allocates the sum
    assert adds_tied == 0  # the embedding's gradient was added into the head's buffer
    assert torch.equal(g_tied, g_plain)  # same two tensors, same order


def test_untied_head_gradients_equal_the_plain_graph(tokenizer, monkeypatch):
    from policylab.models.loading import tiny_llama

    m = tiny_llama(tokenizer)
    m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone())  # untie
    g_plain, _ = _backward_ops(m, True, monkeypatch)
    head_plain = m.lm_head.weight.grad.clone()
    g_ours, _ = _backward_ops(m, False, monkeypatch)
    assert torch.equal(g_ours, g_plain) and torch.equal(m.lm_head.weight.grad, head_plain)


def test_model_logprobs_tied_path_equals_the_plain_graph(tiny_model):
    torch.manual_seed(1)
    tokens = torch.randint(3, tiny_model.config.vocab_size, (2, 9))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    s = SamplingSettings(temperature=0.9)  # random targets: no truncation that could drop them
    lp = model_logprobs(tiny_model, tokens, mask, 4, sampling=s)
    lp.sum().backward()
    got = {n: p.grad.clone() for n, p in tiny_model.named_parameters()}
    tiny_model.zero_grad(set_to_none=True)
    logits = tiny_model(input_ids=tokens[:, :-1], attention_mask=mask[:, :-1].long()).logits[:, 3:]
    ref = _naive(logits, tokens[:, 4:], temperature=0.9)
    ref.sum().backward()
    torch.testing.assert_close(lp, ref)
    # equal up to fp32 summation order, which moves with the thread count: with 2 threads
    # one element of the tied embedding's gradient (|g| <= 4) differed by 1.4e-5 (~30 ulps
    # of 4), with 1 thread none; so the tolerance scales with the gradient's magnitude
    for n, p in tiny_model.named_parameters():
        scale = float(p.grad.abs().max())
        torch.testing.assert_close(got[n], p.grad, rtol=1.3e-6, atol=1e-5 * max(scale, 1.0), msg=n)
