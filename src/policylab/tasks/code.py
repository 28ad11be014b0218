"""A small code task: write a short Python function; it is run in the sandbox.

Each problem has a prompt ("Write a Python function `sum_evens(nums)` that returns ...
Reply with only the code."), correctness tests (argument lists whose expected return
values come from running the reference solution in this process: trusted code, and the
expected values never enter the sandbox), a reference solution, and a larger performance
input on which the reference's runtime distribution is measured (`measure_reference`, and
next to every candidate by `CodeVerifier.run_timed`).

Split. A problem is held out iff blake2b("policylab-code-split:{name}") / 2^64 <
`heldout_fraction` (default 1/3): a pure function of the problem, so the train and
held-out problems are disjoint by construction. The train stream cycles through the
train problems in a seeded order per epoch; its state is one position counter.

The verifier (`CodeVerifier`, the reward `code_tests`): the reply's code (the first
fenced block if there is one, else the whole reply) is run in the sandbox
(`policylab.sandbox.runner`) on the tests; reward 1.0 iff it ran and every return value equals
the expected one (after JSON canonicalization: tuples compare as lists), else 0.0. A
candidate that loops, forks, allocates without bound, writes outside its directory or
opens a socket is stopped there and scores 0; training goes on.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass

from policylab.errors import PolicylabError
from policylab.tasks.example import Example

PROMPT = "Write a Python function `{signature}` that {description}. Reply with only the code."
MAX_SOURCE_CHARS = 20_000


@dataclass(frozen=True)
class Problem:
    name: str  # also the function name
    signature: str
    description: str
    reference: str  # source of a correct solution
    tests: tuple  # argument lists
    perf: str  # Python expression building one set of performance arguments (a list), drawn with `rng`

    def perf_inputs(self, count: int, *, draw: int = 0) -> list[list]:
        """`count` performance argument lists, each its own seeded draw: input k of draw d
        uses random.Random("policylab-code-perf:{name}:{d}:{k}"). Distinct inputs per
        timed call, so a candidate gains nothing from remembering an earlier call."""
        out = []
        for k in range(int(count)):
            rng = random.Random(f"policylab-code-perf:{self.name}:{int(draw)}:{k}")
            out.append(eval(self.perf, {"rng": rng, "range": range, "list": list, "sorted": sorted}))  # noqa: S307
        return out


def _p(name, args, description, body, tests, perf) -> Problem:
    return Problem(name, f"{name}({args})", description, f"def {name}({args}):\n{body}\n", tuple(tests), perf)


PROBLEMS: dict[str, Problem] = {p.name: p for p in (
    _p("sum_evens", "nums", "returns the sum of the even numbers in the list `nums`",
       "    return sum(x for x in nums if x % 2 == 0)",
       [[[1, 2, 3, 4]], [[]], [[-2, 5, 7]], [[1, 3]]], "[[rng.randrange(-1000, 1000) for _ in range(20000)]]"),
    _p("count_vowels", "s", "returns how many vowels (a, e, i, o, u, upper or lower case) the string `s` contains",
       "    return sum(1 for c in s.lower() if c in 'aeiou')",
       [["hello"], [""], ["AEIOU xyz"], ["rhythm"]], "[''.join(rng.choice('abcdeiouxyz ') for _ in range(20000))]"),
    _p("reverse_words", "s", "returns the words of `s` in reverse order, joined by single spaces",
       "    return ' '.join(reversed(s.split()))",
       [["the quick fox"], ["one"], ["  a  b "], [""]], "[' '.join(str(rng.randrange(100)) for _ in range(5000))]"),
    _p("is_palindrome", "s", "returns True if `s` reads the same backwards, ignoring case and every character "
       "that is not a letter or a digit",
       "    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]",
       [["Racecar"], ["A man, a plan, a canal: Panama"], ["abc"], [""]], "(lambda s: [s + rng.choice(['', 'x', 'ab']) + s[::-1]])"
       "(''.join(rng.choice('abAB ,.') for _ in range(10000)))"),
    _p("running_sum", "nums", "returns the list of prefix sums of `nums` (element i is nums[0] + ... + nums[i])",
       "    out, total = [], 0\n    for x in nums:\n        total += x\n        out.append(total)\n    return out",
       [[[1, 2, 3]], [[]], [[5, -5, 5]]], "[[rng.randrange(100) for _ in range(10000)]]"),
    _p("dedupe", "items", "returns the items of the list `items` without repeats, each kept at its first position",
       "    seen, out = set(), []\n    for x in items:\n        if x not in seen:\n            seen.add(x)\n"
       "            out.append(x)\n    return out",
       [[[3, 1, 3, 2, 1]], [[]], [["a", "b", "a"]]], "[[rng.randrange(3000) for _ in range(6000)]]"),
    _p("second_largest", "nums", "returns the second largest distinct value in `nums`, or None if there are fewer "
       "than two distinct values",
       "    vals = sorted(set(nums))\n    return vals[-2] if len(vals) >= 2 else None",
       [[[3, 1, 4, 4]], [[7]], [[2, 2]], [[-1, -5, -3]]], "[[rng.randrange(10**6) for _ in range(20000)]]"),
    _p("count_primes", "n", "returns how many prime numbers are smaller than the integer `n`",
       "    if n < 3:\n        return 0\n    sieve = bytearray([1]) * n\n    sieve[0] = sieve[1] = 0\n"
       "    for i in range(2, int(n ** 0.5) + 1):\n        if sieve[i]:\n"
       "            sieve[i * i::i] = bytearray(len(range(i * i, n, i)))\n    return sum(sieve)",
       [[10], [2], [3], [30], [0]], "[rng.randrange(19000, 21000)]"),
    _p("fib", "n", "returns the n-th Fibonacci number, with fib(0) = 0 and fib(1) = 1",
       "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
       [[0], [1], [10], [30]], "[rng.randrange(1400, 1600)]"),
    _p("gcd", "a, b", "returns the greatest common divisor of the non-negative integers `a` and `b` "
       "(gcd(0, 0) = 0)",
       "    while b:\n        a, b = b, a % b\n    return a",
       [[12, 18], [7, 0], [0, 0], [17, 5]], "[rng.randrange(2**60, 2**61), rng.randrange(2**30, 2**31)]"),
    _p("max_subarray", "nums", "returns the largest sum of a non-empty run of consecutive elements of `nums`",
       "    best = cur = nums[0]\n    for x in nums[1:]:\n        cur = max(x, cur + x)\n        best = max(best, cur)\n"
       "    return best",
       [[[1, -2, 3, 4, -1]], [[-3, -1, -2]], [[5]]], "[[rng.randrange(-100, 100) for _ in range(5000)]]"),
    _p("char_counts", "s", "returns a dict mapping each character of `s` to the number of times it occurs",
       "    out = {}\n    for c in s:\n        out[c] = out.get(c, 0) + 1\n    return out",
       [["banana"], [""], ["aA"]], "[''.join(rng.choice('abcdef') for _ in range(20000))]"),
    _p("flatten", "lists", "returns one list with the elements of the lists in `lists`, in order",
       "    return [x for sub in lists for x in sub]",
       [[[[1, 2], [3], []]], [[]], [[[0], [0]]]], "[[[rng.randrange(9) for _ in range(20)] for _ in range(1000)]]"),
    _p("transpose", "matrix", "returns the transpose of the rectangular matrix `matrix` (a list of equal-length "
       "rows) as a list of lists",
       "    return [list(col) for col in zip(*matrix)]",
       [[[[1, 2, 3], [4, 5, 6]]], [[[1]]], [[[1, 2]]]], "[[[rng.randrange(9) for _ in range(100)] for _ in range(100)]]"),
    _p("rotate", "nums, k", "returns the list `nums` rotated right by `k` positions (k may exceed the length)",
       "    if not nums:\n        return []\n    k %= len(nums)\n    return nums[-k:] + nums[:-k] if k else list(nums)",
       [[[1, 2, 3, 4], 1], [[1, 2, 3], 5], [[], 3], [[1, 2], 0]], "[rng.sample(range(10**6), 20000), rng.randrange(1, 40000)]"),
    _p("merge_sorted", "a, b", "returns one sorted list with the elements of the sorted lists `a` and `b`",
       "    i = j = 0\n    out = []\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
       "            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n            j += 1\n"
       "    return out + a[i:] + b[j:]",
       [[[1, 3, 5], [2, 4]], [[], [1]], [[1, 1], [1]]], "[sorted(rng.sample(range(10**6), 10000)), "
       "sorted(rng.sample(range(10**6), 10000))]"),
    _p("longest_run", "nums", "returns the length of the longest run of equal consecutive values in `nums` "
       "(0 for an empty list)",
       "    best = cur = 0\n    prev = object()\n    for x in nums:\n        cur = cur + 1 if x == prev else 1\n"
       "        prev = x\n        best = max(best, cur)\n    return best",
       [[[1, 1, 2, 2, 2, 3]], [[]], [[4]], [[1, 2, 1]]], "[[rng.randrange(3) for _ in range(20000)]]"),
    _p("digit_sum", "n", "returns the sum of the decimal digits of the non-negative integer `n`",
       "    return sum(int(c) for c in str(n))",
       [[0], [123], [9999], [10]], "[rng.randrange(10**4199, 10**4200)]"),
    _p("has_pair_sum", "nums, target", "returns True if two elements at different positions of `nums` add up to "
       "`target`, else False",
       "    seen = set()\n    for x in nums:\n        if target - x in seen:\n            return True\n        seen.add(x)\n"
       "    return False",
       [[[1, 4, 6], 10], [[5], 10], [[5, 5], 10], [[], 0], [[1, 2], 4]], "(lambda xs: [xs, rng.choice([-1, xs[-1] + xs[-2]])])"
       "(rng.sample(range(0, 10**6, 2), 5000))"),
    _p("unique_count", "nums", "returns how many distinct values the list `nums` contains",
       "    return len(set(nums))",
       [[[1, 2, 2, 3]], [[]], [[0, 0]]], "[[rng.randrange(5000) for _ in range(20000)]]"),
    _p("capitalize_words", "s", "returns `s` with the first letter of every space-separated word in upper case "
       "and the rest of each word unchanged",
       "    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))",
       [["hello world"], ["a"], [""], ["mIxed cASE"]], "[' '.join(rng.choice(['word', 'Alpha', 'x', 'mIxed']) for _ in range(5000))]"),
    _p("factorial", "n", "returns n! for the non-negative integer `n` (0! = 1)",
       "    out = 1\n    for i in range(2, n + 1):\n        out *= i\n    return out",
       [[0], [1], [5], [10]], "[rng.randrange(1300, 1500)]"),
    _p("binary_string", "n", "returns the binary representation of the non-negative integer `n` as a string of "
       "0s and 1s, without a prefix",
       "    return bin(n)[2:]",
       [[0], [5], [8], [255]], "[rng.getrandbits(12000)]"),
    _p("count_pairs", "nums, target", "returns the number of index pairs i < j with nums[i] + nums[j] == target",
       "    counts, total = {}, 0\n    for x in nums:\n        total += counts.get(target - x, 0)\n"
       "        counts[x] = counts.get(x, 0) + 1\n    return total",
       [[[1, 2, 3, 2], 4], [[], 1], [[1, 1, 1], 2]], "[[rng.randrange(100) for _ in range(5000)], 99]"),
)}


def reference_outputs(problem: Problem, inputs) -> list[str]:
    """The reference's return values on `inputs` (argument lists), as the canonical JSON
    text outputs are compared in (`sandbox.runner.canonical_text`: type-strict). The
    reference is policylab's own code: it runs in this process, on a fresh copy of each
    input, and its values never enter the sandbox."""
    from policylab.sandbox.runner import canonical_text

    scope: dict = {}
    exec(compile(problem.reference, f"<reference {problem.name}>", "exec"), scope)  # noqa: S102
    fn = scope[problem.name]
    return [canonical_text(fn(*json.loads(json.dumps(a)))) for a in inputs]


def expected_outputs(problem: Problem) -> list[str]:
    """The reference's outputs on the tests (`reference_outputs`)."""
    return reference_outputs(problem, problem.tests)


_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(reply: str) -> str:
    """The code of a reply: the first fenced block (an unclosed fence runs to the end),
    else the whole reply; at most MAX_SOURCE_CHARS characters."""
    if not isinstance(reply, str):
        raise TypeError(f"reply must be a str, got {type(reply).__name__}")
    m = _FENCE.search(reply)
    code = m.group(1) if m else reply
    return code[:MAX_SOURCE_CHARS]


def _hash01(text: str) -> float:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") / 2**64


class CodeTask:
    """The train / held-out streams over `PROBLEMS` (see the module docstring)."""

    def __init__(self, *, seed: int = 0, heldout_fraction: float = 1 / 3):
        if not 0.0 < heldout_fraction < 1.0:
            raise PolicylabError(f"`heldout_fraction` must be in (0, 1), got {heldout_fraction}")
        self.seed, self.heldout_fraction = int(seed), float(heldout_fraction)
        names = sorted(PROBLEMS)
        self.heldout_names = [n for n in names if self.is_heldout(n)]
        self.train_names = [n for n in names if not self.is_heldout(n)]
        if not self.heldout_names or not self.train_names:
            raise PolicylabError(f"heldout_fraction {heldout_fraction} leaves a split empty")
        self.position = 0

    def is_heldout(self, name: str) -> bool:
        return _hash01(f"policylab-code-split:{name}") < self.heldout_fraction

    @staticmethod
    def example(name: str, split: str, **meta) -> Example:
        p = PROBLEMS[name]
        return Example(PROMPT.format(signature=p.signature, description=p.description), name,
                       {"problem": name, "split": split, **meta})

    @staticmethod
    def reference_reply(example: Example) -> str:
        """A reply the verifier must accept: the problem's reference solution in a code block."""
        return f"```python\n{PROBLEMS[example.meta['problem']].reference.strip()}\n```"

    def train_prompts(self, n: int) -> list[Example]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PolicylabError(f"`n` must be an int >= 0, got {n!r}")
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.train_names))
            order = list(self.train_names)
            random.Random(f"policylab-code-train:{self.seed}:{epoch}").shuffle(order)
            out.append(self.example(order[i], "train", position=self.position))
            self.position += 1
        return out

    def heldout_size(self) -> int:
        return len(self.heldout_names)

    def heldout(self, n: int, *, repeat: bool = False) -> list[Example]:
        size = len(self.heldout_names)
        if n > size and not repeat:
            raise PolicylabError(f"only {size} held-out code problems exist; asked for {n} (repeat=True cycles)")
        return [self.example(self.heldout_names[j % size], "heldout", repeat=j // size) for j in range(n)]

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed, "heldout_fraction": self.heldout_fraction}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed") != self.seed or state.get("heldout_fraction") != self.heldout_fraction:
            raise PolicylabError(f"code task state was saved for {state}; this task has seed {self.seed}, "
                                 f"heldout_fraction {self.heldout_fraction}")
        self.position = int(state["position"])


@dataclass(frozen=True)
class CodeOutcome:
    """One candidate: `correct` (every test's return value as expected and, when timed,
    every timed call's too), the sandbox status, and the timings (CPU ns per timed call,
    measured by the parent) of the candidate and of the reference on the same inputs;
    empty unless the candidate was timed to the end. `timed_out`: the tests passed but
    the timed calls hit a limit, so the timed outputs are unverified and the candidate is
    not correct."""

    correct: bool
    status: str
    candidate_ns: tuple = ()
    reference_ns: tuple = ()
    timed_out: bool = False
    detail: str = ""


def _amortized(windows: list[int], total: int | None) -> tuple[int, ...]:
    """Timed windows with the process's other CPU time (its module level, the tests, the
    warm-up calls, anything between calls) spread evenly over them, so that the timings
    add up to everything the process did: work moved out of the timed calls is still paid."""
    rest = max(0, (total or 0) - sum(windows))
    return tuple(int(w + rest / len(windows)) for w in windows)


class CodeVerifier:
    """The code task's verifier (`task.reward: code_tests`): (replies, problem names) ->
    1.0 / 0.0 per reply, each run in the sandbox under `policy`.

    Contract. A reply earns 1.0 iff its code (`extract_code`) defines the function and, in
    a sandboxed process of its own, returns on every test exactly the reference's value in
    type and value (`sandbox.runner.canonical_text`: True is not 1, 2.0 is not 2, a tuple
    counts as a list). Anything else is 0.0: an exception, a wrong or wrongly typed value,
    a violation of the sandbox (a read or write outside its directory, a fork, a socket), a
    limit, an answer the process wrote before it was asked. Timed (`run_timed`, code_opt),
    the same process is then called on `timing_warmup + timing_repeats` performance inputs
    drawn fresh for this candidate, interleaved call by call with a sandboxed process of
    the reference on the same inputs; every timed output is checked too, and one wrong,
    missing or late output makes the candidate incorrect (no speed term, no correctness
    credit). Timings are CPU time of the child measured by the parent around each call,
    with the rest of the process's CPU time spread over the timed calls (`_amortized`)."""

    __name__ = "code_tests"

    def __init__(self, policy):
        from policylab.sandbox import runner as sandbox

        sandbox.check_available(policy)  # refuse before any training starts
        self.policy = policy
        self._expected = {n: expected_outputs(p) for n, p in PROBLEMS.items()}
        self.draws = 0  # how many candidates were timed: each gets fresh performance inputs

    def _problem(self, answer: str) -> Problem:
        if answer not in PROBLEMS:
            raise PolicylabError(f"code_tests: {answer!r} is not a problem of the code task")
        return PROBLEMS[answer]

    def _tests(self, session, p: Problem) -> bool:
        if not session.load():
            return False
        for args, want in zip(p.tests, self._expected[p.name]):
            c = session.call(list(args))
            if c is None or c.error is not None or c.text != want:
                return False
        return True

    def outcome(self, reply: str, answer: str, *, timing: tuple[int, int] | None = None) -> CodeOutcome:
        """Run one reply's tests in the sandbox; with `timing` = (repeats, warmup), a reply
        that passed is then called on fresh performance inputs next to the reference (a
        wrong reply is never timed)."""
        from policylab.sandbox import runner as sandbox

        p = self._problem(answer)
        cand = sandbox.Session(extract_code(reply), p.name, self.policy)
        try:
            passed = self._tests(cand, p)
            if not passed or timing is None:
                res = cand.close()
                return CodeOutcome(passed and res.status == "ok", res.status, detail=res.detail or cand.load_detail)
            repeats, warmup = int(timing[0]), int(timing[1])
            inputs = p.perf_inputs(warmup + repeats, draw=self.draws)
            self.draws += 1
            want = reference_outputs(p, inputs)
            cand_ns, ref_ns = self._timed(cand, p, inputs, want, warmup)
            total = cand.cpu_ns()
        finally:
            res = cand.close()
        if cand_ns is None:  # a wrong timed output, or the process ended: unverified
            limit = res.status in ("timeout", "cpu_limit", "memory", "output_limit")
            return CodeOutcome(False, res.status, timed_out=limit,
                               detail=res.detail or "a timed output differs from the reference's")
        if res.status != "ok":
            return CodeOutcome(False, res.status, detail=res.detail)
        return CodeOutcome(True, "ok", _amortized(cand_ns, total), ref_ns)

    def _timed(self, cand, p: Problem, inputs: list, want: list[str], warmup: int):
        """(candidate windows, reference timings) of the timed calls, or (None, None) when a
        candidate output is wrong or missing. Calls alternate ABBA: reference then
        candidate on even rounds, candidate then reference on odd ones."""
        from policylab.sandbox import runner as sandbox

        with sandbox.Session(p.reference, p.name, self.policy, check=False) as ref:
            if not self._tests(ref, p):
                raise PolicylabError(f"the reference of {p.name} failed in the sandbox ({ref.close().detail}); the "
                                     "sandbox limits (task.sandbox_*) are too tight for it")
            cand_ns, ref_ns = [], []
            for k, (args, w) in enumerate(zip(inputs, want)):
                order = ("ref", "cand") if k % 2 == 0 else ("cand", "ref")
                for who in order:
                    c = (ref if who == "ref" else cand).call(args)
                    if who == "cand":
                        if c is None or c.error is not None or c.text != w:
                            return None, None
                        if k >= warmup:
                            cand_ns.append(c.cpu_ns)
                    else:
                        if c is None or c.text != w:
                            raise PolicylabError(f"the reference of {p.name} did not answer a timed call in the "
                                                 f"sandbox ({ref.close().detail or 'wrong output'}); the sandbox "
                                                 "limits (task.sandbox_*) are too tight for it")
                        if k >= warmup:
                            ref_ns.append(c.cpu_ns)
            ref_total = ref.cpu_ns()
        return cand_ns, _amortized(ref_ns, ref_total)

    def __call__(self, completions, answers, **context) -> list[float]:
        return [float(self.outcome(c, a).correct) for c, a in zip(completions, answers)]

    def run_timed(self, completions, answers, *, repeats: int, warmup: int) -> list[CodeOutcome]:
        """Tests, then (for the candidates that pass) timed calls against the reference."""
        return [self.outcome(c, a, timing=(repeats, warmup)) for c, a in zip(completions, answers)]


def measure_reference(name: str, policy, *, repeats: int = 15, warmup: int = 2) -> list[int]:
    """The reference solution's runtime distribution (CPU ns per call on fresh performance
    inputs), measured in the sandbox exactly as a candidate is: the reference timed as the
    candidate next to itself."""
    (o,) = CodeVerifier(policy).run_timed([PROBLEMS[name].reference], [name], repeats=repeats, warmup=warmup)
    if not o.correct:
        raise PolicylabError(f"the reference of {name} did not run in the sandbox: {o.status} {o.detail}")
    return list(o.candidate_ns)
