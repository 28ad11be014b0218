"""The mixed-policy methods in the trainer (tiny random Llama): where each method's
sequences come from, how they are labelled, and the invariants of its specification."""

import dataclasses
import math

import pytest
import torch

from policylab import methods
from policylab.batch import ProvenanceError
from policylab.methods.families import borrowed_rollouts, demonstrations, hints_and_gold
from policylab.kernels import mixed as K
from policylab.methods.rows import real_prompts
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config

ROLLOUT = {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 5}


def trainer(small_model_dir, tmp_path, method, params=None, reward="exact_numeric", **sections):
    sections.setdefault("rollout", ROLLOUT)
    cfg = tiny_config(small_model_dir, tmp_path / method, method=method, method_params=dict(params or {}),
                      task={"reward": reward}, **sections)
    return Trainer(cfg)


def source_ctx(tr):
    return tr.context("t").for_stage(tr.method, tr.method.source)


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------- LUFFY


def test_luffy_groups_mix_rollouts_and_solver_demonstrations(small_model_dir, tmp_path):
    tr = trainer(small_model_dir, tmp_path, "luffy")
    batch, _ = tr.collect()
    G = 4
    assert batch.size == 3 * G
    for g in torch.unique(batch.group).tolist():
        rows = (batch.group == g).nonzero().squeeze(-1).tolist()
        kinds = [batch.sources[r] for r in rows]
        assert kinds == ["native"] * 3 + ["demonstration"]  # G − k rollouts, then k = 1 demonstration
        assert batch.producers[rows[-1]] == "solver:arithmetic"
    demo = batch.source_rows("demonstration")
    # the solver's demonstration is verified: exact_numeric gives it reward 1
    assert bool((batch.rewards[demo] == 1).all())
    # μ = 1 for a deterministic producer: log-prob 0.0 exactly, and known
    counted = batch.loss_mask & demo.unsqueeze(-1)
    assert bool((batch.logp_behavior[counted] == 0).all()) and bool(batch.behavior_mask[counted].all())
    # the public API offers no way to mark them native
    with pytest.raises(ProvenanceError, match="cannot be relabelled native"):
        batch.replace(source=("native",) * batch.size)
    # advantages over the mixed group: GRPO's normalization of the native and demo rewards together
    _, A, metrics = tr.round_inputs(tr.prepare(batch))
    from policylab.kernels import advantages

    torch.testing.assert_close(A.adv, advantages.grpo(batch.rewards, batch.group))
    assert metrics["reward/mean@source=demonstration"] == 1.0


def test_luffy_refuses_groups_made_only_of_demonstrations(small_model_dir, tmp_path):
    from policylab.errors import PolicylabError

    with pytest.raises(PolicylabError, match="demos_per_group = 4 must be >= 1 and < rollout.group_size"):
        trainer(small_model_dir, tmp_path, "luffy", {"demos_per_group": 4})


# ----------------------------------------------------------------------------- Off-Context GRPO


def test_off_context_learns_on_the_prompt_alone_and_samples_with_the_hint(small_model_dir, tmp_path):
    tr = trainer(small_model_dir, tmp_path, "off_context_grpo", {"kl_coef": 0.0})
    batch, _ = tr.collect()
    assert set(batch.sources) == {"hinted"} and set(batch.producers) == {"policy"}
    for ids in real_prompts(batch):  # the numerator's input ids: unhinted prompt (+ response), no hint token
        assert "Hint" not in tr.tokenizer.decode(ids)
    # the denominator was computed on the hinted context: a fresh forward on the unhinted
    # batch gives other log-probs than the hinted sampler recorded
    lp_plain = tr.worker.role_logprobs("logp_current", batch)
    assert float((lp_plain - batch.logp_behavior).abs()[batch.loss_mask].max()) > 1e-3
    tr.round_inputs(tr.prepare(batch))  # passes the context check
    # a batch whose two sides saw the same context is refused: the behavior fingerprint
    # replaced by the learner's own prompt (both without the hint)
    same = batch.replace(extras={**batch.extras, "behavior_prompt_hash": torch.tensor(
        [K.fingerprint(p) for p in real_prompts(batch)])})
    with pytest.raises(K.ContextError, match="same context"):
        tr.round_inputs(tr.prepare(same))
    # both with the hint: the learner's prompt rebuilt on prompt ⊕ hint
    hinted_prompts = [tr.encode(hints_and_gold.with_hint(e.prompt, "Hint: the answer is 3.")) for e in tr.task.heldout(1)]
    from policylab.methods.rows import with_prompts

    leaked = with_prompts(batch, hinted_prompts * batch.size, pad_id=tr.tokenizer.pad_token_id)
    leaked = leaked.replace(extras={**leaked.extras, "hint_hash": torch.tensor(
        [K.fingerprint(tr.tokenizer("Hint: the answer is 3.", add_special_tokens=False)["input_ids"])] * batch.size),
        "hint_len": torch.tensor([len(tr.tokenizer("Hint: the answer is 3.", add_special_tokens=False)["input_ids"])]
                                 * batch.size)})
    with pytest.raises(K.ContextError, match="contains the hint"):
        tr.round_inputs(tr.prepare(leaked))


def test_off_context_with_an_empty_hint_is_grpo(small_model_dir, tmp_path):
    sec = dict(train={"dtype": "fp64", "grad_clip": 0.0})
    par = "trainer_utils:parity_reward"  # mixed outcomes on a random model: a nonzero update
    # one trainer after the other: each seeds the global RNG its sampler draws from
    a = trainer(small_model_dir, tmp_path / "a", "off_context_grpo", {"hint_kind": "none", "kl_coef": 0.0}, par, **sec)
    start = weights(a.model)
    ma = a.train_step()
    b = trainer(small_model_dir, tmp_path / "b", "grpo", {"kl_coef": 0.0}, par, **sec)
    mb = b.train_step()
    assert ma["reward/mean"] == mb["reward/mean"]
    assert ma["rollout/sequences@source=native"] == 12.0
    wa, wb = weights(a.model), weights(b.model)
    assert any(not torch.equal(wa[k], start[k]) for k in wa)
    # the same samples, rewards and loss; the weights agree to fp64 rounding (~1e-16: the
    # rebuilt batch is a copy with another memory layout, which can reorder a float sum)
    assert ma["loss/policy"] == pytest.approx(mb["loss/policy"], abs=1e-14)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-9, atol=1e-14)


def test_off_context_evaluation_has_no_hint(small_model_dir, tmp_path, monkeypatch):
    tr = trainer(small_model_dir, tmp_path, "off_context_grpo")
    seen = []
    import policylab.eval.evaluate as ev

    real = ev.evaluate

    def spy(engine, prompts, *a, **kw):
        seen.extend(prompts)
        return real(engine, prompts, *a, **kw)

    monkeypatch.setattr(ev, "evaluate", spy)
    tr.evaluate("x")
    assert seen and all("Hint" not in tr.tokenizer.decode(p) for p in seen)


# ----------------------------------------------------------------------------- GRIN


def test_grin_injects_gold_only_into_all_fail_groups(small_model_dir, tmp_path):
    tr = trainer(small_model_dir, tmp_path, "grin", {"grin_alpha": 0.25, "grin_schedule": "constant"},
                 reward="mixed_helpers:odd_answers_only", rollout={**ROLLOUT, "prompts_per_step": 6})
    batch, _ = tr.collect()
    seen_odd = seen_even = 0
    for g in torch.unique(batch.group).tolist():
        rows = (batch.group == g).nonzero().squeeze(-1).tolist()
        kinds = [batch.sources[r] for r in rows]
        gold_rows = [r for r in rows if batch.sources[r] == "gold"]
        native_ok = batch.outcome["correct"][[r for r in rows if batch.sources[r] == "native"]]
        if gold_rows:  # injected: every native sample of the group failed
            seen_odd += 1
            assert not bool(native_ok.any())
            assert kinds == ["native"] * 3 + ["gold"]  # round(0.25·4) = 1 gold row replaces the last sample
            assert batch.producers[gold_rows[0]] == "solver:arithmetic"
            assert batch.extras["grin_alpha"][rows].tolist() == [0.25] * 4  # the group's real mixture weight
            gm = batch.extras["grin_gold_match"][gold_rows[0]]
            assert bool((gm[batch.loss_mask[gold_rows[0]]] == 1).all())
        else:
            seen_even += 1
            assert bool(native_ok.any()) and batch.extras["grin_alpha"][rows].abs().sum() == 0
    assert seen_odd and seen_even
    _, _, m = tr.round_inputs(tr.prepare(batch))
    assert m["reward/mean@source=gold"] == 1.0 and m["grin/injected_groups"] == seen_odd


def test_grin_denominator_is_the_mixture_in_the_loss(small_model_dir, tmp_path):
    tr = trainer(small_model_dir, tmp_path, "grin", {"grin_schedule": "constant", "kl_coef": 0.04},
                 reward="mixed_helpers:odd_answers_only", rollout={**ROLLOUT, "prompts_per_step": 6})
    batch, _ = tr.collect()
    batch = tr.prepare(batch)
    assert batch.logp_ref is not None and bool(batch.source_rows("gold").any())
    from policylab.methods.loss import tensor_inputs

    lp = tr.worker.role_logprobs("logp_current", batch)
    inp = tensor_inputs(lp, torch.ones(batch.size), batch.loss_mask, logp_ref=batch.logp_ref,
                        extras=dict(batch.extras))
    w = hints_and_gold.mixture_denominator(inp, tr.method.view(hints_and_gold.MIXTURE_DENOMINATOR))
    want = K.grin_mixture_logp(lp, batch.extras["grin_alpha"], batch.extras["grin_gold_match"] > 0.5,
                               batch.loss_mask)
    torch.testing.assert_close(w.logp_old, want)
    gold = batch.source_rows("gold").unsqueeze(-1) & batch.loss_mask
    assert not torch.allclose(w.logp_old[gold], batch.logp_ref[gold])  # never the reference


def test_grin_with_alpha_zero_is_grpo(small_model_dir, tmp_path):
    sec = dict(train={"dtype": "fp64", "grad_clip": 0.0})
    par = "trainer_utils:parity_reward"
    a = trainer(small_model_dir, tmp_path / "a", "grin", {"grin_alpha": 0.0}, par, **sec)
    ma = a.train_step()
    b = trainer(small_model_dir, tmp_path / "b", "grpo", {"kl_coef": 0.0}, par, **sec)
    mb = b.train_step()
    assert ma["grin/injected_groups"] == 0.0 and ma["grad_norm"] > 0
    wb = weights(b.model)
    for k, v in weights(a.model).items():  # equal to fp64 rounding (see the off-context test)
        torch.testing.assert_close(v, wb[k], rtol=1e-9, atol=1e-14)
    assert ma["loss/policy"] == pytest.approx(mb["loss/policy"], abs=1e-14)


# ----------------------------------------------------------------------------- MOER


def test_moer_prefix_schedule_never_lengthens():
    p = methods.get("moer").with_params({"prefix_frac": 0.6, "prefix_decay_steps": 10}).p
    fr = [demonstrations.prefix_fraction(s, p) for s in range(15)]
    assert fr[0] == 0.6 and fr[10] == 0.0 and all(b <= a for a, b in zip(fr, fr[1:]))
    const = methods.get("moer").with_params({"prefix_decay_steps": 0}).p
    assert {demonstrations.prefix_fraction(s, const) for s in range(5)} == {0.5}


def test_moer_guided_rows_stay_guided_and_mask_the_expert_prefix(small_model_dir, tmp_path):
    tr = trainer(small_model_dir, tmp_path, "moer", reward="mixed_helpers:always_right")
    batch, _ = tr.collect()
    guided = batch.source_rows("guided")
    assert int(guided.sum()) == 3 and not bool(batch.source_rows("expert").any())  # success: no rollback
    for r in guided.nonzero().squeeze(-1).tolist():
        assert batch.producers[r] == "policy+solver:arithmetic"
        att = batch.attention_mask[r, batch.prompt_width:]
        first = int(batch.loss_mask[r].nonzero()[0])
        assert first > 0 and bool(att[:first].all())  # the prefix is context, not in the loss (train_prefix false)
        assert bool((batch.logp_behavior[r, :first] == 0).all())  # the expert wrote it: μ = 1
    _, A, _ = tr.round_inputs(tr.prepare(batch))
    # joint group advantage without std: r − mean_g r (all rewards 1 here -> 0)
    assert bool((A.adv == 0).all())


def test_moer_rolls_back_failed_continuations_to_the_full_expert_trace(small_model_dir, tmp_path):
    # the worked solutions verify, the random model's continuations never do
    tr = trainer(small_model_dir, tmp_path, "moer", reward="mixed_helpers:solutions_only")
    batch, _ = tr.collect()
    expert = batch.source_rows("expert")
    assert int(expert.sum()) == 3 and not bool(batch.source_rows("guided").any())
    from policylab.tasks import guidance

    for r in expert.nonzero().squeeze(-1).tolist():
        text = tr.tokenizer.decode(batch.response_tokens[r][batch.loss_mask[r]].tolist(), skip_special_tokens=True)
        assert "=" in text and batch.producers[r] == "solver:arithmetic"
        assert int(batch.loss_mask[r].nonzero()[0]) == 0  # the whole trace is in the loss
    assert guidance.worked_solution  # the traces are the solver's worked solutions


def test_moer_never_uses_an_expert_trace_the_verifier_refuses(small_model_dir, tmp_path):
    # 3 prompts; the worked solution of a problem with an odd answer fails the verifier (a dataset
    # trace whose final answer is wrong), of an even answer it passes; continuations never pass.
    # An unverified trace is neither a prefix nor a rollback target: that prompt's k rows are plain
    # rollouts (native); a verified one is rolled back to after the failed continuation (expert, reward 1)
    tr = trainer(small_model_dir, tmp_path, "moer", reward="mixed_helpers:solutions_of_even_answers",
                 rollout={**ROLLOUT, "prompts_per_step": 6})
    batch, _ = tr.collect()
    from policylab.tasks import guidance

    groups = torch.unique(batch.group).tolist()
    n_odd = 0
    for g in groups:
        rows = (batch.group == g).nonzero().squeeze(-1).tolist()
        kinds = [batch.sources[r] for r in rows]
        assert "guided" not in kinds  # every continuation failed
        if "expert" in kinds:
            r = rows[kinds.index("expert")]
            assert float(batch.rewards[r]) == 1.0  # only a verified trace becomes an expert row
        else:
            assert kinds == ["native"] * 4
            n_odd += 1
    assert bool((batch.rewards[batch.source_rows("expert")] == 1).all())
    assert n_odd >= 1 and int(batch.source_rows("expert").sum()) == len(groups) - n_odd  # both cases seen
    _, _, m = tr.round_inputs(tr.prepare(batch))
    assert m["moer/unverified_traces"] == float(n_odd) and m["moer/rollback_rows"] == float(len(groups) - n_odd)
    assert guidance.worked_solution


def test_moer_unit_ratio_rows_are_never_clipped(small_model_dir, tmp_path):
    tr = trainer(small_model_dir, tmp_path, "moer", reward="mixed_helpers:solutions_only",
                 train={"epochs": 2, "minibatches": 1})
    batch, _ = tr.collect()
    batch = tr.prepare(batch)
    from policylab.methods.loss import policy_loss
    from policylab.methods.spec import LossInputs

    lp = (batch.logp_old + 3.0 * batch.loss_mask).clamp(max=0).requires_grad_()  # far from π_old
    adv = torch.linspace(-1, 1, batch.size)
    inp = LossInputs(logp=lp, logp_old=batch.logp_old, logp_behavior=batch.logp_behavior, logp_ref=None, adv=adv,
                     mask=batch.loss_mask, entropy=None, batch=batch)
    loss, _ = policy_loss(tr.method, inp)
    loss.sum().backward()
    off = batch.source_rows("expert").unsqueeze(-1) & batch.loss_mask
    a2 = adv.unsqueeze(-1).expand_as(lp)
    # unit ratio: value −A, gradient −A on every counted token of expert rows
    torch.testing.assert_close(loss[off], -a2[off])
    torch.testing.assert_close(lp.grad[off], -a2[off])


# ----------------------------------------------------------------------------- GRAFT and ERILS


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory, small_tokenizer):
    tokenizer = small_tokenizer  # the peer shares the learner's (small) vocabulary
    from policylab.models import loading as models

    path = tmp_path_factory.mktemp("peer-model")
    models.tiny_llama(tokenizer, seed=1).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _scripted(ctx, outcomes):
    """ctx whose verifier answers from `outcomes` (a list of lists), call by call."""
    calls = iter(outcomes)

    def score(texts, examples):
        v = torch.tensor(next(calls), dtype=torch.float32)[: len(texts)]
        return v, {"v": v}, v

    return dataclasses.replace(ctx, score=score)


def test_graft_imports_the_whole_mixed_peer_group_of_an_all_fail_prompt(small_model_dir, tmp_path, other_model_dir):
    tr = trainer(small_model_dir, tmp_path, "graft", {"peer_model": str(other_model_dir)},
                 rollout={**ROLLOUT, "prompts_per_step": 2})
    peer = tr.controllers["peer"]
    assert peer.name == other_model_dir.name and peer.model is not tr.model
    # receiver: prompt 0 has a success, prompt 1 all fail; the peer's group on prompt 1 is mixed
    ctx = _scripted(source_ctx(tr), [[1, 0, 0, 0, 0, 0, 0, 0], [1, 0, 1, 0]])
    s = borrowed_rollouts.peer_exchange(2, ctx)
    b = s.batch
    peer_rows = b.source_rows("peer")
    assert int(peer_rows.sum()) == 4  # the whole group, never one success alone
    assert set(b.sources[i] for i in peer_rows.nonzero().squeeze(-1).tolist()) == {f"peer:{peer.name}"}
    assert set(b.producers[i] for i in peer_rows.nonzero().squeeze(-1).tolist()) == {peer.name}
    g = torch.unique(b.group[peer_rows])
    assert g.numel() == 1 and not bool(torch.isin(g, b.group[~peer_rows]).any())  # its own group id
    c = b.extras["graft_compat"][peer_rows]
    assert bool((c > 0).all()) and bool(torch.isfinite(c).all())
    assert b.extras["graft_keep"][peer_rows].tolist() == (c >= 0.1).float().tolist()
    assert len(s.prompt_ids) == 3 and len(s.texts) == b.size
    # a receiver group with any success, or a uniform peer group: nothing borrowed
    for outcomes in ([[1] + [0] * 7, [1, 1, 1, 1], [1, 1, 1, 1]], [[0] * 8, [0, 0, 0, 0], [1, 1, 1, 1]]):
        s = borrowed_rollouts.peer_exchange(2, _scripted(source_ctx(tr), outcomes))
        assert not bool(s.batch.source_rows("peer").any())


def _graft_loss(lp, lp_old, adv, compat, sources, method=None):
    """GRAFT's per-token loss and ∂(Σ loss)/∂lp for one-token rows (a masked second
    position holding garbage), through the method's own correction and objective."""
    from policylab.methods.loss import policy_loss, tensor_inputs

    m = method or methods.get("graft")
    B = len(lp)
    leaf = torch.tensor([[x, 5.0] for x in lp], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[x, -3.0] for x in lp_old], dtype=torch.float64)
    mask = torch.tensor([[True, False]] * B)
    c = torch.tensor(compat, dtype=torch.float32)  # as the source stores it
    inp = tensor_inputs(leaf, torch.tensor(adv, dtype=torch.float64), mask, logp_old=old,
                        group=torch.zeros(B, dtype=torch.long),
                        extras={"graft_compat": c, "graft_keep": (c >= m.p.graft_min_compat).float()})
    inp = inp.replace(batch=inp.batch.replace(source=tuple(sources), producer=tuple(
        s.split(":", 1)[1] if s.startswith("peer:") else "policy" for s in sources)).validate())
    loss, _ = policy_loss(m, inp)
    loss.sum().backward()
    return loss.detach(), leaf.grad


def test_graft_a_less_compatible_borrowed_row_moves_the_policy_less():
    # first update, π_θ = π_old (ρ = 1, inside the clip): ℓ = −w·A, ∂ℓ/∂lp = −w·A, w = min(c, 1) on
    # borrowed rows (0 below graft_min_compat = 0.1), 1 on the native row
    #   rows: native, peer c = 1.0, peer c = 0.5, peer c = 0.05, peer c = 2.0 (capped at 1)
    #   A = +1: ∂ℓ/∂lp = [−1, −1, −0.5, 0, −1];   A = −1: [+1, +1, +0.5, 0, +1]
    src = ["native", "peer:p", "peer:p", "peer:p", "peer:p"]
    compat = [1.0, 1.0, 0.5, 0.05, 2.0]
    lp = [-1.2] * 5
    for a in (1.0, -1.0):
        loss, grad = _graft_loss(lp, lp, [a] * 5, compat, src)
        want = [-a * w for w in (1.0, 1.0, 0.5, 0.0, 1.0)]
        assert grad[:, 0].tolist() == pytest.approx(want, abs=1e-12)
        assert loss[:, 0].tolist() == pytest.approx(want, abs=1e-12)
        assert grad[:, 1].abs().sum() == 0 and loss[:, 1].abs().sum() == 0  # masked positions
    # the clip acts on borrowed rows too (ε = 0.2): later in the round, ρ = e^{lp − lp_old}
    #   ρ = 1.1, A = +1, c = 0.5: unclipped, ∂ℓ/∂lp = −w·A·ρ = −0.5·1.1 = −0.55
    #   ρ = 1.3, A = +1, c = 0.5: clipped at 1.2, ∂ℓ/∂lp = 0 (value −0.5·1.2 = −0.6)
    #   ρ = 0.7, A = −1, c = 0.5: clipped at 0.8, ∂ℓ/∂lp = 0 (value −0.5·(−1)·0.8 = 0.4)
    import math

    lp_old = [-1.2, -1.2, -1.2]
    lp = [-1.2 + math.log(1.1), -1.2 + math.log(1.3), -1.2 + math.log(0.7)]
    loss, grad = _graft_loss(lp, lp_old, [1.0, 1.0, -1.0], [0.5] * 3, ["peer:p"] * 3)
    assert grad[:, 0].tolist() == pytest.approx([-0.55, 0.0, 0.0], abs=1e-12)
    assert loss[:, 0].tolist() == pytest.approx([-0.55, -0.6, 0.4], abs=1e-12)
    # a higher cap lets a row the receiver finds likelier than the peer did weigh more than a native one
    wide = methods.get("graft").with_params({"graft_compat_cap": 2.0})
    _, grad = _graft_loss([-1.2], [-1.2], [1.0], [2.0], ["peer:p"], method=wide)
    assert float(grad[0, 0]) == pytest.approx(-2.0, abs=1e-12)


def test_graft_trains_with_an_initial_copy_peer_and_refuses_a_changed_peer_on_resume(small_model_dir, tmp_path):
    tr = trainer(small_model_dir, tmp_path, "graft")
    assert tr.controllers["peer"].name == "initial"
    state = tr.controllers["peer"].state_dict()
    assert set(state) == {"spec", "name", "fingerprint"}  # the weights are rebuilt, never stored
    with pytest.raises(Exception, match="other weights"):
        tr.controllers["peer"].load_state_dict({**state, "fingerprint": "0" * 24})


def test_erils_caps_external_rows_and_normalizes_per_source(small_model_dir, tmp_path, other_model_dir):
    # parity rewards (mixed on a random model) and a cap that keeps some external rows and
    # rejects others on this seed, so both sources and the cap are exercised
    tr = trainer(small_model_dir, tmp_path, "erils", {"external_model": str(other_model_dir), "external_cap": 6,
                                                      "external_max_new_tokens": 6}, "trainer_utils:parity_reward")
    batch, _ = tr.collect()
    ext = batch.source_rows("external")
    lengths = batch.response_lengths
    assert bool(ext.any()), "no external row reached the batch: the per-source check would be empty"
    assert bool((lengths[ext] <= 6).all())  # over-length external rollouts never reach the loss
    rejected = batch.extras["erils_rejected"]
    for g in torch.unique(batch.group).tolist():
        rows = batch.group == g
        assert int((rows & ext).sum()) + int(rejected[rows][0]) == 2  # k = G/2 sampled, the rest rejected
        assert int((rows & ~ext).sum()) == 2
    assert set(batch.producers[i] for i in ext.nonzero().squeeze(-1).tolist()) <= {other_model_dir.name}
    _, A, m = tr.round_inputs(tr.prepare(batch))
    # naive reference: (r − mean)/(std + eps) within each (group, source), population std
    r = batch.rewards.double()
    want = torch.zeros(batch.size, dtype=torch.float64)
    for g in torch.unique(batch.group).tolist():
        for side in (ext, ~ext):
            rows = ((batch.group == g) & side).nonzero().squeeze(-1).tolist()
            if not rows:
                continue
            vals = [float(r[i]) for i in rows]
            mu = sum(vals) / len(vals)
            sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / len(vals))
            for i in rows:
                want[i] = (float(r[i]) - mu) / (sd + 1e-6)
    assert float(want.abs().sum()) > 0, "every (group, source) without spread: nothing to normalize"
    torch.testing.assert_close(A.adv.double(), want, rtol=1e-5, atol=1e-6)
    assert m["erils/external_rejected"] == float(sum(int(rejected[batch.group == g][0])
                                                     for g in torch.unique(batch.group).tolist()))
    assert m["erils/external_rejected"] > 0


# ----------------------------------------------------------------------------- checkpoints


def test_provenance_survives_checkpoint_and_resume(small_model_dir, tmp_path):
    # with staleness 1 the queue holds a mixed batch when the checkpoint is written
    sec = dict(rollout={**ROLLOUT, "staleness": 1}, train={"steps": 3})
    par = "trainer_utils:parity_reward"
    a = trainer(small_model_dir, tmp_path / "a", "luffy", None, par, **sec)
    a.train_step()
    queued = a.stale_queue[0]
    assert "demonstration" in queued.sources
    a.save()
    ma = a.train_step()  # the uninterrupted run
    wa = weights(a.model)
    b = trainer(small_model_dir, tmp_path / "a", "luffy", None, par, **sec)
    assert b.restore()
    back = b.stale_queue[0]
    assert back.source == queued.source and back.producer == queued.producer
    assert torch.equal(back.behavior_mask, queued.behavior_mask) and torch.equal(back.tokens, queued.tokens)
    mb = b.train_step()  # the resumed run trains the queued batch like the uninterrupted one
    assert ma["rollout/sequences@source=demonstration"] == mb["rollout/sequences@source=demonstration"] == 3.0
    assert ma["reward/mean@source=native"] == mb["reward/mean@source=native"]
    for k, v in weights(b.model).items():
        torch.testing.assert_close(v, wa[k])
