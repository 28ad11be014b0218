"""Procedural arithmetic: "What is 3 × 4? Reply with only the number."

The prompt wording is the one the base model's reference accuracies were measured with. Multiplication
is written "×" by default (`times_symbol="*"` writes "*"); "+" and "-" as themselves.
Ops are named "+", "-", "*" ("×" is accepted as an alias of "*").

Operands: `digits = 1` uses 0..9; `digits = d > 1` uses 10^(d-1)..10^d − 1.

Train / held-out split. A problem belongs to the held-out split iff
    u = blake2b("{split_seed}:{op}:{x}:{y}") / 2^64 < heldout_fraction,
where (x, y) = (min(a, b), max(a, b)) for the commutative ops "+" and "*" and (a, b) for "-".
The split is a pure function of the problem, so no problem can be in both splits
(disjointness by construction, not by bookkeeping), and it depends on neither the
training `seed` nor the stream position. Keying commutative ops on the unordered pair puts
3 + 4 and 4 + 3 on the same side, so the held-out score does not reward memorizing a
twin. Single digits have only 100 ordered pairs per op (55 unordered for + and ×); with
ops (+, ×) there are 200 problems in all, so ≥ 200 distinct held-out prompts cannot
coexist with any training problem: `heldout_size()` gives the exact count (99 with the
defaults) and `heldout(n, repeat=True)` cycles through them when more prompts are wanted.

Train stream: position p (a counter) maps to a problem by hashing "(seed, p, attempt)" and
rejecting held-out problems, so the stream is infinite, i.i.d. over train problems, costs
O(1) per prompt, and its whole state is the integer p (`state_dict` / `load_state_dict`).
"""

from __future__ import annotations

import hashlib
from typing import Iterator

from policylab.errors import PolicylabError
from policylab.tasks.example import Example

PROMPT = "What is {a} {op} {b}? Reply with only the number."
_ENUMERATE_LIMIT = 200_000  # problems; above this the held-out set is sampled, not listed
_MAX_ATTEMPTS = 10_000


def hash_ints(text: str, count: int) -> list[int]:
    digest = hashlib.blake2b(text.encode(), digest_size=8 * count).digest()
    return [int.from_bytes(digest[8 * j : 8 * j + 8], "little") for j in range(count)]


class ArithmeticTask:
    """Seeded family of "a op b" problems with a disjoint held-out split.

    Args:
        ops: subset of ("+", "-", "*"); "×" means "*".
        digits: operand digits (1 -> 0..9).
        seed: train-stream seed (does not change the split).
        heldout_fraction: probability that a problem (unordered pair for + and *) is held out.
        split_seed: seed of the split; keep it fixed to compare runs on one held-out set.
        times_symbol: "×" or "*", how multiplication is written in the prompt.
    """

    def __init__(self, ops=("+", "*"), digits: int = 1, *, seed: int = 0,
                 heldout_fraction: float = 0.5, split_seed: int = 0, times_symbol: str = "×"):
        ops = tuple("*" if op == "×" else op for op in ops)
        if not ops or len(set(ops)) != len(ops) or not set(ops) <= {"+", "-", "*"}:
            raise PolicylabError(f"`ops` must be distinct ops from '+', '-', '*' (or '×'), got {ops}")
        if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 18:
            raise PolicylabError(f"`digits` must be an int in 1..18, got {digits!r}")
        if not 0.0 < heldout_fraction < 1.0:
            raise PolicylabError(f"`heldout_fraction` must be in (0, 1), got {heldout_fraction}")
        if times_symbol not in ("×", "*"):
            raise PolicylabError(f"`times_symbol` must be '×' or '*', got {times_symbol!r}")
        self.ops, self.digits, self.seed = ops, digits, int(seed)
        self.heldout_fraction, self.split_seed, self.times_symbol = heldout_fraction, int(split_seed), times_symbol
        self.lo = 0 if digits == 1 else 10 ** (digits - 1)
        self.hi = 10**digits - 1
        self.position = 0
        self._heldout_pool = self._enumerate_heldout() if self._space() <= _ENUMERATE_LIMIT else None
        if self._heldout_pool is not None and len(self._heldout_pool) in (0, self._space()):
            side = "held-out" if not self._heldout_pool else "train"
            raise PolicylabError(f"the {side} split is empty for {self._config()}; change heldout_fraction or split_seed")

    # ---- problems and the split -------------------------------------------------------
    def _space(self) -> int:
        return len(self.ops) * (self.hi - self.lo + 1) ** 2

    def _config(self) -> str:
        return (f"ops={self.ops}, digits={self.digits}, heldout_fraction={self.heldout_fraction}, "
                f"split_seed={self.split_seed}, times_symbol={self.times_symbol!r}")

    def is_heldout(self, op: str, a: int, b: int) -> bool:
        """The split rule (see module docstring)."""
        x, y = (min(a, b), max(a, b)) if op in ("+", "*") else (a, b)
        u = hash_ints(f"policylab-arith-split:{self.split_seed}:{op}:{x}:{y}", 1)[0] / 2**64
        return u < self.heldout_fraction

    def _example(self, op: str, a: int, b: int, split: str, **meta) -> Example:
        result = a + b if op == "+" else a - b if op == "-" else a * b
        shown = self.times_symbol if op == "*" else op
        return Example(PROMPT.format(a=a, op=shown, b=b), str(result),
                       {"op": op, "a": a, "b": b, "split": split, **meta})

    def _draw(self, tag: str, index: int, attempt: int) -> tuple[str, int, int]:
        h = hash_ints(f"{tag}:{index}:{attempt}", 3)
        width = self.hi - self.lo + 1
        return self.ops[h[0] % len(self.ops)], self.lo + h[1] % width, self.lo + h[2] % width

    # ---- train stream -----------------------------------------------------------------
    def _train_problem(self, position: int) -> tuple[str, int, int]:
        for attempt in range(_MAX_ATTEMPTS):
            op, a, b = self._draw(f"policylab-arith-train:{self.seed}", position, attempt)
            if not self.is_heldout(op, a, b):
                return op, a, b
        raise PolicylabError(f"no train problem found in {_MAX_ATTEMPTS} draws for {self._config()}")

    def train_prompts(self, n: int) -> list[Example]:
        """The next n train examples of the stream; advances the position by n."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PolicylabError(f"`n` must be an int >= 0, got {n!r}")
        out = []
        for _ in range(n):
            out.append(self._example(*self._train_problem(self.position), "train", position=self.position))
            self.position += 1
        return out

    def iter_train(self) -> Iterator[Example]:
        """Infinite train stream from the current position (advances it as it yields)."""
        while True:
            yield self.train_prompts(1)[0]

    def state_dict(self) -> dict:
        """Data position to checkpoint, with the config and seed it is valid for."""
        return {"position": self.position, "seed": self.seed, "config": self._config()}

    def load_state_dict(self, state: dict) -> None:
        """Resume the stream; refuses a state saved under another seed or task config."""
        if state.get("seed") != self.seed or state.get("config") != self._config():
            raise PolicylabError(
                f"task state was saved for seed={state.get('seed')!r}, {state.get('config')}; "
                f"this task has seed={self.seed}, {self._config()}"
            )
        position = state.get("position")
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise PolicylabError(f"task state has an invalid position {position!r}")
        self.position = position

    # ---- held-out split ---------------------------------------------------------------
    def _enumerate_heldout(self) -> list[tuple[str, int, int]]:
        pool = [(op, a, b) for op in self.ops for a in range(self.lo, self.hi + 1)
                for b in range(self.lo, self.hi + 1) if self.is_heldout(op, a, b)]
        # a fixed shuffled order, so heldout(n) for small n mixes ops and operands
        return sorted(pool, key=lambda p: hash_ints(f"policylab-arith-order:{self.split_seed}:{p}", 1)[0])

    def heldout_size(self) -> int | None:
        """Number of distinct held-out problems (None when the space is too large to list)."""
        return None if self._heldout_pool is None else len(self._heldout_pool)

    def heldout(self, n: int, *, repeat: bool = False) -> list[Example]:
        """The first n held-out examples in a fixed order (same for every train seed).

        Raises if n exceeds the number of distinct held-out problems, unless `repeat=True`,
        which cycles through them (meta["repeat"] counts the cycle).
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PolicylabError(f"`n` must be an int >= 0, got {n!r}")
        if self._heldout_pool is None:
            return [self._example(*p, "heldout", repeat=0) for p in self._sample_heldout(n)]
        size = len(self._heldout_pool)
        if n > size and not repeat:
            raise PolicylabError(
                f"only {size} distinct held-out problems exist for {self._config()}; asked for {n}. "
                "Pass repeat=True to cycle through them, or raise heldout_fraction / digits / ops."
            )
        return [self._example(*self._heldout_pool[j % size], "heldout", repeat=j // size) for j in range(n)]

    def _sample_heldout(self, n: int) -> list[tuple[str, int, int]]:
        """Distinct held-out problems by seeded rejection sampling (large spaces only)."""
        seen, out, index = set(), [], 0
        while len(out) < n:
            for attempt in range(_MAX_ATTEMPTS):
                problem = self._draw(f"policylab-arith-heldout:{self.split_seed}", index, attempt)
                if self.is_heldout(*problem):
                    break
            else:
                raise PolicylabError(f"no held-out problem found in {_MAX_ATTEMPTS} draws")
            index += 1
            if problem not in seen:
                seen.add(problem)
                out.append(problem)
        return out
