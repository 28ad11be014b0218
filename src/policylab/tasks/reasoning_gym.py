"""Optional adapter for the `reasoning-gym` procedural datasets (`pip install reasoning-gym`).

`reasoning_gym` is imported inside `load_reasoning_gym`, so policylab does not depend on it.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable, Sequence

from policylab.errors import PolicylabError, ShapeError
from policylab.tasks.example import Example

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def answer_tag_or_reply(completion: str) -> str | None:
    """Text of the last <answer>...</answer> tag if there is one, else the whole reply,
    stripped; None for an empty reply."""
    tags = _ANSWER_TAG.findall(completion)
    text = (tags[-1] if tags else completion).strip()
    return text or None


def load_reasoning_gym(
    name: str,
    *,
    size: int,
    seed: int,
    extract: Callable[[str], str | None] = answer_tag_or_reply,
    **config: Any,
) -> tuple[list[Example], Callable[..., list[float]]]:
    """`size` examples of reasoning-gym dataset `name` and a reward function that scores them.

    Examples: prompt = the dataset's question (no format instruction added; if the replies
    should use <answer> tags, say so in a system prompt, e.g. reasoning_gym.utils.SYSTEM_PROMPTS),
    answer = the reference answer as text, or "" for datasets that have no single
    reference answer (any valid solution counts; only the scorer can judge those), meta =
    {"entry": the full reasoning-gym entry, "dataset": name, "index": i}.

    Scorer: `score(completions, answers, *, metas, **_) -> [B] floats`, where metas are the
    examples' `meta` dicts (pass `context={"metas": [...]}` to `combine_rewards`). It
    extracts the reply's answer with `extract` and calls the dataset's own
    `score_answer(answer, entry)`, which reads the gold from the entry (so `answers` is
    only length-checked). Scores are the dataset's, usually in [0, 1] with partial credit.

    Extra keyword arguments are passed to `reasoning_gym.create_dataset` (dataset config).
    """
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(
            "load_reasoning_gym needs the optional `reasoning-gym` package: pip install reasoning-gym"
        ) from exc
    known = sorted(getattr(getattr(reasoning_gym, "factory", None), "DATASETS", {}) or [])
    if known and name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise PolicylabError(f"unknown reasoning-gym dataset {name!r}{hint} ({len(known)} datasets exist)")
    dataset = reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
    examples = []
    for i in range(len(dataset)):
        entry = dataset[i]
        answer = "" if entry.get("answer") is None else str(entry["answer"])
        examples.append(Example(str(entry["question"]), answer, {"entry": entry, "dataset": name, "index": i}))

    def score(completions: Sequence[str], answers: Sequence[Any], *, metas: Sequence[dict], **_: Any) -> list[float]:
        if not len(completions) == len(answers) == len(metas):
            raise ShapeError(
                f"completions ({len(completions)}), answers ({len(answers)}) and metas ({len(metas)}) differ in length"
            )
        out = []
        for i, (completion, meta) in enumerate(zip(completions, metas)):
            if not isinstance(meta, dict) or meta.get("dataset") != name or "entry" not in meta:
                raise PolicylabError(f"metas[{i}] is not an example meta of reasoning-gym dataset {name!r}")
            out.append(float(dataset.score_answer(answer=extract(completion), entry=meta["entry"])))
        return out

    score.__name__ = f"reasoning_gym_{name}"
    return examples, score


# ------------------------------------------------------------------ train stream + held-out split

_CHUNK = 1000  # items per generated reasoning-gym dataset object (each item is its own seeded draw)
_MAX_SCAN = 200_000  # raw draws searched before a split is declared (nearly) empty


def last_number(completion: str) -> str | None:
    """The last number written in the reply (`rewards.verifiers.extract_last_number`), for
    datasets whose reference answer is a number and a model that does not use tags."""
    from policylab.kernels.rewards.verifiers import extract_last_number

    return extract_last_number(completion)


EXTRACTORS: dict[str, Callable[[str], str | None]] = {"answer_tag": answer_tag_or_reply, "last_number": last_number}


def _unit_hash(text: str) -> float:
    import hashlib

    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") / 2**64


class ReasoningGymTask:
    """One reasoning-gym dataset as an infinite, resumable train stream with a disjoint
    held-out split, and a verifier that is the dataset's own scorer.

    Problems. reasoning-gym draws item i of a dataset with seed s from its own seeded
    generator, so items are generated on demand. Raw item j of stream `tag` is item
    j mod 1000 of the dataset made with seed blake2b("{tag}:{j // 1000}") (1000 items per
    dataset object; the dataset config is `config`).

    Split. A problem is held out iff blake2b("{split_seed}:{dataset}:{question}") / 2^64
    < heldout_fraction: a pure function of the question text, so no held-out question is
    ever a training question (by construction; two raw draws that happen to produce the
    same question land on the same side), whatever the seeds and stream positions.

    Train stream (seed `seed`): raw draws of stream "train:{seed}" in order, held-out
    problems skipped; its whole state is the raw position (`state_dict`). Held-out split:
    the distinct held-out problems of stream "heldout:{split_seed}" in order, the same for
    every training seed; `heldout(n)` cycles through them (meta["repeat"]) when fewer
    than n distinct ones exist within 200,000 raw draws.

    Examples: prompt = the question + `prompt_suffix`; answer = a `Gold` string (the
    reference answer, "" for datasets without a single one) whose `.meta` holds
    {"entry": the full reasoning-gym entry, "dataset", "split", ...}, so the verifier
    reaches the entry on every scoring path.

    Verifier `score(completions, answers, **context)`: `extract(reply)` (EXTRACTORS:
    "answer_tag" = the last <answer> tag, else the whole reply; "last_number"), then the
    dataset's own `score_answer(answer, entry)`; the dataset's scale (usually 0/1, some
    give partial credit in [0, 1]).
    """

    def __init__(self, dataset: str, *, seed: int, config: dict | None = None, heldout_fraction: float = 0.5,
                 split_seed: int = 0, prompt_suffix: str = "", extract: str = "answer_tag"):
        try:
            import reasoning_gym
        except ImportError as exc:
            raise ImportError("task.name=reasoning_gym needs the optional `reasoning-gym` package: "
                              "pip install reasoning-gym") from exc
        known = sorted(getattr(getattr(reasoning_gym, "factory", None), "DATASETS", {}) or [])
        if not dataset:
            raise PolicylabError("a reasoning-gym task needs a dataset name (task.dataset), e.g. chain_sum; "
                                 f"{len(known)} datasets exist")
        if known and dataset not in known:
            close = difflib.get_close_matches(dataset, known, n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise PolicylabError(f"unknown reasoning-gym dataset {dataset!r}{hint} ({len(known)} datasets exist)")
        if not 0.0 < heldout_fraction < 1.0:
            raise PolicylabError(f"`heldout_fraction` must be in (0, 1), got {heldout_fraction}")
        if extract not in EXTRACTORS:
            raise PolicylabError(f"`extract` must be one of {', '.join(EXTRACTORS)}, got {extract!r}")
        self._rg = reasoning_gym
        self.dataset, self.seed, self.config = dataset, int(seed), dict(config or {})
        self.heldout_fraction, self.split_seed = float(heldout_fraction), int(split_seed)
        self.prompt_suffix, self.extract_name = prompt_suffix, extract
        self.extract = EXTRACTORS[extract]
        self.position = 0
        self._chunks: dict[tuple[str, int], Any] = {}
        self._heldout: list[Example] = []
        self._heldout_scanned = 0
        self._heldout_seen: set[str] = set()
        try:  # the scorer, and a config the dataset refuses, now rather than at the first step
            self._scorer = reasoning_gym.create_dataset(dataset, size=1, seed=0, **self.config)
        except (TypeError, ValueError, AssertionError) as exc:
            raise PolicylabError(f"reasoning-gym dataset {dataset!r} refuses config {self.config}: "
                                 f"{type(exc).__name__}: {exc}") from None
        self.score = self._make_scorer()

    # ---- problems -----------------------------------------------------------------------
    def _describe(self) -> str:
        return (f"dataset={self.dataset}, config={self.config}, heldout_fraction={self.heldout_fraction}, "
                f"split_seed={self.split_seed}, prompt_suffix={self.prompt_suffix!r}")

    def _raw(self, tag: str, j: int) -> dict:
        c, i = divmod(j, _CHUNK)
        key = (tag, c)
        ds = self._chunks.get(key)
        if ds is None:
            if len(self._chunks) > 8:
                self._chunks.pop(next(iter(self._chunks)))
            seed = int(_unit_hash(f"policylab-rg:{tag}:{c}") * 2**31)
            ds = self._chunks[key] = self._rg.create_dataset(self.dataset, size=_CHUNK, seed=seed, **self.config)
        return ds[i]

    def is_heldout(self, question: str) -> bool:
        """The split rule (see the class doc)."""
        return _unit_hash(f"policylab-rg-split:{self.split_seed}:{self.dataset}:{question}") < self.heldout_fraction

    def _example(self, entry: dict, split: str, **meta) -> Example:
        from policylab.tasks.example import Gold

        question = str(entry["question"])
        answer = "" if entry.get("answer") is None else str(entry["answer"])
        m = {"entry": entry, "dataset": self.dataset, "split": split, **meta}
        return Example(question + self.prompt_suffix, Gold(answer, m), m)

    # ---- train stream ---------------------------------------------------------------------
    def train_prompts(self, n: int) -> list[Example]:
        """The next n train examples; advances the stream."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PolicylabError(f"`n` must be an int >= 0, got {n!r}")
        out, misses = [], 0
        while len(out) < n:
            entry = self._raw(f"train:{self.seed}", self.position)
            self.position += 1
            if self.is_heldout(str(entry["question"])):
                misses += 1
                if misses > _MAX_SCAN:
                    raise PolicylabError(f"no train problem in {_MAX_SCAN} draws for {self._describe()}; "
                                         "lower heldout_fraction")
                continue
            out.append(self._example(entry, "train", position=self.position - 1))
        return out

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed, "config": self._describe()}

    def load_state_dict(self, state: dict) -> None:
        """Resume the stream; refuses a state saved under another seed or task config."""
        if state.get("seed") != self.seed or state.get("config") != self._describe():
            raise PolicylabError(f"task state was saved for seed={state.get('seed')!r}, {state.get('config')}; "
                                 f"this task has seed={self.seed}, {self._describe()}")
        position = state.get("position")
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise PolicylabError(f"task state has an invalid position {position!r}")
        self.position = position

    # ---- held-out split -----------------------------------------------------------------
    def heldout(self, n: int) -> list[Example]:
        """The first n held-out examples in a fixed order (the same for every train seed),
        cycling through the distinct ones when fewer than n exist (meta["repeat"])."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PolicylabError(f"`n` must be an int >= 0, got {n!r}")
        tag = f"heldout:{self.split_seed}"
        while len(self._heldout) < n and self._heldout_scanned < _MAX_SCAN:
            entry = self._raw(tag, self._heldout_scanned)
            self._heldout_scanned += 1
            q = str(entry["question"])
            if q in self._heldout_seen or not self.is_heldout(q):
                continue
            self._heldout_seen.add(q)
            self._heldout.append(self._example(entry, "heldout", index=len(self._heldout)))
        if n and not self._heldout:
            raise PolicylabError(f"no held-out problem in {_MAX_SCAN} draws for {self._describe()}; "
                                 "raise heldout_fraction")
        size = len(self._heldout)
        if n <= size:
            return self._heldout[:n]
        return [self._heldout[j] if j < size else self._repeat(self._heldout[j % size], j // size) for j in range(n)]

    @staticmethod
    def _repeat(ex: Example, r: int) -> Example:
        from policylab.tasks.example import Gold

        meta = {**ex.meta, "repeat": r}
        return Example(ex.prompt, Gold(str(ex.answer), meta), meta)

    def heldout_size(self) -> int:
        """Distinct held-out problems found so far (after `heldout(n)`)."""
        return len(self._heldout)

    # ---- verifier ---------------------------------------------------------------------------
    def _make_scorer(self) -> Callable[..., list[float]]:
        scorer, name, extract = self._scorer, self.dataset, self.extract

        def score(completions: Sequence[str], answers: Sequence[Any], *, metas: Sequence[dict] | None = None,
                  **_: Any) -> list[float]:
            if len(completions) != len(answers) or (metas is not None and len(metas) != len(answers)):
                raise ShapeError(f"completions ({len(completions)}), answers ({len(answers)})"
                                 + (f" and metas ({len(metas)})" if metas is not None else "") + " differ in length")
            out = []
            for i, (completion, answer) in enumerate(zip(completions, answers)):
                meta = metas[i] if metas is not None else getattr(answer, "meta", None)
                if not isinstance(meta, dict) or meta.get("dataset") != name or "entry" not in meta:
                    raise PolicylabError(
                        f"answer {i} carries no entry of reasoning-gym dataset {name!r}: score the task's own examples "
                        "(their answers are policylab.tasks.Gold strings), or pass metas=[example.meta, ...]")
                value = float(scorer.score_answer(answer=extract(completion), entry=meta["entry"]))
                out.append(value)
            return out

        score.__name__ = f"reasoning_gym_{name}"
        return score
