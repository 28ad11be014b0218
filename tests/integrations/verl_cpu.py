"""verl's actor on CPU, for the tests: verl 0.9.1 ships no CPU platform and registers its
FSDP engines for the devices "cuda" and "npu" only
(`verl/workers/engine/fsdp/transformer_impl.py`: `@EngineRegistry.register(...,
device=["cuda", "npu"])`; `verl/plugin/platform/platform_manager.py` falls back to
"nvidia" when no accelerator is found). Both registries are verl's documented extension
points for new hardware: this module registers a CPU platform (torch.cpu, gloo) and
verl's own FSDP engine classes under the device "cpu". Nothing of verl's training code
is replaced. Import it before anything imports `verl.workers` (the engine module reads
the device name at import), with VERL_PLATFORM=cpu in the environment."""

from __future__ import annotations

import os
import types
from contextlib import contextmanager

import torch

os.environ.setdefault("VERL_PLATFORM", "cpu")

from verl.plugin.platform.platform_base import PlatformBase  # noqa: E402
from verl.plugin.platform.platform_manager import PlatformRegistry  # noqa: E402


def _cpu_module() -> types.ModuleType:
    """torch.cpu plus the memory statistics verl logs (a CPU has no device allocator: 0)."""
    m = types.ModuleType("verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(m, name, getattr(torch.cpu, name))
    for stat in ("max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved"):
        setattr(m, stat, lambda *a, **k: 0)
    m.empty_cache = lambda: None
    m.manual_seed = torch.manual_seed
    m.manual_seed_all = torch.manual_seed
    m.is_available = lambda: True
    m.current_device = lambda: "cpu"
    m.device_count = lambda: 1
    m.set_device = lambda *_: None
    m.mem_get_info = lambda *a, **k: (0, 0)
    m.reset_peak_memory_stats = lambda *a, **k: None
    m.get_device_name = lambda *a, **k: "CPU"  # verl's flops table: no CPU entry (inf peak flops)
    return m


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    _module = _cpu_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return self._module

    def is_available(self) -> bool:
        return True

    def current_device(self):
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "POLICYLAB_CPU_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


def register_engines() -> None:
    """verl's own FSDP engine classes, registered for the device "cpu"."""
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        if EngineRegistry._engines.get(model_type, {}).get("fsdp", {}).get("cpu") is None:  # noqa: SLF001
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(cls)
