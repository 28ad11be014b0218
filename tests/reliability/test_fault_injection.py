"""The second reliability probe, case by case, through the command line (in process where
the case allows it, a subprocess where a signal or a hang is the point): each case exits
with code 2 (or the documented handling), one line `policylab: error: ...` naming the
problem, no traceback; nothing outside the run directory changes and nothing of the
user's is deleted.

The classes behind the cases (docs/reliability.md, "What happens when ..."):
    values    every config value against its range before any work (trainer.config.FIELD_RULES,
              the pipelines' RULES)
    paths     everything a run directory holds goes through the path guard (trainer.run_paths)
    lock      one run per directory (trainer.run_paths.RunLock)
    manifest  a checkpoint is resumed only as it was saved (trainer.checkpoint.verify_manifest)
    deletion  a pipeline deletes only what it wrote (pipelines.common.prepare_run_dir)
    signals   SIGTERM and a full disk say what is intact
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import struct
import time
from pathlib import Path

import pytest
import torch
import yaml

from cli_utils import assert_one_clear_error, cli, cli_inprocess, fingerprint, popen, write_config


def run_cli(capsys, *args) -> tuple[int, str]:
    """policylab ARGS in this process: (exit code, stderr)."""
    from policylab.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err


def one_line(rc: int, err: str, *needles, code: int = 2) -> str:
    assert rc == code, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("policylab: error:")]
    assert len(lines) == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


CKPT_LOG = "{tensorboard: true, progress: false, plot_every: 1, checkpoint_every: 1}"


@pytest.fixture(scope="module")
def trained(small_model_dir, tmp_path_factory):
    """A finished 2-step run (checkpoints step_1 and step_2, plots, TensorBoard); copy it."""
    from policylab.cli import main

    root = tmp_path_factory.mktemp("trained2")
    cfg = write_config(root / "c.yaml", small_model_dir, root / "run", log=CKPT_LOG)
    assert main(["train", str(cfg)]) == 0
    return root / "run"


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst, symlinks=True)
    return dst


def _user_files(tmp_path: Path) -> Path:
    """The user's own files next to the run: a notes file and a folder of pictures."""
    user = tmp_path / "user"
    (user / "pictures").mkdir(parents=True)
    (user / "notes.txt").write_text("my notes\nlast line")
    (user / "pictures" / "reward.png").write_bytes(b"my picture")
    return user


# ------------------------------------------------------------------------------ values
@pytest.mark.parametrize("override, needles", [
    ("seed=-1", ["seed must be in [0, 4294967295]", "got -1"]),
    (f"seed={2**70}", ["seed must be in [0, 4294967295]", str(2**70)]),
    ("threads=-3", ["threads must be in [0, 4096]", "got -3"]),
    ("train.betas=[2,3]", ["train.betas", "element 0 must be in [0, 1)", "got 2"]),
    ("train.weight_decay=-1", ["train.weight_decay must be >= 0", "got -1.0"]),
    ("train.device=cuda", ["train.device 'cuda'", "no usable cuda device"]),
    ("train.device=meta", ["train.device 'meta'", "without data"]),
    ("eval.batch_size=0", ["eval.batch_size must be >= 1", "got 0"]),
    ("eval.temperature=0", ["eval.temperature must be > 0", "got 0.0"]),
    ("train.lora_rank=-1", ["train.lora_rank must be >= 0", "got -1"]),
    ("train.warmup_steps=-5", ["train.warmup_steps must be >= 0", "got -5"]),
    ("run_dir=/", ["run_dir '/' is the filesystem root"]),
    ("run_dir=" + "r" * 300, ["run_dir is too long", "300 bytes", "limit is 255"]),
    ("train.lr=.inf", ["`train.lr` is inf", "must be finite"]),
])
def test_a_bad_value_is_refused_before_anything_is_written(small_model_dir, tmp_path, capsys, monkeypatch,
                                                            override, needles):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    cfg = write_config(work / "c.yaml", small_model_dir, tmp_path / "run")
    if "device=cuda" in override and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    before = fingerprint(work)
    one_line(*run_cli(capsys, "train", cfg, "--set", override), *needles)
    assert not (tmp_path / "run").exists()
    assert fingerprint(work) == before and sorted(p.name for p in work.iterdir()) == ["c.yaml"]


def test_a_run_dir_with_a_tilde_is_expanded_not_created_literally(small_model_dir, tmp_path, capsys, monkeypatch):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    cfg = write_config(work / "c.yaml", small_model_dir, "~/runs/x", steps=1)
    rc, err = run_cli(capsys, "train", cfg)
    assert rc == 0, err[-2000:]
    assert (home / "runs" / "x" / "report.json").is_file()
    assert sorted(p.name for p in work.iterdir()) == ["c.yaml"]  # no literal ./~
    assert yaml.safe_load((home / "runs" / "x" / "config.yaml").read_text())["run_dir"] == str(home / "runs" / "x")


def test_compare_with_a_negative_seed_is_refused_at_plan(small_model_dir, tmp_path, capsys):
    c = tmp_path / "cmp.yaml"
    c.write_text(yaml.safe_dump({"out_dir": str(tmp_path / "out"), "methods": ["grpo"], "seeds": [-1],
                                 "budget": {"steps": 1},
                                 "run": {"model": str(small_model_dir), "rollout": {"prompts_per_step": 2,
                                                                                   "group_size": 2}}}))
    for extra in (["--plan"], []):
        one_line(*run_cli(capsys, "compare", c, *extra), "seed must be in [0, 4294967295]", "got -1")
    assert not (tmp_path / "out").exists()


def test_compare_report_dir_that_is_a_file_is_one_line(small_model_dir, tmp_path, capsys):
    mine = tmp_path / "existing.txt"
    mine.write_text("my file")
    c = tmp_path / "cmp.yaml"
    c.write_text(yaml.safe_dump({"out_dir": str(tmp_path / "out"), "report_dir": str(mine), "methods": ["grpo"],
                                 "seeds": [0], "budget": {"steps": 1},
                                 "run": {"model": str(small_model_dir), "eval": {"n": 2, "max_new_tokens": 4},
                                         "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4}}}))
    one_line(*run_cli(capsys, "compare", c, "--report-only"), str(mine))
    assert mine.read_text() == "my file"


# ------------------------------------------------------------------------------- paths
@pytest.mark.parametrize("entry", ["metrics.jsonl", "plots", "tensorboard", "report.json", "config.yaml"])
def test_a_link_in_a_received_run_is_refused_on_resume_and_eval(trained, tmp_path, capsys, entry):
    run = _copy(trained, tmp_path)
    user = _user_files(tmp_path)
    target = user / ("pictures" if entry in ("plots", "tensorboard") else "notes.txt")
    p = run / entry
    shutil.rmtree(p) if p.is_dir() else p.unlink()
    p.symlink_to(target)
    before = fingerprint(user)
    for cmd in (["resume", run, "--allow-imports", "--set", "train.steps=3"], ["eval", run, "--allow-imports", "--n", "2"]):
        one_line(*run_cli(capsys, *cmd), str(p), "is a symbolic link", str(target))
    assert fingerprint(user) == before
    assert not (run / "metrics.jsonl.partial").exists() and (run / "checkpoints" / "LATEST").read_text() == "step_000002\n"


def test_a_link_inside_plots_is_replaced_not_written_through(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    user = _user_files(tmp_path)
    (run / "plots" / "reward.png").unlink()
    (run / "plots" / "reward.png").symlink_to(user / "pictures" / "reward.png")
    before = fingerprint(user)
    one_line(*run_cli(capsys, "resume", run, "--allow-imports", "--set", "train.steps=3"), "plots/reward.png",
             "is a symbolic link")
    assert fingerprint(user) == before


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_special_file_in_a_run_is_refused_without_hanging(trained, tmp_path, kind):
    run = _copy(trained, tmp_path)
    p = run / "metrics.jsonl"
    p.unlink()
    if kind == "fifo":
        os.mkfifo(p)
    else:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
    try:
        res = cli("resume", run, "--allow-imports", "--set", "train.steps=3", timeout=120)  # hung forever before
    finally:
        if kind == "socket":
            s.close()
    assert_one_clear_error(res, str(p), "a FIFO" if kind == "fifo" else "a socket")


# -------------------------------------------------------------------------------- lock
def test_a_run_directory_in_use_is_refused(trained, tmp_path, capsys):
    from policylab.trainer.run_paths import RunLock

    run = _copy(trained, tmp_path)
    before = fingerprint(run)
    with RunLock(run):  # another process holds it (a flock is per open file: this counts)
        one_line(*run_cli(capsys, "resume", run, "--allow-imports", "--set", "train.steps=3"),
                 f"{run} is in use by another policylab process", f"pid {os.getpid()}", "one run per directory")
        before.pop(str(run / ".policylab.lock"), None)
    assert fingerprint(run) == before


def test_a_stale_lock_is_reported_and_taken_over(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    (run / ".policylab.lock").write_text(json.dumps({"pid": 999999, "host": "elsewhere", "started": 1.0,
                                                     "command": "policylab train c.yaml"}) + "\n")
    rc, err = run_cli(capsys, "resume", run, "--allow-imports", "--set", "train.steps=3")
    assert rc == 0, err[-2000:]
    note = [line for line in err.splitlines() if "left locked" in line]
    assert len(note) == 1 and "pid 999999 on elsewhere" in note[0] and "taken over" in note[0]
    assert not (run / ".policylab.lock").exists()  # released at the end


def test_two_trains_on_one_new_run_directory(small_model_dir, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, run, steps=3)
    procs = [popen("train", cfg) for _ in range(2)]
    codes, errs = [], []
    for p in procs:
        _, err = p.communicate(timeout=300)
        codes.append(p.returncode)
        errs.append(err)
    assert sorted(codes) == [0, 2], errs
    loser = errs[codes.index(2)]
    lines = [line for line in loser.splitlines() if line.startswith("policylab: error:")]
    assert len(lines) == 1 and "Traceback" not in loser
    assert "is in use by another policylab process" in lines[0] or "already holds a run" in lines[0]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "event" not in r] == [1, 2, 3]  # one run's log, not two interleaved
    assert sum(r.get("event") == "start" for r in rows) == 1


# ---------------------------------------------------------------------------- manifest
def _flip_dtype(f: Path, to: str = "I32") -> str:
    """Rewrite the dtype of the first F32 tensor in a safetensors header (same byte size)."""
    raw = bytearray(f.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
    header[name]["dtype"] = to
    new = json.dumps(header, separators=(",", ":")).encode()
    new += b" " * (n - len(new))
    assert len(new) == n
    f.write_bytes(bytes(raw[:8]) + new + bytes(raw[8 + n:]))
    return name


@pytest.mark.parametrize("with_manifest", [True, False])
def test_a_tensor_whose_dtype_was_changed_is_refused(trained, tmp_path, capsys, with_manifest):
    run = _copy(trained, tmp_path)
    ck = run / "checkpoints" / "step_000002"
    name = _flip_dtype(ck / "model.safetensors")
    if not with_manifest:
        (ck / "manifest.json").unlink()
    before = fingerprint(run)
    line = one_line(*run_cli(capsys, "resume", run, "--allow-imports", "--set", "train.steps=3"), f"`{name}`",
                    "step_000001 is intact")
    assert ("it was saved as F32" in line) if with_manifest else ("torch.int32, the model's is torch.float32" in line)
    assert fingerprint(run) == before


@pytest.mark.parametrize("key, value", [("method", "dr_grpo"), ("model", "COPY"), ("rollout.temperature", 0.7)])
def test_a_config_edited_after_the_run_is_refused(trained, small_model_dir, tmp_path, capsys, key, value):
    run = _copy(trained, tmp_path)
    if value == "COPY":  # another model of the same shape
        value = str(tmp_path / "same-shape")
        shutil.copytree(small_model_dir, value)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    node = cfg
    *parents, last = key.split(".")
    for k in parents:
        node = node[k]
    node[last] = value
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    before = fingerprint(run)
    for cmd in (["resume", run, "--allow-imports"], ["eval", run, "--allow-imports", "--n", "2"]):
        one_line(*run_cli(capsys, *cmd), f"config.yaml has {key}={value!r}", "was saved by a run with", key)
    assert fingerprint(run) == before


@pytest.mark.parametrize("edit, needles", [
    ({"step": 100}, ["`step` is 100", "step_000002"]),
    ({"step": -3}, ["`step` is -3", "cannot be negative"]),
    ({"step": "two"}, ["`step` must be int", "'two'"]),
    ({"prompt_counter": None}, ["has no `prompt_counter`"]),
])
def test_a_state_json_with_a_wrong_field_is_refused(trained, tmp_path, capsys, edit, needles):
    run = _copy(trained, tmp_path)
    f = run / "checkpoints" / "step_000002" / "state.json"
    doc = json.loads(f.read_text())
    fields = doc["root"]["$dict"]
    for k, v in edit.items():
        if v is None:
            fields.pop(k)
        else:
            fields[k] = v
    f.write_text(json.dumps(doc))
    before = fingerprint(run)
    one_line(*run_cli(capsys, "resume", run, "--allow-imports", "--set", "train.steps=3"), *needles,
             "step_000001 is intact")
    assert fingerprint(run) == before


# ---------------------------------------------------------------------------- signals
def test_sigterm_during_train_says_what_is_intact(small_model_dir, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, run, steps=200,
                       log="{tensorboard: false, progress: false, plot_every: 0, checkpoint_every: 1}")
    proc = popen("train", cfg)
    latest = run / "checkpoints" / "LATEST"
    deadline = time.time() + 240
    while not (latest.exists() and latest.read_text().strip() >= "step_000002"):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"training ended early: {proc.stderr.read()[-2000:]}")
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "SIGTERM" in line]
    assert len(lines) == 1 and lines[0].startswith("policylab: terminated (SIGTERM) at step "), err[-2000:]
    assert "last checkpoint: step_" in lines[0] and f"`policylab resume {run} --allow-imports`" in lines[0]
    assert not (run / ".policylab.lock").exists()
    # the signal is the subprocess's point; the resume after it runs in process
    res = cli_inprocess("resume", run, "--allow-imports", "--set",
                        "train.steps=" + str(int(latest.read_text()[5:]) + 1))
    assert res.returncode == 0, res.stderr[-2000:]


def test_a_full_disk_while_logging_names_the_file_and_the_intact_checkpoint(small_model_dir, tmp_path, capsys,
                                                                            monkeypatch):
    from policylab.trainer import runlog

    class Full:
        def write(self, _):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    real = runlog.RunLog.log

    def log(self, step, metrics):
        if step == 2:
            self._fh = Full()
        return real(self, step, metrics)

    monkeypatch.setattr(runlog.RunLog, "log", log)
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, run, steps=3,
                       log="{tensorboard: false, progress: false, plot_every: 0, checkpoint_every: 1}")
    one_line(*run_cli(capsys, "train", cfg), "no space left on device", str(run / "metrics.jsonl"),
             "step_000001, is intact", f"policylab resume {run}")
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_000001"


# ---------------------------------------------------------------------- raw tracebacks
def test_a_model_with_a_malicious_pickle_is_refused_and_nothing_runs(small_model_dir, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(small_model_dir, model)
    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('pwned')",))

    (model / "model.safetensors").unlink()
    torch.save({"payload": Payload()}, model / "pytorch_model.bin")
    cfg = write_config(tmp_path / "c.yaml", model, tmp_path / "run")
    one_line(*run_cli(capsys, "train", cfg), "pytorch_model.bin is a pickle that names code", "builtins.exec",
             "nothing in it ran")
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_explain_plot_into_a_folder_is_one_line(tmp_path, capsys):
    folder = tmp_path / "X.svg"
    folder.mkdir()
    one_line(*run_cli(capsys, "explain", "grpo", "--plot", folder), str(folder))


def test_a_jsonl_with_word_answers_is_one_line(small_model_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": "four"}) + "\n" for i in range(8)))
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, tmp_path / "run", steps=1,
                       task=f'{{name: jsonl, path: "{data}"}}')
    rc, err = run_cli(capsys, "train", cfg)
    if rc == 0:
        pytest.skip("the verifier accepts word answers now (validated by the rewards layer)")
    one_line(rc, err, "four")


# ---------------------------------------------------------------------------- deletion
def _rlhf_cfg(model_dir, run_dir, **over) -> dict:
    cfg = {"pipeline": "ppo_rlhf", "run_dir": str(run_dir), "model": str(model_dir), "seed": 1,
           "sft": {"steps": 1, "batch_size": 2, "lr": 1e-3},
           "reward_model": {"steps": 1, "prompts_per_step": 2, "lr": 1e-3, "heldout_prompts": 2},
           "ppo": {"rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
                   "train": {"steps": 1, "lr": 1e-3, "micro_batch_size": 2}},
           "eval": {"prompts": 2, "samples": 1, "max_new_tokens": 4}}
    cfg.update(over)
    return cfg


def _previous_pipeline_run(run: Path) -> None:
    """What a finished ppo_rlhf run left (its marker lists what it wrote)."""
    from policylab.pipelines import common

    common.prepare_run_dir(run, ("sft", "reward_model", "ppo"), overwrite=False, pipeline="ppo_rlhf")
    (run / "sft").mkdir()
    (run / "sft" / "model.safetensors").write_bytes(b"previous weights")
    common.stage_finished(run, "sft")
    (run / "report.md").write_text("# previous report\n")


@pytest.mark.parametrize("case", ["wrong model", "sft.lr=.inf", "run_dir=/", "foreign sft", "linked sft",
                                  "sft is a file", "foreign report.md", "foreign file in sft"])
def test_a_pipeline_deletes_nothing_before_every_check_passed(small_model_dir, tmp_path, capsys, case):
    run = tmp_path / "run"
    user = _user_files(tmp_path)
    sets, needles, overwrite = [], [], ["--overwrite"]
    if case in ("wrong model", "sft.lr=.inf", "run_dir=/", "foreign file in sft"):
        _previous_pipeline_run(run)
    if case == "wrong model":
        sets, needles = ["model=" + str(tmp_path / "no" / "such-model")], ["model", "no/such-model", "does not exist"]
    elif case == "sft.lr=.inf":
        sets, needles = ["sft.lr=.inf"], ["`sft.lr` is inf"]
    elif case == "run_dir=/":
        sets, needles = ["run_dir=/"], ["run_dir '/' is the filesystem root"]
    elif case == "foreign sft":
        (run / "sft").mkdir(parents=True)
        (run / "sft" / "thesis.tex").write_text("mine")
        needles = ["holds sft", "no policylab pipeline wrote there"]
    elif case == "linked sft":
        run.mkdir()
        (run / "sft").symlink_to(user / "pictures")
        needles = [str(run / "sft"), "is a symbolic link"]
    elif case == "sft is a file":
        run.mkdir()
        (run / "sft").write_text("not a folder")
        needles = [str(run / "sft"), "is a regular file"]
    elif case == "foreign report.md":
        run.mkdir()
        (run / "report.md").write_text("# my own report\n")
        needles, overwrite = ["holds report.md", "no policylab pipeline wrote there"], []
    elif case == "foreign file in sft":
        (run / "sft" / "notes.txt").write_text("mine")
        needles = [str(run / "sft"), "holds notes.txt, which the pipeline did not write"]
    c = tmp_path / "p.yaml"
    c.write_text(yaml.safe_dump(_rlhf_cfg(small_model_dir, run)))
    before = fingerprint(run, user)
    args = ["pipeline", "ppo_rlhf", c, *overwrite] + [x for s in sets for x in ("--set", s)]
    one_line(*run_cli(capsys, *args), *needles)
    assert fingerprint(run, user) == before


def test_fusion_refuses_nan_alphas_before_any_expert_trains(small_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    c = tmp_path / "f.yaml"
    c.write_text(yaml.safe_dump({"pipeline": "fusion", "run_dir": str(run), "model": str(small_model_dir)}))
    one_line(*run_cli(capsys, "pipeline", "fusion", c, "--set", "merge.alphas=[.nan, 0.5]"), "`merge.alphas[0]` is nan")
    assert not run.exists()


def test_a_pipeline_overwrite_removes_exactly_what_it_wrote(tmp_path):
    from policylab.pipelines import common

    run = tmp_path / "run"
    _previous_pipeline_run(run)
    (run / "my-notes.txt").write_text("mine")  # not a pipeline entry: kept
    removed = common.prepare_run_dir(run, ("sft", "reward_model", "ppo"), overwrite=True, pipeline="ppo_rlhf")
    assert sorted(removed) == ["report.md", "sft"]
    assert sorted(p.name for p in run.iterdir()) == [".policylab-pipeline.json", "my-notes.txt"]


def test_site_build_refuses_a_directory_that_is_not_a_site(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.html").write_text("<h1>my home page</h1>")
    before = fingerprint(out)
    one_line(*run_cli(capsys, "site", "build", out), "not a policylab site", "index.html", "--overwrite")
    assert fingerprint(out) == before
    from policylab.learn.cli import SITE_MARKER, check_site_dir

    check_site_dir(tmp_path / "new", overwrite=False)  # a new or empty directory is fine
    check_site_dir(out, overwrite=True)  # asked for
    (out / SITE_MARKER).write_text("")
    check_site_dir(out, overwrite=False)  # a previous site build
