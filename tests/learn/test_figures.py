"""The method figures (policylab.learn.figures): a method asked for without a definition is
told the file to write (every shipped method's figure: test_shipped_lessons.py), plotted
points equal to a fresh kernel call at the same x, drawings that are the data (SVG paths = an affine image of the
plotted series), captions and alt text in both languages, overlays, `explain --plot`."""

from __future__ import annotations

import dataclasses
import io
import math
import re
import shutil

import pytest
import torch

from policylab.kernels import advantages, corrections, objectives
from policylab import methods
from policylab.learn import explain, figures
from policylab.learn.figures import render
from policylab.learn.figures.common import grid
from policylab.kernels.rewards import overlong_penalty

F64 = torch.float64


def series(fig, panel_title: str, label: str):
    """The series `label` of the panel titled `panel_title` (English texts)."""
    for p in fig.panels:
        if p.title["en"] == panel_title:
            for s in p.series:
                if s.label["en"] == label:
                    return s
    raise KeyError((panel_title, label, [(p.title["en"], [s.label["en"] for s in p.series]) for p in fig.panels]))


def at(s, x: float) -> float:
    """The plotted y at the grid point nearest x (and that grid point)."""
    i = min(range(len(s.x)), key=lambda j: abs(s.x[j] - x))
    return s.x[i], s.y[i]


# ------------------------------------------------------------------------ completeness


def _skeleton(msg: str, name: str) -> str:
    """The YAML the failure message proposes for `name`, dedented."""
    block = msg.split(f"method {name!r} has no figure: write ")[1].split("\n    and replace")[0]
    return "\n".join(line[6:] for line in block.splitlines()[1:]) + "\n"


@pytest.mark.parametrize("base, derived, view", [
    ("grpo", True, None),  # panels derived from the stages: the skeleton lists none
    ("gmc", False, "group_mass"),  # nothing derivable: the skeleton names the view its family uses
])
def test_a_method_registered_later_without_a_figure_is_told_what_to_add(monkeypatch, tmp_path, base, derived, view):
    name = f"{base}_variant"
    monkeypatch.setitem(methods.REGISTRY, name, dataclasses.replace(methods.get(base), name=name))
    figures.check_complete()  # not a shipped method: the package's figures stay complete without it
    with pytest.raises(figures.FigureError) as err:
        figures.definitions([name])  # asked for by name: told what to add
    msg = str(err.value)
    assert f"method '{name}' has no figure: write src/policylab/learn/figures/defs/{name}.yaml with" in msg
    assert msg.count("has no figure") == 1 and "docs/adding-a-method.md, step 5" in msg
    assert f"tests/learn/test_shipped_lessons.py -k {name}" in msg and f"explain {name} --plot" in msg
    assert "@view(\"name\") in src/policylab/learn/figures/views_<kind>.py" in msg
    skeleton = _skeleton(msg, name)
    assert skeleton.startswith(f"method: {name}\n")
    assert ("panels:" not in skeleton) == derived
    if view:
        assert f"- view: {view}" in skeleton
    # pasted as it is, the placeholders are refused ...
    defs = tmp_path / "defs"
    shutil.copytree(figures.DEFS_DIR, defs)
    (defs / f"{name}.yaml").write_text(skeleton, encoding="utf-8")
    with pytest.raises(figures.FigureError, match=r"`en.caption` is still the placeholder") as err:
        figures.check_complete(defs_dir=defs)  # a file present is validated, shipped or not
    assert "`zh.caption` is still the placeholder" in str(err.value)
    # ... and with the two captions written, the method has its figure
    filled = skeleton.replace(figures.PLACEHOLDERS["en"], "What to look at.").replace(
        figures.PLACEHOLDERS["zh"], "看这里。")
    (defs / f"{name}.yaml").write_text(filled, encoding="utf-8")
    figures.check_complete(defs_dir=defs)
    fig = figures.figure(name, defs_dir=defs)
    assert fig.panels and fig.caption == {"en": "What to look at.", "zh": "看这里。"}


def test_site_build_fails_for_a_page_without_a_figure(tmp_path):
    from policylab.learn import site

    from .conftest import EXAMPLES, FixtureBank

    defs = tmp_path / "defs"
    shutil.copytree(figures.DEFS_DIR, defs)
    (defs / "rloo.yaml").unlink()
    fb = FixtureBank(tmp_path / "bank")
    with pytest.raises(figures.FigureError, match=r"method 'rloo' has no figure: write .*rloo\.yaml"):
        site.build_site(tmp_path / "out", bank_dir=fb.bank_dir, examples=EXAMPLES, topics_path=fb.topics_path,
                        complete=False, figures_dir=defs)


def _write(tmp_path, name, text):
    d = tmp_path / "defs"
    d.mkdir(exist_ok=True)
    (d / f"{name}.yaml").write_text(text, encoding="utf-8")
    return d


@pytest.mark.parametrize("text, match", [
    ("method: tis\nen: {caption: ok}\n", r"missing `zh`"),
    ("method: tis\nen: {caption: ok}\nzh: {caption: not translated}\n", r"`zh.caption` has no Chinese"),
    ("method: tis\npanels: [engine_wieght]\nen: {caption: ok}\nzh: {caption: 好}\n",
     r"unknown view 'engine_wieght' \(did you mean: engine_weight"),
    ("method: icepop\nen: {caption: ok}\nzh: {caption: 好}\n", r"does not match the file name"),
    ("method: tis\nfigure: x\nen: {caption: ok}\nzh: {caption: 好}\n", r"unknown top-level key\(s\) \['figure'\]"),
])
def test_bad_definitions_are_refused(tmp_path, text, match):
    d = _write(tmp_path, "tis", text)
    with pytest.raises(figures.FigureError, match=match):
        figures.definitions(["tis"], defs_dir=d)


def test_a_view_that_fails_names_the_file_and_method(tmp_path):
    d = _write(tmp_path, "gmc", "method: gmc\npanels: [policy_ratio]\nen: {caption: ok}\nzh: {caption: 好}\n")
    # GMC's correction reads frozen per-round weights the ratio view does not provide
    with pytest.raises(figures.FigureError, match=r"gmc.yaml: view 'policy_ratio' failed for gmc: .*gmc_weight"):
        figures.figure("gmc", defs_dir=d)


def test_panels_are_derived_from_the_stages_when_not_listed():
    views = lambda n: [r.view for r in figures.derived_panels(methods.get(n))]  # noqa: E731
    assert views("grpo") == ["group_advantages", "policy_ratio"]  # rewards+group estimator, ratio objective
    assert views("rloo") == ["group_advantages"]  # REINFORCE reads no logp_old: no ratio panel
    assert views("tis") == views("online_icepop") == ["engine_weight"]  # corrections on the engine roles
    assert views("gmc") == []  # its correction reads round weights: a definition must choose
    assert figures.definitions(["tis"])["tis"].panels is None  # tis.yaml relies on the derivation
    assert [p.title["en"] for p in figures.figure("tis").panels] == ["one token, policy ratio 1"]


# ------------------------------------------------------------- plotted point == fresh call


def _ppo_weight(ratio: float, adv: float, eps_low: float, eps_high: float) -> float:
    """−(∂ℓ/∂lp)/A of one token from objectives.ppo_clip, called here directly."""
    lp_old = torch.tensor([[math.log(0.5)]], dtype=F64)
    lp = (lp_old + math.log(ratio)).requires_grad_()
    loss, _ = objectives.ppo_clip(lp, lp_old, torch.tensor([adv], dtype=F64), torch.ones((1, 1), dtype=torch.bool),
                                  eps_low=eps_low, eps_high=eps_high)
    loss.sum().backward()
    return float(-lp.grad[0, 0] / adv)


def test_ppo_ratio_points_equal_a_fresh_ppo_clip_call():
    fig = figures.figure("ppo")
    for x in (0.7, 0.9, 1.1, 1.3):
        for title, adv in (("A > 0", 1.0), ("A < 0", -1.0)):
            gx, y = at(series(fig, title, "ppo"), x)
            assert abs(gx - x) < 1e-9
            assert y == pytest.approx(_ppo_weight(gx, adv, 0.2, 0.2), abs=1e-12), (title, x)
    # the regions, by hand: A > 0 keeps ρ up to 1.2 and then 0; A < 0 is 0 below 0.8 and ρ above
    assert at(series(fig, "A > 0", "ppo"), 1.1)[1] == pytest.approx(1.1)
    assert at(series(fig, "A > 0", "ppo"), 1.3)[1] == 0.0
    assert at(series(fig, "A < 0", "ppo"), 0.7)[1] == 0.0


def test_tis_engine_weights_equal_a_fresh_tis_call():
    s = series(figures.figure("tis"), "one token, policy ratio 1", "tis")
    for k in (0.25, 0.5, 1.0, 1.5, 2.0, 4.0):
        gk, y = at(s, k)
        lp_old = torch.tensor([[math.log(0.1)]], dtype=F64)
        w, _ = corrections.tis(lp_old, lp_old - math.log(gk), torch.ones((1, 1), dtype=torch.bool), cap=2.0)
        assert y == pytest.approx(float(w[0, 0]), rel=1e-12), k  # host PPO at ratio 1 contributes exactly 1
    assert at(s, 4.0)[1] == pytest.approx(2.0)  # min(4, C = 2)


def test_grpo_group_advantages_equal_a_fresh_grpo_call():
    fig = figures.figure("grpo")
    s = series(fig, "one group of 6 replies", "grpo")
    fresh = advantages.grpo(torch.tensor(s.x, dtype=F64), torch.zeros(len(s.x), dtype=torch.long), std="unbiased",
                            eps=1e-6)
    assert s.y == pytest.approx(fresh.tolist(), abs=1e-12)
    right = series(fig, "binary rewards, group of 8", "a correct reply")
    k, y = right.x[0], right.y[0]  # one correct out of 8
    r = torch.tensor([1.0] * int(k) + [0.0] * (8 - int(k)), dtype=F64)
    assert y == pytest.approx(float(advantages.grpo(r, torch.zeros(8, dtype=torch.long), std="unbiased")[0]))
    # by hand: mean 1/8, unbiased std sqrt(1/8) = 0.35355, A = 0.875 / 0.35355 = 2.4749
    assert y == pytest.approx(2.4749, abs=1e-4)


def test_kpop_gmc_overlong_vapo_points_equal_fresh_kernel_calls():
    kl = series(figures.figure("kpop"), "π_old = 0.1", "KL(train ‖ serve)")
    k, y = at(kl, 2.0)
    lp = torch.tensor([[math.log(0.1)]], dtype=F64)
    _, m = corrections.kpop(lp, lp - math.log(k), torch.ones((1, 1), dtype=torch.bool), delta=0.01,
                            in_region_weight="ratio")
    assert y == pytest.approx(float(m["kpop/kl_forward_mean"]), rel=1e-12)

    g = series(figures.figure("gmc"), "capped weights", "that trajectory")
    w0, y = at(g, 12.0)
    w = torch.ones(8, dtype=F64)
    w[0] = w0
    capped, _ = corrections.gmc(w, torch.zeros(8, dtype=torch.long), cap=8.0)
    assert y == pytest.approx(float(capped[0]))  # mass 19 > 8: 12 · 8/19 = 5.0526
    assert y == pytest.approx(12 * 8 / 19)

    o = series(figures.figure("dapo"), "L_max = 32, L_cache = 6", "overlong penalty")
    n, y = at(o, 29)
    assert y == float(overlong_penalty(torch.tensor([int(n)]), max_len=32, cache_len=6)[0])  # (26 - 29)/6 = -0.5

    v = series(figures.figure("vapo"), "α = 0.05", "λ_policy = 1 − 1/(α·l)")
    n, y = at(v, 100)
    lam, _ = advantages.length_adaptive_lambda(torch.tensor([n], dtype=F64), alpha=0.05)
    assert y == pytest.approx(float(lam[0])) and y == pytest.approx(0.8)  # 1 − 1/(0.05·100)


# ------------------------------------------------------------------ the drawing is the data

_G = re.compile(r'<g id="(pl-s\d+-\d+)"[^>]*>\s*<path (?:clip-path="[^"]*" )?d="([^"]*)"', re.S)


def drawn_paths(svg_text: str) -> dict[str, list[tuple[float, float]]]:
    out = {}
    for sid, d in _G.findall(svg_text):
        nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", d)]
        out[sid] = list(zip(nums[0::2], nums[1::2]))
    return out


def assert_affine(data: list[float], drawn: list[float], log: bool = False):
    """drawn = a·data + b (data in log space on a log axis), to the SVG's 0.01 pt."""
    d = [math.log(v) for v in data] if log else data
    i, j = min(range(len(d)), key=d.__getitem__), max(range(len(d)), key=d.__getitem__)
    if d[j] == d[i]:
        assert max(drawn) - min(drawn) < 0.02
        return
    a = (drawn[j] - drawn[i]) / (d[j] - d[i])
    b = drawn[i] - a * d[i]
    for u, v in zip(d, drawn):
        assert abs(a * u + b - v) < 0.02, (u, v, a * u + b)


@pytest.mark.parametrize("name", ["ppo", "tis", "grpo", "kpop"])
def test_svg_lines_are_the_plotted_series(name):
    fig = figures.figure(name)
    paths = drawn_paths(render.svg(fig, "en"))
    checked = 0
    for pi, p in enumerate(fig.panels):
        for si, s in enumerate(p.series):
            sid = figures.series_id(pi, si)
            if s.kind != "line" or p.ylim is not None:
                continue
            pts = paths[sid]
            assert len(pts) == len(s.x), sid
            assert_affine(s.x, [q[0] for q in pts], log=p.xscale == "log")
            assert_affine(s.y, [q[1] for q in pts])
            checked += 1
    assert checked >= 1


def test_svg_text_is_searchable_and_deterministic():
    fig = figures.figure("cispo")
    en, zh = render.svg(fig, "en"), render.svg(fig, "zh")
    assert ">policy ratio ρ = π_θ/π_old</text>" in en and ">策略比率 ρ = π_θ/π_old</text>" in zh
    assert "font-family: 'DejaVu Sans'" in en and "'Noto Sans CJK SC'" in zh  # CSS stack with CJK fallbacks
    assert 'xml:lang="zh-CN"' in zh
    render.clear_cache()
    assert render.svg(fig, "en") == en  # same bytes on a second draw (fixed hash salt, no date)


def test_alt_text_describes_every_series_in_both_languages():
    fig = figures.figure("icepop")
    en, zh = figures.alt_text(fig, "en"), figures.alt_text(fig, "zh")
    for s in fig.panels[0].series:
        assert s.label["en"] in en and s.label["zh"] in zh
    assert "engine ratio k = π_old/μ" in en and "引擎比率" in zh and "log scale" in en and "对数刻度" in zh
    assert en.startswith(f"Figure icepop: {fig.caption['en']}")


# ---------------------------------------------------------------------------- overlays


def test_overlays_put_each_method_on_shared_axes():
    defs = {o.key: o for o in figures.overlay_defs()}
    assert {"clipped-objectives", "engine-corrections", "group-baselines"} <= set(defs)
    fig = figures.overlay("clipped-objectives")
    assert fig.methods == ("ppo", "cispo", "gppo", "gspo")
    for p in fig.panels:
        assert [s.label["en"] for s in p.series] == ["ppo", "cispo", "gppo", "gspo"]
    # each method's curve is that method's own loss: CISPO keeps 1 + ε_high = 1.28 above the bound for A > 0
    assert at(series(fig, "A > 0", "cispo"), 1.4)[1] == pytest.approx(1.28)
    assert at(series(fig, "A > 0", "ppo"), 1.4)[1] == 0.0
    eng = figures.overlay("engine-corrections")
    labels = [s.label["en"] for s in eng.panels[0].series]
    assert labels[:5] == ["tis", "icepop", "kpop", "mis", "minirl"]
    assert labels.count("host objective alone (no correction)") == 1  # a shared reference, kept once
    for o in defs.values():
        assert figures.overlay(o).panels


def test_overlay_with_an_unknown_method_is_refused(tmp_path):
    path = tmp_path / "overlays.yaml"
    path.write_text("overlays:\n  - id: x\n    view: policy_ratio\n    methods: [ppo, ppo_typo]\n"
                    "    en: {title: t, caption: c}\n    zh: {title: 标题, caption: 说明}\n", encoding="utf-8")
    with pytest.raises(figures.FigureError, match="unknown method 'ppo_typo'"):
        figures.overlay_defs(path)


# ------------------------------------------------------------------------ explain --plot


def test_explain_plot_writes_the_site_figure(tmp_path):
    out = io.StringIO()
    path = explain.write_plot("gppo", tmp_path / "gppo.svg", "zh", stdout=out)
    assert path.read_text(encoding="utf-8") == render.svg(figures.figure("gppo"), "zh")
    assert "图（gppo）已写入" in out.getvalue() and figures.figure("gppo").caption["zh"] in out.getvalue()
    png = explain.write_plot("gppo", tmp_path / "gppo.png", "en", stdout=io.StringIO())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_explain_plot_cli(tmp_path, capsys):
    from policylab.cli import main

    assert main(["explain", "tis", "--plot", str(tmp_path / "tis.svg")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("tis: ") and f"Figure (tis) written to {tmp_path / 'tis.svg'}" in text
    assert (tmp_path / "tis.svg").read_text(encoding="utf-8").startswith("<?xml")
    assert main(["explain", "tis", "--plot", str(tmp_path / "tis.txt")]) == 2
    assert "--plot writes .svg, .png or .pdf files" in capsys.readouterr().err


def test_grid_includes_the_kinks():
    xs = grid(0.5, 1.5, 11, keys=(0.8, 1.28, 9.0))
    assert 1.28 in xs and 0.8 in xs and 9.0 not in xs and xs == sorted(xs)
    with pytest.raises(ValueError, match="lo > 0 on a log axis"):
        grid(0.0, 1.0, 5, log=True)
