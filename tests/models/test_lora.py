"""LoRA through PEFT: only adapter weights train; the base weights stay bit-identical."""

import pytest
import torch

pytest.importorskip("peft")

from policylab.trainer.loop import Trainer  # noqa: E402

from trainer_utils import tiny_config  # noqa: E402


def test_lora_step_moves_only_adapters(tiny_model_dir, tmp_path):
    tr = Trainer(tiny_config(tiny_model_dir, tmp_path / "r", train={"lora_rank": 4, "lr": 1e-2}))
    base = {k: v.clone() for k, v in tr.model.state_dict().items() if "lora_" not in k}
    lora = {k: v.clone() for k, v in tr.model.state_dict().items() if "lora_" in k}
    assert lora, "no LoRA parameters were created"
    m = tr.train_step()
    assert m["skipped_nonfinite"] == 0.0
    after = tr.model.state_dict()
    for k, v in base.items():
        assert torch.equal(after[k], v), k
    assert any(not torch.equal(after[k], v) for k, v in lora.items())
    assert tr.save().exists()
