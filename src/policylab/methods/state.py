"""Per-run state objects of methods that are not kernels of their own: a seeded
generator that checkpoints its position. (The EMA scale lives with REINFORCE++ in
`advantages.reinforce_pp`, the single-use ledger with Online IcePop in `corrections`.)"""

from __future__ import annotations

import torch


class SeededGenerator:
    """A torch.Generator owned by a method (e.g. SIS's acceptance draws), seeded once per
    run; its state is saved in checkpoints so a resumed run draws the same numbers."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(int(seed))

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"])
