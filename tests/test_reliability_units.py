"""The reliability pieces on their own: the memory estimate against a hand-computed case,
config refusals, the resume change policy, the import allow-list, metrics.jsonl repair,
JSONL warnings, model directories."""

from __future__ import annotations

import json

import pytest

from policylab.trainer import memory
from policylab.trainer.config import ConfigError, load_config
from policylab.errors import MemoryBudgetError, PolicylabError, PolicylabWarning, UntrustedImportError


# ---------------------------------------------------------------------------- memory
def test_memory_estimate_matches_a_hand_computed_case():
    shape = memory.ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10)
    # kv per row and position: 2 (k, v) x 2 layers x 1 kv head x 4 dims x 4 bytes = 64
    assert shape.kv_bytes == 64
    # activations per trained token: 2 layers x (8*8 + 4*1*4 + 4*16) x 4 bytes = 1152
    assert shape.act_bytes == 1152
    est = memory.estimate_step(shape, memory.StepLayout(2, 2, micro_batch_size=2), prompt_lengths=[3, 5])
    # N = 2 prompts, P = 5 (the widest), B = 4 rows, S = 7 positions
    #   cache   2 x 4 x 7 x 64                              = 3584
    #   prefill 2*5*64 + 2*5*(4*8 + 3*16)*4 + 2*5*5          = 640 + 3200 + 50 = 3890
    #   head    4 x 10 x (4*4 + 8)                           = 960
    assert est.parts["sampling: kv cache"] == 3584
    assert est.parts["sampling: prefill"] == 3890
    assert est.parts["sampling: output head"] == 960
    assert est.sampling == 8434
    # training, micro-batch 2 of 7 positions: 2*7*1152 + 3*2*2*10*4 = 16128 + 480 = 16608
    assert est.training == 16608 and est.total == 16608
    # shared prefix (U = 2 distinct prompts): 2*5*1152 + 2*2*5*64 = 11520 + 1280; rows 2*2*1152 + 480
    pre = memory.estimate_step(shape, memory.StepLayout(2, 2, micro_batch_size=2, shared_prefix=True),
                               prompt_lengths=[3, 5])
    assert pre.training == 11520 + 1280 + 4608 + 480
    # before the first update: gradients (4 bytes) and two fp32 moments per trainable parameter
    first = memory.estimate_step(shape, memory.StepLayout(2, 2, micro_batch_size=2, first_update_params=1000),
                                 prompt_lengths=[3, 5])
    assert first.training == 16608 + 12000


def test_memory_estimate_of_the_long_prompt_case_does_not_fit_24_gib():
    # SmolLM2-135M, 7 prompts of 2,500 tokens x 4 samples: the case that drove memory to 19 of 24 GiB
    shape = memory.ModelShape(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64, vocab=49152)
    layout = memory.StepLayout(4, 32, micro_batch_size=8, shared_prefix=True, first_update_params=134_515_008)
    est = memory.estimate_step(shape, layout, prompt_lengths=[2500] * 7)
    assert est.total > 0.9 * 24 * 2**30


def test_available_memory_can_be_faked_for_tests(monkeypatch):
    monkeypatch.setenv("POLICYLAB_MEM_AVAILABLE", "512M")
    assert memory.available_bytes() == 512 * 2**20
    monkeypatch.setenv("POLICYLAB_MEM_AVAILABLE", "3G")
    assert memory.available_bytes() == 3 * 2**30
    monkeypatch.setenv("POLICYLAB_MEM_AVAILABLE", "lots")
    with pytest.raises(MemoryBudgetError, match="not a size"):
        memory.available_bytes()
    monkeypatch.delenv("POLICYLAB_MEM_AVAILABLE")
    assert memory.available_bytes() > 0  # /proc/meminfo


def test_trainer_refuses_a_step_that_will_not_fit_and_says_what_to_lower(tiny_model_dir, tmp_path, monkeypatch):
    from policylab.trainer.loop import Trainer

    from trainer_utils import tiny_config

    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "r", train={"micro_batch_size": 4, "shared_prefix": False}))
    prompts = [[5] * 1200, [6] * 1200]
    shape = memory.ModelShape.of(tr.model)
    first = sum(p.numel() for p in tr.model.parameters())
    kw = dict(prompt_lengths=[1200, 1200], train_prompts=2)
    big = memory.estimate_step(shape, memory.StepLayout(2, 4, micro_batch_size=4, first_update_params=first), **kw)
    small = memory.estimate_step(shape, memory.StepLayout(2, 4, micro_batch_size=1, first_update_params=first), **kw)
    assert small.sampling < small.training < big.training
    monkeypatch.setenv("POLICYLAB_MEM_AVAILABLE", str(int(small.total / 0.9) + 1))
    with pytest.raises(MemoryBudgetError, match=r"set train.micro_batch_size=1 \(the update is the same"):
        memory.check_sampling(tr, prompts)
    monkeypatch.setenv("POLICYLAB_MEM_CHECK", "off")
    memory.check_sampling(tr, prompts)  # the escape hatch


# ---------------------------------------------------------------------------- config
def test_config_refusals(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(p)
    p.write_text("{}\n")
    assert load_config(p).method == "grpo"  # an explicit empty mapping: every default
    p.write_text("train:\n  lr: .inf\n")
    with pytest.raises(ConfigError, match=r"`train.lr` is inf: every number in a config must be finite"):
        load_config(p)
    p.write_text("train: {betas: [0.9, .nan]}\n")
    with pytest.raises(ConfigError, match=r"`train.betas\[1\]` is nan"):
        load_config(p)
    with pytest.raises(ConfigError, match="run_dir is empty"):
        load_config(None, ["run_dir="])
    with pytest.raises(ConfigError, match="must look like key=value"):
        load_config(None, ["train.steps"])
    with pytest.raises(ConfigError, match=r"value of `train.lr`:1:3: invalid YAML"):
        load_config(None, ["train.lr=[1"])
    p.write_bytes(b"method: gr\xffpo\n")
    with pytest.raises(ConfigError, match=r"c.yaml:1: not UTF-8"):
        load_config(p)


def test_resume_change_policy():
    from policylab.trainer.config import RunConfig
    from policylab.trainer.resume import resume_changes

    cfg = RunConfig()
    new, changes = resume_changes(cfg, ["train.steps=40", "eval.n=10", "log.checkpoint_every=5", "method=grpo"])
    assert changes == {"train.steps": (20, 40), "eval.n": (200, 10), "log.checkpoint_every": (0, 5)}
    assert new.train.steps == 40 and cfg.train.steps == 20  # the recorded config is not touched
    for bad in ["train.lr=1e-3", "rollout.staleness=1", "task.digits=2", "method_params.eps_high=0.3",
                "train={epochs: 2}", "model=elsewhere"]:
        with pytest.raises(ConfigError, match="resume cannot change"):
            resume_changes(cfg, [bad])


def test_imports_are_listed_and_outside_policylab_refused():
    from policylab.trainer.config import RunConfig, TaskConfig
    from policylab.trainer.trust import check_imports

    def run(**task):
        return RunConfig(task=TaskConfig(**task))

    cfg = run(reward="my_pkg.rewards:score", extra_rewards=("policylab.kernels.rewards:format_reward=0.5",))
    said = []
    with pytest.raises(UntrustedImportError, match=r"`my_pkg.rewards` \(task.reward = 'my_pkg.rewards:score'\)"):
        check_imports(cfg, "run/config.yaml", allow=False, say=said.append)
    assert said == []  # refused before anything was said or imported
    assert check_imports(cfg, "run/config.yaml", allow=True, say=said.append) == ["my_pkg.rewards", "policylab.kernels.rewards"]
    assert said and "my_pkg.rewards" in said[0] and "policylab.kernels.rewards" in said[0]
    ok = run(extra_rewards=("policylab.kernels.rewards:format_reward=0.5",))
    assert check_imports(ok, "x", allow=False) == ["policylab.kernels.rewards"]
    lookalike = run(reward="policylab_evil:f")
    with pytest.raises(UntrustedImportError):
        check_imports(lookalike, "x", allow=False)
    with pytest.raises(ConfigError, match="not a module name"):
        check_imports(run(reward="../x:f"), "x", allow=True)
    # a method by import path is code outside policylab too; a built-in name is not
    with pytest.raises(UntrustedImportError, match=r"`their_pkg.m` \(method = 'their_pkg.m:M'\)"):
        check_imports(RunConfig(method="their_pkg.m:M"), "x", allow=False)
    assert check_imports(RunConfig(method="dapo"), "x", allow=False) == []


# ---------------------------------------------------------------------------- files
def test_a_cut_metrics_line_is_moved_aside_when_the_log_is_opened(tmp_path):
    from policylab.trainer.runlog import RunLog, read_records

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a"')
    with pytest.warns(PolicylabWarning, match="last line was cut"):
        log = RunLog(tmp_path, tensorboard=False)
    log.log(2, {"a": 2})
    log.close()
    assert [json.loads(l) for l in path.read_text().splitlines()] == [{"step": 1, "a": 1}, {"step": 2, "a": 2}]
    assert (tmp_path / "metrics.jsonl.partial").read_text() == '{"step": 2, "a"\n'
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.warns(PolicylabWarning, match=r"line\(s\) 2, which are not valid JSON"):
        assert read_records(path) == [{"step": 1}, {"step": 3}]


def test_resume_events_do_not_replace_step_rows(tmp_path):
    from policylab.trainer.runlog import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"event": "resumed_from", "step": 2}\n')
    assert read_metrics(path) == [{"step": 1, "a": 1}, {"step": 2, "a": 2}]


def test_jsonl_warnings_and_utf8(tmp_path):
    from policylab.tasks.jsonl import load_jsonl

    p = tmp_path / "d.jsonl"
    p.write_text('{"id": "a", "prompt": "p", "answer": 1}\n{"id": "a", "prompt": "q", "answer": 2}\n')
    with pytest.warns(PolicylabWarning, match=r"id 'a' on lines 1, 2"):
        load_jsonl(p)
    p.write_text('{"prompt": "p", "answer": 1}\n{"prompt": "p", "answer": 2}\n{"prompt": "p", "answer": 1}\n')
    with pytest.warns(PolicylabWarning, match=r"'1' on line\(s\) 1, 3; '2' on line\(s\) 2"):
        load_jsonl(p)
    p.write_bytes(b'{"prompt": "p", "answer": 1}\n\n{"prompt": "\xff", "answer": 1}\n')
    with pytest.raises(PolicylabError, match=r"d.jsonl:3: not UTF-8 text \(byte 0xff at column 13\)"):
        load_jsonl(p)


def test_directories_that_are_not_models(tmp_path, tiny_model_dir):
    import shutil

    from policylab.models.loading import ModelNotFoundError, check_model_dir, load_policy

    check_model_dir(tiny_model_dir)  # a real one passes
    d = tmp_path / "tok"
    d.mkdir()
    shutil.copy(tiny_model_dir / "tokenizer.json", d)
    with pytest.raises(ModelNotFoundError, match=r"not a model \(tokenizer files only\): it has no config.json, no weights"):
        load_policy(str(d))
    e = tmp_path / "empty"
    e.mkdir()
    with pytest.raises(ModelNotFoundError, match=r"\(empty\)"):
        load_policy(str(e))
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelNotFoundError, match="is a directory but cannot be loaded as a model"):
        load_policy(str(broken))
