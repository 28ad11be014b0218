"""`policylab quiz` / `policylab explain` / `policylab site build`: in process with piped
stdin, and as subprocesses with real pipes; unknown methods answer with close matches."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from policylab import methods
from policylab.learn import explain, quiz
from policylab.methods.cards import card_text

from .conftest import EXAMPLES, fx_leave_one_out

HERE = Path(__file__).resolve().parent


def _quiz(fb, method=None, lang="en", seed=0, answer="my guess\n"):
    out = io.StringIO()
    q = quiz.quiz(method, lang, seed, stdin=io.StringIO(answer), stdout=out, bank_dir=fb.bank_dir,
                  examples=EXAMPLES, topics_path=fb.topics_path)
    return q, out.getvalue()


def test_quiz_asks_reads_and_reveals_with_live_numbers(fixture_bank):
    q, text = _quiz(fixture_bank, method="rloo", seed=3, answer="the baseline is the others' mean\nsecond line\n")
    assert q.methods == ("rloo",) or "rloo" in q.methods
    # the question comes first, then the prompt, then what the reader typed, then the answer
    order = [text.index(q.question["en"]), text.index("Your answer (finish"),
             text.index("Your answer: the baseline is the others' mean\nsecond line"), text.index("Answer: ")]
    assert order == sorted(order)
    fresh = fx_leave_one_out([1.0, 0.0, 0.5])  # K=3: 1 - 0.25 = 0.75, 0 - 0.75 = -0.75, 0.5 - 0.5 = 0
    if q.example.function == "fx_leave_one_out":
        assert "    advantages = [0.7500, -0.7500, 0.0000]" in text and fresh["advantages"] == [0.75, -0.75, 0.0]


def test_quiz_is_seeded_and_covers_method_and_topics(fixture_bank):
    ids = {seed: _quiz(fixture_bank, method="rloo", seed=seed)[0].id for seed in range(12)}
    assert ids == {seed: _quiz(fixture_bank, method="rloo", seed=seed)[0].id for seed in range(12)}
    # rloo's own four, the cross-method question, and grpo's comparison question (it compares with rloo)
    assert set(ids.values()) <= {f"rloo-{c}" for c in ("basics", "mechanism", "comparison", "implementation")} | {
        "x-grpo-rloo", "grpo-comparison"}
    assert len(set(ids.values())) > 2  # the seed really changes the choice


def test_quiz_eof_and_chinese(fixture_bank):
    q, text = _quiz(fixture_bank, lang="zh", seed=1, answer="")  # stdin already at EOF
    assert "你的回答: （未作答）" in text and f"答案: {q.answer['zh']}" in text
    assert "实时数值（刚由 " in text


def test_quiz_unknown_method_close_matches(fixture_bank):
    with pytest.raises(methods.UnknownMethodError, match=r"unknown method 'rlo'\. Did you mean: rloo"):
        _quiz(fixture_bank, method="rlo")


def test_explain_prints_card_formula_and_examples(fixture_bank):
    out = io.StringIO()
    explain.explain("rloo", "en", stdout=out, bank_dir=fixture_bank.bank_dir, examples=EXAMPLES)
    text = out.getvalue()
    assert text.startswith(card_text(methods.get("rloo")))
    assert "advantage: policylab.kernels.advantages.rloo.rloo\n    A_i = r_i − (1/(K−1))" in text
    assert text.count("    advantages = [0.7500, -0.7500, 0.0000]") == 4
    assert "[rloo vs grpo · comparison] rloo-comparison" in text


def test_explain_needs_the_bank_file(fixture_bank):
    with pytest.raises(Exception, match="method 'dapo' has no bank file"):
        explain.explain_text("dapo", bank_dir=fixture_bank.bank_dir, examples=EXAMPLES)


def _fixture_cli(tmp_path, *args, stdin=""):
    return subprocess.run([sys.executable, str(HERE / "fixture_cli.py"), str(tmp_path / "fx"), *args],
                          input=stdin, capture_output=True, text=True, timeout=120)


def test_cli_quiz_through_a_pipe(tmp_path):
    res = _fixture_cli(tmp_path, "quiz", "--method", "grpo", "--seed", "2", stdin="it standardizes\n")
    assert res.returncode == 0, res.stderr
    assert "Your answer: it standardizes" in res.stdout and "live numbers, computed now by fx_" in res.stdout
    res = _fixture_cli(tmp_path, "quiz", "--lang", "zh", "--seed", "5")  # empty pipe: EOF at once
    assert res.returncode == 0, res.stderr
    assert "（未作答）" in res.stdout and "实时数值" in res.stdout


def test_cli_explain_and_site_build(tmp_path):
    res = _fixture_cli(tmp_path, "explain", "grpo", "--lang", "zh")
    assert res.returncode == 0, res.stderr
    assert "[grpo 对比 rloo · 比较] grpo-comparison" in res.stdout and "公式:" in res.stdout
    res = _fixture_cli(tmp_path, "site", "build", str(tmp_path / "site"), "--allow-incomplete")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "site" / "method-grpo.html").is_file() and "wrote " in res.stdout


def test_cli_unknown_method():
    res = subprocess.run([sys.executable, "-m", "policylab.learn.cli", "explain", "grpoo"], input="", capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2
    assert "policylab: error: unknown method 'grpoo'. Did you mean: grpo" in res.stderr


def test_main_cli_has_the_learning_commands():
    """policylab/cli.py's build_parser calls learn.cli.add_subcommands (one line, owned by the lead)."""
    import argparse

    from policylab.cli import build_parser

    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    assert {"quiz", "explain", "site"} <= set(sub.choices), (
        "policylab/cli.py: add `from .learn.cli import add_subcommands; add_subcommands(sub)` in build_parser")
    args = p.parse_args(["quiz", "--method", "grpo", "--lang", "zh", "--seed", "3"])
    assert (args.method, args.lang, args.seed) == ("grpo", "zh", 3)
    assert p.parse_args(["explain", "ppo"]).name == "ppo"
    assert p.parse_args(["site", "build", "out"]).out_dir == "out"


def _policylab(*args):
    """The installed `policylab` command (the console script), as a user runs it."""
    exe = Path(sys.executable).with_name("policylab")
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "policylab.cli"]
    return subprocess.run(cmd + list(args), input="", capture_output=True, text=True, timeout=300)


def test_cli_explain_plot_writes_svg_or_png_by_extension(tmp_path):
    """`policylab explain NAME --plot FILE` through the real command: the SVG is the site's
    figure byte for byte, a .png is a PNG of the same figure, a bad suffix writes nothing."""
    import struct

    from policylab.learn import figures
    from policylab.learn.figures import render

    svg = tmp_path / "kpop.svg"
    res = _policylab("explain", "kpop", "--plot", str(svg))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("kpop: ") and f"Figure (kpop) written to {svg}" in res.stdout
    assert svg.read_text(encoding="utf-8") == render.svg(figures.figure("kpop"), "en")
    png = tmp_path / "out" / "kpop.PNG"
    png.parent.mkdir()
    res = _policylab("explain", "kpop", "--lang", "zh", "--plot", str(png))
    assert res.returncode == 0, res.stderr
    assert f"图（kpop）已写入 {png}" in res.stdout and figures.figure("kpop").caption["zh"] in res.stdout
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    assert width > 800 and height > 400, (width, height)  # 200 dpi, not an empty canvas
    bad = tmp_path / "kpop.jpg"
    res = _policylab("explain", "kpop", "--plot", str(bad))
    assert res.returncode == 2 and "policylab: error: --plot writes .svg, .png or .pdf files" in res.stderr
    assert not bad.exists() and res.stdout == ""
