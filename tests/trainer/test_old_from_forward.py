"""π_old from the training forward in a single on-policy update, whichever engine sampled.

With one epoch, one minibatch and no staleness, the optimizer step runs at the sampling
weights, so π_old = sg(log π_θ) of the step's own forward; the fast mode's TIS forms its
engine ratio k = π_old/μ inside the step from those detached log-probs instead of a
separate no-grad pass. These tests show that this is the same update as with the pass
(hand-worked case, then the real trainer in fp64 against the pass and against a naive
per-row reference), and that the pass still runs wherever π_old is needed apart from the
training forward (several minibatches or epochs, a stale batch, a round stage reading it).
"""

from __future__ import annotations

import math

import pytest
import torch

from policylab import methods
from policylab.backends.update import StepHooks, step_inputs
from policylab.engines import cpu
from policylab.methods.fast_mode import pair_correction
from policylab.methods.loss import policy_loss, tensor_inputs
from policylab.trainer.loop import Trainer
from policylab.trainer.report import summary

from trainer_utils import tiny_config

AMX = frozenset("fpu sse2 avx avx2 fma avx512f avx512_bf16 amx_tile amx_bf16".split())


def _paired():
    return pair_correction(methods.get("grpo"), "fast-bf16").with_params({"kl_coef": 0.0})


def test_hand_worked_step_inputs_read_old_from_the_forward():
    """fp64, one row of three tokens, A = 1, C = 2. The training forward gives
    logp = (-1.0, -0.2, -2.0), the engine recorded μ = (-1.5, -1.2, -1.7); no π_old pass.
    In the step π_old := sg(logp), so log k = logp − μ = (0.5, 1.0, -0.3),
    w = min(k, 2) = (1.6487, 2, 0.7408). PPO clip at ratio exp(lp − sg lp) = 1:
    loss = −A·w·ratio = −w per token and d loss/d logp = −w (the ratio's gradient is 1)."""
    lp_vals = torch.tensor([[-1.0, -0.2, -2.0]], dtype=torch.float64)
    mu = torch.tensor([[-1.5, -1.2, -1.7]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.ones(1, dtype=torch.float64)
    batch = tensor_inputs(lp_vals, adv, mask, logp_behavior=mu).batch
    assert batch.logp_old is None  # no old pass ran

    lp = lp_vals.clone().requires_grad_()
    inp = step_inputs(batch, lp, adv, None, old_from_same_forward=True)
    loss, metrics = policy_loss(_paired(), inp)
    loss.sum().backward()
    w = torch.tensor([[math.exp(0.5), 2.0, math.exp(-0.3)]], dtype=torch.float64)
    torch.testing.assert_close(loss.detach(), -w)
    torch.testing.assert_close(lp.grad, -w)
    assert float(metrics["correction/tis/frac_capped"]) == pytest.approx(1 / 3)

    # naive reference: per token min(exp(lp − μ), C) · (−A · 1)
    naive = [-min(math.exp(a - b), 2.0) for a, b in zip(lp_vals[0].tolist(), mu[0].tolist())]
    torch.testing.assert_close(loss.detach()[0], torch.tensor(naive, dtype=torch.float64))

    # the same loss and gradient as with π_old from a separate pass at the same weights
    lp2 = lp_vals.clone().requires_grad_()
    with_pass = tensor_inputs(lp2, adv, mask, logp_old=lp_vals.clone(), logp_behavior=mu)
    loss2, _ = policy_loss(_paired(), step_inputs(with_pass.batch, lp2, adv, None, old_from_same_forward=False))
    loss2.sum().backward()
    torch.testing.assert_close(loss2.detach(), loss.detach())
    torch.testing.assert_close(lp2.grad, lp.grad)


def test_without_the_old_pass_a_correction_would_have_no_old_policy():
    """The step's inputs without the same-forward rule and without a pass: TIS refuses
    (it never silently uses the live log-probs of another role)."""
    lp = torch.tensor([[-1.0, -0.2]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv = torch.ones(1, dtype=torch.float64)
    batch = tensor_inputs(lp, adv, mask, logp_behavior=lp - 0.1).batch
    with pytest.raises(Exception, match="logp_old"):
        policy_loss(_paired(), step_inputs(batch, lp.clone().requires_grad_(), adv, None,
                                           old_from_same_forward=False))


def _fast_trainer(tiny_model_dir, run_dir, **sections):
    train = {"dtype": "fp64", "grad_clip": 0.0, "micro_batch_size": 3, "lr": 1e-3, **sections.pop("train", {})}
    rollout = {"engine": "fast-bf16", "group_size": 4, "max_new_tokens": 5, **sections.pop("rollout", {})}
    return Trainer(tiny_config(tiny_model_dir, run_dir, rollout=rollout, train=train, **sections))


def _step(tr, batch, adv, *, old_from_same_forward):
    grads = {}

    def keep(model):
        grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        return {}

    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    m = tr.worker.optimizer_step(tr.method, batch, adv, old_from_same_forward=old_from_same_forward,
                                 hooks=StepHooks(grad=keep))
    update = {n: p.detach() - before[n] for n, p in tr.model.named_parameters()}
    return m, grads, update


def _naive_grads(model, batch, adv, cap: float) -> tuple[float, dict]:
    """GRPO (kl 0, seq-mean-token-mean) x TIS at ratio 1, row by row on unpadded tokens:
    L = (1/N_seq) Σ_i (1/|y_i|) Σ_t −A_i · min(exp(sg lp_it − μ_it), C) · exp(lp_it − sg lp_it)."""
    model.zero_grad(set_to_none=True)
    P = batch.prompt_width
    rows = [i for i in range(batch.size) if bool(batch.loss_mask[i].any())]
    total = 0.0
    for i in rows:
        real = batch.attention_mask[i].nonzero().squeeze(-1)
        ids = batch.tokens[i, real].unsqueeze(0)
        n_prompt = int(batch.attention_mask[i, :P].sum())
        logits = model(input_ids=ids[:, :-1], use_cache=False).logits[0].double()
        lsm = torch.log_softmax(logits, -1)
        loss_i = 0.0
        n_tok = int(batch.loss_mask[i].sum())
        for t in range(batch.loss_mask.shape[1]):
            if not bool(batch.loss_mask[i, t]):
                continue
            lp = lsm[n_prompt - 1 + t, ids[0, n_prompt + t]]
            w = min(math.exp(float(lp.detach()) - float(batch.logp_behavior[i, t])), cap)
            a = float(adv[i] if adv.dim() == 1 else adv[i, t])
            loss_i = loss_i + (-a * w * torch.exp(lp - lp.detach()))
        if torch.is_tensor(loss_i):
            loss = loss_i / n_tok / len(rows)
            loss.backward()
            total += float(loss.detach())
    return total, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_fast_step_without_the_pass_is_the_step_with_the_pass(tiny_model_dir, tmp_path, monkeypatch):
    """The real trainer, fp64 tiny Llama, the fast mode (bf16 engine's μ, GRPO x TIS):
    the same loss, TIS weights, gradient and weight update whether π_old comes from the
    training forward or from the no-grad pass, and both equal a naive per-row reference."""
    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: AMX)
    a = _fast_trainer(tiny_model_dir, tmp_path / "a")
    b = _fast_trainer(tiny_model_dir, tmp_path / "b")
    assert not a.needs_old_pass()
    for (n1, p1), (n2, p2) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    batch, _ = a.collect()
    assert batch is not None and batch.logp_behavior is not None
    batch = a.prepare(batch)
    assert batch.logp_old is None  # the fast mode no longer forces the pass here
    batch, A, _ = a.round_inputs(batch)
    adv = A.adv.detach()
    assert bool((adv != 0).any()), "the test batch needs a learning signal"
    mu_gap = (batch.logp_behavior - a.worker.role_logprobs("logp_old", batch))[batch.loss_mask].abs()
    assert float(mu_gap.max()) > 1e-4  # the bf16 engine really differs from the fp64 trainer

    naive_loss, naive = _naive_grads(a.model, batch, adv, cap=a.method.p["tis_cap"])
    a.model.zero_grad(set_to_none=True)

    m_a, g_a, u_a = _step(a, batch, adv, old_from_same_forward=True)
    with_pass = batch.replace(logp_old=b.worker.role_logprobs("logp_old", batch))
    m_b, g_b, u_b = _step(b, with_pass, adv, old_from_same_forward=False)

    assert not m_a.get("skipped_no_signal") and not m_a["skipped_nonfinite"]
    tol = dict(rtol=1e-9, atol=1e-12)
    for key in ("loss/policy", "correction/tis/weight_mean", "correction/tis/frac_capped", "correction/tis/ess"):
        assert m_a[key] == pytest.approx(m_b[key], rel=1e-9, abs=1e-12), key
    assert m_a["loss/policy"] == pytest.approx(naive_loss, rel=1e-9, abs=1e-12)
    assert set(g_a) == set(g_b) == set(naive)
    for n in g_a:
        torch.testing.assert_close(g_a[n], g_b[n], **tol)
        torch.testing.assert_close(u_a[n], u_b[n], **tol)
    # the naive reference runs each row unpadded through the full forward: the Llama's
    # RMSNorm computes in fp32 even for an fp64 model, so a value that differs at fp64
    # rounding can round to another fp32 number there (a few 1e-7 relative, on ~0.1% of
    # the entries); compared as whole vectors
    flat = lambda g: torch.cat([g[n].reshape(-1) for n in sorted(g)])  # noqa: E731
    rel = float((flat(g_a) - flat(naive)).norm() / flat(naive).norm())
    assert rel < 1e-6, rel
    cos = float(torch.nn.functional.cosine_similarity(flat(g_a), flat(naive), dim=0))
    assert cos > 1 - 1e-10, cos
    assert max(float(u.abs().max()) for u in u_a.values()) > 0  # the step moved the weights
    # the engine mismatch is still logged, from the step's own forward
    assert m_a["mismatch/old_vs_behavior_abs_dlogp_mean"] > 1e-4
    assert m_a["mismatch/old_vs_behavior_abs_dlogp_max"] >= m_a["mismatch/old_vs_behavior_abs_dlogp_mean"]


def _old_pass_calls(tr, monkeypatch) -> list[str]:
    calls: list[str] = []
    inner = tr.worker.role_logprobs

    def spy(role, batch):
        calls.append(role)
        return inner(role, batch)

    monkeypatch.setattr(tr.worker, "role_logprobs", spy)
    return calls


def test_single_update_fast_step_runs_no_old_pass_and_says_so(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: AMX)
    tr = _fast_trainer(tiny_model_dir, tmp_path / "r", train={"dtype": "fp32"})
    calls = _old_pass_calls(tr, monkeypatch)
    m = tr.train_step()
    assert "logp_old" not in calls and not tr.needs_old_pass()
    assert "correction/tis/ess" in m
    line = next(x for x in summary(tr).splitlines() if x.startswith("old logp"))
    assert "sg(logp) of the training forward" in line and "tis" in line and "fast-bf16" in line


@pytest.mark.parametrize("case,sections,reason", [
    ("minibatches", {"train": {"minibatches": 2}}, "2 minibatches per epoch"),
    ("epochs", {"train": {"epochs": 2}}, "2 epochs over each batch"),
    ("stale", {"rollout": {"staleness": 1}}, "1 version(s) after sampling"),
    ("round reader", {"method": "stare", "method_params": {}}, "read before the update by stare_round_old"),
])
def test_the_pass_is_still_taken_where_it_is_needed(tiny_model_dir, tmp_path, monkeypatch, case, sections, reason):
    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: AMX)
    tr = _fast_trainer(tiny_model_dir, tmp_path / "r", **sections)
    assert tr.needs_old_pass()
    assert reason in tr.old_logp_source() and "no-grad pass" in tr.old_logp_source()
    calls = _old_pass_calls(tr, monkeypatch)
    for _ in range(2 if case == "stale" else 1):  # a stale queue trains from its second step
        m = tr.train_step()
    assert "logp_old" in calls
    assert m["mismatch/old_vs_behavior_abs_dlogp_mean"] > 1e-4  # from the pass (round-time diagnostics)


def test_which_methods_read_old_before_the_update():
    """Only stages outside the loss count: a correction's π_old is read inside the step."""
    assert methods.get("grpo").old_readers_before_update == ()
    assert methods.get("stare").old_readers_before_update == ("stare_round_old",)
    assert methods.get("tis").old_readers_before_update == ()  # its TIS reads π_old inside the step
