"""rlcr, mad_rl, rlcpr, code_opt and rfpo through the trainer's own stages on the tiny model:
the scoring forward behind RLCPR's posteriors, the frozen critic (in no optimizer group,
unchanged by a step, rebuilt from its path), the reward stages on chosen replies."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from policylab.experiments.exercise import exercise_settings
from policylab import methods
from policylab.sandbox import runner as sb
from policylab.models.frozen_critic import CriticError, FrozenCritic
from policylab.methods.families import calibrated_rewards as cr
from policylab.methods.families import measured_rewards as mr
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config


def _trainer(small_model_dir, tmp_path, name, prepared=None, **sections):
    # prepared: the session's `small_prepared_dir` for RFPO (its critic is trained once)
    ex = exercise_settings(name, model=str(small_model_dir), workdir=prepared or tmp_path / "prepared")
    params = {**ex.pop("method_params", {}), **sections.pop("method_params", {})}
    merged = {k: {**ex.get(k, {}), **sections.get(k, {})} for k in set(ex) | set(sections)}
    return Trainer(tiny_config(small_model_dir, tmp_path / name, method=name, method_params=params, **merged))


def _sampled(tr, n=2):
    ctx = tr.context("t")
    return tr.method.source.fn(n, ctx.for_stage(tr.method, tr.method.source)), ctx


def _stage(tr, fn):
    return next(s for s in tr.method.stages() if s.fn is fn)


# ----------------------------------------------------------------------------- scoring forward
def _naive_continuation(model, batch, i, cont, k, eos):
    prompt = batch.tokens[i, : batch.prompt_width][batch.attention_mask[i, : batch.prompt_width]].tolist()
    resp = batch.tokens[i, batch.prompt_width:][batch.loss_mask[i]].tolist()
    if resp and resp[-1] == eos:
        resp = resp[:-1]
    ids = torch.tensor([prompt + resp + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
    n = ids.shape[1]
    return sum(float(logp[t - 1, ids[0, t]]) for t in range(n - k, n))


def test_continuation_logprobs_equal_an_unpadded_forward(small_model_dir, tmp_path):
    # rows of different prompt and reply lengths (left padding of the prompt, right padding
    # of the replies, trailing EOS stripped): every row must equal its own unpadded forward
    tr = _trainer(small_model_dir, tmp_path, "rlcpr", rollout={"max_new_tokens": 6, "group_size": 3,
                                                               "prompts_per_step": 2})
    s, _ = _sampled(tr, 2)
    b = s.batch
    eos = tr.tokenizer.eos_token_id
    P = b.prompt_width
    tokens, am, lm = b.tokens.clone(), b.attention_mask.clone(), b.loss_mask.clone()
    lm[0, -2:] = False  # row 0: a reply of 4 tokens ending in EOS (stripped), garbage after it
    tokens[0, P + 3] = eos
    lm[2, -4:] = False  # row 2: a reply of 2 tokens, no EOS
    am[1, :3] = False  # row 1: 3 columns of leading prompt padding (garbage tokens under them)
    am[:, P:] = lm
    b = b.replace(tokens=tokens, attention_mask=am, loss_mask=lm).validate()
    conts = [[17, 23, 5 + i] for i in range(b.size)]
    scored = [1 + i % 3 for i in range(b.size)]
    for mbs in (1, 4):
        tr.worker.micro_batch_size = mbs
        got = tr.worker.continuation_logprobs(b, conts, scored, strip_token=eos)
        want = torch.tensor([_naive_continuation(tr.model, b, i, conts[i], scored[i], eos) for i in range(b.size)])
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-4)
    with pytest.raises(Exception, match="scores"):
        tr.worker.continuation_logprobs(b, conts, [0] * b.size)


def test_rlcpr_posteriors_come_from_the_policy_forward(small_model_dir, tmp_path):
    tr = _trainer(small_model_dir, tmp_path, "rlcpr", method_params={"length_threshold": 0.0, "posterior_range": 1.0})
    s, ctx = _sampled(tr)
    st = _stage(tr, cr.rlcpr_posterior)
    s.batch = s.batch.replace(rewards=torch.ones(s.batch.size))
    changes, info = st.fn(s, ctx.for_stage(tr.method, st))
    post = changes["extras"]["answer_posterior"]
    tok = tr.tokenizer
    i = 0
    cont = tok.encode("\nFinal answer:", add_special_tokens=False) + tok.encode(" " + s.examples[i].answer,
                                                                             add_special_tokens=False)
    k = len(tok.encode(" " + s.examples[i].answer, add_special_tokens=False))
    want = _naive_continuation(tr.model, s.batch, i, cont, k, tok.eos_token_id)
    assert abs(float(post[i]) - float(torch.tensor(want).exp())) < 1e-4
    # the gates are open (L_thr 0, τ 1): each group's shortest reply keeps reward 1, the longest pays λ = 0.2
    for g in torch.unique(s.batch.group):
        rows = s.batch.group == g
        L, r = s.batch.response_lengths[rows], changes["rewards"][rows]
        assert float(r[L.argmin()]) == 1.0
        if int(L.max()) > int(L.min()):
            assert abs(float(r[L.argmax()]) - 0.8) < 1e-4


# ----------------------------------------------------------------------------- rlcr, mad_rl
def test_rlcr_stage_penalty_path_and_separate_logging(small_model_dir, tmp_path):
    tr = _trainer(small_model_dir, tmp_path, "rlcr")
    s, ctx = _sampled(tr)
    a = s.examples[0].answer
    texts = [f"{a}\nConfidence: 0.9", f"{a}\nConfidence: 1.4", "x\nConfidence: 0.2", f"{a}"]
    s.texts = texts
    s.examples = [s.examples[0]] * 4
    st = _stage(tr, cr.rlcr_confidence)
    changes, info = st.fn(s, ctx.for_stage(tr.method, st))
    # correct, q 0.9: 0.99; correct, q out of range: 1 − 1 = 0; wrong, q 0.2: −0.04; correct, missing: 0
    torch.testing.assert_close(changes["rewards"], torch.tensor([0.99, 0.0, -0.04, 0.0]))
    assert changes["outcome"]["correct"].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert info["calibration/accuracy"] == 0.75 and info["calibration/parsed_frac"] == 0.5
    assert info["calibration/out_of_range_frac"] == 0.25 and info["calibration/missing_frac"] == 0.25


def test_mad_rl_stage_maps_classes_and_keeps_invalid_replies(small_model_dir, tmp_path):
    from policylab.kernels.rewards.distribution import mad_rl_rewards

    tr = _trainer(small_model_dir, tmp_path, "mad_rl", rollout={"group_size": 4})
    s, ctx = _sampled(tr, 1)
    classes = s.examples[0].meta["classes"]
    s.texts = [classes[0], classes[0] + ".", classes[1], "no idea"]
    s.batch = s.batch.replace(outcome={"correct": torch.tensor([1.0, 1.0, 1.0, 0.0])})
    st = _stage(tr, cr.mad_match)
    changes, info = st.fn(s, ctx.for_stage(tr.method, st))
    K = len(classes) + 1
    assert changes["extras"]["class_id"].tolist() == [0, 0, 1, K - 1]
    want, _ = mad_rl_rewards(torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64), torch.tensor([0, 0, 1, K - 1]),
                             torch.zeros(4, dtype=torch.long),
                             torch.tensor([s.examples[0].meta["target"]] * 4, dtype=torch.float64),
                             coef=1.0, smoothing=0.01, form="log_ratio")
    torch.testing.assert_close(changes["rewards"], want.float())
    assert info["distribution/invalid_frac"] == 0.25


def test_mad_rl_stage_reads_the_task_mapper(small_model_dir, tmp_path):
    # task.class_mapper=single_mention: chatty replies naming one outcome are classes, not invalid
    tr = _trainer(small_model_dir, tmp_path, "mad_rl", rollout={"group_size": 4}, task={"class_mapper": "single_mention"})
    s, ctx = _sampled(tr, 1)
    classes = s.examples[0].meta["classes"]
    assert s.examples[0].meta["mapper"] == "single_mention"
    s.texts = [f"The result is {classes[0]}.", classes[1], f"{classes[0]} or {classes[1]}", "no idea"]
    s.batch = s.batch.replace(outcome={"correct": torch.tensor([1.0, 1.0, 0.0, 0.0])})
    st = _stage(tr, cr.mad_match)
    changes, info = st.fn(s, ctx.for_stage(tr.method, st))
    K = len(classes) + 1
    assert changes["extras"]["class_id"].tolist() == [0, 1, K - 1, K - 1]
    assert info["distribution/invalid_frac"] == 0.5


# ----------------------------------------------------------------------------- code_opt
@pytest.mark.skipif(not (sb.probe()["network"] and sb.probe()["filesystem"]), reason="no sandbox here")
def test_code_opt_stage_gates_on_the_tests(small_model_dir, tmp_path):
    from policylab.tasks.code import PROBLEMS

    tr = _trainer(small_model_dir, tmp_path, "code_opt", rollout={"max_new_tokens": 4})
    s, ctx = _sampled(tr, 1)
    name = s.examples[0].answer
    ref = PROBLEMS[name].reference
    s.texts = [ref, f"def {name}(*a):\n    return None\n"]
    s.examples = s.examples[:2]
    s.batch = s.batch.select(torch.arange(2))
    st = _stage(tr, mr.code_runtime)
    changes, info = st.fn(s, ctx.for_stage(tr.method, st))
    assert changes["outcome"]["correct"].tolist() == [1.0, 0.0]
    r = changes["rewards"]
    # the reference against itself: correct (1) and a speed score in [−1, 1] (mostly 0: inside the noise band)
    assert 0.5 <= float(r[0]) <= 1.5 and bool(changes["extras"]["speed_scored"][0])
    assert float(r[1]) == 0.0 and not bool(changes["extras"]["speed_scored"][1])
    assert info["code/correct_frac"] == 0.5


@pytest.mark.skipif(not (sb.probe()["network"] and sb.probe()["filesystem"]), reason="no sandbox here")
def test_code_opt_stops_malicious_candidates_scores_them_zero_and_the_run_goes_on(small_model_dir, tmp_path):
    import tempfile
    from pathlib import Path

    from policylab.tasks.code import PROBLEMS

    tr = _trainer(small_model_dir, tmp_path, "code_opt", rollout={"max_new_tokens": 4})
    s, ctx = _sampled(tr, 3)  # 3 prompts x 2 samples: six rows
    name = s.examples[0].answer
    marker = Path(tempfile.mkdtemp(prefix="policylab-marker-"))
    marker.chmod(0o777)  # anyone may write here: only the sandbox stands in the way
    body = f"def {name}(*a):\n    return None\n"
    s.texts = [
        f"import os\nos.fork()\n{body}",  # forks
        f"def {name}(*a):\n    while True:\n        pass\n",  # loops
        f"import socket\nsocket.create_connection(('127.0.0.1', 9))\n{body}",  # opens a socket
        f"open({str(marker / 'pwned')!r}, 'w').write('x')\n{body}",  # writes outside its directory
        f"def {name}(*a):\n    return bytearray(10**10)\n",  # allocates without bound
        PROBLEMS[name].reference,  # honest
    ]
    s.examples = [s.examples[0]] * 6
    st = _stage(tr, mr.code_runtime)
    changes, info = st.fn(s, ctx.for_stage(tr.method, st))
    assert changes["outcome"]["correct"].tolist() == [0.0] * 5 + [1.0]
    assert changes["rewards"][:5].tolist() == [0.0] * 5  # stopped: scored as failed, no speed reward
    assert float(changes["rewards"][5]) >= 0.5  # the honest reply after them still runs and scores
    assert not (marker / "pwned").exists()
    assert info["code/status_ok_frac"] < 1.0 and info["code/correct_frac"] == pytest.approx(1 / 6)
    m = tr.train_step()  # and training goes on in the same process
    assert "code/correct_frac" in m and tr.step == 1


# ----------------------------------------------------------------------------- rfpo
def test_rfpo_critic_is_frozen_in_no_optimizer_group_and_unchanged_by_a_step(small_model_dir, tmp_path, small_prepared_dir):
    tr = _trainer(small_model_dir, tmp_path, "rfpo", small_prepared_dir)
    critic = tr.controllers["frozen_critic"]
    params = list(critic.parameters())
    assert params and all(not p.requires_grad for p in params)
    in_opt = {id(p) for g in tr.optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in in_opt for p in params)
    policy_ids = {id(p) for p in tr.model.parameters()}
    assert not any(id(p) in policy_ids for p in params)  # its own copy of the base model
    before = [p.detach().clone() for p in params]
    policy_before = [p.detach().clone() for p in tr.model.parameters()]
    tr.cfg.train.lr = 1e-2
    for g in tr.optimizer.param_groups:
        g["lr"] = 1e-2
    m = tr.train_step()
    assert all(torch.equal(a, p) for a, p in zip(before, critic.parameters()))
    if tr.policy_version:  # the policy did move
        assert any(not torch.equal(a, p) for a, p in zip(policy_before, tr.model.parameters()))
    assert "rfpo/critic_final_mean" in m


def test_rfpo_reward_does_not_read_the_gold_answer(small_model_dir, tmp_path, small_prepared_dir):
    tr = _trainer(small_model_dir, tmp_path, "rfpo", small_prepared_dir)
    s, ctx = _sampled(tr)
    st = _stage(tr, mr.rfpo_critic)
    right, _ = st.fn(s, ctx.for_stage(tr.method, st))
    wrong = dataclasses.replace(s, examples=[dataclasses.replace(e, answer="-12345") for e in s.examples])
    flipped, _ = st.fn(wrong, ctx.for_stage(tr.method, st))
    torch.testing.assert_close(right["rewards"], flipped["rewards"])
    torch.testing.assert_close(right["extras"]["critic_values"], flipped["extras"]["critic_values"])


def test_rfpo_reward_stage_never_calls_the_verifier(small_model_dir, tmp_path, small_prepared_dir):
    # "no verifier during RL": the critic's forecast is the reward, so the reward stage must
    # work with a task whose verifier cannot score anything (it used to call it on every reply
    # and stop the step on None)
    tr = _trainer(small_model_dir, tmp_path, "rfpo", small_prepared_dir)
    s, ctx = _sampled(tr)
    st = _stage(tr, mr.rfpo_critic)
    calls = []

    def no_verifier(*args, **kwargs):
        calls.append(args)
        raise AssertionError("rfpo's reward stage called the verifier")

    sctx = dataclasses.replace(ctx.for_stage(tr.method, st), task_reward=no_verifier, score=no_verifier)
    changes, info = st.fn(s, sctx)
    assert calls == []
    assert "gold_correct" not in changes["extras"] and not any("gold" in k for k in info)
    # the reward is the critic's thresholded, debiased value: r = 1[v̂ >= τ] on finished replies,
    # v̂ itself (a flagged forecast) on truncated ones
    critic = tr.controllers["frozen_critic"]
    b = s.batch
    _, final = critic.values(b.tokens, b.attention_mask, b.loss_mask, b.prompt_width)
    a, c = critic.length_bias
    vhat = final.double() - (a + c * b.response_lengths.double())
    finished = ~b.extras["truncated"].bool()
    want = torch.where(finished, (vhat >= tr.method.p.tau).double(), vhat)
    torch.testing.assert_close(changes["rewards"].double(), want, rtol=0, atol=1e-6)
    assert changes["outcome"]["correct"].tolist() == [float(x) for x in (finished & (vhat >= tr.method.p.tau)).tolist()]


def test_rfpo_state_is_the_critic_path_and_refuses_another_critic(small_model_dir, tmp_path, small_prepared_dir):
    tr = _trainer(small_model_dir, tmp_path, "rfpo", small_prepared_dir)
    st = tr.controllers["frozen_critic"].state_dict()
    assert set(st) == {"path", "fingerprint", "head_sha"}  # no weights in the run's checkpoint
    with pytest.raises(CriticError, match="another critic"):
        tr.controllers["frozen_critic"].load_state_dict({**st, "head_sha": "0" * 32})


def test_rfpo_refuses_a_missing_critic_and_a_critic_for_other_weights(small_model_dir, tmp_path, small_tokenizer,
                                                                      small_prepared_dir):
    from policylab.models import loading as models
    from policylab.methods.spec import RunShape

    with pytest.raises(Exception, match="train-critic"):  # when the run's state is built, before any rollout
        methods.get("rfpo").with_params({}, RunShape()).state_objects(0)
    with pytest.raises(Exception, match="no critic.json"):
        methods.get("rfpo").with_params({"critic_path": str(tmp_path)}, RunShape())
    path = exercise_settings("rfpo", model=str(small_model_dir), workdir=small_prepared_dir)["method_params"]["critic_path"]
    other = models.tiny_llama(small_tokenizer, seed=1)
    with pytest.raises(CriticError, match="other base weights"):
        FrozenCritic(path, base=other)
