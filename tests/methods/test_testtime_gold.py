"""Gold answers reach only the evaluator, never the update, for every test-time method.

Each method trains one step twice from the same seed: once with the task's true gold
answers, once with every gold answer replaced by a wrong one. The replies are given
numeric answers (the tiny random model writes no numbers), and for Probe-ERPO the probes
answer correctly for one prompt and wrongly for the other, so every branch trains. The
two updates must be bit-identical (and not trivially zero)."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch

from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config

METHODS = ("ttpo", "probe_erpo", "tasco")
_Q = re.compile(r"What is (\d+) ([+\-×*]) (\d+)\?")


def _solve(text: str) -> int:
    a, op, b = _Q.findall(text)[-1]
    a, b = int(a), int(b)
    return a + b if op == "+" else a - b if op == "-" else a * b


def _patch(tr: Trainer, wrong_gold: bool) -> None:
    tok = tr.tokenizer
    if wrong_gold:
        stream = tr.task.next_train
        tr.task.next_train = lambda n: [dataclasses.replace(e, answer="-987") for e in stream(n)]

    def decode(batch):
        # each group: three replies with the true result, one with result + 1 (a dissent)
        out = []
        for i in range(batch.size):
            prompt = tok.decode(batch.tokens[i, :batch.prompt_width][batch.attention_mask[i, :batch.prompt_width]])
            y = _solve(prompt)
            out.append(str(y + 1) if i % 4 == 3 else str(y))
        return out

    def greedy(prompts, max_new_tokens):
        # probes: the first prompt's two probes answer right, the second prompt's wrong
        return [tok(str(_solve(tok.decode(p)) + (0 if j < 2 else 5)), add_special_tokens=False)["input_ids"]
                for j, p in enumerate(prompts)]

    tr.rollout.decode = decode
    tr.rollout.greedy = greedy


def _step(name, small_model_dir, run_dir: Path, wrong_gold: bool):
    cfg = tiny_config(small_model_dir, run_dir, method=name, method_params={}, task={"reward": "exact_numeric"},
                      rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4})
    tr = Trainer(cfg)
    _patch(tr, wrong_gold)
    start = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    m = tr.train_step()
    return tr, start, m


@pytest.mark.parametrize("name", METHODS)
def test_wrong_gold_answers_leave_the_update_bit_identical(name, small_model_dir, tmp_path):
    a, start, ma = _step(name, small_model_dir, tmp_path / "true", wrong_gold=False)
    b, _, mb = _step(name, small_model_dir, tmp_path / "wrong", wrong_gold=True)
    assert a.policy_version == b.policy_version == 1
    wa, wb = a.model.state_dict(), b.model.state_dict()
    assert any(not torch.equal(wa[k], start[k]) for k in wa), "the update moved nothing"
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    for key in ("reward/mean", "loss/policy", "grad_norm"):
        assert ma[key] == mb[key], key
    if name == "ttpo":
        assert ma["ttpo/dissent_rows"] == 2.0 and ma["ttpo/rl_tokens"] > 0 and ma["loss/self_distill"] != 0.0
    if name == "probe_erpo":
        assert ma["adv/reinforced"] == 1.0 and ma["adv/suppressed"] == 2.0 and ma["adv/low_groups"] == 1.0


class _Unreadable(str):
    """A gold answer that raises on any use (comparison, hashing, conversion, parsing)."""

    def _read(self, *a, **k):
        raise AssertionError("the gold answer was read")

    __str__ = __eq__ = __ne__ = __hash__ = __format__ = __len__ = __iter__ = __getitem__ = __contains__ = _read
    __float__ = __int__ = strip = split = lower = replace = encode = _read


def _unreadable_gold(tr: Trainer) -> None:
    stream = tr.task.next_train
    tr.task.next_train = lambda n: [dataclasses.replace(e, answer=_Unreadable("7")) for e in stream(n)]


@pytest.mark.parametrize("name", METHODS)
def test_no_test_time_stage_reads_gold(name, small_model_dir, tmp_path):
    # a training step with gold answers that raise on any use: nothing of the step reads
    # them (sources, rewards, filters, advantages, the loss), and it trains
    cfg = tiny_config(small_model_dir, tmp_path / name, method=name, method_params={}, task={"reward": "exact_numeric"},
                      rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4})
    tr = Trainer(cfg)
    _patch(tr, wrong_gold=False)
    _unreadable_gold(tr)
    tr.train_step()
    assert tr.policy_version == 1


def test_an_unreadable_gold_answer_is_noticed_where_gold_is_read(small_model_dir, tmp_path):
    # the control: GRPO's verifier reads the gold answer, and the step stops on it
    cfg = tiny_config(small_model_dir, tmp_path / "grpo", method="grpo", method_params={},
                      task={"reward": "exact_numeric"}, rollout={"prompts_per_step": 2, "group_size": 4,
                                                                   "max_new_tokens": 4})
    tr = Trainer(cfg)
    _unreadable_gold(tr)
    with pytest.raises(Exception, match="the gold answer was read"):
        tr.train_step()


@pytest.mark.parametrize("name", ["ttpo", "probe_erpo"])
def test_update_with_real_majorities_does_not_depend_on_the_micro_batch_size(name, small_model_dir, tmp_path):
    # the generic invariance test sees no parseable answer from the random model (every TTPO
    # group is ineligible); here the replies carry majorities and dissents, so both terms train
    from test_same_update import _directions, _record_grads

    cfg = tiny_config(small_model_dir, tmp_path / name, method=name, method_params={}, task={"reward": "exact_numeric"},
                      rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 5},
                      train={"dtype": "fp64", "grad_clip": 0.0})
    tr = Trainer(cfg)
    _patch(tr, wrong_gold=False)
    batch, _ = tr.collect()
    batch, A, _ = tr.round_inputs(tr.prepare(batch))
    start = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    dirs = _directions(tr.model)
    grads: list = []
    _record_grads(tr.optimizer, tr.model, dirs, grads)
    for mbs in (1, batch.size):
        tr.model.load_state_dict(start)
        tr.worker.micro_batch_size = mbs
        tr.worker.optimizer_step(tr.method, batch, A.adv, old_from_same_forward=not tr.needs_old_pass())
    one, whole = grads
    assert whole["norm"] > 0
    assert math.isclose(one["norm"], whole["norm"], rel_tol=1e-9)
    for x, y in zip(one["proj"], whole["proj"]):
        assert math.isclose(x, y, rel_tol=1e-8, abs_tol=1e-12 * whole["norm"])


def _votes(tr: Trainer) -> None:
    """Replies with real votes for TTRL (the random model writes no numbers). In each
    sampled batch, in order of appearance, group 0 reads (5, 5, 5, 6): a majority of
    three; group 1 (5, 5, 6, 7): a plurality of two; group 2 (5, 5, 6, 6): a tie, so no
    label, and the filter drops it. The trainer then samples one more prompt to refill the
    step (its group 0 of that call: a majority of three). Rewards, 1 for agreeing with the
    group's label: (1, 1, 1, 0), (1, 1, 0, 0), (1, 1, 1, 0)."""
    replies = ((5, 5, 5, 6), (5, 5, 6, 7), (5, 5, 6, 6))

    def decode(batch):
        order: dict[int, int] = {}
        seen: dict[int, int] = {}
        out = []
        for g in batch.group.tolist():
            k = order.setdefault(g, len(order))
            out.append(str(replies[k % 3][seen.get(g, 0)]))
            seen[g] = seen.get(g, 0) + 1
        return out

    tr.rollout.decode = decode


def _ttrl_step(small_model_dir, run_dir: Path, micro_batch_size: int) -> tuple[dict, dict, dict]:
    """One trainer step of TTRL (fp64, one optimizer step on the whole batch): (metrics,
    the gradient the optimizer saw, the weight update)."""
    cfg = tiny_config(small_model_dir, run_dir, method="ttrl", method_params={},
                      rollout={"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 5},
                      train={"dtype": "fp64", "grad_clip": 0.0, "steps": 1, "micro_batch_size": micro_batch_size})
    tr = Trainer(cfg)
    _votes(tr)
    start = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    grads: dict = {}
    step = tr.optimizer.step

    def recording_step(*a, **kw):
        assert not grads, "one optimizer step expected"
        grads.update({n: p.grad.detach().clone() for n, p in tr.model.named_parameters() if p.grad is not None})
        return step(*a, **kw)

    tr.optimizer.step = recording_step
    m = tr.train_step()
    return m, grads, {k: v - start[k] for k, v in tr.model.state_dict().items()}


def test_ttrl_update_with_real_majorities_does_not_depend_on_the_micro_batch_size(small_model_dir, tmp_path):
    # the generic invariance test skips TTRL (the random model has no majority). Here the
    # votes are real (see `_votes`): the eligibility filter drops a tied group and the step
    # is refilled, GRPO's advantage uses whole groups, seq_mean_token_mean normalizes per
    # sequence over the whole optimizer step; the 12 trained rows go through in
    # micro-batches of 1 and 2 rows (groups of 4 split across them) and all at once.
    runs = {mbs: _ttrl_step(small_model_dir, tmp_path / f"mbs{mbs}", mbs) for mbs in (1, 2, 12)}
    m, grads, delta = runs[12]
    assert m["filter/filtered_fraction"] == 0.25 and m["filter/refill_rounds"] == 1  # the tie, then a refill
    assert m["rollout/sequences"] == 12 and m["optimizer_steps"] == 1
    # fp32 rewards (8 agreeing of 12): the fp32 mean is the rounded 8/12, exactly
    assert m["reward/mean"] == float(torch.tensor(8 / 12, dtype=torch.float32))
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    assert norm > 1e-3 and max(float(d.abs().max()) for d in delta.values()) > 1e-4  # it trains
    for mbs in (1, 2):
        m_k, grads_k, delta_k = runs[mbs]
        assert m_k["rollout/sequences"] == 12 and m_k["reward/mean"] == m["reward/mean"]
        assert set(grads_k) == set(grads)
        for n in grads:
            # fp64: the same per-row terms summed in other groupings differ by fp64 rounding
            # only (measured: <= 4e-17 of the gradient's norm); 1e-10 of the norm is far above
            # that and far below a real difference (each micro-batch normalized by its own
            # token count instead of the step's changes the gradient by O(1))
            torch.testing.assert_close(grads_k[n], grads[n], rtol=1e-9, atol=1e-10 * norm, msg=n)
        for k in delta:
            # one AdamW step from equal gradients: lr * m / (sqrt(v) + eps) ~ 1e-3 per weight,
            # the gradients' relative error carried through (fp64)
            torch.testing.assert_close(delta_k[k], delta[k], rtol=1e-9, atol=1e-12, msg=k)
        for key in ("grad_norm", "policy/entropy", "tokens"):
            assert math.isclose(m_k[key], m[key], rel_tol=1e-9), (mbs, key, m_k[key], m[key])
        # the loss is a mean of advantages that cancel to ~1e-8: absolute, at fp64 rounding of
        # the O(1) terms it sums
        assert abs(m_k["loss/policy"] - m["loss/policy"]) <= 1e-13, (mbs, m_k["loss/policy"], m["loss/policy"])
