"""The held-out evaluation's sample stream for a fixed seed, recorded per CPU feature set.

The README's quickstart figures are sampled at T = 1, and which tokens are drawn depends
on the host's float kernels: the engine draws from the inverse CDF of an fp32 softmax, so
a logit rounded one way on AVX-512 and the other way on AVX2 moves a CDF boundary, and a
draw near it picks the neighbouring token (the rest of that reply then differs). The same
seed on the same kind of host draws the same stream, so the base accuracy is a property
of (code, seed, CPU feature set).

This test pins that stream on a tiny random model: the trainer's own evaluation path
(`Trainer.evaluate`: the quickstart's sampler, temperature 1, its seed rule), 8 prompts,
8 new tokens. The random model's end-of-reply token is made likely (its tied embedding
row scaled up), so replies end at different lengths and the engine's path for finished
rows (dropping them from the batch, the draws of the rows still running) is in the
stream, as it is for the real model, whose replies end after a few tokens. `eval_fingerprint.json` holds, per `torch.backends.cpu.get_cpu_capability()`,
the sha256 of the sampled token ids (and the first two replies in clear, to read a diff),
the CPU model it was recorded on (another CPU model with the same instruction set can run
other math-library paths: the stream is checked on the recording CPU model only), plus the
README's quickstart base figure measured with that stream on that kind of host (on this
host: 15.5% ± 2.6 with its AVX-512 kernels, 13.0% ± 2.4 with the AVX2 kernels forced;
85 of the 200 base replies differ between the two). When code changes the stream (the sampler, the evaluation's seed, the prompt
order, the engine's forward), this test fails: re-measure `make quickstart` on each kind of
host the README names, then re-record

    POLICYLAB_RECORD_FINGERPRINT=1 .venv/bin/python -m pytest -q -p no:cacheprovider \\
        tests/eval/test_eval_fingerprint.py

which rewrites the streams and clears the README figures it pairs them with: fill in the
re-measured figures in the JSON and in the README's quickstart table (the second test
fails until they agree). The AVX2 entry is checked from an AVX-512 host too, in a fresh
interpreter with the ISA switches of `tests/methods/test_same_update_avx2.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

FILE = Path(__file__).with_name("eval_fingerprint.json")
README = Path(__file__).resolve().parents[2] / "README.md"
RECORD = os.environ.get("POLICYLAB_RECORD_FINGERPRINT") == "1"
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def eval_stream(model_dir, run_dir) -> dict:
    """The first evaluation samples of a quickstart-like run on `model_dir`."""
    from policylab.trainer.loop import Trainer
    from trainer_utils import tiny_config

    cfg = tiny_config(model_dir, run_dir, seed=0, task={"name": "arithmetic", "ops": ["+", "*"], "digits": 1},
                      eval={"n": 8, "temperature": 1.0, "max_new_tokens": 8, "batch_size": 8})
    tr = Trainer(cfg)
    rows: list[list[int]] = []
    generate = tr.engine.generate

    def recording(*a, **kw):
        b = generate(*a, **kw)
        rows.extend(b.response_tokens[i][b.loss_mask[i]].tolist() for i in range(b.size))
        return b

    tr.engine.generate = recording
    res = tr.evaluate("base")
    return {"sha256": hashlib.sha256(json.dumps(rows).encode()).hexdigest(), "first_rows": rows[:2],
            "rows": rows, "n_rows": len(rows), "accuracy": res["accuracy"]}


@pytest.fixture(scope="module")
def eos_model_dir(tmp_path_factory, tokenizer):
    """tiny_llama(tokenizer, seed 0) whose end-of-reply token gets a large random output row
    (tied embedding; it is the padding row, 0 in tiny_llama): entries N(0, 4²), so its
    logit has std ~30 against log(vocab) ~ 11, and about a third of the draws end the reply."""
    from policylab.models import loading as models

    model = models.tiny_llama(tokenizer)
    emb = model.get_input_embeddings().weight
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        emb[tokenizer.eos_token_id] = 4.0 * torch.randn(emb.shape[1], generator=g)
    path = tmp_path_factory.mktemp("eos-model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def cpu_model() -> str:
    """The CPU's model name: the same instruction set on another CPU model can run other
    math-library code paths (MKL dispatches per model), so a stream is checked only on the
    CPU model it was recorded on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _recorded() -> dict:
    return json.loads(FILE.read_text()) if FILE.exists() else {}


def _check(cap: str, got: dict) -> None:
    rec = _recorded()
    if cap not in rec:
        pytest.skip(f"no eval stream recorded for CPU capability {cap} (record it: see the module docstring)")
    want = rec[cap]
    if want.get("cpu") != cpu_model():
        pytest.skip(f"the {cap} stream was recorded on {want.get('cpu')!r}, this is {cpu_model()!r} (record it here)")
    assert got["first_rows"] == want["first_rows"] and got["sha256"] == want["sha256"], (
        f"the evaluation stream of seed 0 changed on a {cap} host: the README's quickstart figures measured with "
        f"the old stream no longer describe this code. Re-measure them and re-record (module docstring). "
        f"got first rows {got['first_rows']}, recorded {want['first_rows']}")


def test_eval_stream_is_the_recorded_one_on_this_host(eos_model_dir, tmp_path):
    cap = torch.backends.cpu.get_cpu_capability()
    got = eval_stream(eos_model_dir, tmp_path / "run")
    assert got["n_rows"] == 8
    lengths = [len(r) for r in got["rows"]]
    assert min(lengths) < 8 and max(lengths) > 1, f"the stream should have replies of several lengths: {lengths}"
    if RECORD:
        rec = _recorded()
        rec[cap] = {**{k: got[k] for k in ("sha256", "first_rows")}, "cpu": cpu_model(), "readme_base": None}
        FILE.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    _check(cap, got)


_RUN = ("import sys, json, torch; sys.path[:0] = sys.argv[3:]; from test_eval_fingerprint import eval_stream; "
        "from pathlib import Path; print('STREAM', json.dumps({'cap': torch.backends.cpu.get_cpu_capability(), "
        "**eval_stream(sys.argv[1], Path(sys.argv[2]))}))")


def test_eval_stream_on_the_avx2_kernels(eos_model_dir, tmp_path):
    native = torch.backends.cpu.get_cpu_capability()
    if native not in ("AVX512", "AVX512_BF16", "AMX"):
        pytest.skip(f"the AVX2 switches apply to x86 CPUs with AVX-512; this one runs {native} kernels natively")
    here = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if k != "POLICYLAB_RECORD_FINGERPRINT"} | AVX2
    proc = subprocess.run([sys.executable, "-c", _RUN, str(eos_model_dir), str(tmp_path / "run"), str(here),
                           str(here.parent)], env=env, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("STREAM ")), None)
    assert proc.returncode == 0 and line, (proc.stdout + proc.stderr)[-3000:]
    got = json.loads(line[len("STREAM "):])
    assert got.pop("cap") == "AVX2"  # the switch took
    if RECORD:
        rec = _recorded()
        rec["AVX2"] = {**{k: got[k] for k in ("sha256", "first_rows")}, "cpu": cpu_model(), "readme_base": None}
        FILE.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    _check("AVX2", got)


def test_the_readme_states_the_base_figure_measured_with_each_recorded_stream():
    # the quickstart block names each feature set's base accuracy beside it; a re-recorded
    # stream has no figure until `make quickstart` is re-measured on that kind of host
    block = re.search(r"<!-- QUICKSTART-RESULTS -->(.*)<!-- /QUICKSTART-RESULTS -->", README.read_text(), re.S)
    assert block, "README has no quickstart results block"
    rec = _recorded()
    assert rec, f"{FILE.name} records no stream"
    for cap, entry in rec.items():
        fig = entry.get("readme_base")
        assert fig, (f"the {cap} eval stream was re-recorded: re-measure `make quickstart` on a {cap} host and put "
                     f"its base accuracy in {FILE.name} (readme_base) and in the README")
        assert fig in block.group(1), f"README's quickstart block does not state the {cap} base figure {fig!r}"
