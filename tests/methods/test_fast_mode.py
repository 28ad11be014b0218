"""The fast mode (`rollout.engine: fast-bf16`, policylab.methods.fast_mode): one setting
samples with the bf16 FastEngine, records its log-probs as μ and pairs the method with TIS
on the engine ratio; refused on a CPU without native bf16 (CPU flags monkeypatched)."""

import math

import pytest
import torch

from policylab import methods
from policylab.methods.fast_mode import CORRECTION_WHY, pair_correction, train_dtype
from policylab.engines import cpu
from policylab.errors import ConfigError
from policylab.methods.loss import policy_loss, tensor_inputs
from policylab.trainer.config import config_from_dict
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config

AVX2_ONLY = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma".split())
AMX = AVX2_ONLY | {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}


def test_other_engines_leave_the_method_unchanged():
    m = methods.get("grpo")
    for engine in ("auto", "fast", "hf"):
        assert pair_correction(m, engine) is m


def test_grpo_gets_tis_with_its_own_cap_parameter_and_header():
    m = pair_correction(methods.get("grpo"), "fast-bf16")
    assert [s.name for s in m.corrections] == ["tis"]
    assert m.p["tis_cap"] == 2.0
    assert "logp_old" in m.roles and "logp_behavior" in m.required_fields  # TIS reads π_old (in the step when single)
    assert m.old_readers_before_update == ()
    labels = dict(line(m.p) for line in m.header)
    assert "TIS" in labels["mismatch"] and CORRECTION_WHY in labels["mismatch"]
    assert "fast mode" in m.card.summary and "fast-bf16" in m.card.samples
    # the cap is a typed parameter of the paired method
    assert m.with_params({"tis_cap": 3.0}).p["tis_cap"] == 3.0
    with pytest.raises(ValueError, match="tis_cap"):
        methods.get("grpo").with_params({"tis_cap": 3.0})  # not a grpo parameter outside the fast mode


def test_paired_loss_is_the_host_loss_times_the_truncated_engine_ratio():
    """Hand-worked (fp64): on-policy (logp = logp_old, ratio 1), A = 1 on three tokens.
    log k = logp_old - logp_mu = 0.5, 1.0, -0.3  ->  k = 1.6487, 2.7183, 0.7408;
    min(k, 2) = 1.6487, 2 (capped), 0.7408. PPO clip at ratio 1: loss = -A * 1 = -1 per
    token, so the paired loss is -w per token."""
    lp_old = torch.tensor([[-1.0, -0.2, -2.0]], dtype=torch.float64)
    lp_mu = torch.tensor([[-1.5, -1.2, -1.7]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.ones(1, dtype=torch.float64)
    host = methods.get("grpo").with_params({"kl_coef": 0.0})
    paired = pair_correction(methods.get("grpo"), "fast-bf16").with_params({"kl_coef": 0.0})
    inp = tensor_inputs(lp_old.clone().requires_grad_(), adv, mask, logp_old=lp_old, logp_behavior=lp_mu)
    base, _ = policy_loss(host, inp)
    loss, metrics = policy_loss(paired, inp)
    w = torch.tensor([[math.exp(0.5), 2.0, math.exp(-0.3)]], dtype=torch.float64)
    torch.testing.assert_close(base, -torch.ones(1, 3, dtype=torch.float64))
    torch.testing.assert_close(loss, -w)
    # naive reference: per token, min(exp(old - mu), C) times the host's loss
    naive = torch.tensor([[min(math.exp(o - u), 2.0) * b for o, u, b in zip(lp_old[0].tolist(), lp_mu[0].tolist(),
                                                                             base[0].tolist())]], dtype=torch.float64)
    torch.testing.assert_close(loss, naive)
    assert float(metrics["correction/tis/frac_capped"]) == pytest.approx(1 / 3)


def test_a_method_with_its_own_correction_keeps_it():
    for name in ("tis", "icepop", "gmc", "sis"):
        m0 = methods.get(name)
        m = pair_correction(m0, "fast-bf16")
        assert m.corrections == m0.corrections
        assert "own engine-ratio correction" in dict(line(m.p) for line in m.header)["mismatch"]


def test_a_method_with_another_source_is_refused():
    with pytest.raises(ConfigError, match="luffy's samples come from its own source"):
        pair_correction(methods.get("luffy"), "fast-bf16")


def test_config_makes_it_a_bf16_engine_and_refuses_a_contradiction(small_model_dir, tmp_path):
    cfg = tiny_config(small_model_dir, tmp_path / "r", rollout={"engine": "fast-bf16"})
    assert cfg.rollout.engine_dtype == "bf16"
    with pytest.raises(ConfigError, match="contradicts"):
        tiny_config(small_model_dir, tmp_path / "r", rollout={"engine": "fast-bf16", "engine_dtype": "int8"})
    with pytest.raises(ConfigError, match="fast-bf16"):
        config_from_dict({"rollout": {"engine": "fast-fp8"}})


def test_trainer_step_samples_with_bf16_and_corrects(small_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: AMX)
    tr = Trainer(tiny_config(small_model_dir, tmp_path / "r", rollout={"engine": "fast-bf16", "group_size": 4}))
    assert tr.engine.engine_name == "fast-bf16" and tr.engine.dtype == torch.bfloat16
    assert next(tr.model.parameters()).dtype == torch.float32  # fp32 master weights
    assert not tr.needs_old_pass()  # one update per batch: π_old is the training forward (test_old_from_forward)
    m = tr.train_step()
    assert m["mismatch/old_vs_behavior_abs_dlogp_mean"] > 1e-4  # a real mismatch, measured in the step
    assert "correction/tis/ess" in m and 0.0 < m["correction/tis/ess"] <= 1.0


def test_refused_on_a_host_without_native_bf16(small_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: AVX2_ONLY)
    cfg = tiny_config(small_model_dir, tmp_path / "r", rollout={"engine": "fast-bf16"})
    with pytest.raises(cpu.UnsupportedHost, match="avx512_bf16 or amx_bf16.*avx2 fma.*emulated"):
        Trainer(cfg)


def test_train_dtype_auto_follows_the_engine_the_cpu_and_the_measurement(tiny_model_dir, tmp_path, monkeypatch):
    """train.dtype: auto is fp32 in exact mode; under the fast mode, only where the CPU has
    native bf16, bf16 if its measured forward error allowed it (it does not), else
    bf16-backward if its measured gradient error allows it (it does); an explicit value
    is kept."""
    from policylab.methods import fast_mode

    assert fast_mode.BF16_TRAINING_ALLOWED is False  # the measured verdicts (fast_mode_error.md)
    assert fast_mode.BF16_BACKWARD_ALLOWED is True
    assert train_dtype("fast-bf16", AMX) == "bf16-backward" and train_dtype("fast-bf16", AVX2_ONLY) == "fp32"
    monkeypatch.setattr(fast_mode, "BF16_BACKWARD_ALLOWED", False)  # the rule had the gradient failed
    assert train_dtype("fast-bf16", AMX) == "fp32"
    monkeypatch.setattr(fast_mode, "BF16_TRAINING_ALLOWED", True)  # the rule had the forward passed
    assert train_dtype("fast-bf16", AMX) == "bf16" and train_dtype("fast-bf16", AVX2_ONLY) == "fp32"
    assert train_dtype("fast", AMX) == "fp32" and train_dtype("auto", AMX) == "fp32"
    for flags, want in ((AMX, "bf16"), (AVX2_ONLY, "fp32")):
        monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO, f=flags: f)
        assert tiny_config(tiny_model_dir, tmp_path / "r", rollout={"engine": "fast-bf16"}).train.dtype == want
        assert tiny_config(tiny_model_dir, tmp_path / "r").train.dtype == "fp32"
        assert tiny_config(tiny_model_dir, tmp_path / "r", rollout={"engine": "fast-bf16"},
                           train={"dtype": "fp32"}).train.dtype == "fp32"
    with pytest.raises(ConfigError, match="train.dtype 'fp16' is not one of auto, fp32, bf16, bf16-backward, fp64"):
        tiny_config(tiny_model_dir, tmp_path / "r", train={"dtype": "fp16"})


def test_fast_mode_trains_bf16_with_fp32_master_weights_and_says_so(tiny_model_dir, tmp_path, monkeypatch):
    from policylab.trainer.report import summary

    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: AMX)
    assert Trainer(tiny_config(tiny_model_dir, tmp_path / "a", rollout={"engine": "fast-bf16"})).cfg.train.dtype \
        == "bf16-backward"  # auto, today's verdicts
    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "r", rollout={"engine": "fast-bf16", "group_size": 4},
                             train={"dtype": "bf16"}))
    assert tr.cfg.train.dtype == "bf16" and tr.worker.dtype == "bf16"
    m = tr.train_step()
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    assert math.isfinite(m["loss/policy"]) and "correction/tis/ess" in m
    head = summary(tr).splitlines()[0]
    assert "bf16 training: decoder body in bf16 autocast, head, log-softmax and ratios in fp32" in head


def test_fast_mode_auto_trains_bf16_backward_and_says_so(tiny_model_dir, tmp_path, monkeypatch):
    """What auto picks today on a CPU with native bf16: a real step runs in the
    bf16-backward region (linear calls routed), fp32 master weights, TIS on, and the run
    header names the numerics."""
    from policylab.models import bf16_backward
    from policylab.trainer.report import summary

    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: AMX)
    routed = []
    orig = bf16_backward.Bf16Backward.__exit__

    def spy(self, *exc):
        routed.append(self.calls)
        return orig(self, *exc)

    monkeypatch.setattr(bf16_backward.Bf16Backward, "__exit__", spy)
    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "r", rollout={"engine": "fast-bf16", "group_size": 4}))
    assert tr.cfg.train.dtype == "bf16-backward" and tr.worker.dtype == "bf16-backward"
    m = tr.train_step()
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    assert math.isfinite(m["loss/policy"]) and "correction/tis/ess" in m
    assert m.get("skipped_no_signal", 0.0) == 0.0  # this seed's batch has signal (parity reward, mixed groups)
    assert routed and max(routed) > 0  # the step's linear layers ran through the region
    assert "bf16-backward training: every forward value (log-probs, ratios, loss) in fp32" in summary(tr).splitlines()[0]
