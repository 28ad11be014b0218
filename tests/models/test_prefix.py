"""SharedPrefix: each distinct prompt computed once, same log-probs and gradient as the
full forward of every row (the naive reference is `model_logprobs` on each whole row)."""

import dataclasses
import pytest
import torch

from policylab import SamplingSettings, methods
from policylab.models import loading as models
from policylab.errors import PolicylabError
from policylab.models.logprobs import model_logprobs
from policylab.models.prefix import SharedPrefix, distinct_prompts
from policylab.backends.update import Learner, UpdateSettings, optimizer_step

from trainer_utils import tiny_config


def _batch(tokenizer, seed=0):
    """6 rows: 3 prompts of different lengths (left-padded, width 5), 2 responses each,
    responses of different lengths with padding after eos."""
    g = torch.Generator().manual_seed(seed)
    pad = tokenizer.pad_token_id
    prompts = [[11, 12, 13, 14, 15], [21, 22, 23], [31, 32, 33, 34]]
    P, T = 5, 6
    tokens, att = [], []
    for i, p in enumerate(prompts):
        for j in range(2):
            n_resp = [6, 3, 5, 1, 4, 6][2 * i + j]
            resp = torch.randint(100, 2000, (n_resp,), generator=g).tolist()
            row = [pad] * (P - len(p)) + p + resp + [pad] * (T - n_resp)
            m = [False] * (P - len(p)) + [True] * (len(p) + n_resp) + [False] * (T - n_resp)
            tokens.append(row)
            att.append(m)
    return torch.tensor(tokens), torch.tensor(att), P


def test_distinct_prompts_needs_equal_tokens_and_mask():
    # rows 0 and 1 share tokens AND mask; row 2 has the same tokens with another mask
    tokens = torch.tensor([[0, 5, 6, 9], [0, 5, 6, 8], [0, 5, 6, 7]])
    att = torch.tensor([[False, True, True, True], [False, True, True, True], [True, True, True, True]])
    uniq, inv = distinct_prompts(tokens, att, 3)
    assert uniq.shape[0] == 2
    assert inv[0] == inv[1] and inv[0] != inv[2]


def _close(got: torch.Tensor, ref: torch.Tensor, name: str = "") -> None:
    """fp64 models still run HF's RMSNorm in fp32, so two mathematically equal gradients
    whose fp64 partial sums round differently flip an fp32 ulp in ~0.1% of the entries
    (measured: max 1.3e-7 of the tensor's scale). The bound, 1e-6 of the tensor's largest
    entry, sits above that floor and far below any missing or doubled contribution
    (order 1e-1 and more)."""
    scale = float(ref.abs().max())
    assert scale > 0, name
    assert float((got - ref).abs().max()) <= 1e-6 * scale, f"{name}: {float((got - ref).abs().max()) / scale:.2e}"


@pytest.mark.parametrize("sampling", [SamplingSettings(), SamplingSettings(temperature=0.7)])
def test_logprobs_and_gradient_equal_the_full_forward(tokenizer, sampling):
    model = models.tiny_llama(tokenizer).double()
    tokens, att, P = _batch(tokenizer)
    # reference: the full forward of each row on its own
    ref_lp = torch.cat([model_logprobs(model, tokens[i : i + 1], att[i : i + 1], P, sampling=sampling).detach()
                        for i in range(6)])
    # shared prefix: 3 prompt forwards for 6 rows, micro-batches of 2 in another order
    sp = SharedPrefix(model, tokens, att, P)
    assert (sp.n_rows, sp.n_distinct) == (6, 3)
    got = torch.zeros_like(ref_lp)
    for rows in torch.tensor([5, 0, 3, 1, 2, 4]).split(2):
        got[rows] = sp.logprobs(model, rows, tokens[rows], att[rows], sampling=sampling).detach()
    torch.testing.assert_close(got, ref_lp, rtol=1e-10, atol=1e-12)
    assert torch.all(got[~att[:, P:]] == 0)  # response padding scores exactly 0
    assert float(ref_lp.abs().sum()) > 1.0  # real log-probs, not padding zeros


def test_gradient_equals_full_forward_sum(tokenizer):
    model = models.tiny_llama(tokenizer).double()
    tokens, att, P = _batch(tokenizer, seed=1)
    w = torch.randn(tokens.shape[0], tokens.shape[1] - P, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    model.zero_grad()
    (model_logprobs(model, tokens, att, P, sampling=SamplingSettings()) * w).sum().backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    sp = SharedPrefix(model, tokens, att, P)
    for rows in [torch.tensor([4, 1]), torch.tensor([0]), torch.tensor([2, 3, 5])]:
        # trailing columns that are padding for every row of the micro-batch are cut
        cols = P + int(att[rows, P:].any(0).nonzero().max()) + 1
        lp = sp.logprobs(model, rows, tokens[rows, :cols], att[rows, :cols], sampling=SamplingSettings())
        (lp * w[rows, : cols - P]).sum().backward()
    before = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    sp.backward()
    for n, p in model.named_parameters():
        _close(p.grad, ref[n], n)
    # the prompts' share arrives only with sp.backward(): the first layer's q-projection
    # gradient differs before it (prompt tokens feed every response position)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(before[q], ref[q])


def test_optimizer_step_same_update_with_and_without_prefix(tiny_model_dir, tmp_path):
    from policylab.trainer.loop import Trainer

    cfg = tiny_config(tiny_model_dir, tmp_path / "run", train={"dtype": "fp64"},
                      rollout={"prompts_per_step": 3, "group_size": 3, "max_new_tokens": 5})
    tr = Trainer(cfg)
    batch = tr.prepare(tr.collect()[0])
    assert distinct_prompts(batch.tokens, batch.attention_mask, batch.prompt_width)[0].shape[0] == 3
    adv = torch.linspace(-1, 1, batch.size, dtype=torch.float64)
    start = {k: v.clone() for k, v in tr.model.state_dict().items()}
    for mode in ["token_mean", "seq_mean_token_mean"]:
        # dr_grpo declares L_norm (the constant of seq_mean_token_sum_norm); only the mode changes
        recipe = dataclasses.replace(methods.get("dr_grpo").with_params({"L_norm": 5.0}), aggregation=mode)
        deltas = {}
        for shared, mbs in [(False, 9), (True, 9), (True, 2), (True, 1)]:
            tr.model.load_state_dict(start)
            opt = torch.optim.SGD(tr.model.parameters(), lr=1.0)
            settings = UpdateSettings(micro_batch_size=mbs, dtype="fp64", grad_clip=0.0, shared_prefix=shared)
            m = optimizer_step(Learner(tr.model, opt, settings=settings), recipe, batch, adv, old_from_same_forward=True)
            assert m["skipped_nonfinite"] == 0.0
            deltas[(shared, mbs)] = {k: v - start[k] for k, v in tr.model.state_dict().items()}
        ref = deltas[(False, 9)]
        assert max(float(d.abs().max()) for d in ref.values()) > 1e-6
        for key in [(True, 9), (True, 2), (True, 1)]:
            for k in ref:
                if float(ref[k].abs().max()) > 0:
                    _close(deltas[key][k], ref[k], k)
                else:
                    assert torch.equal(deltas[key][k], ref[k]), k


def test_trainer_role_pass_uses_prefix_and_matches(tiny_model_dir, tmp_path):
    from policylab.trainer.loop import Trainer

    outs = {}
    for shared in (True, False):
        cfg = tiny_config(tiny_model_dir, tmp_path / f"r{shared}", train={"dtype": "fp64", "shared_prefix": shared},
                          rollout={"prompts_per_step": 2, "group_size": 3, "max_new_tokens": 5})
        tr = Trainer(cfg)
        batch = tr.collect()[0]
        outs[shared] = tr.worker.role_logprobs("logp_old", batch)
    torch.testing.assert_close(outs[True], outs[False], rtol=1e-10, atol=1e-12)


def test_no_grad_prefix_backward_is_a_no_op(tokenizer):
    model = models.tiny_llama(tokenizer)
    tokens, att, P = _batch(tokenizer)
    with torch.no_grad():
        sp = SharedPrefix(model, tokens, att, P)
        lp = sp.logprobs(model, torch.arange(6), tokens, att, sampling=SamplingSettings())
    sp.backward()
    assert not lp.requires_grad and all(p.grad is None for p in model.parameters())


def test_decoder_without_cache_is_refused_with_the_option_name(tokenizer):
    class NoCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 4)

        def forward(self, input_ids, **kw):
            return type("Out", (), {"last_hidden_state": self.emb(input_ids)})()

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dec, self.head = NoCache(), torch.nn.Linear(4, 50)

        def get_decoder(self):
            return self.dec

        def get_output_embeddings(self):
            return self.head

    tokens = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 5]])
    with pytest.raises(PolicylabError, match="train.shared_prefix: false"):
        SharedPrefix(LM(), tokens, torch.ones_like(tokens, dtype=torch.bool), 2)


def test_micro_batch_without_response_columns_is_refused(tokenizer):
    model = models.tiny_llama(tokenizer)
    tokens, att, P = _batch(tokenizer)
    sp = SharedPrefix(model, tokens, att, P)
    with pytest.raises(PolicylabError, match="prompt width"):
        sp.logprobs(model, torch.arange(2), tokens[:2, :P], att[:2, :P], sampling=SamplingSettings())


def test_entropy_chunks_and_narrower_mask_match(tokenizer):
    model = models.tiny_llama(tokenizer).double()
    tokens, att, P = _batch(tokenizer, seed=3)
    mask = att[:, P:].clone()
    mask[:, 0] = False  # score only some tokens
    s = SamplingSettings(temperature=0.9)
    with torch.no_grad():
        lp0, ent0 = model_logprobs(model, tokens, att, P, sampling=s, with_entropy=True, mask=mask)
        sp = SharedPrefix(model, tokens, att, P)
        lp1, ent1 = sp.logprobs(model, torch.arange(6), tokens, att, sampling=s, with_entropy=True, mask=mask,
                                chunk_size=5)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-10)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-10)
    assert bool((lp1[~mask] == 0).all()) and float(ent1[mask].min()) > 0


def test_one_response_column(tokenizer):
    model = models.tiny_llama(tokenizer).double()
    tokens, att, P = _batch(tokenizer)
    tokens, att = tokens[:, : P + 1], att[:, : P + 1]
    with torch.no_grad():
        ref = model_logprobs(model, tokens, att, P, sampling=SamplingSettings())
        got = SharedPrefix(model, tokens, att, P).logprobs(model, torch.arange(6), tokens, att,
                                                            sampling=SamplingSettings())
    assert got.shape == (6, 1)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)


def test_optimizer_step_metrics_equal_with_and_without_prefix(tiny_model_dir, tmp_path):
    from policylab.trainer.loop import Trainer

    cfg = tiny_config(tiny_model_dir, tmp_path / "run", train={"dtype": "fp64"},
                      rollout={"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 6})
    tr = Trainer(cfg)
    batch = tr.prepare(tr.collect()[0])
    adv = tr.method.advantage.fn(batch, tr.context().for_stage(tr.method, tr.method.advantage)).adv
    adv = adv + 0.1 * torch.randn(adv.shape, generator=torch.Generator().manual_seed(0), dtype=adv.dtype)
    opt = torch.optim.SGD(tr.model.parameters(), lr=0.0)  # weights stay: compare metrics on the same weights
    kw = dict(micro_batch_size=5, dtype="fp64", grad_clip=0.0)
    m0 = optimizer_step(Learner(tr.model, opt, settings=UpdateSettings(shared_prefix=False, **kw)), tr.method, batch,
                        adv, old_from_same_forward=True)
    m1 = optimizer_step(Learner(tr.model, opt, settings=UpdateSettings(shared_prefix=True, **kw)), tr.method, batch,
                        adv, old_from_same_forward=True)
    assert m0.keys() == m1.keys() and m0["grad_norm"] > 0
    for k in m0:
        assert m1[k] == pytest.approx(m0[k], rel=1e-6, abs=1e-9), k


def test_row_expansion_has_a_deterministic_backward():
    # advanced indexing t[index] with repeated rows accumulates its gradient in a
    # thread-dependent order on CPU (it made two identical real-model runs diverge);
    # the prefix expansion must give bit-identical gradients on every repeat
    from policylab.models.prefix import _rows_of

    torch.manual_seed(0)
    x = torch.randn(4, 3, 45, 64, requires_grad=True)  # a prefix key block: 4 prompts
    index = torch.arange(4).repeat_interleave(8)[torch.randperm(32)]
    g = torch.randn(32, 3, 45, 64)
    grads = []
    for _ in range(10):
        x.grad = None
        (_rows_of(x, index) * g).sum().backward()
        grads.append(x.grad.clone())
    assert all(torch.equal(gr, grads[0]) for gr in grads)
    # and it is the sum of the repeated rows' gradients (naive loop)
    ref = torch.zeros_like(x)
    for r, i in enumerate(index.tolist()):
        ref[i] += g[r]
    torch.testing.assert_close(grads[0], ref, rtol=1e-6, atol=1e-5)
