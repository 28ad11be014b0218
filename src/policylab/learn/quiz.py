"""Terminal round of the bank: `policylab quiz`.

    quiz_round(n=5, method=None, lang="en")   N questions (filters: method, topic,
                                              category), each asked, the reader's answer
                                              read from stdin (EOF-safe, works piped), the
                                              answer, its boundary and the worked example
                                              shown, then a score and a review of the
                                              missed ones

`policylab explain` and `--plot` live in `learn.explain`; the words and pieces both views
share in `learn.views`.
"""

from __future__ import annotations

import random
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from policylab.errors import PolicylabError
from policylab.learn import index
from policylab.learn.views import answer_lines, example_lines, heading, ui_words

if TYPE_CHECKING:  # the round imports torch and the registry only after its first question is shown
    from policylab.learn import bank


def _read_answer(stdin: TextIO | None) -> str:
    """Lines up to an empty line or end of input; never blocks past EOF (no stdin at all,
    e.g. a closed descriptor 0, counts as EOF)."""
    if stdin is None:
        return ""
    lines = []
    while True:
        try:
            line = stdin.readline()
        except (EOFError, OSError, ValueError):  # closed or unreadable stdin
            break
        if not line or not line.strip():
            break
        lines.append(line.rstrip("\n"))
    return "\n".join(lines)


def _score_answer(stdin: TextIO | None) -> bool:
    """The reader's own verdict after the reveal: a line starting with y/yes/是/对 counts
    as right; anything else, an empty line or EOF, as missed."""
    if stdin is None:
        return False
    try:
        line = stdin.readline()
    except (EOFError, OSError, ValueError):
        return False
    return line.strip().lower() in ("y", "yes", "是", "对", "对了")


def _topic_methods(topic: str, topics_path=None) -> set:
    """The methods of the reading-order steps whose title (either language) contains
    `topic` (case-insensitive); none matching is an error listing the titles."""
    steps = index.reading_steps(topics_path)
    key = topic.strip().lower()
    hit = [s for s in steps if any(key in str(t).lower() for t in (s.get("topic") or {}).values())]
    if not hit:
        titles = "; ".join(str((s.get("topic") or {}).get("en")) for s in steps)
        raise PolicylabError(f"no reading-order topic matches {topic!r}; the topics are: {titles}")
    return {m for s in hit for m in s.get("methods") or ()}


def select(method: str | None = None, topic: str | None = None, category: str | None = None, *, lang: str = "en",
           bank_dir=None, topics_path=None) -> list[index.Pending]:
    """The questions a round draws from: every question of the bank (methods, metrics,
    literature-only cards, cross-method questions), narrowed to one subject (`method`,
    any spelling `subjects.resolve` accepts), to the methods of a reading-order topic, and
    to one category. Nothing is rendered (no example runs), and a subject named by the
    name of its bank file (any case) is found without loading the method registry."""
    if category is not None and category not in CATEGORIES:
        raise PolicylabError(f"category must be one of {', '.join(CATEGORIES)}, got {category!r}")
    pool = index.question_index(bank_dir=bank_dir, topics_path=topics_path)
    if method is not None:
        name = _subject_name(method, pool, lang, bank_dir)
        pool = [p for p in pool if name in p.methods or p.compare_with == name]
        pool.sort(key=lambda p: (p.methods[0] != name, p.topic))  # its own questions first
    if topic is not None:
        ms = _topic_methods(topic, topics_path)
        pool = [p for p in pool if set(p.methods) <= ms]
    if category is not None:
        pool = [p for p in pool if p.category == category]
    return pool


CATEGORIES = ("basics", "mechanism", "comparison", "implementation")  # = questions.CATEGORIES (tested)


def _subject_name(typed: str, pool: list, lang: str, bank_dir) -> str:
    """The subject `typed` names: the owner of a bank file spelled that way (any case,
    '-' or space for '_'), else whatever `subjects.resolve` finds (aliases, import paths,
    close-match suggestions; this loads the registry)."""
    if isinstance(typed, str):
        files = {index.norm(p.methods[0]): p.methods[0] for p in pool if not p.topic}
        if index.norm(typed) in files:
            return files[index.norm(typed)]
    from policylab.learn import bank, lessons, subjects

    s = subjects.resolve(typed)
    if s.kind == "method" and not lessons.is_shipped(s.name) and not bank.has_lesson(s.name, bank_dir):
        raise PolicylabError(ui_words(lang)["no_lesson"].format(name=s.name))
    return s.name


@dataclass
class Round:
    """What a round asked, in order, and the reader's verdicts."""

    asked: list = field(default_factory=list)  # [Question]
    right: list = field(default_factory=list)  # [bool], one per question

    @property
    def score(self) -> int:
        return sum(self.right)

    @property
    def missed(self) -> list:
        return [q for q, ok in zip(self.asked, self.right) if not ok]


class _Renderer:
    """Renders the round's questions in order in a background thread (the first import of
    torch and the registry happens there, while the reader reads the first question);
    `get(i)` waits for question i and re-raises what rendering it raised. Rendering stops
    at the first failure or at `close()`, which waits for the question in progress (an
    interpreter must not exit while the thread is inside an import)."""

    def __init__(self, picked: list, lang: str, examples):
        self._picked, self._lang, self._examples = picked, lang, examples
        self._done = [threading.Event() for _ in picked]
        self._out: list = [None] * len(picked)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quiz-render", daemon=True)

    def start(self) -> None:
        """Begin rendering (once; `get` starts it too)."""
        if self._thread.ident is None:
            self._thread.start()

    def _run(self) -> None:
        for i, p in enumerate(self._picked):
            if self._stop.is_set():
                break
            try:
                self._out[i] = (True, p.render(self._lang, examples=self._examples))
            except BaseException as exc:  # noqa: BLE001 - handed to the reader's thread
                self._out[i] = (False, exc)
                self._stop.set()
            self._done[i].set()

    def get(self, i: int):
        self.start()
        self._done[i].wait()
        ok, value = self._out[i]
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()


def quiz_round(n: int = 5, method: str | None = None, lang: str = "en", seed: int | None = None, *,
               topic: str | None = None, category: str | None = None, stdin: TextIO | None = None,
               stdout: TextIO | None = None, bank_dir=None, examples=None, topics_path=None) -> Round:
    """A round of `n` different questions chosen by `random.Random(seed)` from `select(...)`
    (fewer when the pool is smaller): each is asked, the reader's answer read from `stdin`
    (up to an empty line or EOF), the answer with its boundary and the worked example with
    its live numbers shown, and the reader says whether they had it (y / anything else).
    Then the score and a review of the missed questions with their examples. Only the
    asked questions' examples run, in a background thread started once the first question
    is on the screen, in the order they are asked: a question whose text needs no number
    is shown before its example has run (the first one before torch is even imported),
    its answer once the example has."""
    ui = ui_words(lang)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PolicylabError(f"a round has at least one question, got n = {n!r}")
    stdin = sys.stdin if stdin is None else stdin
    out = sys.stdout if stdout is None else stdout
    pool = select(method, topic, category, lang=lang, bank_dir=bank_dir, topics_path=topics_path)
    if not pool:
        raise PolicylabError(ui["empty"] + (f" ({ui['filters']}: {_filters(method, topic, category)})"
                                            if method or topic or category else ""))
    picked = random.Random(seed).sample(pool, min(n, len(pool)))
    rendered = _Renderer(picked, lang, examples)
    try:
        return _ask(picked, rendered, lang, stdin, out)
    finally:
        rendered.close()


def _ask(picked: list, rendered: _Renderer, lang: str, stdin, out) -> Round:
    ui = ui_words(lang)
    result = Round()
    for i, p in enumerate(picked, 1):
        text = p.text(lang)
        if text is None:  # the question itself holds a live number: wait for its example
            q = rendered.get(i - 1)
            text = q.question[lang]
        out.write(f"[{i}/{len(picked)}] {heading(p, lang)}\n{text}\n\n{ui['prompt']}\n")
        out.flush()
        rendered.start()  # the examples run (torch loads) while the reader reads the question
        given = _read_answer(stdin)
        q = rendered.get(i - 1)
        out.write(f"\n{ui['yours']}: {given or ui['skipped']}\n\n" + "\n".join(answer_lines(q, lang)) + "\n\n")
        out.write("\n".join(example_lines(q, lang)) + f"\n\n{ui['verdict']}\n")
        out.flush()
        result.asked.append(q)
        result.right.append(_score_answer(stdin))
        out.write("\n")
    out.write(ui["score"].format(score=result.score, n=len(picked)) + "\n")
    if result.missed:
        out.write(f"\n{ui['review']}\n")
        for q in result.missed:
            out.write(f"\n{heading(q, lang)}\n{q.question[lang]}\n" + "\n".join(answer_lines(q, lang)) + "\n")
            out.write("\n".join(example_lines(q, lang)) + "\n")
    out.flush()
    return result


def _filters(method, topic, category) -> str:
    return ", ".join(f"{k}={v}" for k, v in (("method", method), ("topic", topic), ("category", category)) if v)


def quiz(method: str | None = None, lang: str = "en", seed: int | None = None, *, stdin: TextIO | None = None,
         stdout: TextIO | None = None, bank_dir=None, examples=None, topics_path=None) -> bank.Question:
    """A round of one question (`quiz_round(1, ...)`); returns the question asked."""
    return quiz_round(1, method, lang, seed, stdin=stdin, stdout=stdout, bank_dir=bank_dir, examples=examples,
                      topics_path=topics_path).asked[0]
