"""bf16 training: `accumulate` runs the prompt prefix and every micro-batch in one autocast
region, so they share autocast's bf16 casts of the weights (one copy per step instead of
one per live forward). The gradients are bit-identical to the previous layout, where the
prefix and each micro-batch's forward had a region of their own (the reference below)."""

import pytest
import torch

from policylab.backends import update
from policylab.backends.update import StepHooks
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config


def _per_forward_regions(monkeypatch):
    """The reference: `_accumulate` outside any region, the prefix in a region of its own
    (each micro-batch's `_forward` opens its own)."""
    orig_prefix = update.shared_prefix_or_none

    def accumulate(model, method, plan, settings, *, old_from_same_forward):
        def prefix_in_own_region(*a, **k):
            with update.autocast(settings.dtype, settings.device):
                return orig_prefix(*a, **k)

        with monkeypatch.context() as mp:
            mp.setattr(update, "shared_prefix_or_none", prefix_in_own_region)
            assert not torch.is_autocast_enabled("cpu")
            return update._accumulate(model, method, plan, settings, old_from_same_forward=old_from_same_forward)

    return accumulate


def _grads(tiny_model_dir, run_dir, *, prefix: bool, reference, monkeypatch):
    tr = Trainer(tiny_config(tiny_model_dir, run_dir, rollout={"group_size": 4, "max_new_tokens": 5},
                             train={"dtype": "bf16", "micro_batch_size": 3, "shared_prefix": prefix,
                                    "grad_clip": 0.0}))
    batch, _ = tr.collect()
    assert batch is not None
    batch, A, _ = tr.round_inputs(tr.prepare(batch))
    grads = {}

    def keep(model):
        grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        return {}

    with monkeypatch.context() as mp:
        if reference is not None:
            mp.setattr(update, "accumulate", reference)
        tr.worker.optimizer_step(tr.method, batch, A.adv.detach(), old_from_same_forward=True,
                                 hooks=StepHooks(grad=keep))
    return grads


@pytest.mark.parametrize("prefix", [True, False], ids=["shared-prefix", "full-rows"])
def test_one_region_gives_the_same_gradients(tiny_model_dir, tmp_path, monkeypatch, prefix):
    new = _grads(tiny_model_dir, tmp_path / "a", prefix=prefix, reference=None, monkeypatch=monkeypatch)
    ref = _grads(tiny_model_dir, tmp_path / "b", prefix=prefix, reference=_per_forward_regions(monkeypatch),
                 monkeypatch=monkeypatch)
    assert new.keys() == ref.keys() and len(new) > 0
    assert sum(float(g.abs().sum()) for g in new.values()) > 0  # a batch with signal
    for name in new:
        assert torch.equal(new[name], ref[name]), name


def test_the_region_ends_with_the_accumulation(tiny_model_dir, tmp_path, monkeypatch):
    """The optimizer step runs outside autocast (its cast cache is gone with the region)."""
    seen = []
    orig = update.apply_step

    def spy(*a, **k):
        seen.append(torch.is_autocast_enabled("cpu"))
        return orig(*a, **k)

    monkeypatch.setattr(update, "apply_step", spy)
    _grads(tiny_model_dir, tmp_path / "c", prefix=True, reference=None, monkeypatch=monkeypatch)
    assert seen == [False]
