"""`train.dtype: bf16-backward` (policylab.models.bf16_backward): the forward is fp32 and
bit-identical to a plain fp32 forward; only the two products of each linear layer's
backward use bf16-rounded operands (fp32 accumulation)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from policylab.backends.update import StepHooks, autocast
from policylab.batch import SamplingSettings
from policylab.models.bf16_backward import Bf16Backward, bf16_backward_linear
from policylab.models.logprobs import model_logprobs
from policylab.trainer.config import TRAIN_DTYPES
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config

BF = torch.bfloat16


def test_hand_worked_forward_exact_backward_rounded():
    """x = 1 + 2⁻¹⁰ is an fp32 number that bf16 cannot hold (8 significant bits: the
    neighbours of 1 are 1 − 2⁻⁹ and 1 + 2⁻⁷), so bf16(x) = 1. With W = [[3]] and b = [0.5]:
        forward  y = 3 · (1 + 2⁻¹⁰) + 0.5 = 3.5029296875      (exact in fp32, kept)
        dL/dW    = g · bf16(x) = 1 · 1 = 1                    (fp32 would give 1.0009765625)
        dL/dx    = bf16(g) · bf16(W) = 1 · 3 = 3              (3 is a bf16 number: exact)
        dL/db    = g = 1                                      (fp32)"""
    x = torch.tensor([[1.0 + 2.0 ** -10]], requires_grad=True)
    w = torch.tensor([[3.0]], requires_grad=True)
    b = torch.tensor([0.5], requires_grad=True)
    y = bf16_backward_linear(x, w, b)
    assert y.dtype == torch.float32 and float(y.detach()) == 3.5029296875
    y.sum().backward()
    assert float(w.grad) == 1.0 and float(x.grad) == 3.0 and float(b.grad) == 1.0
    # the fp32 layer on the same numbers: the weight gradient keeps the 2⁻¹⁰
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    F.linear(x2, w2, b.detach()).sum().backward()
    assert float(w2.grad) == 1.0009765625


def test_against_a_naive_bf16_reference():
    """Random shapes, a 3-d input as a decoder feeds it: each gradient equals the naive
    product of the bf16-rounded operands summed in fp64 and rounded to bf16 (within one
    bf16 rounding step: the fp32 accumulation order differs), and differs from the fp32
    gradient (the mode is not a no-op)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=g, requires_grad=True)
    w = torch.randn(24, 16, generator=g, requires_grad=True)
    b = torch.randn(24, generator=g, requires_grad=True)
    up = torch.randn(3, 5, 24, generator=g)
    y = bf16_backward_linear(x, w, b)
    torch.testing.assert_close(y, F.linear(x.detach(), w.detach(), b.detach()), rtol=0, atol=0)
    y.backward(up)

    ub, xb, wb = up.to(BF).double(), x.detach().to(BF).double(), w.detach().to(BF).double()
    naive_w = torch.zeros(24, 16, dtype=torch.float64)
    naive_x = torch.zeros(3, 5, 16, dtype=torch.float64)
    for i in range(3):
        for t in range(5):
            naive_w += torch.outer(ub[i, t], xb[i, t])
            naive_x[i, t] = ub[i, t] @ wb
    for got, naive in ((w.grad, naive_w), (x.grad, naive_x)):
        ref = naive.to(BF).double()
        step = ref.abs() * 2.0 ** -7 + 1e-30  # one bf16 step at |ref|
        assert bool(((got.double() - ref).abs() <= step).all())
    torch.testing.assert_close(b.grad, up.sum((0, 1)))

    x32, w32 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    F.linear(x32, w32, b.detach()).backward(up)
    rel = float((w.grad - w32.grad).norm() / w32.grad.norm())
    assert 1e-5 < rel < 2e-2  # bf16 rounding (~2⁻⁹ per operand), not zero and not large


def test_region_routes_only_recording_fp32_linears():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with Bf16Backward() as mode:
        with torch.no_grad():
            lin(x)  # sampling, evaluation, π_old / reference passes
        lin.double()(x.double())  # fp64 training runs as it would outside
        lin.float()
        assert mode.calls == 0
        lin(x)
        assert mode.calls == 1
        torch.relu(x)  # anything but F.linear passes through
        assert mode.calls == 1


def test_one_cast_per_input_and_a_new_one_after_it_changes():
    with Bf16Backward() as mode:
        x = torch.randn(3, 4)
        a, b = mode._cast(x), mode._cast(x)
        assert a is b and a.dtype == BF  # q/k/v (gate/up) read one input: one bf16 copy
        x.add_(1.0)  # an in-place change bumps the version: the old copy is not reused
        c = mode._cast(x)
        assert c is not a and torch.equal(c, x.to(BF))


def test_tiny_llama_forward_bit_identical_gradient_close(tiny_model):
    """The trainer's log-prob forward on a tiny Llama: bit-identical log-probs inside the
    region; gradients within bf16 rounding of fp32's, and nearer to them than bf16
    autocast's, whose forward itself moves."""
    torch.manual_seed(0)
    B, P, T = 3, 5, 6
    tokens = torch.randint(3, 400, (B, P + T))
    am = torch.ones(B, P + T, dtype=torch.bool)
    am[0, :2] = False  # left padding
    weights = torch.randn(B, T)

    def run(dtype):
        tiny_model.zero_grad(set_to_none=True)
        with autocast(dtype) as region:
            lp = model_logprobs(tiny_model, tokens, am, P, sampling=SamplingSettings())
            (lp * weights).sum().backward()
        calls = getattr(region, "calls", None)
        return lp.detach(), {n: p.grad.clone() for n, p in tiny_model.named_parameters()}, calls

    lp32, g32, _ = run("fp32")
    lpbb, gbb, calls = run("bf16-backward")
    lpac, gac, _ = run("bf16")
    assert torch.equal(lp32, lpbb)
    assert calls == 2 * 7 + 1  # 7 linear layers in each of the 2 decoder layers, and the head
    assert not torch.equal(lp32, lpac)

    flat = lambda g: torch.cat([v.flatten() for v in g.values()]).double()  # noqa: E731
    ref = flat(g32)
    err_bb = float((flat(gbb) - ref).norm() / ref.norm())
    err_ac = float((flat(gac) - ref).norm() / ref.norm())
    assert 1e-5 < err_bb < 1e-2
    assert err_bb < err_ac


def test_config_accepts_it_and_names_it_in_refusals(tiny_model_dir, tmp_path):
    import pytest

    from policylab.errors import ConfigError

    assert "bf16-backward" in TRAIN_DTYPES
    cfg = tiny_config(tiny_model_dir, tmp_path / "ok", train={"dtype": "bf16-backward"})
    assert cfg.train.dtype == "bf16-backward"
    with pytest.raises(ConfigError, match="bf16-backward"):
        tiny_config(tiny_model_dir, tmp_path / "bad", train={"dtype": "bf16_backward"})


def test_trainer_step_same_loss_and_close_gradients(tiny_model_dir, tmp_path):
    """A real optimizer step of the trainer (shared prompt prefix, 3-row micro-batches):
    the logged loss is the fp32 step's to the bit (the forward is fp32), the accumulated
    gradient within bf16 rounding of fp32's."""

    def step(dtype, where):
        tr = Trainer(tiny_config(tiny_model_dir, tmp_path / where, rollout={"group_size": 4, "max_new_tokens": 5},
                                 train={"dtype": dtype, "micro_batch_size": 3, "shared_prefix": True,
                                        "grad_clip": 0.0}))
        assert tr.worker.dtype == dtype
        batch, _ = tr.collect()
        batch, A, _ = tr.round_inputs(tr.prepare(batch))
        grads = {}

        def keep(model):
            grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
            return {}

        out = tr.worker.optimizer_step(tr.method, batch, A.adv.detach(), old_from_same_forward=True,
                                       hooks=StepHooks(grad=keep))
        return out, grads

    out32, g32 = step("fp32", "a")
    outbb, gbb = step("bf16-backward", "b")
    losses = [k for k in out32 if k.startswith("loss")]
    assert losses and all(out32[k] == outbb[k] for k in losses)
    ref = torch.cat([g.flatten() for g in g32.values()]).double()
    got = torch.cat([gbb[n].flatten() for n in g32]).double()
    assert float(ref.norm()) > 0
    rel = float((got - ref).norm() / ref.norm())
    assert 1e-6 < rel < 1e-2


def test_chunked_logprobs_recompute_inside_the_region(tiny_model):
    """`chunk_size` recomputes each chunk's output head in the backward
    (torch.utils.checkpoint): inside a bf16-backward region the recomputation is routed
    like the forward (it used to be a plain F.linear that saved other tensors, which the
    checkpoint refused), with the backward called inside or outside the region. The
    log-probs are a plain fp32 forward's of the same chunks bit for bit; the gradient is
    as close to the fp32 gradient as the unchunked bf16-backward one is."""
    torch.manual_seed(1)
    B, P, T = 3, 4, 7
    tokens = torch.randint(3, 400, (B, P + T))
    am = torch.ones(B, P + T, dtype=torch.bool)
    weights = torch.randn(B, T)

    def run(chunk_size, region, backward_inside=True):
        tiny_model.zero_grad(set_to_none=True)
        with region or contextlib.nullcontext():
            lp = model_logprobs(tiny_model, tokens, am, P, sampling=SamplingSettings(), chunk_size=chunk_size)
            loss = (lp * weights).sum()
            if backward_inside:
                loss.backward()
        if not backward_inside:
            loss.backward()
        return lp.detach(), torch.cat([p.grad.flatten() for p in tiny_model.parameters()]).double()

    lp32, g32 = run(5, None)
    _, g32_whole = run(None, None)
    whole = Bf16Backward()
    _, g_whole = run(None, whole)
    err = lambda g: float((g - g32).norm() / g32.norm())  # noqa: E731
    for inside in (True, False):
        region = Bf16Backward()
        lp, g = run(5, region, inside)  # 21 positions: chunks of 5, 5, 5, 5, 1
        assert torch.equal(lp, lp32)
        assert region.calls == whole.calls - 1 + 5 + 5  # the head: once per chunk, and again in each recomputation
        assert 1e-5 < err(g) < 1e-2
        assert err(g) < 2 * float((g_whole - g32_whole).norm() / g32_whole.norm())
