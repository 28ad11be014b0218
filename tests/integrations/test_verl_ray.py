"""The verl plug-in inside a Ray actor: a worker process that imports verl sees policylab's
losses and estimators without any policylab import of its own, and computes the same
loss as the driver."""

from __future__ import annotations

import pytest
from engines import require

require("verl")
ray = require("ray")

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@ray.remote(num_cpus=1)
class Worker:
    def registries(self):
        import sys

        from verl.trainer.ppo import core_algos

        return {"imported_by_verl": "policylab.integrations.verl" in sys.modules,
                "losses": sorted(k for k in core_algos.POLICY_LOSS_REGISTRY if k.startswith("policylab_")),
                "estimators": sorted(k for k in core_algos.ADV_ESTIMATOR_REGISTRY if k.startswith("policylab_"))}

    def loss(self, name, tensors):
        from verl.trainer.ppo import core_algos
        from verl.workers.config import ActorConfig, PolicyLossConfig

        cfg = ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2,
                          policy_loss=PolicyLossConfig(loss_mode=name))
        logp = tensors["logp"].clone().requires_grad_()
        loss, _ = core_algos.get_policy_loss_fn(name)(old_log_prob=tensors["old"], log_prob=logp,
                                                      advantages=tensors["adv"], response_mask=tensors["mask"],
                                                      loss_agg_mode="token-mean", config=cfg)
        loss.backward()
        return float(loss), logp.grad


def test_a_ray_actor_has_the_registries_and_the_same_loss(cluster):
    import torch
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig, PolicyLossConfig

    from policylab.integrations import hosting
    from policylab.integrations import verl as PV

    w = Worker.remote()
    got = ray.get(w.registries.remote())
    assert got["imported_by_verl"]
    assert got["losses"] == sorted(PV.loss_name(n) for n in hosting.hostable(PV.ENGINE))
    assert got["estimators"] == sorted(PV.REGISTERED["advantage_estimators"])

    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 5, generator=g, dtype=torch.float64) - 0.1
    tensors = {"old": old, "logp": old + 0.1 * torch.randn(4, 5, generator=g, dtype=torch.float64),
               "adv": torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64).unsqueeze(-1).expand(4, 5).clone(),
               "mask": torch.ones(4, 5, dtype=torch.bool)}
    remote_loss, remote_grad = ray.get(w.loss.remote("policylab_gppo", tensors))
    cfg = ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2,
                      policy_loss=PolicyLossConfig(loss_mode="policylab_gppo"))
    logp = tensors["logp"].clone().requires_grad_()
    loss, _ = core_algos.get_policy_loss_fn("policylab_gppo")(
        old_log_prob=old, log_prob=logp, advantages=tensors["adv"], response_mask=tensors["mask"],
        loss_agg_mode="token-mean", config=cfg)
    loss.backward()
    assert remote_loss == float(loss)
    torch.testing.assert_close(remote_grad, logp.grad, rtol=0, atol=0)
