"""Full-vocabulary entropy and KL per position, chunked over positions and vocabulary
(`policylab.models.vocab.head_stats`, `LocalWorker.vocab_stats`), against the naive [B, T, V]
computation; the prompt log-likelihood of `LocalWorker.prompt_logprobs`."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

from policylab import SamplingSettings
from policylab.models import loading as models
from policylab.backends.local import LocalWorker
from policylab.backends.update import Learner, UpdateSettings
from policylab.batch import RolloutBatch
from policylab.engines.fast import FastEngine
from policylab.errors import PolicylabError
from policylab.models.vocab import head_stats, response_hidden


def _naive(model, ref, batch, temperature=1.0, allowed=()):
    """Entropy and KL from the full logits [B, T, V], one loop over positions."""
    def logits(m):
        out = m(input_ids=batch.tokens[:, :-1], attention_mask=batch.attention_mask[:, :-1].long(),
                position_ids=(batch.attention_mask[:, :-1].long().cumsum(-1) - 1).clamp(min=0)).logits
        z = out[:, batch.prompt_width - 1:].double() / temperature
        if allowed:
            keep = torch.zeros(z.shape[-1], dtype=torch.bool)
            keep[list(allowed)] = True
            z = z.masked_fill(~keep, float("-inf"))
        return z

    with torch.no_grad():
        zp, zq = logits(model), logits(ref)
    B, T = batch.loss_mask.shape
    ent = torch.zeros(B, T, dtype=torch.float64)
    kl = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        for t in range(T):
            if not batch.loss_mask[i, t]:
                continue
            lp, lq = torch.log_softmax(zp[i, t], -1), torch.log_softmax(zq[i, t], -1)
            p = lp.exp()
            fin = torch.isfinite(lp)
            ent[i, t] = -(p[fin] * lp[fin]).sum()
            kl[i, t] = (p[fin] * (lp[fin] - lq[fin])).sum()
    return ent, kl


@pytest.fixture
def pair(tokenizer):
    policy = models.tiny_llama(tokenizer)
    ref = copy.deepcopy(policy)
    with torch.no_grad():  # a reference that differs from the policy
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel() % 97)))
    return policy, ref


def _batch(policy, tokenizer, sampling, seed=0) -> RolloutBatch:
    eng = FastEngine(policy, tokenizer)
    return eng.generate([[1, 5, 6, 7], [1, 300, 301]], group_size=2, sampling=sampling, max_new_tokens=5,
                        policy_version=0, batch_id="v", seed=seed)


def _worker(policy, ref, mbs=3):
    return LocalWorker(Learner(policy, None, settings=UpdateSettings(micro_batch_size=mbs, dtype="fp32", grad_clip=0.0)),
                       ref_model=ref)


@pytest.mark.parametrize("sampling", [SamplingSettings(), SamplingSettings(temperature=0.7),
                                      SamplingSettings(allowed_ids=(40, 41, 42))])
@pytest.mark.parametrize("chunks", [(1, 5000), (64, 8192), (3, 49152)])
def test_chunked_entropy_and_kl_equal_the_naive_full_vocabulary_loop(pair, tokenizer, sampling, chunks):
    policy, ref = pair
    b = _batch(policy, tokenizer, sampling)
    got = _worker(policy, ref).vocab_stats(b, kl_to_reference=True, position_chunk=chunks[0], vocab_chunk=chunks[1])
    ent, kl = _naive(policy, ref, b, sampling.temperature, sampling.allowed_ids)
    assert_close(got["entropy"].double(), ent, rtol=1e-4, atol=1e-4)
    assert_close(got["kl"].double(), kl, rtol=1e-4, atol=1e-5)
    assert float(kl[b.loss_mask].min()) > 0  # a real drift: the check is not 0 == 0
    assert bool((got["entropy"][~b.loss_mask] == 0).all()) and bool((got["kl"][~b.loss_mask] == 0).all())


def test_kl_of_a_model_to_itself_is_zero_and_entropy_needs_no_reference(pair, tokenizer):
    policy, _ = pair
    b = _batch(policy, tokenizer, SamplingSettings())
    w = _worker(policy, copy.deepcopy(policy))
    out = w.vocab_stats(b, kl_to_reference=True)
    assert float(out["kl"].abs().max()) < 1e-5
    only = _worker(policy, None).vocab_stats(b)
    assert set(only) == {"entropy"}
    assert_close(only["entropy"], out["entropy"])
    with pytest.raises(PolicylabError, match="no reference model is loaded"):
        _worker(policy, None).vocab_stats(b, kl_to_reference=True)


def test_truncated_samplers_are_refused(pair, tokenizer):
    policy, ref = pair
    b = _batch(policy, tokenizer, SamplingSettings(top_k=20))
    with pytest.raises(PolicylabError, match="untruncated sampling distribution"):
        _worker(policy, ref).vocab_stats(b, kl_to_reference=True)
    h, head, cap = response_hidden(policy, b.tokens, b.attention_mask, b.prompt_width)
    with pytest.raises(ValueError, match="vocab_chunk"):
        head_stats(h, head, b.loss_mask, sampling=SamplingSettings(), vocab_chunk=0)


def test_prompt_logprobs_score_each_prompt_token_given_its_prefix(pair, tokenizer):
    policy, ref = pair
    b = _batch(policy, tokenizer, SamplingSettings())
    got = _worker(policy, ref, mbs=1).prompt_logprobs("logp_ref", b)
    P = b.prompt_width
    assert got.shape == (b.size, P)
    for i in range(b.size):
        real = b.tokens[i, :P][b.attention_mask[i, :P]].tolist()
        with torch.no_grad():
            lp = torch.log_softmax(ref(input_ids=torch.tensor([real])).logits[0].double(), -1)
        want = [float(lp[j - 1, real[j]]) for j in range(1, len(real))]
        row = got[i][b.attention_mask[i, :P]]
        assert float(row[0]) == 0.0  # the first real token: nothing predicts it
        assert_close(row[1:].double(), torch.tensor(want, dtype=torch.float64), rtol=1e-4, atol=1e-4)
        assert bool((got[i][~b.attention_mask[i, :P]] == 0).all())  # left padding
