"""bf16 training (`train.dtype: bf16`): the decoder body under bf16 autocast, the output
head and the log-softmax in fp32 on the fp32 master weights, so the log-probs every ratio
is formed from come from fp32 logits (models.logprobs.logprobs_from_hidden)."""

from __future__ import annotations

import math

import torch

from policylab.backends.update import autocast
from policylab.batch import SamplingSettings
from policylab.models.logprobs import logprobs_from_hidden, model_logprobs
from policylab.models.vocab import response_hidden


class _Head(torch.nn.Module):
    """A 2-in, 3-out linear head without bias; records the dtype it computed in."""

    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.seen: list[torch.dtype] = []

    def forward(self, h):
        z = torch.nn.functional.linear(h, self.weight)
        self.seen.append(z.dtype)
        return z


def test_hand_worked_head_in_fp32_under_autocast():
    """h = (1, 2), W rows (1, 0), (0, 1), (1, 1) -> z = (1, 2, 3); log-softmax of the target
    2: 3 − log(e + e² + e³) = −0.40761. Under bf16 autocast the head still computes in
    fp32 (the recorded dtype), with the same value and a gradient on the fp32 weight."""
    head = _Head(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    h = torch.tensor([[[1.0, 2.0]]], dtype=torch.bfloat16)  # what a bf16 body hands on
    target = torch.tensor([[2]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    with autocast("bf16"):
        lp = logprobs_from_hidden(h, head, None, target, mask, sampling=SamplingSettings())
    expected = 3.0 - math.log(math.exp(1) + math.exp(2) + math.exp(3))
    assert head.seen == [torch.float32] and lp.dtype == torch.float32
    assert abs(float(lp.detach()) - expected) < 1e-6 and abs(expected + 0.40761) < 1e-5
    lp.sum().backward()
    # naive reference of d lp / d W: (onehot(target) − softmax(z)) ⊗ h
    p = torch.softmax(torch.tensor([1.0, 2.0, 3.0]), 0)
    naive = (torch.nn.functional.one_hot(torch.tensor(2), 3).float() - p)[:, None] * torch.tensor([1.0, 2.0])
    assert head.weight.grad.dtype == torch.float32
    torch.testing.assert_close(head.weight.grad, naive)

    # without autocast nothing changes: the head runs in the input's dtype
    head.seen.clear()
    logprobs_from_hidden(h.float(), head, None, target, mask, sampling=SamplingSettings())
    assert head.seen == [torch.float32]


def test_model_logprobs_bf16_body_fp32_head_equals_the_reference(tiny_model):
    """The tiny Llama: under the trainer's bf16 autocast, model_logprobs equals the bf16
    body's hidden states through the fp32 head and an fp32 log-softmax, computed by hand."""
    torch.manual_seed(0)
    tokens = torch.randint(5, 100, (2, 9))
    att = torch.ones_like(tokens, dtype=torch.bool)
    att[1, :2] = False  # left padding
    P = 4
    with torch.no_grad():
        with autocast("bf16"):
            lp = model_logprobs(tiny_model, tokens, att, P, sampling=SamplingSettings())
            h, head, _ = response_hidden(tiny_model, tokens, att, P)
        ref = torch.log_softmax(torch.nn.functional.linear(h.float(), head.weight.float()), -1)
        ref = ref.gather(-1, tokens[:, P:, None]).squeeze(-1)
        fp32 = model_logprobs(tiny_model, tokens, att, P, sampling=SamplingSettings())
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref, rtol=0, atol=1e-6)
    assert 0 < float((lp - fp32).abs().max()) < 0.5  # bf16 body: a real but small difference
