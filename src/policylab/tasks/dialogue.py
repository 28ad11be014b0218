"""A two-turn arithmetic dialogue: the second question builds on the first answer.

    user:      What is 3 + 4? Reply with only the number.
    assistant: 7
    user:      Now multiply that by 5. Reply with only the number.
    assistant: 35

An example holds the first user message as `prompt`, the follow-up user messages in
`meta["turns"]` (played by a multi-turn source after each assistant reply), the answer of
every turn in `meta["turn_answers"]` and the final answer as `answer` (what the verifier
checks against the last assistant turn: `exact_numeric` works as is).

Problems: a, b in 0..9 (10^(d-1)..10^d − 1 for `digits` = d), the second operation "+" ("Now
add c to that.") or "*" ("Now multiply that by c."), c in 2..9. Train / held-out split as
in `ArithmeticTask`: a problem is held out iff
    blake2b("{split_seed}:{min(a,b)}:{max(a,b)}:{op2}:{c}") / 2^64 < heldout_fraction,
a pure function of the problem (the first sum keyed on the unordered pair, so 3 + 4 and
4 + 3 fall on the same side): no problem is in both splits, whatever the training seed.
The held-out problems are listed in a fixed shuffled order; the train stream hashes
(seed, position, attempt) and rejects held-out problems, so its state is one integer.
"""

from __future__ import annotations

from policylab.errors import PolicylabError
from policylab.tasks.arithmetic import hash_ints
from policylab.tasks.example import Example

FIRST = "What is {a} + {b}? Reply with only the number."
SECOND = {"+": "Now add {c} to that. Reply with only the number.",
          "*": "Now multiply that by {c}. Reply with only the number."}
_C = tuple(range(2, 10))
_MAX_ATTEMPTS = 10_000


class TwoTurnArithmeticTask:
    """Seeded two-turn problems with a disjoint held-out split (see the module doc)."""

    def __init__(self, digits: int = 1, *, seed: int = 0, second_ops=("+", "*"), heldout_fraction: float = 0.5,
                 split_seed: int = 0):
        second_ops = tuple("*" if o == "×" else o for o in second_ops)
        if not second_ops or not set(second_ops) <= set(SECOND) or len(set(second_ops)) != len(second_ops):
            raise PolicylabError(f"`second_ops` must be distinct ops from '+', '*', got {second_ops}")
        if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 3:
            raise PolicylabError(f"`digits` must be an int in 1..3, got {digits!r}")
        if not 0.0 < heldout_fraction < 1.0:
            raise PolicylabError(f"`heldout_fraction` must be in (0, 1), got {heldout_fraction}")
        self.digits, self.seed, self.second_ops = digits, int(seed), second_ops
        self.heldout_fraction, self.split_seed = heldout_fraction, int(split_seed)
        self.lo = 0 if digits == 1 else 10 ** (digits - 1)
        self.hi = 10**digits - 1
        self.position = 0
        self._pool = sorted(
            [(a, b, o, c) for a in range(self.lo, self.hi + 1) for b in range(self.lo, self.hi + 1)
             for o in second_ops for c in _C if self.is_heldout(a, b, o, c)],
            key=lambda p: hash_ints(f"policylab-dialogue-order:{self.split_seed}:{p}", 1)[0])
        total = (self.hi - self.lo + 1) ** 2 * len(second_ops) * len(_C)
        if len(self._pool) in (0, total):
            raise PolicylabError(f"the {'held-out' if not self._pool else 'train'} split is empty for {self._config()}")

    def _config(self) -> str:
        return (f"digits={self.digits}, second_ops={self.second_ops}, heldout_fraction={self.heldout_fraction}, "
                f"split_seed={self.split_seed}")

    def is_heldout(self, a: int, b: int, op: str, c: int) -> bool:
        x, y = min(a, b), max(a, b)
        u = hash_ints(f"policylab-dialogue-split:{self.split_seed}:{x}:{y}:{op}:{c}", 1)[0] / 2**64
        return u < self.heldout_fraction

    def _example(self, a: int, b: int, op: str, c: int, split: str, **meta) -> Example:
        first = a + b
        final = first + c if op == "+" else first * c
        return Example(FIRST.format(a=a, b=b), str(final),
                       {"turns": [SECOND[op].format(c=c)], "turn_answers": [str(first), str(final)],
                        "a": a, "b": b, "op2": op, "c": c, "split": split, **meta})

    def _train_problem(self, position: int):
        width = self.hi - self.lo + 1
        for attempt in range(_MAX_ATTEMPTS):
            h = hash_ints(f"policylab-dialogue-train:{self.seed}:{position}:{attempt}", 4)
            p = (self.lo + h[0] % width, self.lo + h[1] % width, self.second_ops[h[2] % len(self.second_ops)],
                 _C[h[3] % len(_C)])
            if not self.is_heldout(*p):
                return p
        raise PolicylabError(f"no train problem found in {_MAX_ATTEMPTS} draws for {self._config()}")

    def train_prompts(self, n: int) -> list[Example]:
        """The next n train examples; advances the position by n."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PolicylabError(f"`n` must be an int >= 0, got {n!r}")
        out = []
        for _ in range(n):
            out.append(self._example(*self._train_problem(self.position), "train", position=self.position))
            self.position += 1
        return out

    def heldout_size(self) -> int:
        return len(self._pool)

    def heldout(self, n: int, *, repeat: bool = False) -> list[Example]:
        """The first n held-out examples in a fixed order (`repeat` cycles past the pool)."""
        if n > len(self._pool) and not repeat:
            raise PolicylabError(f"only {len(self._pool)} distinct held-out problems exist for {self._config()}; "
                                 f"asked for {n}. Pass repeat=True to cycle through them.")
        return [self._example(*self._pool[j % len(self._pool)], "heldout", repeat=j // len(self._pool))
                for j in range(n)]

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed, "config": self._config()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed") != self.seed or state.get("config") != self._config():
            raise PolicylabError(f"task state was saved for seed={state.get('seed')!r}, {state.get('config')}; "
                                 f"this task has seed={self.seed}, {self._config()}")
        position = state.get("position")
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise PolicylabError(f"task state has an invalid position {position!r}")
        self.position = position
