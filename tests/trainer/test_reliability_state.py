"""Checkpoint state without pickle: exact round trips, bit-identical resume, and files that
cannot run code (a real payload that would write a marker file)."""

import collections
import json
import math
import random

import numpy as np
import pytest
import torch

from policylab.trainer import safestate
from policylab.batch import RolloutBatch, SamplingSettings
from policylab.trainer.checkpoint import latest_checkpoint, load_checkpoint
from policylab.errors import CheckpointError
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config


def _same(a, b):
    """Exact equality, types included (tensors: dtype, shape and bits)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bool else a, b.view(torch.uint8) if b.dtype == torch.bool else b) \
            or (a.is_floating_point() and torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(0), b.nan_to_num(0)))
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    elif isinstance(a, RolloutBatch | SamplingSettings):
        import dataclasses

        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name))
    else:
        assert a == b


def _roundtrip(obj, tmp_path):
    safestate.save_state(obj, tmp_path)
    return safestate.load_state(tmp_path)


def test_every_kind_of_value_round_trips_exactly(tmp_path):
    obj = {
        "ints": [0, -1, 2**70, True, False, None],
        "floats": (0.1, -0.0, 1e-310, float("inf"), float("-inf"), float("nan"), 1.0),
        "int_keys": {0: "a", 3: {"x": 1}, (1, 2): "tuple key", None: 4},
        "str_keys_that_look_like_tags": {"$tensor": "not a tensor", "$dict": [1]},
        "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
        "sets": ({1, 2, 3}, frozenset({"x"})),
        "tensors": [torch.arange(5), torch.randn(2, 3, dtype=torch.float64), torch.tensor(3.5),
                    torch.zeros(0, 4), torch.tensor([True, False]), torch.randn(3).to(torch.bfloat16),
                    torch.randn(4, 4)[:, 1], torch.ones(2, requires_grad=True)],
        "numpy": (np.arange(6, dtype=np.uint32).reshape(2, 3), np.float64(2.5), np.int64(-7)),
        "dtype": torch.float32,
        "python_rng": random.Random(5).getstate(),
        "numpy_rng": np.random.RandomState(3).get_state(),
        "torch_rng": torch.Generator().manual_seed(9).get_state(),
        "sampling": SamplingSettings(temperature=0.7, top_p=0.9, top_k=5),
        "text": "ünïcode \udcff and \n newlines",
    }
    back = _roundtrip(obj, tmp_path)
    _same(obj, back)


def test_shared_tensor_objects_stay_shared_and_views_are_stored_alone(tmp_path):
    t = torch.arange(10.0)
    obj = {"a": t, "b": t, "view": t[2:5], "other_view": t[5:]}
    back = _roundtrip(obj, tmp_path)
    assert back["a"] is back["b"]
    assert torch.equal(back["view"], t[2:5]) and torch.equal(back["other_view"], t[5:])


def test_values_it_cannot_represent_are_refused_on_save(tmp_path):
    class Custom:
        pass

    with pytest.raises(TypeError, match=r"state\['x'\]\[1\].*Custom"):
        safestate.encode({"x": [1, Custom()]})


def test_a_dataclass_name_outside_the_allow_list_is_refused(tmp_path):
    marker = tmp_path / "marker"
    doc = {"format": safestate.FORMAT,
           "root": {"$dataclass": "os.system", "fields": {"command": f"touch {marker}"}}}
    (tmp_path / safestate.JSON_NAME).write_text(json.dumps(doc))
    from safetensors.torch import save_file

    save_file({}, str(tmp_path / safestate.TENSORS_NAME))
    with pytest.raises(safestate.StateFormatError, match="not an allowed type"):
        safestate.load_state(tmp_path)
    assert not marker.exists()


def test_unknown_field_of_an_allowed_dataclass_is_refused(tmp_path):
    doc, tensors = safestate.encode(SamplingSettings())
    doc["root"]["fields"]["__class__"] = "x"
    with pytest.raises(safestate.StateFormatError, match="does not have"):
        safestate.decode(doc, tensors)


def test_trainer_state_with_stale_queue_and_controllers_round_trips(small_model_dir, tmp_path):
    cfg = tiny_config(small_model_dir, tmp_path / "r", method="online_icepop", method_params={},
                      rollout={"staleness": 0}, train={"steps": 3})
    tr = Trainer(cfg)
    tr.train_step()
    tr.train_step()
    st = tr.state()
    assert st["controllers"] and any(st["controllers"].values())
    (tmp_path / "s").mkdir()
    _same(st, _roundtrip(st, tmp_path / "s"))

    cfg = tiny_config(small_model_dir, tmp_path / "q", method="missing_old_logits", method_params={},
                      rollout={"staleness": 2}, train={"steps": 4})
    tr = Trainer(cfg)
    tr.train_step()
    tr.train_step()
    st = tr.state()
    assert len(st["stale_queue"]) == 2 and isinstance(st["stale_queue"][0], RolloutBatch)
    (tmp_path / "t").mkdir()
    _same(st, _roundtrip(st, tmp_path / "t"))


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("sections, steps, at", [
    ({"method": "missing_old_logits", "method_params": {}, "rollout": {"staleness": 2}}, 5, 3),
    ({"train": {"epochs": 2, "minibatches": 2}}, 4, 2),
])
def test_resume_with_stale_queue_and_optimizer_state_equals_the_uninterrupted_run(sections, steps, at, tiny_model_dir,
                                                                                   tmp_path):
    full = Trainer(tiny_config(tiny_model_dir, tmp_path / "a", train={"steps": steps, **sections.get("train", {})},
                               **{k: v for k, v in sections.items() if k != "train"}))
    rows_full = [full.train_step() for _ in range(steps)]

    def make(run):
        return Trainer(tiny_config(tiny_model_dir, run, train={"steps": steps, **sections.get("train", {})},
                                   **{k: v for k, v in sections.items() if k != "train"}))

    first = make(tmp_path / "b")
    for _ in range(at):
        first.train_step()
    assert first.optimizer.state, "the optimizer has moments to carry"
    if first.cfg.rollout.staleness:
        assert len(first.stale_queue) == 2
    first.save()
    del first
    second = make(tmp_path / "b")
    assert second.restore() and second.step == at
    rows_resumed = [second.train_step() for _ in range(steps - at)]
    for k, v in _params(full.model).items():
        assert torch.equal(_params(second.model)[k], v), k
    for a, b in zip(rows_full[at:], rows_resumed):
        for key in ("reward/mean", "response/length_mean", "loss/policy", "grad_norm"):
            if key in a:
                assert a[key] == b[key], key


def test_checkpoint_files_are_json_and_safetensors_only(small_model_dir, tmp_path):
    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r"))
    tr.train_step()
    path = tr.save()
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "model.safetensors", "state.json",
                                                      "state.safetensors"]
    doc = json.loads((path / "state.json").read_text())
    assert doc["format"] == safestate.FORMAT


def _legacy_run(small_model_dir, tmp_path, payload_marker=None):
    """A run whose checkpoint is in the old pickle format; with a marker, its state.pt
    carries a payload that writes the marker file when unpickled."""
    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r"))
    tr.train_step()
    path = tr.save()
    state = tr.state()
    if payload_marker is not None:
        class Payload:
            def __reduce__(self):
                return (exec, (f"open({str(payload_marker)!r}, 'w').write('pwned')",))

        state["evil"] = Payload()
    for f in ("state.json", "state.safetensors"):
        (path / f).unlink()
    torch.save(state, path / "state.pt")
    return tr, path


def test_old_pickle_checkpoint_is_refused_with_the_conversion_command(small_model_dir, tmp_path):
    marker = tmp_path / "marker"
    tr, path = _legacy_run(small_model_dir, tmp_path, payload_marker=marker)
    with pytest.raises(CheckpointError, match="convert-checkpoint .* --i-trust-this-file"):
        tr.restore()
    with pytest.raises(CheckpointError, match="old pickle|convert-checkpoint"):
        load_checkpoint(path, tr.models())
    assert not marker.exists()


def test_latest_outside_the_run_is_never_followed(small_model_dir, tmp_path):
    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r"))
    tr.train_step()
    tr.save()
    latest = tr.run_dir / "checkpoints" / "LATEST"
    for bad in [str(tmp_path / "elsewhere"), "../../elsewhere", "step_000001/..", "step_1/../../x"]:
        latest.write_text(bad + "\n")
        with pytest.raises(CheckpointError, match="not a checkpoint of this run"):
            latest_checkpoint(tr.run_dir)
    # a step directory that is a link out of the run
    outside = tmp_path / "outside"
    outside.mkdir()
    (tr.run_dir / "checkpoints" / "step_000009").symlink_to(outside, target_is_directory=True)
    latest.write_text("step_000009\n")
    with pytest.raises(CheckpointError, match="link out of"):
        latest_checkpoint(tr.run_dir)
    # checkpoints/ itself a link to another run's checkpoints: neither read nor written
    other = tmp_path / "other"
    (tr.run_dir / "checkpoints").rename(other)
    (tr.run_dir / "checkpoints").symlink_to(other, target_is_directory=True)
    with pytest.raises(CheckpointError, match="is a link"):
        latest_checkpoint(tr.run_dir)
    from policylab.trainer.run_dir import preflight

    with pytest.raises(CheckpointError, match="is a link"):
        preflight(tr.run_dir)


def test_non_finite_weights_are_never_written(small_model_dir, tmp_path):
    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r"))
    tr.train_step()
    good = tr.save()
    with torch.no_grad():
        next(tr.model.parameters()).view(-1)[0] = float("nan")
    tr.step += 1
    from policylab.errors import NonFiniteError

    with pytest.raises(NonFiniteError, match="refusing to write checkpoint step_000002.*NaN or inf.*step_000001 is intact"):
        tr.save()
    assert latest_checkpoint(tr.run_dir) == good
    assert sorted(p.name for p in (tr.run_dir / "checkpoints").iterdir()) == ["LATEST", "step_000001"]
