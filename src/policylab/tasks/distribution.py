"""Draw from a stated distribution: replies whose class frequencies should match a target.

Prompt families (each prompt states its distribution; the reply must name one outcome):

    coin    "A coin lands heads with probability 30%. Toss it once and reply with only the
             result: heads or tails."                          classes heads, tails
    bag     "A bag holds 2 red, 1 blue and 3 green marbles. Draw one at random and reply
             with only its colour: red, blue or green."        classes red, blue, green
    die     "Roll a fair 4-sided die and reply with only the number it shows."  1 .. n

Each example's `meta` holds `classes` (the named outcomes), `target` (p* over the
classes plus a last entry 0.0 for the explicit `invalid` class) and `mapper` (how a reply
maps to a class, `rewards.distribution.map_class`: `exact` or `single_mention`); `answer`
holds the allowed outcomes as "heads|tails" for the verifier
`rewards.distribution.valid_outcome_reward` (1.0 iff the reply names exactly one outcome). There is no single correct reply: the
task is calibration of the group's frequencies (`mad_rl`).

Split: a prompt is held out iff blake2b("policylab-dist-split:{key}") / 2^64 < 0.3, a
function of the prompt alone (disjoint by construction). The train stream cycles over the
train prompts in a seeded order per epoch.
"""

from __future__ import annotations

import hashlib
import random

from policylab.errors import PolicylabError
from policylab.kernels.rewards.distribution import MAPPERS
from policylab.tasks.example import Example


def _problems() -> list[tuple[str, str, list[str], list[float]]]:
    out = []
    for pct in range(10, 100, 10):
        out.append((f"coin:{pct}", f"A coin lands heads with probability {pct}%. Toss it once and reply with only "
                    "the result: heads or tails.", ["heads", "tails"], [pct / 100, 1 - pct / 100]))
    for r in range(1, 5):
        for b in range(1, 5):
            for g in range(1, 5):
                n = r + b + g
                out.append((f"bag:{r}:{b}:{g}", f"A bag holds {r} red, {b} blue and {g} green marbles. Draw one "
                            "at random and reply with only its colour: red, blue or green.",
                            ["red", "blue", "green"], [r / n, b / n, g / n]))
    for sides in (2, 3, 4, 6):
        out.append((f"die:{sides}", f"Roll a fair {sides}-sided die and reply with only the number it shows.",
                    [str(k) for k in range(1, sides + 1)], [1 / sides] * sides))
    return out


PROBLEMS = _problems()


def _hash01(text: str) -> float:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") / 2**64


class DistributionTask:
    def __init__(self, *, seed: int = 0, heldout_fraction: float = 0.3, mapper: str = "exact"):
        if not 0.0 < heldout_fraction < 1.0:
            raise PolicylabError(f"`heldout_fraction` must be in (0, 1), got {heldout_fraction}")
        if mapper not in MAPPERS:
            raise PolicylabError(f"`mapper` must be one of {MAPPERS}, got {mapper!r}")
        self.seed, self.heldout_fraction, self.mapper = int(seed), float(heldout_fraction), mapper
        self.train = [p for p in PROBLEMS if not self.is_heldout(p[0])]
        self.held = [p for p in PROBLEMS if self.is_heldout(p[0])]
        self.position = 0

    def is_heldout(self, key: str) -> bool:
        return _hash01(f"policylab-dist-split:{key}") < self.heldout_fraction

    def example(self, problem, split: str, **meta) -> Example:
        key, prompt, classes, target = problem
        return Example(prompt, "|".join(classes), {"key": key, "classes": list(classes), "mapper": self.mapper,
                                                   "target": [*target, 0.0], "split": split, **meta})

    @staticmethod
    def reference_reply(example: Example) -> str:
        """A reply the verifier must accept: one of the example's outcomes, alone."""
        return example.meta["classes"][0]

    def train_prompts(self, n: int) -> list[Example]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.train))
            order = list(range(len(self.train)))
            random.Random(f"policylab-dist-train:{self.seed}:{epoch}").shuffle(order)
            out.append(self.example(self.train[order[i]], "train", position=self.position))
            self.position += 1
        return out

    def heldout_size(self) -> int:
        return len(self.held)

    def heldout(self, n: int, *, repeat: bool = False) -> list[Example]:
        if n > len(self.held) and not repeat:
            raise PolicylabError(f"only {len(self.held)} held-out distribution prompts; asked for {n}")
        return [self.example(self.held[j % len(self.held)], "heldout", repeat=j // len(self.held))
                for j in range(n)]

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed") != self.seed:
            raise PolicylabError(f"distribution task state was saved for seed {state.get('seed')}, this is {self.seed}")
        self.position = int(state["position"])
