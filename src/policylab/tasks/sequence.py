"""Procedural number sequences: "What number comes next: 3, 5, 7, 9? Reply with only the number."

A second task domain next to arithmetic (the fusion pipeline trains and reports per
domain). A problem is an arithmetic progression (start s, step d) shown by its first four
terms; the answer is s + 4·d. Starts 0..19, steps 1..9: 180 problems.

Train / held-out split, as in `tasks.arithmetic`: a problem is held out iff
blake2b("{split_seed}:{s}:{d}") / 2^64 < heldout_fraction, a pure function of the
problem, so the two splits are disjoint by construction. The train stream maps position p
to a problem by hashing (seed, p, attempt) and rejecting held-out ones; its state is p.
"""

from __future__ import annotations

from policylab.errors import PolicylabError
from policylab.tasks.arithmetic import hash_ints
from policylab.tasks.example import Example

PROMPT = "What number comes next: {terms}? Reply with only the number."
STARTS, STEPS = range(0, 20), range(1, 10)


class SequenceTask:
    def __init__(self, *, seed: int = 0, heldout_fraction: float = 0.5, split_seed: int = 0):
        if not 0.0 < heldout_fraction < 1.0:
            raise PolicylabError(f"`heldout_fraction` must be in (0, 1), got {heldout_fraction}")
        self.seed, self.heldout_fraction, self.split_seed = int(seed), heldout_fraction, int(split_seed)
        self.position = 0
        self._held = sorted(((s, d) for s in STARTS for d in STEPS if self.is_heldout(s, d)),
                            key=lambda p: hash_ints(f"policylab-seq-order:{self.split_seed}:{p}", 1)[0])

    def is_heldout(self, s: int, d: int) -> bool:
        return hash_ints(f"policylab-seq-split:{self.split_seed}:{s}:{d}", 1)[0] / 2**64 < self.heldout_fraction

    def _example(self, s: int, d: int, split: str, **meta) -> Example:
        terms = ", ".join(str(s + k * d) for k in range(4))
        return Example(PROMPT.format(terms=terms), str(s + 4 * d),
                       {"start": s, "step": d, "split": split, "domain": "sequence", **meta})

    def _config(self) -> str:
        return f"sequence heldout_fraction={self.heldout_fraction}, split_seed={self.split_seed}"

    def train_prompts(self, n: int) -> list[Example]:
        out = []
        for _ in range(n):
            for attempt in range(10_000):
                h = hash_ints(f"policylab-seq-train:{self.seed}:{self.position}:{attempt}", 2)
                s, d = STARTS[h[0] % len(STARTS)], STEPS[h[1] % len(STEPS)]
                if not self.is_heldout(s, d):
                    break
            else:
                raise PolicylabError("no train problem found")
            out.append(self._example(s, d, "train", position=self.position))
            self.position += 1
        return out

    def heldout_size(self) -> int:
        return len(self._held)

    def heldout(self, n: int, *, repeat: bool = False) -> list[Example]:
        if n > len(self._held) and not repeat:
            raise PolicylabError(f"only {len(self._held)} distinct held-out sequence problems; pass repeat=True")
        return [self._example(*self._held[j % len(self._held)], "heldout", repeat=j // len(self._held))
                for j in range(n)]

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed, "config": self._config()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed") != self.seed or state.get("config") != self._config():
            raise PolicylabError(f"task state was saved for seed={state.get('seed')!r}, {state.get('config')}")
        self.position = int(state["position"])
