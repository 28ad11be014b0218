"""policylab.models.logprobs: sampler-consistent per-token log-probs and entropy."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from policylab import SamplingSettings
from policylab.errors import NonFiniteError, ShapeError
from policylab.models.logprobs import kept_set, model_logprobs, token_logprobs


# ----------------------------------------------------------------------------------------
# naive references: one position at a time, Python floats
# ----------------------------------------------------------------------------------------
def naive_kept(z: list[float], top_k: int, top_p: float) -> list[bool]:
    """HF semantics, spelled out: top-k keeps every value >= the k-th largest; top-p
    walks the kept tokens from least to most likely and drops each one while the mass
    walked so far (itself included) is <= 1 - top_p; the most likely always stays."""
    keep = [True] * len(z)
    if top_k > 0:
        kth = sorted(z, reverse=True)[min(top_k, len(z)) - 1]
        keep = [v >= kth for v in z]
    if top_p < 1.0:
        m = max(v for v, k in zip(z, keep) if k)
        total = sum(math.exp(v - m) for v, k in zip(z, keep) if k)
        order = sorted((i for i in range(len(z)) if keep[i]), key=lambda i: z[i])
        walked = 0.0
        for i in order[:-1]:
            walked += math.exp(z[i] - m) / total
            if walked <= 1 - top_p:
                keep[i] = False
    return keep


def naive_logp_entropy(logits, targets, temperature=1.0, top_k=0, top_p=1.0):
    B, T, _ = logits.shape
    logp = torch.zeros(B, T, dtype=torch.float64)
    ent = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            z = [float(v) / temperature for v in logits[b, t]]
            keep = naive_kept(z, top_k, top_p)
            lse = math.log(sum(math.exp(v) for v, k in zip(z, keep) if k))
            tgt = int(targets[b, t])
            logp[b, t] = z[tgt] - lse if keep[tgt] else float("-inf")
            ent[b, t] = -sum(math.exp(v - lse) * (v - lse) for v, k in zip(z, keep) if k)
    return logp, ent


def random_case(seed, B=3, T=4, V=11, scale=2.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale).to(dtype)
    # targets: the most likely token, so it survives every top-k/top-p setting
    return logits, logits.argmax(-1)


SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7),
    dict(temperature=1.3, top_k=3),
    dict(temperature=1.0, top_p=0.6),
    dict(temperature=0.7, top_k=5, top_p=0.8),
]


# ----------------------------------------------------------------------------------------
# hand-worked cases
# ----------------------------------------------------------------------------------------
def test_hand_worked_temperature_topk_topp():
    # probs [1/2, 1/4, 1/8, 1/8] as logits ln(4), ln(2), 0, 0
    logits = torch.tensor([[[math.log(4), math.log(2), 0.0, 0.0]]], dtype=torch.float64)
    one = lambda tok, **kw: token_logprobs(logits, torch.tensor([[tok]]), **kw).item()  # noqa: E731
    # plain: log(1/4)
    assert one(1) == pytest.approx(math.log(0.25), abs=1e-12)
    # temperature 0.5 squares the odds: 16 : 4 : 1 : 1 -> p(0) = 16/22
    assert one(0, temperature=0.5) == pytest.approx(math.log(16 / 22), abs=1e-12)
    # top_k=2 keeps {0, 1}, renormalized 2/3 : 1/3
    assert one(1, top_k=2) == pytest.approx(math.log(1 / 3), abs=1e-12)
    # top_p=0.7: ascending cumsum 1/8, 1/4, 1/2, 1; drop where <= 0.3 -> tokens 2 and 3
    assert one(1, top_p=0.7) == pytest.approx(math.log(1 / 3), abs=1e-12)
    # top_p=0.5 is an exact boundary: cumsum 1/2 <= 1 - 0.5, so token 1 goes too and
    # token 0 alone has all the mass (the smallest set whose mass reaches top_p)
    assert one(0, top_p=0.5) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(NonFiniteError, match="outside the sampler's kept set"):
        one(1, top_p=0.5)


def test_topk_keeps_all_ties_at_the_kth_value():
    # logits [1, 0, 0, -1], top_k=2: the 2nd largest is 0, shared by tokens 1 and 2,
    # so three tokens are kept: logp(1) = 0 - ln(e + 1 + 1)
    logits = torch.tensor([[[1.0, 0.0, 0.0, -1.0]]], dtype=torch.float64)
    lp = token_logprobs(logits, torch.tensor([[1]]), top_k=2)
    assert lp.item() == pytest.approx(-math.log(math.e + 2), abs=1e-12)
    with pytest.raises(NonFiniteError, match="outside"):
        token_logprobs(logits, torch.tensor([[3]]), top_k=2)


def test_entropy_hand_worked():
    # uniform over 4 -> ln 4; top_k=2 on [1/2, 1/4, 1/8, 1/8] -> H(2/3, 1/3)
    uniform = torch.zeros(1, 1, 4, dtype=torch.float64)
    _, h = token_logprobs(uniform, torch.tensor([[0]]), with_entropy=True)
    assert h.item() == pytest.approx(math.log(4), abs=1e-12)
    logits = torch.tensor([[[math.log(4), math.log(2), 0.0, 0.0]]], dtype=torch.float64)
    _, h = token_logprobs(logits, torch.tensor([[0]]), top_k=2, with_entropy=True)
    expected = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    assert h.item() == pytest.approx(expected, abs=1e-12)


# ----------------------------------------------------------------------------------------
# against the naive loop and against transformers' own warpers
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", SETTINGS)
def test_matches_naive_loop(kw):
    logits, targets = random_case(0)
    # target: the LEAST likely token the naive rule keeps (the boundary of the kept set)
    for b in range(3):
        for t in range(4):
            z = [float(v) / kw["temperature"] for v in logits[b, t]]
            keep = naive_kept(z, kw.get("top_k", 0), kw.get("top_p", 1.0))
            targets[b, t] = min((i for i in range(len(z)) if keep[i]), key=lambda i: z[i])
    lp, h = token_logprobs(logits, targets, with_entropy=True, **kw)
    ref_lp, ref_h = naive_logp_entropy(logits, targets, **kw)
    assert_close(lp, ref_lp)
    assert_close(h, ref_h)


def test_plain_equals_log_softmax_gather():
    logits, _ = random_case(1, V=50)
    targets = torch.randint(0, 50, (3, 4), generator=torch.Generator().manual_seed(2))
    ref = torch.log_softmax(logits / 0.8, -1).gather(-1, targets[..., None]).squeeze(-1)
    assert_close(token_logprobs(logits, targets, temperature=0.8), ref)


@pytest.mark.parametrize("integer_logits", [False, True])
def test_kept_set_equals_transformers_warpers(integer_logits):
    # integer logits make ties at the top-k / top-p boundaries common
    g = torch.Generator().manual_seed(3)
    for _ in range(60):
        if integer_logits:
            z = torch.randint(-3, 4, (4, 30), generator=g).float()
        else:
            z = torch.randn(4, 30, generator=g) * 2
        k = int(torch.randint(0, 8, (1,), generator=g))
        p = float(torch.rand(1, generator=g)) * 0.98 + 0.01
        warped = z
        if k:
            warped = TopKLogitsWarper(k)(None, warped)
        warped = TopPLogitsWarper(p)(None, warped)
        assert torch.equal(kept_set(z, top_k=k, top_p=p), torch.isfinite(warped))


# ----------------------------------------------------------------------------------------
# chunking, gradients, dtypes, masks
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", SETTINGS)
@pytest.mark.parametrize("chunk_size", [1, 5, 12, 100])
def test_chunked_equals_unchunked_values_and_grads(kw, chunk_size):
    base, targets = random_case(4)
    grads, outs = [], []
    for cs in (None, chunk_size):
        logits = base.clone().requires_grad_(True)
        lp, h = token_logprobs(logits, targets, chunk_size=cs, with_entropy=True, **kw)
        (lp.sum() + 0.3 * h.sum()).backward()
        outs.append((lp.detach(), h.detach()))
        grads.append(logits.grad)
    assert_close(outs[0], outs[1], rtol=0, atol=1e-12)
    assert_close(grads[0], grads[1], rtol=0, atol=1e-12)
    assert grads[0].abs().sum() > 0


def test_gradient_matches_naive_autograd_with_topk():
    base, targets = random_case(5)
    logits = base.clone().requires_grad_(True)
    token_logprobs(logits, targets, temperature=0.7, top_k=3).sum().backward()
    # naive: -inf outside the kept set, then log_softmax + gather
    ref_logits = base.clone().requires_grad_(True)
    z = ref_logits / 0.7
    keep = torch.tensor([[naive_kept(z[b, t].tolist(), 3, 1.0) for t in range(4)] for b in range(3)])
    z = z.masked_fill(~keep, float("-inf"))
    torch.log_softmax(z, -1).gather(-1, targets[..., None]).sum().backward()
    assert_close(logits.grad, ref_logits.grad)
    # dropped tokens get exactly no gradient
    assert bool((logits.grad[~keep] == 0).all())


def test_half_precision_input_is_computed_in_fp32():
    logits, targets = random_case(6, dtype=torch.bfloat16)
    lp = token_logprobs(logits, targets)
    assert lp.dtype == torch.float32
    ref = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None]).squeeze(-1)
    assert_close(lp, ref)
    assert token_logprobs(logits.double(), targets).dtype == torch.float64


def test_mask_gives_zero_and_skips_the_check_at_uncounted_positions():
    logits = torch.tensor([[[3.0, 0.0, -1.0], [3.0, 0.0, -1.0]]])
    targets = torch.tensor([[0, 2]])  # token 2 is outside top_k=1
    mask = torch.tensor([[True, False]])
    lp, h = token_logprobs(logits, targets, top_k=1, mask=mask, with_entropy=True)
    assert lp.tolist() == [[0.0, 0.0]] and h.tolist() == [[0.0, 0.0]]
    with pytest.raises(NonFiniteError, match=r"target token 2 at position \[0, 1\]"):
        token_logprobs(logits, targets, top_k=1)


# ----------------------------------------------------------------------------------------
# bad inputs
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(chunk_size=0), "chunk_size"),
    ],
)
def test_bad_settings_raise(kw, match):
    logits, targets = random_case(7)
    with pytest.raises(ValueError, match=match):
        token_logprobs(logits, targets, **kw)


def test_bad_shapes_and_ids_raise():
    logits, targets = random_case(8)
    with pytest.raises(ShapeError, match="`logits`"):
        token_logprobs(logits[0], targets[0])
    with pytest.raises(ShapeError, match="`targets`"):
        token_logprobs(logits, targets[:, :2])
    with pytest.raises(ShapeError, match="`targets`"):
        token_logprobs(logits, targets.int())
    with pytest.raises(ShapeError, match="outside"):
        token_logprobs(logits, torch.full_like(targets, 11))
    with pytest.raises(ShapeError, match="`mask`"):
        token_logprobs(logits, targets, mask=torch.ones(3, 4))


def test_nan_logits_raise():
    logits, targets = random_case(9)
    logits[1, 2, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"nan at position \[1, 2\]"):
        token_logprobs(logits, targets)


# ----------------------------------------------------------------------------------------
# model_logprobs on a tiny random Llama
# ----------------------------------------------------------------------------------------
def left_padded(rows: list[list[int]], prompt_lens: list[int], pad: int):
    """rows = prompt + response ids, left-padded to a common prompt width; responses
    right-padded with `pad` (attention False)."""
    P = max(prompt_lens)
    T = max(len(r) - p for r, p in zip(rows, prompt_lens))
    tokens = torch.full((len(rows), P + T), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), P + T, dtype=torch.bool)
    for i, (r, p) in enumerate(zip(rows, prompt_lens)):
        tokens[i, P - p : P - p + len(r)] = torch.tensor(r)
        mask[i, P - p : P - p + len(r)] = True
    return tokens, mask, P


ROWS = [[1, 50, 60, 70, 80, 5, 6, 7], [1, 90, 11, 12, 13], [1, 20, 30, 40, 41, 42, 43, 44, 45]]
PROMPT_LENS = [5, 2, 4]


def test_model_logprobs_matches_full_forward_per_row(tiny_model):
    # the reference scores each row alone, unpadded, with the plain full forward: if
    # position ids or padding leaked, the padded batch would differ from it
    tokens, mask, P = left_padded(ROWS, PROMPT_LENS, pad=2)
    s = SamplingSettings(temperature=0.9)
    with torch.no_grad():
        lp = model_logprobs(tiny_model, tokens, mask, P, sampling=s)
        for i, (row, p) in enumerate(zip(ROWS, PROMPT_LENS)):
            ids = torch.tensor([row])
            logits = tiny_model(ids).logits[0, p - 1 : -1] / 0.9
            ref = torch.log_softmax(logits, -1).gather(-1, ids[0, p:, None]).squeeze(-1)
            n = len(row) - p
            assert_close(lp[i, :n], ref, rtol=0, atol=1e-5)
            assert bool((lp[i, n:] == 0).all())  # response padding
    assert torch.isfinite(lp).all()


def test_model_logprobs_response_only_equals_full_logits_and_chunks(tiny_model):
    # fp64 so that values and gradients of the three paths agree to rounding
    model = tiny_model.double()
    tokens, mask, P = left_padded(ROWS, PROMPT_LENS, pad=2)
    s = SamplingSettings(temperature=0.8)
    results = []
    for kw in (dict(response_only_logits=True), dict(response_only_logits=False), dict(chunk_size=4)):
        model.zero_grad()
        lp, h = model_logprobs(model, tokens, mask, P, sampling=s, with_entropy=True, **kw)
        (lp.sum() + h.sum()).backward()
        results.append((lp.detach(), h.detach(), model.model.embed_tokens.weight.grad.clone()))
    for other in results[1:]:
        assert_close(other, results[0], rtol=0, atol=1e-10)
    assert results[0][2].abs().sum() > 0


def test_model_logprobs_applies_top_k_top_p(tiny_model):
    tokens, mask, P = left_padded(ROWS, PROMPT_LENS, pad=2)
    s = SamplingSettings(temperature=0.8, top_k=30000, top_p=0.9)
    with torch.no_grad():
        logits = tiny_model(tokens[:, :-1], attention_mask=mask[:, :-1].long(),
                            position_ids=(mask[:, :-1].long().cumsum(-1) - 1).clamp(min=0)).logits[:, P - 1 :]
        targets = tokens[:, P:]
        keep = kept_set(logits / 0.8, top_k=30000, top_p=0.9).gather(-1, targets[..., None]).squeeze(-1)
        counted = mask[:, P:] & keep
        assert counted.sum() >= 5 and (~keep & mask[:, P:]).any()  # both cases occur
        ref = token_logprobs(logits, targets, temperature=0.8, top_k=30000, top_p=0.9, mask=counted)
        lp = model_logprobs(tiny_model, tokens, mask, P, sampling=s, mask=counted)
        assert_close(lp, ref, rtol=0, atol=1e-5)
        # and the truncation matters: the plain log-softmax differs at counted positions
        plain = model_logprobs(tiny_model, tokens, mask, P, sampling=SamplingSettings(temperature=0.8))
        assert ((plain - lp).abs()[counted] > 1e-3).all()
        with pytest.raises(NonFiniteError, match="outside the sampler's kept set"):
            model_logprobs(tiny_model, tokens, mask, P, sampling=s)


def test_model_logprobs_bad_inputs(tiny_model):
    tokens, mask, P = left_padded(ROWS, PROMPT_LENS, pad=2)
    s = SamplingSettings()
    with pytest.raises(ShapeError, match="prompt_width"):
        model_logprobs(tiny_model, tokens, mask, 0, sampling=s)
    with pytest.raises(ShapeError, match="attention_mask"):
        model_logprobs(tiny_model, tokens, mask.long(), P, sampling=s)
    with pytest.raises(ShapeError, match="`mask`"):
        model_logprobs(tiny_model, tokens, mask, P, sampling=s, mask=mask)
    with pytest.raises(ValueError, match="cannot split"):
        model_logprobs(torch.nn.Linear(2, 2), tokens, mask, P, sampling=s)


def test_detached_entropy_equals_the_differentiable_one_without_a_graph():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 40, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 40, (3, 5))
    for kw in ({}, {"top_k": 7}, {"top_p": 0.8}):
        m = _kept_mask(logits, targets, **kw)  # score only targets the sampler could draw
        lp1, ent1 = token_logprobs(logits, targets, with_entropy=True, mask=m, **kw)
        lp2, ent2 = token_logprobs(logits, targets, with_entropy="detached", mask=m, **kw)
        assert ent1.requires_grad and not ent2.requires_grad and lp2.requires_grad
        assert torch.equal(ent1.detach(), ent2) and torch.isfinite(ent2).all()
        # naive reference: -Σ p log p over the kept set
        z = logits.detach()
        keep = kept_set(z, **kw) if kw else torch.ones_like(z, dtype=torch.bool)
        p = torch.softmax(z.masked_fill(~keep, float("-inf")), -1)
        ref = -(p * torch.log(torch.where(keep, p, torch.ones_like(p)))).sum(-1)
        assert m.any()
        torch.testing.assert_close(ent2[m], ref[m])


def _kept_mask(logits, targets, top_k=0, top_p=1.0):
    keep = kept_set(logits.detach(), top_k=top_k, top_p=top_p)
    return keep.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
