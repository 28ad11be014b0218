"""The command line as a careless or hostile user runs it: every case exits with one clear
line (exit code 2 for bad input, 130 for Ctrl-C), leaves the user's files as they were,
and never runs code a received run directory carries (real payloads that would write a
marker file)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from cli_utils import assert_one_clear_error, cli, cli_inprocess, fingerprint, popen, write_config


# Commands run in the test's process (`cli_inprocess`: policylab.cli.main, the same exit
# code, stdout and stderr) where the new interpreter is not what is checked; a fault
# injected into the process, Ctrl-C and a PYTHONPATH of the test's own keep a subprocess.

# its tests share the module fixture `trained_run`: one worker under xdist
pytestmark = pytest.mark.xdist_group("test_reliability_cli")


@pytest.fixture(scope="module")
def trained_run(small_model_dir, tmp_path_factory):
    """A finished 2-step run with checkpoints at steps 1 and 2 (copy it before changing it)."""
    root = tmp_path_factory.mktemp("trained")
    cfg = write_config(root / "c.yaml", small_model_dir, root / "run", log="{tensorboard: false, progress: false, "
                       "plot_every: 0, checkpoint_every: 1}")
    res = cli_inprocess("train", cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    (root / "train.stderr").write_text(res.stderr)
    return root / "run"


def _copy_run(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


def _legacy_payload(run: Path, marker: Path) -> None:
    """Turn the run's latest checkpoint into the old format, with a state.pt that writes
    `marker` when it is unpickled."""

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('pwned')",))

    step = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    for f in ("state.json", "state.safetensors"):
        (step / f).unlink()
    torch.save({"step": 2, "payload": Payload()}, step / "state.pt")


# ------------------------------------------------------------------------------ security
def test_eval_of_a_received_pickle_checkpoint_does_not_run_its_payload(trained_run, tmp_path):
    run = _copy_run(trained_run, tmp_path)
    marker = tmp_path / "marker"
    _legacy_payload(run, marker)
    before = fingerprint(run)
    for args in (["eval", run, "--n", "2", "--allow-imports"], ["resume", run, "--allow-imports", "--set", "train.steps=3"]):
        res = cli_inprocess(*args)
        assert_one_clear_error(res, "state.pt", "can run arbitrary code", f"policylab convert-checkpoint {run} "
                               "--i-trust-this-file")
        assert not marker.exists()
    res = cli_inprocess("convert-checkpoint", run)
    assert_one_clear_error(res, "--i-trust-this-file", "runs any code")
    assert not marker.exists()
    assert fingerprint(run) == before
    # the payload is real: with the explicit trust flag the conversion unpickles it
    res = cli_inprocess("convert-checkpoint", run, "--i-trust-this-file")
    assert marker.exists() and marker.read_text() == "pwned"


def test_a_converted_old_checkpoint_resumes(trained_run, tmp_path):
    run = _copy_run(trained_run, tmp_path)
    step = run / "checkpoints" / "step_000002"
    from policylab.trainer import safestate

    state = safestate.load_state(step)
    for f in ("state.json", "state.safetensors"):
        (step / f).unlink()
    torch.save(state, step / "state.pt")
    res = cli_inprocess("convert-checkpoint", run, "--i-trust-this-file")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "converted" in res.stdout and (step / "state.json").is_file()
    res = cli_inprocess("resume", run, "--allow-imports", "--set", "train.steps=3")
    assert res.returncode == 0, res.stderr[-2000:]
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_000003"


@pytest.mark.parametrize("latest", ["ABS", "../../evil/step_000002", "step_000002/../../../evil/step_000002"])
def test_latest_pointing_outside_the_run_is_never_followed(trained_run, tmp_path, latest):
    run = _copy_run(trained_run, tmp_path)
    evil = tmp_path / "evil" / "step_000002"
    shutil.copytree(run / "checkpoints" / "step_000002", evil)
    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('pwned')",))

    for f in ("state.json", "state.safetensors"):
        (evil / f).unlink()
    torch.save({"payload": Payload()}, evil / "state.pt")
    (run / "checkpoints" / "LATEST").write_text((str(evil) if latest == "ABS" else latest) + "\n")
    before = fingerprint(run, tmp_path / "evil")
    for args in (["resume", run, "--allow-imports"], ["eval", run, "--n", "2", "--allow-imports"]):
        res = cli_inprocess(*args)
        assert_one_clear_error(res, "not a checkpoint of this run", "only a step_N directory inside")
        assert not marker.exists()
    assert fingerprint(run, tmp_path / "evil") == before


def test_reward_module_of_a_received_run_is_named_and_refused(trained_run, tmp_path):
    run = _copy_run(trained_run, tmp_path)
    marker = tmp_path / "marker"
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "evil_reward.py").write_text(
        f"open({str(marker)!r}, 'w').write('pwned')\n"
        "def reward(responses, answers, **kw):\n    return [0.0] * len(responses)\n")
    cfg_text = (run / "config.yaml").read_text().replace("trainer_utils:parity_reward", "evil_reward:reward")
    (run / "config.yaml").write_text(cfg_text)
    _record_in_manifests(run, "task.reward", "evil_reward:reward")  # as if the run had been trained with it
    before = fingerprint(run)
    pypath = f"{mods}{os.pathsep}{Path(__file__).parent}"
    for args in (["eval", run, "--n", "2"], ["resume", run, "--set", "train.steps=3"]):
        res = cli(*args, PYTHONPATH=pypath)
        assert_one_clear_error(res, "`evil_reward`", "task.reward", "--allow-imports", "Nothing was imported")
        assert not marker.exists()
    assert fingerprint(run) == before
    # with the flag the module is named before it is imported, and its code does run
    res = cli("eval", run, "--n", "2", "--allow-imports", PYTHONPATH=pypath)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "imports: evil_reward (task.reward = 'evil_reward:reward')" in res.stderr
    assert marker.exists()


def _record_in_manifests(run: Path, key: str, value) -> None:
    """Every checkpoint's manifest records `key` = `value` (a run that was trained so)."""
    from policylab.trainer.checkpoint import config_digest

    for m in (run / "checkpoints").glob("step_*/manifest.json"):
        doc = json.loads(m.read_text())
        doc["config"][key] = value
        doc["config_sha256"] = config_digest(doc["config"])
        m.write_text(json.dumps(doc))


def test_train_names_the_modules_its_own_config_imports(trained_run):
    stderr = (trained_run.parent / "train.stderr").read_text()
    assert "c.yaml imports: trainer_utils (task.reward = 'trainer_utils:parity_reward')" in stderr


# ----------------------------------------------------------------------------- data loss
def test_a_previous_run_without_checkpoint_is_not_overwritten(small_model_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text('{"trained": {"accuracy": 0.9}}')
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    (run / "config.yaml").write_text("method: grpo\n")
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, run, steps=1)
    before = fingerprint(run, cfg)
    res = cli_inprocess("train", cfg)
    assert_one_clear_error(res, "already holds a run", "report.json", "--overwrite")
    assert fingerprint(run, cfg) == before
    res = cli_inprocess("train", cfg, "--overwrite")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "removed the previous run's" in res.stderr
    assert json.loads((run / "report.json").read_text())["steps"] == 1 and not (run / "metrics.jsonl.partial").exists()


def test_the_config_file_trained_from_is_never_overwritten(small_model_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg = write_config(run / "config.yaml", small_model_dir, run, steps=1, extra="# my notes\n")
    before = fingerprint(run)
    res = cli_inprocess("train", cfg, "--overwrite")
    assert_one_clear_error(res, "the config file you train from", "overwrite it")
    assert fingerprint(run) == before


@pytest.mark.parametrize("value", ["", "."])
def test_empty_or_current_run_dir_is_refused(small_model_dir, tmp_path, value):
    work = tmp_path / "work"
    work.mkdir()
    write_config(work / "c.yaml", small_model_dir, tmp_path / "run", steps=1)
    before = fingerprint(work)
    res = cli_inprocess("train", "c.yaml", "--set", f"run_dir={value}", cwd=work)
    assert_one_clear_error(res, "run_dir", "empty" if value == "" else "current directory")
    assert fingerprint(work) == before and sorted(p.name for p in work.iterdir()) == ["c.yaml"]


def test_a_cut_last_metrics_line_is_repaired_on_resume_and_skipped_by_readers(trained_run, tmp_path):
    run = _copy_run(trained_run, tmp_path)
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "reward/me')  # killed mid-write
    from policylab.errors import PolicylabWarning
    from policylab.trainer.runlog import read_metrics

    with pytest.warns(PolicylabWarning, match="its last line, which was cut"):
        rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    res = cli_inprocess("resume", run, "--allow-imports", "--set", "train.steps=3")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "policylab: warning:" in res.stderr and "last line was cut" in res.stderr
    lines = (run / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]  # every line is valid JSON again
    assert [r["step"] for r in recs if "event" not in r] == [1, 2, 3]
    assert (run / "metrics.jsonl.partial").read_text() == '{"step": 3, "reward/me\n'


def _immutable(path: Path) -> bool:
    """Make `path` unwritable: chmod for a normal user; root ignores permissions, so then
    the immutable attribute (False when the filesystem does not support it)."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return True
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def _mutable(path: Path) -> None:
    if os.geteuid() != 0:
        path.chmod(0o755)
    elif shutil.which("chattr") is not None:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def test_a_read_only_run_directory_is_refused_before_step_1(small_model_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, run, steps=1)
    if not _immutable(run):
        pytest.skip("cannot make a directory read-only for root here (no chattr support)")
    try:
        res = cli_inprocess("train", cfg)
        assert_one_clear_error(res, f"run directory {run} cannot be written", "nothing was trained")
        assert list(run.iterdir()) == []
    finally:
        _mutable(run)


def test_no_room_for_a_checkpoint_is_found_before_step_1(small_model_dir, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, run, steps=1)
    res = cli("train", cfg, fault="disk-free:1000000")
    assert_one_clear_error(res, "not enough disk space for a checkpoint", "MiB are free", "nothing was trained")
    assert not (run / "metrics.jsonl").exists()
    # nothing half-made is left in the way of the next attempt
    from policylab.trainer.config import load_config
    from policylab.trainer.run_dir import check_new_run_dir

    assert check_new_run_dir(load_config(cfg)) == []


def test_a_full_disk_during_a_checkpoint_write_keeps_the_previous_one(small_model_dir, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, run, steps=2,
                       log="{tensorboard: false, progress: false, plot_every: 0, checkpoint_every: 1}")
    res = cli("train", cfg, fault="enospc-at:step_000002")
    assert_one_clear_error(res, "no space left on device", "step_000002", "step_000001 is intact")
    ck = run / "checkpoints"
    assert (ck / "LATEST").read_text().strip() == "step_000001"
    assert sorted(p.name for p in ck.iterdir()) == ["LATEST", "step_000001"]  # no stray temporary directory
    res = cli_inprocess("resume", run, "--allow-imports")
    assert res.returncode == 0, res.stderr[-2000:]
    assert (ck / "LATEST").read_text().strip() == "step_000002"


# --------------------------------------------------------------------------------- silent
@pytest.mark.parametrize("override, key", [
    ("train.lr=inf", "train.lr"), ("train.lr=nan", "train.lr"), ("rollout.temperature=-.inf", "rollout.temperature"),
    ("method_params.eps_high=.nan", "method_params.eps_high"),
])
def test_non_finite_numbers_in_the_config_are_refused(small_model_dir, tmp_path, override, key):
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, tmp_path / "run")
    res = cli_inprocess("train", cfg, "--set", override)
    assert_one_clear_error(res, f"`{key}` is", "must be finite")
    assert not (tmp_path / "run").exists()


def test_non_finite_weights_are_never_checkpointed(small_model_dir, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, run, steps=3)
    res = cli_inprocess("train", cfg, "--set", "train.lr=1e39", "--set", "train.grad_clip=0")
    assert_one_clear_error(res, "weights hold NaN or inf after step", "lower train.lr", "never checkpointed")
    assert not (run / "checkpoints" / "LATEST").exists()


@pytest.mark.parametrize("override", ["method=dapo", "rollout.group_size=4", "model=embedded"])  # more: test_reliability_units
def test_resume_refuses_changes_that_alter_the_run(trained_run, tmp_path, override):
    run = _copy_run(trained_run, tmp_path)
    before = fingerprint(run)
    res = cli_inprocess("resume", run, "--allow-imports", "--set", override)
    assert_one_clear_error(res, override.split("=")[0])
    assert fingerprint(run) == before


def test_resume_records_a_change_it_accepts(trained_run, tmp_path):
    run = _copy_run(trained_run, tmp_path)
    res = cli_inprocess("resume", run, "--allow-imports", "--set", "train.steps=3", "--set", "method=grpo")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "train.steps 2 -> 3" in res.stderr
    import yaml

    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["steps"] == 3
    events = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if '"resumed_from"' in l]
    assert events[-1]["changes"] == {"train.steps": [2, 3]}
    assert json.loads((run / "report.json").read_text())["resume_changes"] == [{"at_step": 2, "train.steps": [2, 3]}]


def test_an_empty_yaml_file_is_refused(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("# nothing here yet\n")
    res = cli_inprocess("train", cfg)
    assert_one_clear_error(res, f"{cfg} is empty", "`{}`")


def test_jsonl_duplicates_and_conflicting_answers_are_warned(small_model_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"id": 1, "prompt": "What is 2 + 2?", "answer": "4"},
        {"id": 2, "prompt": "What is 3 + 3?", "answer": "6"},
        {"id": 1, "prompt": "What is 5 + 5?", "answer": "10"},
        {"id": 4, "prompt": "What is 2 + 2?", "answer": "5"},
    ]) + "\n")
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, tmp_path / "run", steps=1,
                       task=f'{{name: jsonl, path: "{data}", reward: "trainer_utils:parity_reward"}}')
    res = cli_inprocess("train", cfg)
    assert res.returncode == 0, res.stderr[-2000:]
    warn = [l for l in res.stderr.splitlines() if l.startswith("policylab: warning:")]
    assert any("id 1 on lines 1, 3" in l for l in warn), warn
    assert any("different answers" in l and "'4' on line(s) 1; '5' on line(s) 4" in l for l in warn), warn


def test_a_step_that_will_not_fit_in_memory_is_refused_before_sampling(tiny_model_dir, tmp_path):
    data = tmp_path / "long.jsonl"
    # 1500 words: within the model's context in the real tokenizer (not in the small one)
    data.write_text(json.dumps({"prompt": "word " * 1500, "answer": "1"}) + "\n")
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_model_dir, run, steps=1,
                       task=f'{{name: jsonl, path: "{data}", reward: "trainer_utils:parity_reward"}}')
    before = fingerprint(cfg, data)
    res = cli_inprocess("train", cfg, POLICYLAB_MEM_AVAILABLE="16M")
    line = assert_one_clear_error(res, "step 1", "needs an estimated", "but 0.02 GiB are available",
                                  "lower rollout.prompts_per_step, rollout.group_size")
    assert "sampling: kv cache" in line or "sampling: prefill" in line
    assert fingerprint(cfg, data) == before
    steps = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if '"event"' not in l]
    assert steps == []  # nothing was sampled or trained


# ------------------------------------------------------------ raw tracebacks, now one line
@pytest.mark.parametrize("kind", ["empty", "tokenizer only"])
def test_a_directory_that_is_not_a_model(small_model_dir, tmp_path, kind):
    d = tmp_path / "not-a-model"
    d.mkdir()
    if kind == "tokenizer only":
        for f in Path(small_model_dir).iterdir():
            if f.name.startswith(("tokenizer", "special_tokens")):
                shutil.copy(f, d / f.name)
    elif kind == "config only":
        shutil.copy(Path(small_model_dir) / "config.json", d / "config.json")
    cfg = write_config(tmp_path / "c.yaml", d, tmp_path / "run")
    res = cli_inprocess("train", cfg)
    assert_one_clear_error(res, "is a directory but not a model", "save_pretrained")


@pytest.mark.parametrize("text, where, what", [
    ("method: grpo\ntrain:\n\tsteps: 2\n", ":3:1:", "tab"),
    ("method: grpo\ntrain: {steps: 2\n", ":3:1:", "flow mapping at line 2, column 8"),
    ("task: {ops: [1, 2}\n", ":1:18:", "expected ',' or ']', but got '}' (while parsing a flow sequence at line 1"),
])
def test_yaml_syntax_errors_name_file_line_and_column(tmp_path, text, where, what):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    res = cli_inprocess("train", cfg)
    assert_one_clear_error(res, f"{cfg}{where}", "invalid YAML", what)


def test_a_jsonl_file_with_non_utf8_bytes(small_model_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_bytes(b'{"prompt": "ok", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    cfg = write_config(tmp_path / "c.yaml", small_model_dir, tmp_path / "run",
                       task=f'{{name: jsonl, path: "{data}", reward: "trainer_utils:parity_reward"}}')
    res = cli_inprocess("train", cfg)
    assert_one_clear_error(res, f"{data}:2: not UTF-8", "0xe9")


@pytest.mark.parametrize("victim", ["model.safetensors", "state.safetensors", "state.json"])
def test_a_truncated_latest_checkpoint_names_the_file_and_the_intact_one(trained_run, tmp_path, victim):
    run = _copy_run(trained_run, tmp_path)
    f = run / "checkpoints" / "step_000002" / victim
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    before = fingerprint(run)
    for cmd in ("resume", "eval") if victim == "model.safetensors" else ("resume",):
        res = cli_inprocess(cmd, run, "--allow-imports", *(["--n", "2"] if cmd == "eval" else []))
        assert_one_clear_error(res, "checkpoint step_000002 is damaged", str(f),
                               f"`policylab resume {run} --from step_000001`")
        assert fingerprint(run) == before
    if victim == "model.safetensors":
        res = cli_inprocess("resume", run, "--allow-imports", "--from", "step_000001")
        assert res.returncode == 0, res.stderr[-2000:]
        assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_000002"


def test_ctrl_c_reports_the_step_and_how_to_resume_and_strays_are_cleaned(small_model_dir, tmp_path):
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
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    lines = [l for l in err.splitlines() if "interrupted" in l]
    assert len(lines) == 1 and lines[0].startswith("policylab: interrupted at step "), err[-2000:]
    assert "of 200" in lines[0] and "last checkpoint: step_" in lines[0] and f"`policylab resume {run} --allow-imports`" in lines[0]
    # a stray temporary directory, as a kill during a checkpoint write leaves it, goes at the next start
    stray = run / "checkpoints" / ".tmp-step_000099-abc123"
    stray.mkdir()
    (stray / "model.safetensors").write_bytes(b"half")
    res = cli_inprocess("resume", run, "--allow-imports", "--set", "train.steps=" + str(
        int(latest.read_text().strip().split("_")[1]) + 1))
    assert res.returncode == 0, res.stderr[-2000:]
    assert not stray.exists() and "left by an interrupted checkpoint write" in res.stderr


def test_eval_of_a_run_trained_without_evaluation(trained_run, tmp_path):
    run = _copy_run(trained_run, tmp_path)  # trained with eval.n=0
    res = cli_inprocess("eval", run, "--allow-imports")
    assert_one_clear_error(res, "eval.n=0", "pass --n N")
    res = cli_inprocess("eval", run, "--allow-imports", "--n", "0")
    assert_one_clear_error(res, "--n must be >= 1")


def test_resume_set_without_equals(trained_run, tmp_path):
    run = _copy_run(trained_run, tmp_path)
    before = fingerprint(run)
    res = cli_inprocess("resume", run, "--set", "train.steps")
    assert_one_clear_error(res, "'train.steps' must look like key=value")
    assert fingerprint(run) == before


def test_train_seconds_count_every_part_of_a_resumed_run(trained_run, tmp_path):
    run = _copy_run(trained_run, tmp_path)
    from policylab.trainer import safestate

    first = safestate.load_state(run / "checkpoints" / "step_000002")["run"]
    # a run killed after its checkpoint has no train_seconds in its report yet
    report = json.loads((run / "report.json").read_text())
    report.pop("train_seconds")
    report.pop("train_seconds_parts")
    (run / "report.json").write_text(json.dumps(report))
    res = cli_inprocess("resume", run, "--allow-imports", "--set", "train.steps=3")
    assert res.returncode == 0, res.stderr[-2000:]
    after = json.loads((run / "report.json").read_text())
    parts = after["train_seconds_parts"]
    assert len(parts) == 2 and parts[0] == first["train_seconds_parts"][0] and parts[1] > 0
    assert after["train_seconds"] == sum(parts)
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if '"event"' not in l]
    assert rows[-1]["step"] == 3 and rows[-1]["time/elapsed_s"] > rows[-2]["time/elapsed_s"]
