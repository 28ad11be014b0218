"""policylab inside TRL's GRPOTrainer: the loss equals TRL's own loss_type on the same
batch, short real training runs on a tiny model, and a two-process data-parallel run
equal to the one-process run on the same global batch."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from engines import require

require("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from policylab.errors import PolicylabError  # noqa: E402
from policylab.integrations import trl as PT  # noqa: E402

HERE = Path(__file__).resolve().parent


def _config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, fp16=False, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, num_generations=4, max_completion_length=6, learning_rate=1e-3,
                max_steps=2, logging_steps=1, report_to="none", save_strategy="no", gradient_checkpointing=False,
                seed=0, data_seed=0, dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True,
                log_completions=False)
    base.update(kw)
    return GRPOConfig(**base)


def _reward(prompts, completions, completion_ids, **kw):
    return [float(len(c) % 3) + 0.1 * (c[0] % 5 if c else 0) for c in completion_ids]


def _dataset(n=8):
    return Dataset.from_list([{"prompt": f"What is {a} + {a}?"} for a in range(n)])


def _trainer(tmp_path, tiny_model_dir, method, params=None, **cfg):
    return PT.PolicylabGRPOTrainer(method=method, method_params=params or {}, model=str(tiny_model_dir),
                                   reward_funcs=[_reward], args=_config(tmp_path, **cfg), train_dataset=_dataset())


def _inputs(trainer, B=8, P=3, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(10, 500, (B, P), generator=g)
    completion_ids = torch.randint(10, 500, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    completion_mask = (torch.arange(T).expand(B, T) < lengths.unsqueeze(-1)).long()
    model = trainer.model
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            model, torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([torch.ones(B, P, dtype=torch.long), completion_mask], 1), T)
    return {"prompt_ids": prompt_ids, "prompt_mask": torch.ones(B, P, dtype=torch.long),
            "completion_ids": completion_ids, "completion_mask": completion_mask,
            "advantages": torch.randn(B, generator=g),
            "old_per_token_logps": logp + 0.2 * torch.randn(B, T, generator=g),
            "ref_per_token_logps": logp + 0.3 * torch.randn(B, T, generator=g),
            "num_items_in_batch": completion_mask.sum() * 2}


def _loss_and_grad(fn, trainer, inputs):
    trainer.model.zero_grad()
    loss = fn(trainer.model, inputs)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    return loss.detach(), grad


# the GRPOConfig settings of TRL's own loss for each method, worked by hand from the two
# codes: TRL clips the ratio to [1 - epsilon, 1 + epsilon_high] as policylab's eps_low /
# eps_high do, and its CISPO caps the weight at epsilon_high itself where policylab caps it at
# 1 + eps_high; beta is the KL coefficient only when the KL is in the loss (grpo's 0.04)
HAND_MAPPED = [
    ("grpo", {}, dict(loss_type="grpo", epsilon=0.2, epsilon_high=0.2, beta=0.04)),
    ("dapo", {}, dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0)),
    ("dr_grpo", {}, dict(loss_type="dr_grpo", epsilon=0.2, epsilon_high=0.2, beta=0.0)),
    ("cispo", {"eps_high": 0.28}, dict(loss_type="cispo", epsilon_high=1.28, beta=0.0)),
    ("cispo", {"eps_high": 4.0}, dict(loss_type="cispo", epsilon_high=5.0, beta=0.0)),  # ScaleRL's epsilon_max 5
]


@pytest.mark.parametrize("method,params,trl_kw", HAND_MAPPED)
def test_parameter_names_map_explicitly_to_trl(method, params, trl_kw):
    got = PT.trl_loss_args(method, params)
    assert got.keys() == trl_kw.keys()
    for k, v in trl_kw.items():
        assert got[k] == v if isinstance(v, str) else got[k] == pytest.approx(v, rel=0, abs=1e-15), k


def test_trl_loss_settings_that_disagree_with_the_method_are_refused_naming_the_parameter(tmp_path, tiny_model_dir):
    # TRL's epsilon_high is not read by the replaced loss: 5.0 with policylab's default eps_high 0.28 disagrees
    with pytest.raises(PolicylabError, match=r"epsilon_high=5\.0 -> set method_params\['eps_high'\] \(TRL's CISPO "
                                             r"epsilon_high=5\.0 is policylab's cispo eps_high=4\)"):
        _trainer(tmp_path, tiny_model_dir, "cispo", {}, loss_type="cispo", epsilon_high=5.0)
    with pytest.raises(PolicylabError, match=r"loss_type='grpo' -> set the method itself"):
        _trainer(tmp_path, tiny_model_dir, "dapo", {}, loss_type="grpo")
    with pytest.raises(PolicylabError, match=r"beta=0\.1 -> set method_params\['kl_coef'\]"):
        _trainer(tmp_path, tiny_model_dir, "grpo", {}, beta=0.1, use_bias_correction_kl=False)
    with pytest.raises(PolicylabError, match=r"epsilon=0\.3 -> set method_params\['eps_low'\]"):
        _trainer(tmp_path, tiny_model_dir, "dapo", {}, epsilon=0.3)  # dapo's eps_low is 0.2
    with pytest.raises(PolicylabError, match=r"epsilon_high=0\.3"):  # tis has no TRL loss type: any change is dropped
        _trainer(tmp_path, tiny_model_dir, "tis", {}, epsilon_high=0.3, use_vllm=False)
    # the method's own values in TRL's terms are accepted
    _trainer(tmp_path, tiny_model_dir, "cispo", {"eps_high": 4.0}, loss_type="cispo", epsilon_high=5.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(method_params="x"), r"parameters of method `grpo` must be a mapping .* got str 'x'"),
    (dict(method=None), r"`method` must be a policylab method name .* got NoneType None"),
    (dict(method=3), r"got int 3"),
    (dict(method="grpoo"), r"unknown method 'grpoo'\. Did you mean: grpo"),
    (dict(method_params={1: 0.2}), r"parameter names of method `grpo` must be strings"),
])
def test_bad_method_arguments_give_one_policylab_error(tmp_path, tiny_model_dir, kwargs, match):
    kw = dict(method="grpo", method_params={}, model=str(tiny_model_dir), reward_funcs=[_reward],
              args=_config(tmp_path, use_bias_correction_kl=False), train_dataset=_dataset())
    kw.update(kwargs)
    with pytest.raises(PolicylabError, match=match):
        PT.PolicylabGRPOTrainer(**kw)


@pytest.mark.parametrize("method,params,trl_kw", [(m, p, {k: v for k, v in kw.items() if k != "beta"})
                                                  for m, p, kw in HAND_MAPPED[:4]])
def test_the_loss_equals_trl_loss_type_on_the_same_batch(tmp_path, tiny_model_dir, method, params, trl_kw):
    # TRL's default multiplies its KL by the ratio; grpo's k3 KL in the loss is plain
    trainer = _trainer(tmp_path, tiny_model_dir, method, params, use_bias_correction_kl=False, **trl_kw)
    assert trainer.beta == (0.04 if method == "grpo" else 0.0)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    inputs = _inputs(trainer)
    ours = _loss_and_grad(trainer._compute_loss, trainer, inputs)
    theirs = _loss_and_grad(lambda m, i: GRPOTrainer._compute_loss(trainer, m, i), trainer, inputs)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-4, atol=1e-7)
    assert float(ours[1].abs().sum()) > 0


def test_methods_trl_cannot_host_are_refused_naming_the_missing_role(tmp_path, tiny_model_dir):
    with pytest.raises(PolicylabError, match="round stage `zcpo_drift` needs the full-vocabulary entropy"):
        _trainer(tmp_path, tiny_model_dir, "zcpo")
    # GMC runs through the round extension, which reads the sampler's log-probs
    with pytest.raises(PolicylabError, match="reads logp_behavior"):
        _trainer(tmp_path, tiny_model_dir, "gmc")
    with pytest.raises(PolicylabError, match="reads logp_behavior"):
        _trainer(tmp_path, tiny_model_dir, "tis")
    with pytest.raises(PolicylabError, match="advantage `gae` reads `values`"):
        _trainer(tmp_path, tiny_model_dir, "ppo")
    with pytest.raises(PolicylabError, match="use_bias_correction_kl=False"):
        _trainer(tmp_path, tiny_model_dir, "grpo")
    # a TRL setting under which TRL would skip the replaced loss (its Liger path never calls
    # _compute_loss): refused before anything trains
    with pytest.raises(PolicylabError, match="would be ignored.*use_liger_kernel=True"):
        _trainer(tmp_path, tiny_model_dir, "cispo", use_liger_kernel=True)
    with pytest.raises(PolicylabError, match="has no parameter `eps_hi`"):
        _trainer(tmp_path, tiny_model_dir, "cispo", {"eps_hi": 0.3})
    assert "cispo" in PT.methods() and "gmc" in PT.methods() and "zcpo" not in PT.methods()


# reinforce_pp puts its KL in the reward (a round stage TRL has no hook for): run without it
@pytest.mark.parametrize("method,params", [("grpo", {}), ("gspo", {}), ("reinforce_pp", {"kl_coef": 0.0}),
                                           ("rloo", {})])
def test_a_short_real_training_run(tmp_path, tiny_model_dir, method, params):
    trainer = _trainer(tmp_path, tiny_model_dir, method, params, max_steps=2, use_bias_correction_kl=False)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    moved = [k for k, v in trainer.model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert moved, "no parameter changed"
    assert all(torch.isfinite(v).all() for v in trainer.model.parameters())
    logged = [h for h in trainer.state.log_history if "policylab/loss" in h]
    assert len(logged) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DATA_PARALLEL_METHODS = ("grpo", "dapo")


@pytest.fixture(scope="module")
def data_parallel_runs(tmp_path_factory, tiny_model_dir):
    """Both methods' one-process and two-process runs (trl_run.py), each set of processes
    running the methods one after the other: (prefix of the one-process run, of the two-process run)."""
    root = tmp_path_factory.mktemp("data-parallel")
    env = {**os.environ, "PYTHONPATH": str(HERE), "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}
    one, two = root / "one", root / "two"
    script, methods = str(HERE / "trl_run.py"), ",".join(DATA_PARALLEL_METHODS)
    # same global batch (16 completions per step): 1 process x 4 micro-batches of 4, 2 processes x 2 of 4
    subprocess.run([sys.executable, script, str(tiny_model_dir), str(one), "4", "4", methods], env=env, check=True,
                   timeout=600, capture_output=True)
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    # accelerate 1.15's `--cpu` runs one process unless MPI is set up; `--multi_gpu` starts two
    # processes with torchrun, and `use_cpu=True` in the config makes them CPU ranks over gloo
    run = subprocess.run([accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                          "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
                          str(_free_port()), script, str(tiny_model_dir), str(two), "4", "2", methods],
                         env=env, timeout=900, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    return one, two


@pytest.mark.distributed
@pytest.mark.xdist_group("trl_data_parallel")  # the methods share the module fixture's processes
@pytest.mark.parametrize("method", DATA_PARALLEL_METHODS)
def test_two_process_data_parallel_update_equals_one_process(data_parallel_runs, tiny_model_dir, method):
    from safetensors.torch import load_file

    from policylab.models import loading as models

    one, two = (Path(f"{p}.{method}") for p in data_parallel_runs)
    # the two ranks each generated for their half of the global batch
    halves = [Path(f"{two}.rollout{rank}").read_text().split("\n")[:-1] for rank in (0, 1)]
    assert len(halves[0]) == len(halves[1]) == 8, halves
    assert sorted(halves[0] + halves[1]) == sorted(Path(f"{one}.rollout0").read_text().split("\n")[:-1])
    assert not Path(f"{one}.rollout1").exists()
    a, b = load_file(f"{one}.safetensors"), load_file(f"{two}.safetensors")
    start = models.load_policy(str(tiny_model_dir))[0].state_dict()
    moved = 0.0
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
        moved += float((a[k] - start[k]).abs().sum())
    assert moved > 0  # the step changed the weights


# ----------------------------------------------------------------------------- logging, the README


def _fixed_rollout(batch_prompts, trainer):
    """Fixed completions per prompt and place in its group (TRL's rollout_func hook), so
    two runs with different batch splits see the same generation batch."""
    G = trainer.num_generations
    tok = trainer.processing_class
    comps = []
    for i, p in enumerate(batch_prompts):
        seed = sum(map(ord, p)) + 7 * (i % G)
        g = torch.Generator().manual_seed(seed)
        comps.append(torch.randint(10, 500, (3 + seed % 4,), generator=g).tolist())
    return {"prompt_ids": [tok(p)["input_ids"] for p in batch_prompts], "completion_ids": comps, "logprobs": None}


def _logged(tmp_path, tiny_model_dir, method, per_device, accumulation):
    cfg = _config(tmp_path / f"{per_device}x{accumulation}", per_device_train_batch_size=per_device,
                  gradient_accumulation_steps=accumulation, max_steps=1, shuffle_dataset=False,
                  use_bias_correction_kl=False, lr_scheduler_type="constant", warmup_steps=0)
    trainer = PT.PolicylabGRPOTrainer(method=method, model=str(tiny_model_dir), reward_funcs=[_reward], args=cfg,
                                      train_dataset=_dataset(2), rollout_func=_fixed_rollout)
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "policylab/loss" in h]
    return log["policylab/loss"], log["loss"]


# a per-row normalizer (rows x accumulation) and a token one; (grpo's loss is 0 here: ratio 1 and
# zero-mean group advantages in a sequence mean)
@pytest.mark.parametrize("method", ["dr_grpo", "dapo"])
def test_logged_loss_is_the_step_loss_with_and_without_gradient_accumulation(tmp_path, tiny_model_dir, method):
    # one optimizer step on the same 8 completions: one micro-batch of 8, or two of 4 accumulated
    ours_1, trl_1 = _logged(tmp_path, tiny_model_dir, method, 8, 1)
    ours_2, trl_2 = _logged(tmp_path, tiny_model_dir, method, 4, 2)
    assert abs(ours_1) > 1e-6  # not a comparison of zeros
    # TRL's `loss` is the sum of the micro-batches' shares: the whole batch's loss either way
    assert trl_2 == pytest.approx(trl_1, rel=1e-5, abs=1e-7)
    # policylab's logged loss means the same: the step's loss (it was the mean of the shares, half of it here)
    assert ours_1 == pytest.approx(trl_1, rel=1e-5, abs=1e-7)
    assert ours_2 == pytest.approx(trl_2, rel=1e-5, abs=1e-7)


def _readme_snippet() -> str:
    text = (HERE.parents[1] / "README.md").read_text()
    block = text.split("<!-- TRL-SNIPPET -->", 1)[1]
    return block.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_trl_snippet_runs_as_written_on_cpu(tmp_path, tiny_model_dir, monkeypatch):
    import policylab.models.loading as loading

    code = _readme_snippet()
    assert "PolicylabGRPOTrainer" in code and "use_cpu=not gpu" in code
    assert not torch.cuda.is_available()  # the point of the test: this machine has no GPU
    # the only substitution: the embedded SmolLM2 is replaced by the tiny random model
    monkeypatch.setattr(loading, "materialize_embedded", lambda *a, **k: tiny_model_dir)
    monkeypatch.chdir(tmp_path)
    losses = []  # policylab's loss ran (the random tiny model earns reward 0, so nothing moves)
    real = PT.PolicylabGRPOTrainer._compute_loss

    def spy(self, model, inputs):
        out = real(self, model, inputs)
        losses.append(float(out.detach()))
        return out

    monkeypatch.setattr(PT.PolicylabGRPOTrainer, "_compute_loss", spy)
    ns: dict = {"__name__": "readme_snippet"}
    exec(compile(code, "README.md:TRL-SNIPPET", "exec"), ns)
    trainer = ns["trainer"]
    assert trainer.state.global_step == 2 and trainer.args.use_cpu and not trainer.args.bf16
    assert trainer.policylab_method.name == "cispo" and trainer.policylab_method.p["eps_high"] == 0.28
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    assert (tmp_path / "out").is_dir()


def test_policylab_method_rewards_as_trl_reward_functions(tmp_path, tiny_model_dir):
    from policylab.integrations.rewards import trl_reward_func

    rlcr = trl_reward_func("rlcr")
    # hand-worked RLCR: R = c - (q - c)^2; no parseable confidence: c - 1
    got = rlcr(prompts=["p"] * 3, completions=["42 Confidence: 0.8", "41 Confidence: 0.9", "42"],
               answer=["42", "42", "42"])
    assert got == pytest.approx([0.96, -0.81, 0.0], abs=1e-6)
    # TTRL's majority vote within each group of num_generations (no gold read): groups [3,3,4,5], [7,8,8,8]
    ttrl = trl_reward_func("ttrl", num_generations=4)
    got = ttrl(prompts=["p"] * 8, completions=["3", "3", "4", "5", "7", "8", "8", "8"], answer=["0"] * 8)
    assert got == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    with pytest.raises(PolicylabError, match="no `answer` column"):
        rlcr(prompts=["p"], completions=["1"], solution=["1"])
    # inside a real PolicylabGRPOTrainer run (the tiny model's replies parse no confidence: c - 1)
    trainer = PT.PolicylabGRPOTrainer(method="rlcr", model=str(tiny_model_dir), reward_funcs=[rlcr],
                                      args=_config(tmp_path, max_steps=1),
                                      train_dataset=Dataset.from_list([{"prompt": "What is 2 + 2?", "answer": "4"}] * 8))
    trainer.train()
    assert trainer.state.global_step == 1
