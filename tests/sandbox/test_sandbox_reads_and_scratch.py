"""The sandbox's read wall, its capped scratch directory and its protocol: a candidate
reads nothing of policylab (the answer keys live there) nor any other file outside its
directory, fills at most `scratch_bytes` in at most `scratch_files` files, and what it
writes on its answer pipe out of turn ends its run. Each case is a real candidate; the
`audit_hook=False` cases show the kernel wall (Landlock, the tmpfs) holding by itself."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

import policylab
from policylab.sandbox import runner as sb

POLICY = sb.SandboxPolicy(sb.SandboxLimits(cpu_seconds=2, memory_mb=256, wall_seconds=10, output_bytes=200_000,
                                           scratch_bytes=1024 * 1024, scratch_files=16))
TASK_FILE = Path(policylab.__file__).resolve().parent / "tasks" / "code.py"

pytestmark = pytest.mark.skipif(not (sb.probe()["network"] and sb.probe()["filesystem"]),
                                reason=f"this machine cannot wall a candidate in: {sb.probe()['detail']}")


def _job(src: str, calls=((1,),), **kw) -> dict:
    return {"source": src, "entry": "f", "calls": [list(c) for c in calls], **kw}


@pytest.fixture
def readable_secret():
    # world-readable, in a world-traversable directory: only the sandbox stops a read
    d = Path(tempfile.mkdtemp(prefix="policylab-secret-"))
    os.chmod(d, 0o755)
    f = d / "key.txt"
    f.write_text("the answer is 42")
    os.chmod(f, 0o644)
    yield f
    shutil.rmtree(d, ignore_errors=True)


def test_the_library_s_own_files_are_not_readable():
    for path in (str(TASK_FILE), "sys.argv[0]"):
        target = path if path == "sys.argv[0]" else repr(path)
        src = f"import sys\ndef f(x):\n    return open({target}).read()[:20]\n"
        r = sb.run_job(_job(src), POLICY)
        assert r.status == "violation" and "read outside" in r.detail, r


def test_without_the_hook_landlock_denies_the_library_and_other_files(readable_secret):
    src = ("import sys\ndef f(x):\n    out = []\n"
           f"    for p in ({str(TASK_FILE)!r}, sys.argv[0], {str(readable_secret)!r}, '/etc/passwd'):\n"
           "        try:\n            open(p).read()\n            out.append('read')\n"
           "        except OSError as e:\n            out.append(type(e).__name__)\n    return out\n")
    r = sb.run_job(_job(src, audit_hook=False), POLICY)
    assert r.status == "ok", r
    assert r.report["outputs"][0] == ["PermissionError"] * 4


def test_listing_a_directory_outside_is_stopped():
    r = sb.run_job(_job(f"import os\ndef f(x):\n    return os.listdir({str(TASK_FILE.parent)!r})\n"), POLICY)
    assert r.status == "violation" and "listing outside" in r.detail
    src = (f"import os\ndef f(x):\n    try:\n        return os.listdir({str(TASK_FILE.parent)!r})\n"
           "    except OSError as e:\n        return type(e).__name__\n")
    r = sb.run_job(_job(src, audit_hook=False), POLICY)
    assert r.report["outputs"] == ["PermissionError"]


def test_its_own_files_stay_readable():
    src = "def f(x):\n    open('a.txt', 'w').write('hi')\n    return open('a.txt').read()\n"
    assert sb.run_job(_job(src), POLICY).report["outputs"] == ["hi"]


def test_scratch_space_is_capped_and_never_reaches_the_host_tmp():
    # 100 files of 100 kB: the 1 MiB tmpfs is full after about 10 (ENOSPC); before the
    # cap all 100 landed in the host's temporary directory
    src = ("def f(x):\n    n = 0\n    try:\n        for i in range(100):\n"
           "            with open(f'junk{i}', 'wb') as fh:\n                fh.write(b'x' * 100_000)\n"
           "            n += 1\n    except OSError as e:\n        return [n, e.errno]\n    return [n, 0]\n")
    tmp = tempfile.gettempdir()
    before = set(os.listdir(tmp))
    r = sb.run_job(_job(src, audit_hook=False), POLICY)
    n, errno = r.report["outputs"][0]
    assert errno == 28 and n <= 10  # ENOSPC
    # no junk file anywhere in the host's temporary directory: not at its top, not in any folder
    # that appeared during the run (other test workers' sandboxes may create and remove folders
    # there meanwhile, so the folder list itself is not compared)
    leaked = [f for f in os.listdir(tmp) if f.startswith("junk")]
    for d in set(os.listdir(tmp)) - before:
        for root, _, files in os.walk(os.path.join(tmp, d), onerror=lambda e: None):
            leaked += [os.path.join(root, f) for f in files if f.startswith("junk")]
    assert leaked == []


def test_the_number_of_files_is_capped():
    src = ("def f(x):\n    n = 0\n    try:\n        for i in range(1000):\n            open(f'e{i}', 'w').close()\n"
           "            n += 1\n    except OSError as e:\n        return [n, e.errno]\n    return [n, 0]\n")
    n, errno = sb.run_job(_job(src, audit_hook=False), POLICY).report["outputs"][0]
    assert errno == 28 and n == POLICY.limits.scratch_files


def test_an_answer_written_before_it_was_asked_ends_the_run():
    # the candidate writes a forged answer on its own answer pipe, then returns normally:
    # the parent finds two answers to one request and stops the run
    src = ("import os, sys\ndef f(x):\n"
           "    os.write(int(sys.argv[4]), b'{\"output\": 99, \"error\": null}\\n')\n    return x\n")
    r = sb.run_job(_job(src, calls=[(1,), (2,)]), POLICY)
    assert r.status == "violation" and "before it was asked" in r.detail and not r.ran


def test_a_forged_answer_read_before_the_real_one_is_still_caught():
    # the forged line arrives alone and is read as call 1's answer; the real answer lands only
    # after the parent has sent call 2, so the stream is one line out of step: the parent finds
    # the answer lines left over when the child ends and refuses the run
    src = ("import os, sys, time\ndef f(x):\n"
           "    os.write(int(sys.argv[4]), b'{\"output\": 99, \"error\": null}\\n')\n"
           "    time.sleep(0.3)\n    return x\n")
    r = sb.run_job(_job(src, calls=[(1,), (2,)]), POLICY)
    assert r.status == "violation" and "before it was asked" in r.detail and not r.ran


def test_a_malformed_answer_ends_the_run():
    src = "import os, sys\ndef f(x):\n    os.write(int(sys.argv[4]), b'not json\\n')\n    os._exit(0)\n"
    r = sb.run_job(_job(src), POLICY)
    assert r.status == "violation" and not r.ran


def test_return_values_keep_their_type():
    src = "def f(x):\n    return [True, 1, 1.0, 'a', (1, 2), {'k': None}, 2**70]\n"
    (out,) = sb.run_job(_job(src), POLICY).report["outputs"]
    assert out == [True, 1, 1.0, "a", [1, 2], {"k": None}, {"__bigint__": format(2**70, "x")}]
    assert sb.canonical_text(True) != sb.canonical_text(1) and sb.canonical_text(2.0) != sb.canonical_text(2)
    # an int subclass with a forged __eq__ is tagged, never equal to an int
    src = "class I(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return I(3)\n"
    (out,) = sb.run_job(_job(src), POLICY).report["outputs"]
    assert out == {"__unsupported__": "I"}


def test_the_parent_times_each_call_from_the_child_s_cpu_clock():
    # a call that burns ~30 ms of CPU and one that returns at once, in one session
    src = ("import time\nclock = time.process_time_ns\ndef f(ms):\n    t = clock()\n"
           "    while clock() - t < ms * 1_000_000:\n        pass\n    return ms\n")
    with sb.Session(src, "f", POLICY) as s:
        assert s.load()
        busy, idle = s.call([30]), s.call([0])
        total = s.cpu_ns()
    assert busy.text == "30" and idle.text == "0"
    assert busy.cpu_ns >= 30_000_000 > idle.cpu_ns  # CPU time (a lower bound), not wall-clock time
    assert total >= busy.cpu_ns + idle.cpu_ns
