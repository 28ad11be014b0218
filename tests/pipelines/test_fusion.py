"""fusion: task-vector merge, the MOPD signal (kernel and through the method), the domain
tasks (sequence, mixture), per-domain metrics, and the pipeline end to end on the tiny
random model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from policylab import methods
from policylab.models import loading as models
from policylab.trainer.config import ConfigError, config_from_dict
from policylab.errors import PolicylabError, ShapeError
from policylab.learn.figures.common import bare_batch, stage_context
from policylab.methods.loss import policy_loss, tensor_inputs
from policylab.kernels import mixed as K
from policylab.pipelines import fusion
from policylab.tasks.example import Example
from policylab.tasks.mixture import DOMAINS, MixtureTask, domain_of
from policylab.tasks.sequence import SequenceTask
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


# ----------------------------------------------------------------------------- merge


def test_merge_hand_case_and_one_expert():
    # θ = [1, 1] + 0.5·([2, 1] − [1, 1]) + 0.5·([1, 3] − [1, 1]) = [1, 1] + [0.5, 0] + [0, 1] = [1.5, 2.0]
    out = fusion.merge_task_vectors({"w": t([1.0, 1.0])}, [{"w": t([2.0, 1.0])}, {"w": t([1.0, 3.0])}], [0.5, 0.5])
    torch.testing.assert_close(out["w"], t([1.5, 2.0]))
    one = fusion.merge_task_vectors({"w": t([1.0, 1.0])}, [{"w": t([2.0, 1.0])}], [1.0])
    torch.testing.assert_close(one["w"], t([2.0, 1.0]))


def test_merging_real_state_dicts_matches_a_naive_loop(tokenizer):
    base = models.tiny_llama(tokenizer, seed=0).state_dict()
    e1 = models.tiny_llama(tokenizer, seed=1).state_dict()
    e2 = models.tiny_llama(tokenizer, seed=2).state_dict()
    # one expert at α = 1 is that expert, bit for bit; α = 0 everywhere is the base
    one = fusion.merge_task_vectors(base, [e1], [1.0])
    assert all(torch.equal(one[k], e1[k]) for k in base)
    zero = fusion.merge_task_vectors(base, [e1, e2], [0.0, 0.0])
    assert all(torch.equal(zero[k], base[k]) for k in base)
    merged = fusion.merge_task_vectors(base, [e1, e2], [0.3, 0.6])
    for k in list(base)[:5]:
        flat_b, flat_1, flat_2 = base[k].reshape(-1), e1[k].reshape(-1), e2[k].reshape(-1)
        ref = torch.tensor([float(b) + 0.3 * (float(x) - float(b)) + 0.6 * (float(y) - float(b))
                            for b, x, y in zip(flat_b[:50], flat_1[:50], flat_2[:50])])
        torch.testing.assert_close(merged[k].reshape(-1)[:50], ref.to(base[k].dtype))


def test_merge_refuses_another_layout_or_vocabulary():
    base = {"model.embed_tokens.weight": torch.zeros(4, 2), "w": torch.zeros(3)}
    with pytest.raises(ShapeError, match="another vocabulary"):
        fusion.merge_task_vectors(base, [{"model.embed_tokens.weight": torch.zeros(5, 2), "w": torch.zeros(3)}], [1.0])
    with pytest.raises(ShapeError, match="another layout"):
        fusion.merge_task_vectors(base, [{"model.embed_tokens.weight": torch.zeros(4, 2), "w": torch.zeros(4)}], [1.0])
    with pytest.raises(ShapeError, match="missing \\['w'\\]"):
        fusion.merge_task_vectors(base, [{"model.embed_tokens.weight": torch.zeros(4, 2)}], [1.0])
    with pytest.raises(ShapeError, match="float64"):
        fusion.merge_task_vectors(base, [{"model.embed_tokens.weight": torch.zeros(4, 2, dtype=F64),
                                          "w": torch.zeros(3)}], [1.0])
    with pytest.raises(PolicylabError, match="one α per expert"):
        fusion.merge_task_vectors(base, [dict(base)], [0.5, 0.5])
    with pytest.raises(PolicylabError, match="finite"):
        fusion.merge_task_vectors(base, [dict(base)], [float("nan")])


def test_checkpoints_with_another_tokenizer_are_refused():
    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    fusion.check_vocabularies([Tok({"a": 0, "b": 1}), Tok({"a": 0, "b": 1})])
    with pytest.raises(PolicylabError, match="another vocabulary"):
        fusion.check_vocabularies([Tok({"a": 0, "b": 1}), Tok({"a": 1, "b": 0})])


# ----------------------------------------------------------------------------- MOPD


MASK = torch.tensor([[False, True, True, True, False]])
LP_S = t([[-9.0, -1.0, -0.2, -2.0, -9.0]])
LP_T = t([[-0.1, -0.5, -0.4, -1.0, -0.1]])


def test_mopd_hand_case_both_horizons_with_masked_ends():
    # d = lp_s − lp_t on the counted positions 1..3: [−0.5, 0.2, −1.0]; token: A = −d = [0.5, −0.2, 1.0];
    # sequence: A_t = Σ_{u ≥ t} −d_u = [0.5 − 0.2 + 1.0, −0.2 + 1.0, 1.0] = [1.3, 0.8, 1.0]; masked ends 0
    tok = K.mopd_advantages(LP_S, LP_T, MASK, horizon="token")
    seq = K.mopd_advantages(LP_S, LP_T, MASK, horizon="sequence")
    torch.testing.assert_close(tok, t([[0.0, 0.5, -0.2, 1.0, 0.0]]))
    torch.testing.assert_close(seq, t([[0.0, 1.3, 0.8, 1.0, 0.0]]))
    # naive loop reference for a random batch with ragged masks
    g = torch.Generator().manual_seed(0)
    s, te = -torch.rand(3, 6, generator=g, dtype=F64) * 3, -torch.rand(3, 6, generator=g, dtype=F64) * 3
    mask = torch.tensor([[True] * 6, [False, True, True, False, False, False], [False] * 5 + [True]])
    seq = K.mopd_advantages(s, te, mask, horizon="sequence")
    for i in range(3):
        for j in range(6):
            ref = sum(-(s[i, u] - te[i, u]).item() for u in range(j, 6) if mask[i, u]) if mask[i, j] else 0.0
            assert seq[i, j].item() == pytest.approx(ref, abs=1e-12)


def test_mopd_refuses_bad_input():
    with pytest.raises(PolicylabError, match="`horizon` must be one of token, sequence"):
        K.mopd_advantages(LP_S, LP_T, MASK, horizon="episode")
    with pytest.raises(ShapeError):
        K.mopd_advantages(LP_S, LP_T[:, :4], MASK, horizon="token")
    bad = LP_T.clone()
    bad[0, 2] = float("nan")
    with pytest.raises(PolicylabError, match="logp_teacher. is not finite"):
        K.mopd_advantages(LP_S, bad, MASK, horizon="token")
    bad[0, 2] = -0.4
    bad[0, 0] = float("nan")  # a masked position may hold anything
    K.mopd_advantages(LP_S, bad, MASK, horizon="token")


def _mopd_batch(lp_s, lp_t, domain):
    B, L = lp_s.shape
    return bare_batch(B, L, mask=MASK.expand(B, -1).clone(), logp_current=lp_s,
                      extras={"logp_teacher": lp_t, "domain": torch.tensor(domain)})


def test_the_methods_mopd_stage_and_reinforce_loss():
    m = methods.get("fusion")
    stage = m.advantage
    two = torch.cat([LP_S, LP_S])
    res = stage.fn(_mopd_batch(two, torch.cat([LP_T, LP_S]), [0, 1]), stage_context(m, stage))
    torch.testing.assert_close(res.adv[0], t([0.0, 0.5, -0.2, 1.0, 0.0]))
    assert torch.equal(res.adv[1], torch.zeros(5, dtype=F64))  # a teacher equal to the student: no signal
    # per-domain diagnostics, never only their average: arithmetic gap −(0.5 − 0.2 + 1.0)/3, sequence 0
    assert res.info[f"mopd/teacher_gap@domain={DOMAINS[0]}"] == pytest.approx(-1.3 / 3)
    assert res.info[f"mopd/teacher_gap@domain={DOMAINS[1]}"] == pytest.approx(0.0)
    # REINFORCE-style: ∂ℓ/∂lp = −A on every counted token (the loss has no ratio)
    leaf = two.clone().requires_grad_(True)
    loss, _ = policy_loss(m, tensor_inputs(leaf, res.adv, MASK.expand(2, -1).clone()))
    loss.sum().backward()
    torch.testing.assert_close(leaf.grad, -res.adv)
    seq = m.with_params({"mopd_horizon": "sequence"})
    res = seq.advantage.fn(_mopd_batch(LP_S, LP_T, [0]), stage_context(seq, seq.advantage))
    torch.testing.assert_close(res.adv[0], t([0.0, 1.3, 0.8, 1.0, 0.0]))


def test_fusion_refuses_a_second_update_on_a_batch():
    from policylab.methods.spec import RunShape

    with pytest.raises(PolicylabError, match="REINFORCE-style"):
        methods.get("fusion").with_params({}, RunShape(epochs=2))


def test_each_row_is_scored_by_the_teacher_of_its_domain(tiny_model_dir, tokenizer, tmp_path):
    other = tmp_path / "teacher"
    models.tiny_llama(tokenizer, seed=7).save_pretrained(other)
    tokenizer.save_pretrained(other)
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", method="fusion",
                      method_params={"teachers": f"arithmetic={other}"}, task={"name": "mixture"},
                      rollout={"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 4})
    tr = Trainer(cfg)
    batch, _ = tr.collect()
    batch, A, _ = tr.round_inputs(tr.prepare(batch))
    dom = batch.extras["domain"]
    assert set(dom.tolist()) <= {0, 1}
    teachers = tr.controllers["teachers"]
    for d in set(dom.tolist()):
        rows = (dom == d).nonzero().squeeze(-1)
        sub = batch.select(rows)
        expect = teachers.for_domain(DOMAINS[d]).logprobs(sub)
        torch.testing.assert_close(batch.extras["logp_teacher"][rows], expect.to(batch.extras["logp_teacher"].dtype))
    assert teachers.for_domain("arithmetic").name == "teacher" and teachers.for_domain("sequence").name == "initial"
    m = tr.train_step()
    assert any(k.startswith("accuracy@domain=") for k in m), sorted(m)
    assert any(k.startswith("adv/mopd/teacher_gap@domain=") or k.startswith("mopd/teacher_gap@domain=") for k in m)


# ----------------------------------------------------------------------------- domain tasks


def test_sequence_task_answers_and_split():
    task = SequenceTask(seed=0)
    held = {(e.meta["start"], e.meta["step"]) for e in task.heldout(task.heldout_size())}
    for e in task.train_prompts(200):
        s, d = e.meta["start"], e.meta["step"]
        assert e.answer == str(s + 4 * d) and f"{s}, {s + d}, {s + 2 * d}, {s + 3 * d}?" in e.prompt
        assert (s, d) not in held and e.meta["split"] == "train" and e.meta["domain"] == "sequence"
    assert 0 < len(held) < 180


def test_mixture_draws_domains_in_proportion_and_resumes():
    only = MixtureTask(DOMAINS, [1.0, 0.0], seed=0)
    assert {domain_of(e) for e in only.train_prompts(50)} == {"arithmetic"}
    half = MixtureTask(DOMAINS, [1.0, 1.0], seed=0)
    exs = half.train_prompts(400)
    share = sum(domain_of(e) == "sequence" for e in exs) / 400
    assert 0.4 < share < 0.6  # binomial(400, 0.5): 4 standard errors either side
    state = half.state_dict()
    nxt = half.train_prompts(5)
    again = MixtureTask(DOMAINS, [1.0, 1.0], seed=0)
    again.load_state_dict(state)
    assert [e.prompt for e in again.train_prompts(5)] == [e.prompt for e in nxt]
    with pytest.raises(PolicylabError, match="mix"):
        MixtureTask(DOMAINS, [1.0, 3.0], seed=0).load_state_dict(state)
    # no held-out prompt of any domain in the train stream
    held = {e.prompt for d in DOMAINS for e in half.heldout_of(d, 300)}
    assert not held & {e.prompt for e in exs}
    assert {domain_of(e) for e in half.heldout(6)} == set(DOMAINS)


def test_domain_tags_are_never_guessed():
    assert domain_of(Example("What is 1 + 2?", "3", {"op": "+", "a": 1, "b": 2})) == "arithmetic"
    with pytest.raises(PolicylabError, match="no domain tag"):
        domain_of(Example("Solve the puzzle", "3", {}))


@pytest.mark.parametrize("task,match", [
    ({"name": "mixture", "mix": [1.0]}, "one number per domain"),
    ({"name": "mixture", "domains": ["arithmetic", "poetry"], "mix": [1, 1]}, "the domains are"),
    ({"name": "mixture", "mix": [-1, 2]}, ">= 0"),
    ({"name": "mixture", "domains": ["sequence", "sequence"]}, "distinct"),
])
def test_mixture_config_refusals(tmp_path, task, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict({"run_dir": str(tmp_path), "task": task})


def test_sequence_and_mixture_build_through_the_task_config(tmp_path):
    from policylab.tasks.source import build_task

    for name in ("sequence", "mixture"):
        cfg = config_from_dict({"run_dir": str(tmp_path), "task": {"name": name}})
        src = build_task(cfg.task, seed=0)
        ex = src.next_train(3)
        assert len(ex) == 3 and src.reward_fn([ex[0].answer], [ex[0].answer]) == [1.0]
        assert "held-out" in src.describe


# ----------------------------------------------------------------------------- the pipeline


def _write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def _tiny(model_dir, run_dir, **over) -> dict:
    cfg = {"pipeline": "fusion", "run_dir": str(run_dir), "model": str(model_dir), "seed": 2,
           "experts": {"rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
                       "train": {"steps": 1, "lr": 1e-3, "micro_batch_size": 2},
                       "method_params": {"kl_coef": 0.0}},
           "eval": {"prompts": 3, "samples": 1, "max_new_tokens": 4}}
    cfg.update(over)
    return cfg


def test_the_pipeline_reports_every_model_per_domain(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    cfg = fusion.load_config(_write(tmp_path / "f.yaml", _tiny(tiny_model_dir, run_dir)))
    report = fusion.run(cfg)
    for d in DOMAINS:
        assert sorted((run_dir / f"expert_{d}" / "checkpoints").glob("step_*"))
    assert (run_dir / "merge" / "config.json").is_file()
    assert sorted((run_dir / "mix" / "checkpoints").glob("step_*"))
    assert sorted((run_dir / "mopd" / "checkpoints").glob("step_*"))
    mopd_cfg = yaml.safe_load((run_dir / "mopd" / "config.yaml").read_text())
    assert mopd_cfg["method"] == "fusion" and mopd_cfg["task"]["name"] == "mixture"
    assert all(f"{d}=" in mopd_cfg["method_params"]["teachers"] for d in DOMAINS)
    ev = report["evaluation"]
    assert set(ev) == {"base", "expert_arithmetic", "expert_sequence", "merge", "mix", "mopd"}
    for name, row in ev.items():
        for d in DOMAINS:
            assert 0.0 <= row[d]["accuracy"] <= 1.0 and row[d]["n"] == 3, (name, d)
        assert row["mean_over_domains"] == pytest.approx(sum(row[d]["accuracy"] for d in DOMAINS) / 2)
    assert any("@domain=" in k for k in report["stages"]["mopd"]["per_domain_log"])
    md = (run_dir / "report.md").read_text()
    assert "| model | arithmetic | sequence | mean over domains | worst domain |" in md
    assert json.loads((run_dir / "report.json").read_text())["domains"] == list(DOMAINS)


def test_bad_fusion_configs_are_refused(tiny_model_dir, tmp_path):
    def bad(over, match):
        with pytest.raises(ConfigError, match=match):
            fusion.load_config(_write(tmp_path / "b.yaml", _tiny(tiny_model_dir, tmp_path / "r", **over)))

    bad({"domains": ["arithmetic"]}, "two or more distinct domains")
    bad({"routes": ["merge", "average"]}, "routes must be")
    bad({"merge": {"alphas": [1.0]}}, "one α per domain")
    bad({"mix": {"mix": [1.0, -1.0]}}, "one proportion >= 0")
    bad({"mopd": {"horizon": "episode"}}, "mopd.horizon")
    bad({"experts": {"task": {"name": "gsm"}}}, "experts.task cannot be set")
    bad({"experts": {"method": "fusion"}}, "not fusion")
    bad({"merge": {"alpha": [1.0]}}, "Did you mean: alphas")
    # a run config the trainer refuses fails before any expert trains
    cfg = fusion.load_config(_write(tmp_path / "late.yaml", _tiny(
        tiny_model_dir, tmp_path / "late", experts={"method": "grpo", "method_params": {"no_such": 1}})))
    with pytest.raises(PolicylabError, match="no_such"):
        fusion.run(cfg)
    assert not (tmp_path / "late" / "expert_arithmetic").exists()
