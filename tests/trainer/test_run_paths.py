"""The run directory's path guard and lock (trainer.run_paths), and the checkpoint
manifest (trainer.checkpoint), piece by piece."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch

from policylab.errors import CheckpointError, RunBusyError, RunPathError
from policylab.trainer import run_paths as rp


def test_guard_refuses_links_and_special_files(tmp_path):
    run = tmp_path / "run"
    (run / "plots").mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("user")
    assert rp.guard(run, "metrics.jsonl") == run / "metrics.jsonl"  # missing: fine
    (run / "metrics.jsonl").symlink_to(outside)
    with pytest.raises(RunPathError, match=rf"metrics.jsonl is a symbolic link \(to {outside}\)"):
        rp.guard(run, "metrics.jsonl")
    os.mkfifo(run / "fifo")
    with pytest.raises(RunPathError, match="is a FIFO"):
        rp.guard(run, "fifo")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(run / "sock"))
    with pytest.raises(RunPathError, match="is a socket"):
        rp.guard(run, "sock")
    s.close()
    with pytest.raises(RunPathError, match="is a directory, not a file"):
        rp.guard(run, "plots")
    (run / "linked").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(RunPathError, match="linked is a symbolic link"):
        rp.guard(run, "linked", "x.png")  # an intermediate link is refused too
    with pytest.raises(RunPathError, match="does not name a path inside"):
        rp.guard(run, "../outside.txt")
    (tmp_path / "link-to-run").symlink_to(run)
    rp.guard(tmp_path / "link-to-run", "plots", want="dir")  # the run directory itself may be a link (the user's choice)


def test_open_refuses_what_appeared_after_the_check(tmp_path):
    p = tmp_path / "metrics.jsonl"
    target = tmp_path / "user.txt"
    target.write_text("user")
    rp.guard(tmp_path, "metrics.jsonl")
    p.symlink_to(target)  # swapped in between the check and the open
    with pytest.raises(RunPathError, match="symbolic link"):
        rp.open_file(p, "a")
    p.unlink()
    os.mkfifo(p)
    with pytest.raises(RunPathError, match="FIFO"):
        rp.open_file(p, "a")  # no reader: refused at once, not waited on
    with pytest.raises(RunPathError, match="FIFO"):
        rp.read_bytes(p)
    assert target.read_text() == "user"


def test_replace_file_replaces_a_link_and_never_writes_through_it(tmp_path):
    target = tmp_path / "user.txt"
    target.write_text("user")
    p = tmp_path / "report.json"
    p.symlink_to(target)
    rp.replace_file(p, "{}")
    assert not p.is_symlink() and p.read_text() == "{}" and target.read_text() == "user"
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert p.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777  # as open() makes it, not mkstemp's 0600
    plain.unlink()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["report.json", "user.txt"]  # no temporary left


def test_check_run_tree(tmp_path):
    run = tmp_path / "run"
    (run / "plots").mkdir(parents=True)
    rp.check_run_tree(run)
    (run / "plots" / "a.png").symlink_to(tmp_path)
    with pytest.raises(RunPathError, match="a.png is a symbolic link"):
        rp.check_run_tree(run)
    (run / "plots" / "a.png").unlink()
    os.mkfifo(run / "plots" / "b.png")
    with pytest.raises(RunPathError, match="b.png is a FIFO"):
        rp.check_run_tree(run)


def test_the_lock_is_exclusive_released_and_reports_a_stale_holder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    first = rp.RunLock(run).acquire()
    rec = json.loads((run / rp.LOCK_NAME).read_text())
    assert rec["pid"] == os.getpid() and first.stale is None
    with pytest.raises(RunBusyError, match=rf"in use by another policylab process \(pid {os.getpid()} on "):
        rp.RunLock(run).acquire()
    first.release()
    assert not (run / rp.LOCK_NAME).exists()
    (run / rp.LOCK_NAME).write_text(json.dumps({"pid": 4242, "host": "h", "started": 0}))  # a killed holder's file
    second = rp.RunLock(run).acquire()
    assert second.stale["pid"] == 4242 and "pid 4242 on h" in rp.stale_note(run, second.stale)
    second.release()
    (run / rp.LOCK_NAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunPathError, match="symbolic link"):
        rp.RunLock(run).acquire()
    assert not (tmp_path / "elsewhere").exists()


# ----------------------------------------------------------------------------- manifest
def _save(tmp_path, config=None):
    from policylab.trainer.checkpoint import save_checkpoint

    model = torch.nn.Linear(3, 2)
    state = {"step": 4, "policy_version": 4, "prompt_counter": 8, "optimizer": {}, "scheduler": {}, "rng": {},
             "task": {}}
    return save_checkpoint(tmp_path / "run", 4, {"model": model}, state, config=config), model


def test_the_manifest_records_files_tensors_and_config(tmp_path):
    from policylab.trainer.checkpoint import config_digest, verify_manifest

    path, model = _save(tmp_path, {"method": "grpo", "seed": 1})
    doc = json.loads((path / "manifest.json").read_text())
    assert doc["step"] == 4 and doc["config_sha256"] == config_digest({"method": "grpo", "seed": 1})
    assert doc["files"]["model.safetensors"]["tensors"] == {"weight": ["F32", [2, 3]], "bias": ["F32", [2]]}
    import hashlib

    assert doc["files"]["state.json"]["sha256"] == hashlib.sha256((path / "state.json").read_bytes()).hexdigest()
    verify_manifest(path, {"method": "grpo", "seed": 1})
    with pytest.raises(CheckpointError, match=r"config.yaml has seed=2, but checkpoint step_000004 was saved by a "
                                              r"run with seed=1"):
        verify_manifest(path, {"method": "grpo", "seed": 2})
    with pytest.raises(CheckpointError, match=r"has method=None, .* with method='grpo'"):
        verify_manifest(path, {"seed": 1})
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(2, 4), "bias": torch.zeros(2)}, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"tensor `weight` has shape \[2, 4\], but it was saved with \[2, 3\]"):
        verify_manifest(path)
    save_file({**{k: v.detach() for k, v in model.state_dict().items()}, "extra": torch.zeros(1)},
              str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="tensor `extra` was not in the checkpoint"):
        verify_manifest(path)


def test_identity_config_leaves_out_what_a_resume_may_change():
    from policylab.trainer.config import load_config
    from policylab.trainer.resume import identity_config

    a = identity_config(load_config(None, ["train.steps=3", "run_dir=runs/a", "eval.n=5"]))
    b = identity_config(load_config(None, ["train.steps=9", "run_dir=runs/b", "eval.n=7"]))
    assert a == b and "method" in a and "model" in a and "train.lr" in a
    assert identity_config(load_config(None, ["train.lr=1e-4"])) != a
