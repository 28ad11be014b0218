"""`policylab evidence`: both arms of a mechanism on the tiny random Llama, shared
controls, resume, refusals; the declarations of every registered method; the quantities
and the verdict statistics against hand-worked numbers."""

from __future__ import annotations

import io
import json
import math

import pytest
import torch

from policylab import methods
from policylab.errors import ConfigError, RunInterrupted
from policylab.methods.registry import UnknownMethodError
from policylab.experiments.evidence import Settings, evidence, requested
from policylab.experiments.evidence.arms import arms_of, shared_run
from policylab.experiments.evidence.verdict import NOT_OBSERVED, OBSERVED, paired, verdict
from policylab.methods.mechanisms import MECHANISMS, REDUCTIONS, TASKS, Quantity, mechanism

# the tiny model answers nothing right: a reward with mixed outcomes gives the arms a signal
TINY_SETS = (("task.reward", "trainer_utils:gold_or_even"), ("rollout.max_new_tokens", 4),
             ("rollout.group_size", 4), ("rollout.prompts_per_step", 2), ("train.micro_batch_size", 4))


def tiny_settings(tmp_path, model_dir, seeds=(0, 1), steps=1):
    return Settings(out_dir=tmp_path / "ev", seeds=seeds, steps=steps, model=str(model_dir), eval_n=4,
                    sets=TINY_SETS)


def quiet():
    from rich.console import Console

    return Console(file=io.StringIO(), width=200)


# ----------------------------------------------------------------------------- declarations
def test_every_registered_method_declares_one_mechanism():
    assert set(MECHANISMS) == set(methods.names())
    for name, m in MECHANISMS.items():
        assert mechanism(name) is m and m.method == name and m.signature
        assert m.direction in (1, -1), name
        if m.measurable:
            assert isinstance(m.quantity, Quantity) and m.task in TASKS, name
        else:
            assert m.quantity is None and len(m.not_measurable_here) > 40, name


def test_every_declared_control_is_a_valid_run_of_a_registered_method():
    from policylab.trainer.config import config_from_dict
    from policylab.trainer.loop import run_shape

    s = Settings(out_dir=__import__("pathlib").Path("/nonexistent"))
    for name, m in MECHANISMS.items():
        if not m.measurable:
            continue
        arm, control = arms_of(m, s)
        for a in (arm, control):
            cfg = config_from_dict({**a.run, "method": a.method, "seed": 0, "run_dir": "/nonexistent/x",
                                    "method_params": {**({"kl_coef": 0.0} if any(
                                        p.name == "kl_coef" for p in methods.get(a.method).params) else {}),
                                        **a.method_params}})
            methods.get(a.method).with_params(cfg.method_params, run_shape(cfg))
        # the control differs from the method arm (otherwise it switches nothing off)
        assert (arm.method, arm.method_params, arm.run) != (control.method, control.method_params, control.run), name


def test_own_task_comes_from_the_methods_exercise_and_the_task_preset_wins_over_it():
    for name, m in MECHANISMS.items():
        if m.measurable and m.task == "own":
            assert "task" in methods.get(name).exercise, name
    s = Settings(out_dir=__import__("pathlib").Path("/x"))
    # tis' exercise asks for a bf16 engine; its mechanism's preset (int4) is the one measured
    assert shared_run(MECHANISMS["tis"], s, control=False)["rollout"]["engine_dtype"] == "int4"
    rlid = shared_run(MECHANISMS["rlid"], s, control=False)
    assert rlid["task"] == {"name": "menu_arithmetic", "reward": "menu_label"}
    # grpo's no-update control differs from its method arm only in the learning rate
    a, c = shared_run(MECHANISMS["grpo"], s, control=False), shared_run(MECHANISMS["grpo"], s, control=True)
    assert c["train"].pop("lr") == 0.0 and a["train"].pop("lr") == 1.0e-5 and a == c


# ----------------------------------------------------------------------------- quantities
def test_quantity_reductions_hand_worked():
    # steps out of order, a NaN, a bool and a missing key are skipped: values in step order 0.5, 1.5, 2.0, 4.0
    rows = [{"step": 3, "k": 2.0}, {"step": 1, "k": 0.5}, {"step": 2, "k": 1.5}, {"step": 5, "k": float("nan")},
            {"step": 6, "k": True}, {"step": 7}, {"step": 4, "k": 4}, {"k": 100.0}]
    assert Quantity("k", "mean")(rows) == pytest.approx((0.5 + 1.5 + 2.0 + 4.0) / 4)  # 2.0
    assert Quantity("k", "late")(rows) == pytest.approx((2.0 + 4.0) / 2)  # second half of 4 values: 3.0
    # odd count: 5 values, the second half starts at index 5 // 2 = 2: (3 + 4 + 5) / 3 = 4
    five = [{"step": i, "k": float(i)} for i in range(1, 6)]
    assert Quantity("k", "late")(five) == pytest.approx(4.0)
    assert Quantity("k", "late")([{"step": 1, "k": 7.0}]) == 7.0  # one value: itself
    assert Quantity("k")([{"step": 1, "other": 1.0}]) is None
    # final: the value of the last step that logged it (4 at step 4; the NaN at 5 and the bool at 6 skipped)
    assert Quantity("k", "final")(rows) == 4.0 and Quantity("k", "final").label == "final value of `k`"
    with pytest.raises(ValueError, match="reduce"):
        Quantity("k", "median")


@pytest.mark.parametrize("name", sorted(n for n, m in MECHANISMS.items() if m.measurable))
def test_each_declared_quantity_reads_its_key_hand_worked(name):
    q = MECHANISMS[name].quantity
    assert q.reduce in REDUCTIONS
    rows = [{"step": 1, q.key: 0.5, "noise": 9.0}, {"step": 2, q.key: 1.5}, {"step": 3, q.key: 2.0},
            {"step": 4, q.key: 4.0}, {"step": 5, "noise": 1.0}]
    want = {"mean": 2.0, "late": 3.0, "final": 4.0}[q.reduce]  # (0.5+1.5+2+4)/4 ; (2+4)/2 ; the last
    assert q(rows) == pytest.approx(want, abs=1e-12)
    assert q([{"step": 1, "noise": 1.0}]) is None


# ----------------------------------------------------------------------------- statistics
def test_paired_difference_and_verdict_hand_worked():
    # d = [0.5, 1.0, 2.5]: mean 4/3; sample var ((-5/6)^2 + (-1/3)^2 + (7/6)^2) / 2 = (25/36 + 4/36 + 49/36) / 2
    # = 78/72 = 1.08333; se = sqrt(1.08333 / 3) = 0.600925; t = 2.2188 < t(2) = 4.303
    s = paired({0: 1.0, 1: 2.0, 2: 4.0, 3: None}, {0: 0.5, 1: 1.0, 2: 1.5, 3: 0.0})
    assert s["seeds"] == [0, 1, 2] and s["difference"] == pytest.approx(4 / 3)
    assert s["difference_se"] == pytest.approx(math.sqrt(78 / 72 / 3)) and s["t"] == pytest.approx(2.21880, abs=1e-4)
    assert s["method"] == pytest.approx(7 / 3) and s["control"] == pytest.approx(1.0)
    # seeds for |t| = 1.96: (1.96 * sd / |mean|)^2 = (1.96 * 1.040833 / 1.333333)^2 = 2.341 -> 3
    assert s["seeds_needed"] == 3
    assert verdict(s, 1) == (NOT_OBSERVED, "difference within noise: |t| = 2.22 < 4.30 (3 seeds)")
    # accuracies whose differences cancel exactly, +1/12 - 1/12 + 0 (the fp sum leaves ~1e-17): no effect
    # to power, so no seed count (it once printed "about 97318272746609 seeds")
    s = paired({0: 0.5 + 1 / 12, 1: 0.4, 2: 0.3}, {0: 0.5, 1: 0.4 + 1 / 12, 2: 0.3})
    assert s["difference"] == 0.0 and s["seeds_needed"] is None and s["t"] == 0.0
    # the same with the accuracies stored in float32, as the runs record them (residue ~1e-8)
    f32 = [float(torch.tensor(x, dtype=torch.float32)) for x in (0.5 + 1 / 12, 0.4, 0.4 + 1 / 12, 7 / 15)]
    s = paired({0: f32[0], 1: f32[1], 2: f32[3]}, {0: 0.5, 1: f32[2], 2: 7 / 15})
    assert s["difference"] == 0.0 and s["seeds_needed"] is None
    # a small real difference (1e-4 of the value) is kept
    assert paired({0: 0.5001, 1: 0.5002}, {0: 0.5, 1: 0.5})["difference"] == pytest.approx(1.5e-4)
    # d = [1.0, 1.1, 0.9]: mean 1.0, var (0 + 0.01 + 0.01) / 2 = 0.01, se = sqrt(0.01 / 3) = 0.057735, t = 17.32
    s = paired({0: 2.0, 1: 2.1, 2: 1.9}, {0: 1.0, 1: 1.0, 2: 1.0})
    assert s["t"] == pytest.approx(17.3205, abs=1e-3)
    assert verdict(s, 1)[0] == OBSERVED
    assert verdict(s, -1) == (NOT_OBSERVED, "significant in the opposite direction: |t| = 17.32 >= 4.30 (3 seeds)")
    # identical differences: se 0, t infinite in the sign of the mean
    s = paired({0: 1.0, 1: 2.0}, {0: 0.0, 1: 1.0})
    assert s["difference_se"] == 0.0 and s["t"] == math.inf
    assert verdict(s, 1) == (NOT_OBSERVED, "in the claimed direction, |t| = inf >= 12.71, but 2 seeds are too few "
                                           "for a claim (at least 3)")
    three = paired({0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.0, 1: 1.0, 2: 2.0})  # identical differences over 3 seeds
    assert three["t"] == math.inf and verdict(three, 1)[0] == OBSERVED
    assert verdict(paired({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}), 1) == (NOT_OBSERVED, "no difference at all (2 seeds)")
    one = paired({0: 5.0}, {0: 1.0})
    assert one["difference_se"] is None and verdict(one, 1)[0] == NOT_OBSERVED
    assert verdict(paired({}, {}), 1)[0] == NOT_OBSERVED
    with pytest.raises(ValueError):
        verdict(s, 0)


# ----------------------------------------------------------------------------- the command
def test_evidence_runs_both_arms_shares_the_control_and_writes_one_table(tmp_path, small_model_dir):
    s = tiny_settings(tmp_path, small_model_dir)
    table = evidence(["gspo", "cispo", "cord"], s, console=quiet(), command="policylab evidence gspo cispo cord")
    rows = {r["method"]: r for r in table["rows"]}
    assert set(rows) == set(methods.names()) | {"orl"}  # the literature-only entry too
    for name in ("gspo", "cispo"):
        r = rows[name]
        assert r["verdict"] in ("observed", "not observed", "not measurable here"), r
        assert r["runs"]["control_label"] == "grpo" and r["runs"]["method_group"] == r["runs"]["control_group"]
        assert set(r["per_seed"]) == {"0", "1"}
        cap = r["capability"]
        assert cap["method"]["optimizer_steps"] == 4 == cap["control"]["optimizer_steps"]  # 1 step x 4 minibatches
        assert cap["method"]["sampled_tokens"] > 0 and cap["paired_accuracy"]["n"] == 2
    # the per-seed quantities are the declared quantity of each arm's own metrics
    from policylab.trainer.runlog import read_metrics

    group = tmp_path / "ev" / rows["gspo"]["runs"]["method_group"]
    for seed in (0, 1):
        for lab, arm in (("gspo", "method"), ("grpo", "control")):
            got = MECHANISMS["gspo"].quantity(read_metrics(group / "runs" / f"{lab}-seed{seed}" / "metrics.jsonl"))
            assert rows["gspo"]["per_seed"][str(seed)][arm] == got
    if rows["gspo"]["verdict"] != "not measurable here":
        st = rows["gspo"]["stats"]
        d = [rows["gspo"]["per_seed"][str(k)]["method"] - rows["gspo"]["per_seed"][str(k)]["control"] for k in (0, 1)]
        assert st["difference"] == pytest.approx(sum(d) / 2)
    # one plain-GRPO control run per seed serves both gspo and cispo
    assert sorted(p.name for p in (group / "runs").iterdir()) == [
        "cispo-seed0", "cispo-seed1", "grpo-seed0", "grpo-seed1", "gspo-seed0", "gspo-seed1"]
    assert rows["cord"]["verdict"] == "not measurable here" and "retention" in rows["cord"]["why"]
    assert rows["dapo"]["verdict"] == "not run"
    # the capability table: each method arm against the plain-GRPO run of its group, paired by seed
    cap = {r["method"]: r for r in table["capability"]}
    assert set(cap) == {"gspo", "cispo"}
    for name in ("gspo", "cispo"):
        c, mine = cap[name], rows[name]["capability"]
        assert c["seeds"] == [0, 1] and c["optimizer_steps"] == [4, 4]
        assert c["difference"] == pytest.approx(mine["paired_accuracy"]["difference"])
        if c["difference_se"] is not None:  # 95% t interval with 1 degree of freedom
            assert c["interval"] == pytest.approx([c["difference"] - 12.706 * c["difference_se"],
                                                   c["difference"] + 12.706 * c["difference_se"]])
    assert "## Held-out accuracy against GRPO on the same prompts" in (tmp_path / "ev" / "evidence.md").read_text()
    # the cost line: distinct runs (shared controls once) x seeds, and the mean measured wall-clock per run
    # (a method its task refuses at these settings, e.g. on the tiny model, needs no runs)
    distinct = {(a.group, a.label) for m in MECHANISMS.values() if m.measurable and rows[m.method]["verdict"] != "refused"
                for a in arms_of(m, s)}
    assert table["cost"]["runs_needed"] == 2 * len(distinct) and table["cost"]["seconds_per_run"] > 0
    md = (tmp_path / "ev" / "evidence.md").read_text()
    assert "policylab evidence gspo cispo cord" in md and "| `gspo` |" in md
    assert json.loads((tmp_path / "ev" / "evidence.json").read_text())["counts"] == table["counts"]
    # a second invocation runs nothing and gives the same rows
    stamp = (group / "runs" / "grpo-seed0" / "metrics.jsonl").stat().st_mtime_ns
    again = evidence(["cispo"], s, console=quiet(), command="policylab evidence cispo")
    assert (group / "runs" / "grpo-seed0" / "metrics.jsonl").stat().st_mtime_ns == stamp
    assert [r for r in again["rows"] if r["method"] == "gspo"] == [rows["gspo"]]
    assert again["commands"] == ["policylab evidence gspo cispo cord", "policylab evidence cispo"]


def test_an_interrupted_evidence_run_resumes_where_it_stopped(tmp_path, small_model_dir, monkeypatch):
    from policylab.trainer import loop as trainer_mod

    s = tiny_settings(tmp_path, small_model_dir, seeds=(0,), steps=2)
    real = trainer_mod.Trainer.train_step
    calls = {"n": 0}

    def flaky(self):
        calls["n"] += 1
        if calls["n"] == 4:  # gspo's 2 steps (seed-major: the method arm first), then grpo's second step
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", flaky)
    with pytest.raises(RunInterrupted, match=r"Run `policylab evidence gspo` again to continue"):
        evidence(["gspo"], s, console=quiet(), command="policylab evidence gspo")
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", real)
    table = evidence(["gspo"], s, console=quiet(), command="policylab evidence gspo")
    row = next(r for r in table["rows"] if r["method"] == "gspo")
    assert row["verdict"] == "not observed" and "1 seed(s)" in row["why"]  # one seed: no uncertainty, no claim
    log = (tmp_path / "ev" / row["runs"]["control_group"] / "runs" / "grpo-seed0" / "metrics.jsonl").read_text()
    assert '"event": "resumed_from"' in log
    assert row["capability"]["control"]["optimizer_steps"] == 8  # 2 steps x 4 minibatches, across the resume


def test_unknown_and_literature_only_methods_and_no_names_are_refused(tmp_path):
    from policylab.methods.registry import LiteratureOnlyError

    with pytest.raises(UnknownMethodError, match="unknown method 'dapoo'.*dapo"):
        requested(["dapoo"], False)
    with pytest.raises(LiteratureOnlyError):
        requested(["orl"], False)
    with pytest.raises(ConfigError, match="or pass --all"):
        requested([], False)
    with pytest.raises(ConfigError, match="not both"):
        requested(["dapo"], True)
    assert [m.method for m in requested([], True)] == methods.names()


def test_cli_evidence_refuses_before_running_and_plans(tmp_path, small_model_dir):
    from cli_utils import cli

    res = cli("evidence", "nope", "--out", str(tmp_path / "ev"))
    assert res.returncode == 2 and res.stderr.startswith("policylab: error: unknown method 'nope'"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "ev").exists()
    res = cli("evidence", "gspo", "--seeds", "0,0", "--out", str(tmp_path / "ev"))
    assert res.returncode == 2 and "distinct" in res.stderr
    args = ["evidence", "gspo", "--model", str(small_model_dir), "--out", str(tmp_path / "ev"), "--seeds", "0",
            "--steps", "1", "--eval-n", "4"] + [x for k, v in TINY_SETS for x in ("--set", f"{k}={v}")]
    res = cli(*args, "--plan")
    assert res.returncode == 0, res.stderr
    assert "gspo: mean of `policy/clip_frac`" in res.stdout and "runs       2 new" in res.stdout
    assert not (tmp_path / "ev").exists()  # --plan runs and writes nothing


# ----------------------------------------------------------------------------- card levels
def test_every_card_states_four_levels_derived_from_measured_results():
    from policylab.methods import evidence as ev

    for name in methods.names():
        lv = ev.levels(name)
        assert lv.formula == ev.FORMULA and lv.scale in (ev.SCALE, ev.SCALE_TRL, ev.SCALE_STEP)
        assert (lv.scale == ev.SCALE_STEP) == (name in ("cord", "gcpo", "iso")), name
        if name in ev._CAPABILITY:
            assert lv.capability == ev.EVIDENCE[name]
        else:
            assert lv.capability == ev.CAPABILITY_RUNS.get(name, ev.NOT_MEASURED), name
        decl = MECHANISMS[name]
        if name in ev.MECHANISM:
            assert lv.mechanism == ev.MECHANISM[name]
        elif not decl.measurable:
            assert lv.mechanism.startswith("not measurable here: ") and lv.mechanism[21:] in decl.not_measurable_here
        else:
            assert lv.mechanism == ev.NOT_MEASURED, name
        status = methods.get(name).card.status
        assert status.startswith(ev.EVIDENCE[name]) and f"mechanism {lv.mechanism};" in status, name
    with pytest.raises(KeyError):
        ev.levels("nope")


def test_card_mechanism_levels_agree_with_the_committed_evidence_table():
    from pathlib import Path

    from policylab.experiments.evidence.table import capability_texts, card_texts
    from policylab.methods import evidence as ev

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "evidence.json"
    table = json.loads(path.read_text()) if path.is_file() else {"rows": []}
    assert ev.MECHANISM == card_texts(table)
    assert ev.CAPABILITY_RUNS == capability_texts(table)


def test_the_committed_table_has_a_row_with_a_verdict_for_every_registered_method():
    """Trainable methods and literature-only entries alike; a literature-only row is not
    measurable and says why from its card."""
    from pathlib import Path

    from policylab import methods
    from policylab.experiments.evidence.table import literature_rows
    from policylab.methods import registry

    table = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "evidence.json").read_text())
    rows = {r["method"]: r for r in table["rows"]}
    assert sorted(rows) == sorted(methods.names() + registry.literature_names())
    assert all(r["verdict"] in ("observed", "not observed", "not measurable here") for r in rows.values())
    (orl,) = [r for r in literature_rows() if r["method"] == "orl"]
    assert orl["verdict"] == "not measurable here" and "diffusion" in orl["why"]
    assert rows["orl"] == orl


def test_card_text_of_a_measured_row_hand_worked():
    from policylab.experiments.evidence.table import card_text

    row = {"method": "gspo", "verdict": "observed", "quantity": "mean of `policy/clip_frac`", "control": "grpo",
           "why": "x", "per_seed": {}, "stats": {"method": 0.5, "control": 0.125, "difference": 0.375,
                                                 "difference_se": 0.0125, "n": 3}}
    assert card_text(row) == ("observed: mean of `policy/clip_frac` 0.5 vs 0.125 for the control (grpo), difference "
                              "+0.375 ± 0.0125 over 3 seeds (benchmarks/results/evidence.md)")
    refused = {"verdict": "refused", "why": "evidence x: nothing was run: the task's base accuracy cannot be measured: "
                                            "the verifier `v` gives ..."}
    assert card_text(refused) == ("refused on its task: the task's base accuracy cannot be measured "
                                  "(benchmarks/results/evidence.md)")
    assert card_text({"verdict": "not run"}) is None
    assert card_text({"verdict": "not measurable here", "why": "declared"}) is None


def test_stated_confidence_probe_hand_worked():
    from policylab.tasks.confidence import ConfidenceTask

    replies = ["7\nConfidence: 0.9", "8\nConfidence: 0.2", "5", "3\nConfidence: 1.5", "4\nconfidence: 60%"]
    correct = [True, False, True, False, True]
    # parsed: 0.9 (right), 0.2 (wrong), 0.6 (right); "5" has none, 1.5 is out of range
    # Brier = ((0.9-1)^2 + (0.2-0)^2 + (0.6-1)^2) / 3 = (0.01 + 0.04 + 0.16) / 3 = 0.07
    m = ConfidenceTask.heldout_metrics(replies, correct)
    assert m["confidence/parsed"] == 3 and m["confidence/parsed_frac"] == pytest.approx(0.6)
    assert m["confidence/brier"] == pytest.approx(0.07) and m["confidence/mean"] == pytest.approx(1.7 / 3)
    naive = [(q - c) ** 2 for q, c in ((0.9, 1), (0.2, 0), (0.6, 1))]
    assert m["confidence/brier"] == pytest.approx(sum(naive) / len(naive))
    # nothing parseable: no Brier at all, never a made-up value
    assert ConfidenceTask.heldout_metrics(["5", "6"], [True, False]) == {"confidence/parsed_frac": 0.0,
                                                                          "confidence/parsed": 0}
    with pytest.raises(ValueError, match="2 replies but 1"):
        ConfidenceTask.heldout_metrics(["5", "6"], [True])
    # the evidence rows: RLCR's quantity reads the evaluation after training, not the base one
    q = MECHANISMS["rlcr"].quantity
    rows = [{"step": 0, "eval/confidence/brier": 0.5}, {"step": 1, "reward/mean": 0.1},
            {"step": 2, "reward/mean": 0.2}, {"step": 2, "eval/confidence/brier": 0.25}]
    assert q(rows) == 0.25 and MECHANISMS["rlcr"].direction == -1


def test_capability_card_text_hand_worked_and_its_chinese():
    from policylab.experiments.evidence.table import capability_card_text, card_text
    from policylab.learn.glossary import generated_zh

    # d = [+0.075, +0.025, +0.05]: mean 0.05, s.e. 0.0144; 95% t (2 df, 4.303): ± 0.0621
    row = {"seeds": [0, 1, 2], "method_accuracy": {"mean": 0.5}, "grpo_accuracy": {"mean": 0.45},
           "difference": 0.05, "difference_se": 0.0144, "interval": [0.05 - 0.0621, 0.05 + 0.0621], "seeds_needed": 3}
    text = capability_card_text(row, 4)
    assert text == ("held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 50.0% vs GRPO's 45.0% on "
                    "the same prompts, difference +5.0% ± 1.4% (95% interval [-1.2%, +11.2%], not significant); about 3 "
                    "seeds would make a difference of this size significant (benchmarks/results/evidence.md)")
    assert generated_zh(text) == ("在其证据任务上训练 4 个采样步后的留出集准确率（3 个种子）：50.0%，同一批提示上 GRPO 为 45.0%，差为 "
                                  "+5.0% ± 1.4%（95% 区间 [-1.2%, +11.2%]，不显著）；约需 3 个种子才能使这样大小的差显著"
                                  "（benchmarks/results/evidence.md）")
    two = capability_card_text({**row, "seeds": [0, 1], "interval": [0.01, 0.09]}, 4)
    assert "[+1.0%, +9.0%], too few seeds for a claim)" in two and "种子太少，不作结论" in generated_zh(two)
    sig = capability_card_text({**row, "interval": [0.01, 0.09]}, 4)
    assert "(95% interval [+1.0%, +9.0%], significant) (benchmarks" in sig and "seeds would" not in sig
    assert "，显著）（" in generated_zh(sig)
    one = capability_card_text({**row, "seeds": [0], "difference_se": None, "interval": None}, 4)
    assert one.endswith("1 seed: 50.0% vs GRPO's 45.0% on the same prompts, difference +5.0%; one seed so far, no claim "
                        "(benchmarks/results/evidence.md)")
    assert generated_zh(one).endswith("差为 +5.0%；目前只有一个种子，不作结论（benchmarks/results/evidence.md）")
    mech = card_text({"verdict": "observed", "quantity": "late-half mean of `policy/entropy`",
                      "control": "dapo with eps_high=0.2", "stats": {"method": 0.5, "control": 0.4, "difference": 0.1,
                                                                     "difference_se": 0.01, "n": 3}})
    assert generated_zh(mech) == ("已观察到：`policy/entropy` 的后半程均值为 0.5，对照组（dapo，eps_high=0.2）为 0.4，3 个种子上的差为 "
                                  "+0.1 ± 0.01（benchmarks/results/evidence.md）")
    never = card_text({"verdict": "not measurable here", "quantity": "mean of `a/b`", "per_seed": {}})
    assert never == ("not measurable here: the runs never logged `a/b` as a finite number at this size and budget "
                     "(benchmarks/results/evidence.md)")
    assert generated_zh("free text") is None


def test_a_method_its_task_cannot_evaluate_is_refused_without_stopping_the_others(tmp_path):
    import dataclasses

    from policylab.experiments.evidence.arms import build_plans

    # cispo's control scored by a verifier that gives everything 0: compare's check finds that the
    # reference answers score 0, so no base accuracy, and refuses that method only
    bad = dataclasses.replace(MECHANISMS["cispo"], control_run={"task": {"reward": "trainer_utils:zero_reward"}})
    arms, refused, plans = build_plans([bad, MECHANISMS["gspo"]], Settings(out_dir=tmp_path))
    assert set(refused) == {"cispo"} and "base accuracy cannot be measured" in refused["cispo"]
    assert set(arms) == {"gspo"} and set(plans) == {"gspo"}
    assert [(r.label, r.seed) for r in plans["gspo"].runs] == [(lab, s) for lab in ("gspo", "grpo") for s in (0, 1, 2)]
    assert not any(tmp_path.iterdir())  # nothing ran, nothing written
    # the code and distribution tasks check their verifier on a reference reply (not the gold
    # text, which no verifier of theirs accepts): their methods plan
    arms, refused, _ = build_plans([MECHANISMS["code_opt"], MECHANISMS["mad_rl"]], Settings(out_dir=tmp_path))
    assert refused == {} and set(arms) == {"code_opt", "mad_rl"}


def test_the_mechanisms_own_settings_win_over_the_commands_set(tmp_path):
    s = Settings(out_dir=tmp_path, sets=(("train.minibatches", 2), ("rollout.max_new_tokens", 12)))
    rloo = shared_run(MECHANISMS["rloo"], s, control=False)
    assert rloo["train"]["minibatches"] == 1 and rloo["rollout"]["max_new_tokens"] == 12  # REINFORCE: one update
    assert shared_run(MECHANISMS["gspo"], s, control=False)["train"]["minibatches"] == 2
    assert shared_run(MECHANISMS["grpo"], Settings(out_dir=tmp_path, sets=(("train.lr", 1e-4),)),
                      control=True)["train"]["lr"] == 0.0  # the no-update control stays one


def _t_quantile_975(df: int) -> float:
    """Naive reference: the 0.975 quantile of Student's t by bisection on its CDF, the density
    integrated with Simpson's rule from 0 (the CDF at 0 is 1/2)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x: float, n: int = 4000) -> float:
        h = x / n
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 20.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < 0.975 else (lo, mid)
    return (lo + hi) / 2


def test_t_crit_table_against_the_t_distribution_and_between_entries():
    from policylab.experiments.evidence.verdict import T_CRIT, t_crit

    for df, value in T_CRIT.items():
        if df > 1:  # df = 1 (Cauchy) has too heavy a tail for this quick integral's range
            assert value == pytest.approx(_t_quantile_975(df), abs=1.5e-3), df
    assert t_crit(1) == 12.706 and t_crit(12) == 2.179  # hand: the printed tables' values
    assert t_crit(35) == T_CRIT[30] and t_crit(59) == T_CRIT[40]  # between entries: the lower df's, wider
    assert t_crit(500) == 1.96
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_crit(0)
