"""train.recompute_elementwise: RMSNorm and SiLU-gate intermediates recomputed in the
backward. Same outputs and gradients bit for bit as the plain modules (the naive
reference), and the memory it saves equals the hand-counted tensors it no longer keeps."""

import copy
import ctypes
import gc

import pytest
import torch

from policylab.models import loading as models
from policylab.models.recompute import recompute_elementwise, recomputed_modules
from policylab.trainer import memory
from policylab.trainer.allocator import glibc

from trainer_utils import tiny_config


def _pair(tokenizer):
    plain = models.tiny_llama(tokenizer).train()
    rec = copy.deepcopy(plain)
    assert recompute_elementwise(rec) == 2 * 2 + 1 + 2  # 2 layers x 2 norms, the final norm, 2 MLPs
    return plain, rec


def _tokens(n_rows=3, n_tok=11, seed=0):
    return torch.randint(0, 2000, (n_rows, n_tok), generator=torch.Generator().manual_seed(seed))


def _loss_and_grads(model, tokens, autocast: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(tokens).logits
    logp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1)
    loss = -(logp * torch.linspace(-1, 1, logp.shape[1])).mean()
    loss.backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_outputs_and_gradients_bit_identical(tokenizer, autocast):
    plain, rec = _pair(tokenizer)
    x = _tokens()
    lp_a, g_a = _loss_and_grads(plain, x, autocast)
    lp_b, g_b = _loss_and_grads(rec, x, autocast)
    assert torch.equal(lp_a, lp_b)
    assert g_a.keys() == g_b.keys()
    for name in g_a:
        assert torch.equal(g_a[name], g_b[name]), name
    # the gradients are real (not all zero) in every swapped module's weights
    assert all(g_b[n].abs().sum() > 0 for n in g_b if "norm" in n or "mlp" in n)


def test_without_gradients_nothing_is_checkpointed(tokenizer):
    plain, rec = _pair(tokenizer)
    x = _tokens()
    with torch.no_grad():
        assert torch.equal(plain(x).logits, rec(x).logits)
    frozen = copy.deepcopy(rec).requires_grad_(False)  # a reference model copied after the swap
    assert recomputed_modules(frozen) == 7
    out = frozen(x).logits
    assert out.grad_fn is None and torch.equal(out, plain(x).logits.detach())


def test_state_dict_and_idempotence(tokenizer):
    plain, rec = _pair(tokenizer)
    assert recompute_elementwise(rec) == 0  # already swapped
    sa, sb = plain.state_dict(), rec.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _live_bytes() -> int:
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    gc.collect()
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd


@pytest.mark.skipif(not glibc(), reason="live heap bytes from glibc's mallinfo2")
def test_memory_saved_is_the_hand_counted_tensors(tokenizer):
    """Forward of the decoder body with gradients, 4 rows x 50 tokens (200 tokens), fp32,
    hidden H = 64, intermediate I = 128, 2 layers. Per token the plain modules keep, beyond
    what the recomputing ones keep: per RMSNorm the normalized input (H fp32 = 256 B) and
    rsqrt(mean(x^2) + eps) (4 B), 5 norms (2 per layer + the final one); per MLP silu(g)
    (I fp32 = 512 B), 2 MLPs. 200 x (5 x 260 + 2 x 512) = 464,800 bytes."""
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc without mallinfo2")
    plain, rec = _pair(tokenizer)
    x = _tokens(4, 50)
    kept = {}
    for name, model in (("plain", plain), ("recompute", rec)):
        before = _live_bytes()
        h = model.model(x).last_hidden_state
        kept[name] = _live_bytes() - before
        h.sum().backward()  # the graph is usable; then freed
        del h
    saved = kept["plain"] - kept["recompute"]
    assert saved == pytest.approx(464_800, rel=0.05), kept


def test_memory_estimate_follows_the_setting():
    # SmolLM2-135M: 30 layers, H 576, I 1536, 3 kv heads of 64, fp32
    shape = memory.ModelShape(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64,
                              vocab=49152)
    assert shape.act_bytes == 30 * (8 * 576 + 4 * 192 + 4 * 1536) * 4 == 1_382_400
    assert shape.activation_bytes(recompute=True) == 30 * (6 * 576 + 4 * 192 + 3 * 1536) * 4 == 1_059_840
    layout = memory.StepLayout(8, 48, micro_batch_size=8)
    plain = memory.training_bytes(shape, layout, n_prompts=4, prompt_len=40)["micro-batch"]
    rec = memory.training_bytes(shape, memory.StepLayout(8, 48, micro_batch_size=8, recompute=True),
                                n_prompts=4, prompt_len=40)["micro-batch"]
    assert plain - rec == 8 * 88 * (1_382_400 - 1_059_840)


@pytest.mark.parametrize("on", [True, False])
def test_trainer_applies_the_setting(tiny_model_dir, tmp_path, on):
    from policylab.trainer.loop import Trainer

    t = Trainer(tiny_config(tiny_model_dir, tmp_path / "run", train={"recompute_elementwise": on}))
    assert recomputed_modules(t.model) == (7 if on else 0)
    m = t.train_step()
    assert m["time/step_s"] > 0
