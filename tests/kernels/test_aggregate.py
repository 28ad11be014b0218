"""aggregate / normalizer: hand cases, loop reference, micro-batch invariance, bad inputs."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.aggregate import MODES, aggregate, normalizer
from policylab.errors import NonFiniteError, PolicylabError, ShapeError

F64 = torch.float64


def l_norm_for(mode):
    return 4.0 if mode == "seq_mean_token_sum_norm" else None


def aggregate_loop(loss, mask, mode, L_norm=None):
    """Naive reference straight from the formulas."""
    B, T = loss.shape
    seq_sums, seq_lens = [], []
    for b in range(B):
        n = sum(bool(mask[b, t]) for t in range(T))
        seq_sums.append(sum(float(loss[b, t]) for t in range(T) if mask[b, t]))
        seq_lens.append(n)
    n_tok = sum(seq_lens)
    n_seq = sum(1 for n in seq_lens if n > 0)
    if mode == "token_mean":
        return sum(seq_sums) / n_tok
    if mode == "seq_mean_token_mean":
        return sum(s / n for s, n in zip(seq_sums, seq_lens) if n > 0) / n_seq
    if mode == "seq_mean_token_sum":
        return sum(seq_sums) / n_seq
    return sum(seq_sums) / (n_seq * L_norm)


def dapo_case():
    # per-token losses [1, 1] (length 2) and [0, 0, 0, 0] (length 4)
    loss = torch.tensor([[1.0, 1.0, 9.0, 9.0], [0.0, 0.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    return loss, mask


def test_dapo_hand_case():
    loss, mask = dapo_case()
    # token_mean: (1 + 1 + 0·4) / 6 = 0.3333 ; seq_mean_token_mean: (2/2 + 0/4) / 2 = 0.5
    assert aggregate(loss, mask, "token_mean").item() == pytest.approx(1 / 3, abs=1e-15)
    assert aggregate(loss, mask, "seq_mean_token_mean").item() == pytest.approx(0.5, abs=1e-15)
    # seq_mean_token_sum: (2 + 0) / 2 = 1.0 ; seq_mean_token_sum_norm (L_norm = 4): 2 / (2·4) = 0.25
    assert aggregate(loss, mask, "seq_mean_token_sum").item() == pytest.approx(1.0, abs=1e-15)
    assert aggregate(loss, mask, "seq_mean_token_sum_norm", L_norm=4.0).item() == pytest.approx(0.25, abs=1e-15)


def test_length_bias_of_token_vs_sequence_mean():
    # lengths 2 and 8, ℓ = x (gradient 1 per token). token_mean: every token 1/10.
    # seq_mean_token_mean: 1/(2·2) = 0.25 on the short one, 1/(2·8) = 0.0625 on the long one.
    x = torch.zeros(2, 8, dtype=F64, requires_grad=True)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[0, :2], mask[1, :] = True, True
    (g_tok,) = torch.autograd.grad(aggregate(x, mask, "token_mean"), x)
    (g_seq,) = torch.autograd.grad(aggregate(x, mask, "seq_mean_token_mean"), x)
    assert_close(g_tok[mask], torch.full((10,), 0.1, dtype=F64), rtol=1e-15, atol=0)
    assert_close(g_seq[0, :2], torch.full((2,), 0.25, dtype=F64), rtol=1e-15, atol=0)
    assert_close(g_seq[1], torch.full((8,), 0.0625, dtype=F64), rtol=1e-15, atol=0)


def random_batch(seed, B=8, T=6):
    torch.manual_seed(seed)
    loss = torch.randn(B, T, dtype=F64)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])[:B]  # row 3 is empty
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    return loss, mask


@pytest.mark.parametrize("mode", MODES)
def test_matches_loop_reference(mode):
    loss, mask = random_batch(0)
    loss = torch.where(mask, loss, torch.tensor(float("nan"), dtype=F64))  # padding is garbage
    got = aggregate(loss, mask, mode, L_norm=l_norm_for(mode))
    assert got.item() == pytest.approx(aggregate_loop(loss, mask, mode, l_norm_for(mode)), rel=1e-13)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n_micro", [1, 2, 4, 8])
def test_micro_batches_with_shared_normalizer_reproduce_the_full_batch(mode, n_micro):
    loss_base, mask = random_batch(1)
    theta = torch.randn(8, 6, dtype=F64, requires_grad=True)

    def per_token(rows):  # a nonlinear per-token loss of the parameters
        return torch.sin(theta[rows]) * loss_base[rows] + theta[rows] ** 2

    L = l_norm_for(mode)
    full = aggregate(per_token(slice(None)), mask, mode, L_norm=L)
    (g_full,) = torch.autograd.grad(full, theta)

    shared = normalizer(mask, mode, L_norm=L)  # once per optimizer step, full final mask
    size = 8 // n_micro
    total = 0.0
    for k in range(n_micro):
        rows = slice(k * size, (k + 1) * size)
        total = total + aggregate(per_token(rows), mask[rows], mode, normalizer=shared)
    (g_split,) = torch.autograd.grad(total, theta)
    assert_close(total, full, rtol=1e-13, atol=1e-15)
    assert_close(g_split, g_full, rtol=1e-13, atol=1e-15)


def test_local_normalizers_break_the_split():
    # negative control (the test above can fail): averaging micro-batch token means with
    # local denominators weights the micro-batches' tokens unequally.
    loss, mask = random_batch(2)
    full = aggregate(loss, mask, "token_mean")
    halves = [aggregate(loss[r], mask[r], "token_mean") for r in (slice(0, 4), slice(4, 8))]
    assert abs(((halves[0] + halves[1]) / 2 - full).item()) > 1e-3


def test_empty_sequence_is_not_counted():
    # row 1 has no valid token: it adds 0 and is not in N_seq -> (1 + 1)/2 / 1 = 1.0
    loss = torch.tensor([[1.0, 1.0], [5.0, 5.0]], dtype=F64)
    mask = torch.tensor([[True, True], [False, False]])
    assert aggregate(loss, mask, "seq_mean_token_mean").item() == 1.0
    assert normalizer(mask, "seq_mean_token_sum") == 1.0
    assert normalizer(mask, "token_mean") == 2.0
    assert normalizer(mask, "seq_mean_token_sum_norm", L_norm=3.0) == 3.0


def test_all_false_mask():
    loss = torch.ones(2, 3, dtype=F64, requires_grad=True)
    empty = torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(PolicylabError, match="no valid token"):
        aggregate(loss, empty, "token_mean")
    with pytest.raises(PolicylabError, match="no valid token"):
        normalizer(empty, "seq_mean_token_mean")
    # with a positive shared normalizer the micro-batch contributes exactly 0 (and grad 0)
    out = aggregate(loss, empty, "token_mean", normalizer=5.0)
    assert out.item() == 0.0
    (g,) = torch.autograd.grad(out, loss)
    assert (g == 0).all()


def test_non_finite_loss():
    mask = torch.tensor([[True, False]])
    x = torch.tensor([[1.0, float("nan")]], dtype=F64, requires_grad=True)
    out = aggregate(x * 2, mask, "token_mean")  # NaN at padding: ignored, no NaN gradient
    (g,) = torch.autograd.grad(out, x)
    assert out.item() == 2.0 and torch.equal(g, torch.tensor([[2.0, 0.0]], dtype=F64))
    with pytest.raises(NonFiniteError, match="`loss`"):
        aggregate(torch.tensor([[float("inf"), 0.0]]), mask, "token_mean")


def test_L_norm_is_only_used_by_its_mode():
    # one trainer-wide L_norm may be passed to every mode; only seq_mean_token_sum_norm uses it,
    # and with an explicit shared normalizer it is already inside the denominator.
    loss, mask = dapo_case()
    assert aggregate(loss, mask, "token_mean", L_norm=4.0).item() == pytest.approx(1 / 3)
    assert normalizer(mask, "seq_mean_token_sum", L_norm=4.0) == 2.0
    shared = normalizer(mask, "seq_mean_token_sum_norm", L_norm=4.0)  # 2 · 4 = 8
    out = aggregate(loss, mask, "seq_mean_token_sum_norm", normalizer=shared, L_norm=4.0)
    assert shared == 8.0 and out.item() == pytest.approx(0.25)


def test_normalizer_as_tensor_and_dtype():
    loss, mask = dapo_case()
    out = aggregate(loss.float(), mask, "token_mean", normalizer=torch.tensor(6.0, dtype=F64))
    assert out.dtype == torch.float32 and out.item() == pytest.approx(1 / 3)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(mode="mean"), ValueError, "`mode` must be one of"),
    (dict(mode="seq_mean_token_sum_norm"), ValueError, "`L_norm` is required"),
    (dict(mode="seq_mean_token_sum_norm", L_norm=0.0), ValueError, "positive finite"),
    (dict(mode="seq_mean_token_sum_norm", L_norm="4"), ValueError, "positive finite"),
    (dict(mode="token_mean", normalizer=0.0), ValueError, "positive and finite"),
    (dict(mode="token_mean", normalizer=float("nan")), ValueError, "positive and finite"),
    (dict(mode="token_mean", normalizer=torch.tensor([1.0, 2.0])), ShapeError, "scalar"),
    (dict(mode="token_mean", normalizer=torch.tensor(2.0, requires_grad=True)), ValueError, "constant"),
    (dict(mode="token_mean", normalizer="6"), ValueError, "float or a 0-dim tensor"),
    (dict(mode="token_mean", mask=torch.ones(2, 4)), ShapeError, "bool"),
    (dict(mode="token_mean", mask=torch.ones(2, 3, dtype=torch.bool)), ShapeError, "`mask` has shape"),
    (dict(mode="token_mean", loss=torch.ones(8)), ShapeError, r"\[B, T\]"),
])
def test_bad_inputs(kwargs, err, match):
    loss, mask = dapo_case()
    args = dict(loss=loss, mask=mask)
    args.update(kwargs)
    with pytest.raises(err, match=match):
        aggregate(**args)
