"""The code task: disjoint split, references that pass their own tests in the sandbox, the
verifier's scoring of right, wrong and malicious replies, the reference's runtime
distribution."""

import statistics
import tempfile
from pathlib import Path

import pytest

from policylab.sandbox import runner as sb
from policylab.trainer.config import TaskConfig
from policylab.tasks import code

pytestmark = pytest.mark.skipif(not (sb.probe()["network"] and sb.probe()["filesystem"]),
                                reason="this machine cannot wall a candidate in")
POLICY = sb.SandboxPolicy(sb.SandboxLimits(cpu_seconds=2, memory_mb=256, wall_seconds=8))


@pytest.fixture(scope="module")
def verifier():
    return code.CodeVerifier(POLICY)


def test_split_is_disjoint_and_fixed():
    t = code.CodeTask(seed=0)
    assert set(t.train_names).isdisjoint(t.heldout_names)
    assert set(t.train_names) | set(t.heldout_names) == set(code.PROBLEMS)
    assert code.CodeTask(seed=5).heldout_names == t.heldout_names  # the seed moves the stream, not the split
    seen = {e.answer for e in t.train_prompts(3 * len(t.train_names))}
    assert seen == set(t.train_names)
    assert {e.answer for e in t.heldout(len(t.heldout_names))} == set(t.heldout_names)


def test_stream_state_round_trips():
    a, b = code.CodeTask(seed=1), code.CodeTask(seed=1)
    a.train_prompts(5)
    b.load_state_dict(a.state_dict())
    assert [e.answer for e in a.train_prompts(4)] == [e.answer for e in b.train_prompts(4)]
    with pytest.raises(code.PolicylabError, match="seed"):
        code.CodeTask(seed=2).load_state_dict(a.state_dict())


def test_every_reference_passes_its_tests_in_the_sandbox(verifier):
    replies = [f"```python\n{p.reference}```" for p in code.PROBLEMS.values()]
    assert verifier(replies, list(code.PROBLEMS)) == [1.0] * len(code.PROBLEMS)


@pytest.mark.parametrize("reply,ok", [
    ("def sum_evens(nums):\n    return sum(x for x in nums if x % 2 == 0)\n", True),
    ("Here you go:\n```python\ndef sum_evens(nums):\n    return sum(n for n in nums if not n % 2)\n```\nDone.", True),
    ("```python\ndef sum_evens(nums):\n    return sum(nums)\n", False),  # unclosed fence, wrong answer
    ("def sum_evens(nums):\n    return sum(x for x in nums if x % 2)\n", False),
    ("def total(nums):\n    return 0\n", False),  # wrong name
    ("def sum_evens(nums) return 0", False),  # syntax error
    ("The sum of the even numbers.", False),
])
def test_verifier_scores_replies(verifier, reply, ok):
    assert verifier([reply], ["sum_evens"]) == [float(ok)]


def test_malicious_replies_score_zero_and_leave_nothing_behind(verifier):
    d = Path(tempfile.mkdtemp(prefix="policylab-marker-"))
    d.chmod(0o777)
    m = d / "pwned"
    bad = [
        f"import os\nos.fork()\nopen({str(m)!r}, 'w')\ndef sum_evens(nums):\n    return 0\n",
        "def sum_evens(nums):\n    while True:\n        pass\n",
        f"def sum_evens(nums):\n    open({str(m)!r}, 'w').write('x')\n    return sum(x for x in nums if x % 2 == 0)\n",
        "import socket\ndef sum_evens(nums):\n    return 0\n",
        "def sum_evens(nums):\n    return [0] * 10**10\n",
    ]
    good = code.PROBLEMS["sum_evens"].reference
    got = verifier(bad + [good], ["sum_evens"] * (len(bad) + 1))
    assert got == [0.0] * len(bad) + [1.0]  # the run goes on: the last, honest reply still scores
    assert not m.exists()


def test_timed_run_measures_candidate_and_reference_together(verifier):
    p = code.PROBLEMS["count_primes"]
    naive = ("def count_primes(n):\n    return sum(1 for k in range(2, n) if all(k % d for d in range(2, int(k**0.5) + 1)))\n")
    fast, slow = verifier.run_timed([p.reference, naive], ["count_primes"] * 2, repeats=5, warmup=1)
    assert fast.correct and slow.correct
    assert len(fast.candidate_ns) == len(fast.reference_ns) == 5
    if slow.candidate_ns:  # trial division is several times slower than the sieve
        assert statistics.median(slow.candidate_ns) > 2 * statistics.median(slow.reference_ns)
    else:
        assert slow.timed_out


def test_a_wrong_reply_is_never_timed(verifier):
    (o,) = verifier.run_timed(["def count_primes(n):\n    return 0\n"], ["count_primes"], repeats=5, warmup=1)
    assert not o.correct and o.candidate_ns == ()


def test_reference_runtime_distribution_is_measured():
    ns = code.measure_reference("count_primes", POLICY, repeats=9, warmup=1)
    assert len(ns) == 9 and all(t > 0 for t in ns)


def test_extract_code():
    assert code.extract_code("```py\nx = 1\n```") == "x = 1\n"
    assert code.extract_code("plain") == "plain"
    assert len(code.extract_code("a" * 50_000)) == code.MAX_SOURCE_CHARS


def test_build_task_wires_the_verifier_and_refuses_numeric_ones():
    from policylab.errors import ConfigError
    from policylab.tasks.source import build_task

    src = build_task(TaskConfig(name="code", reward="code_tests"), seed=0)
    assert getattr(src.reward_fn, "__name__", "") == "code_tests"
    assert src.heldout(2)[0].meta["split"] == "heldout"
    with pytest.raises(ConfigError, match="code_tests"):
        build_task(TaskConfig(name="code", reward="exact_numeric"), seed=0)
    with pytest.raises(ConfigError, match="task.name=code"):
        build_task(TaskConfig(name="arithmetic", reward="code_tests"), seed=0)
    # the default task.reward=auto picks the code task's own verifier
    assert getattr(build_task(TaskConfig(name="code"), seed=0).reward_fn, "__name__", "") == "code_tests"
