"""Every recorded method computes the update recorded in `golden_steps.json`, on any CPU.

Recording (rewrites the cases it runs, keeps the others; review the diff before committing):

    POLICYLAB_RECORD_GOLDEN=1 .venv/bin/python -m pytest -q -p no:cacheprovider \\
        tests/methods/test_same_update.py -k test_same_update_as_recorded

Each case runs the real trainer on the tiny random Llama for one rollout step (two where a
stale queue needs the second, and for vapo, whose critic's first update then reaches the
advantages), with two minibatches where the method allows it, so the old-logprob pass and
ratios != 1 are exercised.

The whole path is fp64, so that what is recorded does not depend on the host's math
kernels (the same vectorized fp32 kernel rounds differently on AVX-512 and on AVX2):

* train.dtype = fp64: the policy (and the critic) train in fp64;
* the rollout engine decodes the fp64 model and keeps its scores, its draw and
  `logp_behavior` in fp64 (`FastEngine.fp64_scores`), where it would otherwise round
  the logits to fp32;
* cases that need a behavior engine other than the learner (the engine-mismatch
  corrections) sample from an int8 weight-quantized copy of the fp64 weights, decoded in
  fp64 (`rollout.engine_dtype = int8`): a real mismatch (|dlogp| ~ 1e-3) that is the same
  on every host. A bf16 engine is not: its matmuls round to bf16 in kernels that differ
  per instruction set (with oneDNN capped at AVX2 the bf16 cases' loss moved by 2.5%).

Left in fp32 are only the pieces the Llama forward itself computes in fp32 for an fp64
model (RMSNorm statistics, rotary tables; the engine mirrors them): element-wise maps and
64-wide row reductions. They do not show: between the AVX-512 and the AVX2 kernels the
recorded updates differ at fp64 rounding only (see `_METRIC_TOL`;
`test_same_update_avx2.py` checks it on every run on an AVX-512 host).

ggpo and gmc were once recorded with a bug (a group statistic per micro-batch) and not
compared; they are recorded from the fixed code and compared like every other case.

Compared are every logged metric (wall-clock, memory and throughput keys excluded) and
the gradient at every optimizer step (gradient clipping off, so magnitudes count: Adam's
first steps are close to sign(gradient) and would hide them) plus the final weight update
of the policy (and the critic): norm and 8 projections onto fixed random directions
(equal projections onto random directions mean equal vectors up to rounding). The
tolerances are in `_METRIC_TOL` and `_VECTOR_TOL`, each with the path it is for.

Where a fix deliberately changed a default since the first recording (`FIXED_DEFAULTS`),
the case keeps the old value, so the golden still covers the rest of the method.
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pytest
import torch

from policylab.experiments.exercise import exercise_settings
from policylab import methods
from policylab.engines.fast import FastEngine
from policylab.models import loading
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config

GOLDEN = Path(__file__).with_name("golden_steps.json")
RECORD = os.environ.get("POLICYLAB_RECORD_GOLDEN") == "1"

_BASE = dict(
    rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 5},
    # micro-batch = minibatch (4 rows): one forward per minibatch; the micro-batch split is
    # covered by `test_update_does_not_depend_on_the_micro_batch_size`. lr 3e-3: after the
    # first minibatch's step the second one's ratios spread over ~[0.7, 1.4], so the clip
    # branches act (PPO's clip_frac ~0.1) and a moved clip bound changes the record; at
    # 1e-3 no ratio came near the bounds
    train={"dtype": "fp64", "minibatches": 2, "steps": 1, "grad_clip": 0.0, "micro_batch_size": 4, "lr": 3e-3},
)
_OTHER_ENGINE = {"engine_dtype": "int8"}  # a behavior engine that is not the learner (see the docstring)
_STALE = {"staleness": 1}

# per method: config sections merged over _BASE (rollout/train merged key by key)
CASES: dict[str, dict] = {
    "ppo": {}, "grpo": {}, "grpo_process": {}, "dr_grpo": {}, "dapo": {}, "rloo": {"train": {"minibatches": 1}},
    "remax": {"train": {"minibatches": 1}}, "reinforce_pp": {}, "reinforce_pp_baseline": {},
    "vapo": {"train": {"steps": 2}}, "gspo": {}, "cispo": {}, "gppo": {}, "ttrl": {},
    "tis": {"rollout": _OTHER_ENGINE}, "icepop": {"rollout": _OTHER_ENGINE}, "kpop": {"rollout": _OTHER_ENGINE},
    "mis": {"rollout": _OTHER_ENGINE}, "minirl": {"rollout": _OTHER_ENGINE},
    "online_icepop": {"rollout": _OTHER_ENGINE, "train": {"minibatches": 1}},
    "gmc": {"rollout": _STALE, "train": {"steps": 2}}, "sis": {"rollout": _STALE, "train": {"steps": 2}},
    "missing_old_logits": {"rollout": {**_STALE, **_OTHER_ENGINE}, "train": {"steps": 2}},
    "ripo": {}, "gppo_fdiv": {}, "tapo": {}, "luspo": {}, "ggpo": {},
}

# The int8 engine's ratios k = exp(logp_old - logp_behavior) lie in ~[0.9975, 1.0014] here:
# far inside every correction's default band, where each of them weighs a token by k
# alone, so five of them would record one and the same update. These cases move their
# thresholds inside that range, so each correction's own branch acts (caps, masks on
# either side, the binary-KL test, the sequence-level geometric mean).
ENGAGE: dict[str, dict] = {
    "tis": {"tis_cap": 1.0005},
    "icepop": {"icepop_low": 0.999, "icepop_high": 1.0005},
    "online_icepop": {"icepop_low": 0.999, "icepop_high": 1.0005},
    "kpop": {"kpop_delta": 1e-11},
    "mis": {"mis_low": 0.9995, "mis_high": 1.0005},
    "minirl": {"engine_cap": 1.0005},
    "missing_old_logits": {"tis_cap": 1.0005},
}

# defaults changed on purpose since the first recording: the case pins the recorded value
FIXED_DEFAULTS: dict[str, dict] = {
    # grpo_process now has GRPO's objective, k3 KL in the loss included (it had dropped it)
    "grpo_process": {"method_params": {"kl_coef": 0.0}},
    # vapo's value pretraining is on by default now; the recording had none
    "vapo": {"method_params": {"value_pretrain_steps": 0, "allow_untrained_critic": True}},
}

_SKIP_PREFIXES = ("time/", "sys/", "rollout/tokens_per_s", "rollout/completions_per_s", "lr")

# Every metric and the gradient / update digests come from the fp64 path. Measured between
# AVX-512 and AVX2 kernels on this host: metrics of size > 1e-6 agree to <= 1.5e-11
# relative, the digests to <= 6e-14 of the update's norm. 1e-8 relative leaves a thousand-
# fold margin and still sees a change of a method's math: PPO's clip bound moved from 0.2
# to 0.2001 moves grpo's loss by 8e-4 relative (13 cases fail), GRPO's std epsilon moved
# from 1e-6 to 1.1e-6 moves the advantages by ~2e-7 relative (19 cases fail).
# The absolute floor, 1e-11, is for quantities that are zero up to fp64 rounding: the
# engine-vs-trainer mismatch of the fp64 engine (`mismatch/*` of every case but the int8
# ones: exactly 0 on AVX-512, <= 2^-49 = one fp64 spacing of a log-prob ~ -11 on AVX2), a
# KL between identical policies, a mean of advantages that cancel. It is ~5000 such
# spacings, and below every real mismatch (the int8 engine's |dlogp| ~ 1e-3).
_METRIC_TOL = dict(rel_tol=1e-8, abs_tol=1e-11)
# a projection is a sum of ~3.2e6 products (one per weight) of the update with N(0, 1) entries: its rounding
# error is relative to the update's norm, not to the (possibly tiny) projection itself
_VECTOR_TOL = dict(rel_tol=1e-8, abs_per_norm=1e-10)


def _config(name, tiny_model_dir, tmp_path):
    case = CASES[name]
    sections = {k: {**_BASE.get(k, {}), **case.get(k, {})} for k in ("rollout", "train")}
    params = {**ENGAGE.get(name, {}), **FIXED_DEFAULTS.get(name, {}).get("method_params", {})}
    return tiny_config(tiny_model_dir, tmp_path / name, method=name, method_params=params, **sections)


_DIRECTIONS: dict = {}


def _directions(model, seed: int = 1234, k: int = 8):
    """Fixed random directions per parameter (drawn once per parameter layout)."""
    layout = tuple((n, p.numel()) for n, p in sorted(model.state_dict().items()))
    if layout not in _DIRECTIONS:
        g = torch.Generator().manual_seed(seed)
        _DIRECTIONS[layout] = {n: torch.randn((k, numel), generator=g, dtype=torch.float64) for n, numel in layout}
    return _DIRECTIONS[layout]


def _project(vectors: dict, dirs: dict) -> dict:
    proj = torch.zeros(8, dtype=torch.float64)
    sq = 0.0
    for n in sorted(vectors):
        d = vectors[n].reshape(-1).to(torch.float64)
        sq += float((d * d).sum())
        proj += dirs[n] @ d
    return {"norm": math.sqrt(sq), "proj": proj.tolist()}


def _digest(before: dict, model, dirs) -> dict:
    after = {n: t.detach().to(torch.float64) for n, t in model.state_dict().items()}
    return _project({n: after[n] - before[n] for n in after}, dirs)


def _record_grads(optimizer, model, dirs, out: list) -> None:
    """Wrap `optimizer.step` so every call first records the projected gradient."""
    step = optimizer.step
    names = {id(p): n for n, p in model.named_parameters()}

    def recording_step(*a, **kw):
        grads = {names[id(p)]: p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None}
        full = {n: grads.get(n, torch.zeros_like(t, dtype=torch.float64)) for n, t in model.state_dict().items()
                if n in names.values()}
        out.append(_project(full, {n: dirs[n] for n in full}))
        return step(*a, **kw)

    optimizer.step = recording_step


def vote_texts(tr: Trainer) -> None:
    """Give TTRL's majority vote something to count: the random model writes no numbers,
    so every group would be ineligible and the update zero. Group g's replies read
    (g, g, g, g + 1) from the first reply on: a majority of three and one dissent."""
    def decode(batch):
        return [str(int(g) + (1 if i % 4 == 3 else 0)) for i, g in enumerate(batch.group.tolist())]

    tr.rollout.decode = decode


_SETUP = {"ttrl": vote_texts}  # per case, after the trainer is built


_REAL_LOAD = loading.load_policy
_LOADED: dict = {}


def _load_once(name_or_path, *, dtype=torch.float32):
    """`load_policy` for the golden cases: the model is read from disk once per (path,
    dtype) and each trainer gets a deep copy (the same weights, bit for bit; ~0.3 s of the
    ~0.7 s a case takes); the tokenizer, which nothing writes to, is shared."""
    key = (str(name_or_path), dtype)
    if key not in _LOADED:
        _LOADED[key] = _REAL_LOAD(name_or_path, dtype=dtype)
    model, tokenizer = _LOADED[key]
    return copy.deepcopy(model), tokenizer


def fp64_trainer(cfg) -> Trainer:
    """The trainer of `cfg` (train.dtype fp64) with its engine's log-probs in fp64 too."""
    tr = Trainer(cfg)
    assert isinstance(tr.engine, FastEngine), "the golden path samples with FastEngine (a Llama policy)"
    tr.engine.fp64_scores = True  # refused by the engine unless it decodes in fp64
    return tr


def _run(name, tiny_model_dir, tmp_path) -> dict:
    cfg = _config(name, tiny_model_dir, tmp_path)
    tr = fp64_trainer(cfg)
    if name in _SETUP:
        _SETUP[name](tr)
    models = {"policy": tr.model}
    if getattr(tr, "critic", None) is not None:
        models["critic"] = tr.critic
    before = {k: {n: t.detach().to(torch.float64).clone() for n, t in m.state_dict().items()} for k, m in models.items()}
    dirs = {k: _directions(m) for k, m in models.items()}
    grads: list = []
    _record_grads(tr.optimizer, tr.model, dirs["policy"], grads)
    rows = [tr.train_step() for _ in range(cfg.train.steps)]
    metrics = [{k: float(v) for k, v in sorted(r.items())
                if not k.startswith(_SKIP_PREFIXES) and isinstance(v, (int, float))} for r in rows]
    return {"metrics": metrics, "grads": grads,
            "weights": {k: _digest(before[k], m, dirs[k]) for k, m in models.items()}}


# SIS's acceptance diagnostics are 1 - p and log p of an acceptance probability within ~4e-7
# of 1, set by fp32 rounding of the behavior log-probs: measured between an AVX-512 and an
# AVX2-only host, 0.99999967 vs 0.99999958 and 3.3e-7 vs 4.2e-7 (9e-8 apart). An absolute
# floor of 1e-6 for these two only; the update itself (loss, gradients) keeps the tolerance above.
_ROUNDING_FLOOR = {"correction/sis/accept_prob_mean": 1e-6, "correction/sis/log_envelope_mean": 1e-6}


def _metric_close(got: float, want: float, key: str = "") -> bool:
    if math.isnan(got) or math.isnan(want):
        return math.isnan(got) and math.isnan(want)
    tol = dict(_METRIC_TOL, abs_tol=max(_METRIC_TOL["abs_tol"], _ROUNDING_FLOOR.get(key, 0.0)))
    return math.isclose(got, want, **tol)


def _vector_close(got: dict, want: dict) -> bool:
    rel, floor = _VECTOR_TOL["rel_tol"], _VECTOR_TOL["abs_per_norm"] * max(1.0, want["norm"])
    return (math.isclose(got["norm"], want["norm"], rel_tol=rel, abs_tol=floor)
            and all(math.isclose(a, b, rel_tol=rel, abs_tol=floor) for a, b in zip(got["proj"], want["proj"])))


def compare(name: str, got: dict, want: dict) -> None:
    """Assert the run `got` of case `name` computed the recorded update `want`."""
    assert len(got["metrics"]) == len(want["metrics"])
    for step, (g, w) in enumerate(zip(got["metrics"], want["metrics"])):
        missing = sorted(set(w) - set(g))
        assert not missing, f"step {step}: metrics no longer logged: {missing}"
        wrong = {k: (g[k], w[k]) for k in w if not _metric_close(g[k], w[k], k)}
        assert not wrong, f"step {step}: metrics differ (got, recorded): {wrong}"
    assert len(got["grads"]) == len(want["grads"]), "a different number of optimizer steps"
    for i, (g, w) in enumerate(zip(got["grads"], want["grads"])):
        assert _vector_close(g, w), (f"optimizer step {i}: gradient (got, recorded)", g, w)
    assert set(got["weights"]) == set(want["weights"])
    for part, w in want["weights"].items():
        assert _vector_close(got["weights"][part], w), (f"{part}: weight update (got, recorded)", got["weights"][part], w)


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_update_as_recorded(name, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "load_policy", _load_once)
    got = _run(name, tiny_model_dir, tmp_path)
    if RECORD:
        data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        data[name] = got
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    compare(name, got, json.loads(GOLDEN.read_text())[name])


@pytest.mark.parametrize("name", methods.names())
def test_update_does_not_depend_on_the_micro_batch_size(name, small_model_dir, tmp_path, small_prepared_dir):
    # every registered method (the ones added since the recording too): one round on one
    # batch (8 rows, 2 groups of 4), the whole batch as one optimizer step: one row per
    # micro-batch vs all eight at once must give the same gradient, whatever the method
    # computes across the rows of a group. On the small-vocabulary tiny model: the property is
    # the loss path's, not the vocabulary's (the golden cases above keep the real one)
    exercise = exercise_settings(name, model=str(small_model_dir), workdir=small_prepared_dir)
    sections = {k: {**_BASE.get(k, {}), **exercise.get(k, {})} for k in ("rollout", "train")}
    sections["train"]["minibatches"] = 1  # the whole batch is the optimizer step here
    cfg = tiny_config(small_model_dir, tmp_path / name, method=name,
                      method_params=dict(exercise.get("method_params", {})), **sections,
                      **{k: v for k, v in exercise.items() if k not in sections and k != "method_params"})
    cfg.rollout.staleness = 0  # one round at the current weights is enough here
    tr = Trainer(cfg)
    batch, _ = tr.collect()
    if batch is None:
        pytest.skip("no group passed the method's filters on this seed")
    batch, A, _ = tr.round_inputs(tr.prepare(batch))
    adv = A.adv
    if not bool((adv != 0).any()):
        # the random model's replies all scored alike (e.g. no number for a numeric judge):
        # the loss path is what is under test here, so give it seeded nonzero advantages
        adv = torch.randn(adv.shape, generator=torch.Generator().manual_seed(0), dtype=adv.dtype)
    start = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    dirs = _directions(tr.model)
    grads = []
    _record_grads(tr.optimizer, tr.model, dirs, grads)
    for mbs in (1, batch.size):
        tr.model.load_state_dict(start)
        tr.worker.micro_batch_size = mbs
        tr.worker.optimizer_step(tr.method, batch, adv, old_from_same_forward=not tr.needs_old_pass())
    one, whole = grads
    assert whole["norm"] > 0
    assert math.isclose(one["norm"], whole["norm"], rel_tol=1e-7), (one["norm"], whole["norm"])
    for x, y in zip(one["proj"], whole["proj"]):
        assert math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9 * whole["norm"]), (one["proj"], whole["proj"])


def test_every_recorded_method_is_still_registered_and_compared():
    recorded = set(json.loads(GOLDEN.read_text()))
    assert recorded == set(CASES)
    assert recorded <= set(methods.names())


def test_every_recorded_case_trains():
    # a golden of an update that moved nothing would pin nothing
    for name, want in json.loads(GOLDEN.read_text()).items():
        assert want["weights"]["policy"]["norm"] > 1e-6, name
        assert want["grads"] and all(g["norm"] > 0 for g in want["grads"]), name


def test_fp64_engine_log_probs(tiny_model, tokenizer):
    # the switch the golden path relies on: fp64 behavior log-probs from an fp64 decoder,
    # refused where the decoder computes in fp32 (nothing would be fp64 to keep)
    from policylab.batch import SamplingSettings

    with pytest.raises(ValueError, match="fp64 decoder"):
        FastEngine(tiny_model, tokenizer, fp64_scores=True)
    model = tiny_model.double()
    engine = FastEngine(model, tokenizer, fp64_scores=True)
    kw = dict(group_size=2, sampling=SamplingSettings(), max_new_tokens=3, policy_version=0, batch_id="b", seed=1)
    batch = engine.generate([[1, 2, 3]], **kw)
    assert batch.logp_behavior.dtype == torch.float64
    engine.fp64_scores = False  # the default: the logits rounded to fp32, as HF generate does
    assert engine.generate([[1, 2, 3]], **kw).logp_behavior.dtype == torch.float32
