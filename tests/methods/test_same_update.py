"""Every registered method computes the update recorded in `golden_steps.json`.

The file was recorded on the code before methods became typed specs that own their
stages (`POLICYLAB_RECORD_GOLDEN=1 pytest tests/methods/test_same_update.py` rewrites it).
Each case runs the real trainer on the tiny random Llama in fp64 for one or two rollout
steps (two minibatches where the method allows it, so the old-logprob pass and ratios
!= 1 are exercised) and compares:

* every logged metric (wall-clock, memory and throughput keys excluded), and
* the gradient at every optimizer step (gradient clipping off, so magnitudes count: Adam's
  first steps are close to sign(gradient) and would hide them) and the final weight update
  of the policy (and the critic): norm and 8 projections onto fixed random directions.
  Equal projections onto random directions mean equal vectors up to rounding.

Where a later fix deliberately changes a default (named in `FIXED_DEFAULTS`), the case
sets the old value explicitly, so the comparison still covers the rest of the method.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from policylab.experiments.exercise import exercise_settings
from policylab import methods
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config

GOLDEN = Path(__file__).with_name("golden_steps.json")
RECORD = os.environ.get("POLICYLAB_RECORD_GOLDEN") == "1"

_BASE = dict(
    rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 5},
    train={"dtype": "fp64", "minibatches": 2, "steps": 1, "grad_clip": 0.0},
)
_BF16 = {"engine_dtype": "bf16"}
_STALE = {"staleness": 1}

# per method: config sections merged over _BASE (rollout/train merged key by key)
CASES: dict[str, dict] = {
    "ppo": {}, "grpo": {}, "grpo_process": {}, "dr_grpo": {}, "dapo": {}, "rloo": {"train": {"minibatches": 1}},
    "remax": {"train": {"minibatches": 1}}, "reinforce_pp": {}, "reinforce_pp_baseline": {},
    "vapo": {"train": {"steps": 2}}, "gspo": {}, "cispo": {}, "gppo": {}, "ttrl": {},
    "tis": {"rollout": _BF16}, "icepop": {"rollout": _BF16}, "kpop": {"rollout": _BF16}, "mis": {"rollout": _BF16},
    "minirl": {"rollout": _BF16}, "online_icepop": {"rollout": _BF16, "train": {"minibatches": 1}},
    "gmc": {"rollout": _STALE, "train": {"steps": 2}}, "sis": {"rollout": _STALE, "train": {"steps": 2}},
    "missing_old_logits": {"rollout": {**_STALE, **_BF16}, "train": {"steps": 2}},
    "ripo": {}, "gppo_fdiv": {}, "tapo": {}, "luspo": {}, "ggpo": {},
}

# defaults changed on purpose since the recording: the case pins the recorded value
FIXED_DEFAULTS: dict[str, dict] = {
    # grpo_process now has GRPO's objective, k3 KL in the loss included (it had dropped it)
    "grpo_process": {"method_params": {"kl_coef": 0.0}},
    # vapo's value pretraining is on by default now; the recording had none
    "vapo": {"method_params": {"value_pretrain_steps": 0, "allow_untrained_critic": True}},
}

# bugs fixed since the recording: the recorded update was wrong, so it is not compared.
# Both computed a statistic over a group inside each micro-batch, so a group split across
# micro-batches saw only part of itself and the update depended on the micro-batch size;
# `test_update_does_not_depend_on_the_micro_batch_size` below covers every method now.
FIXED_BUGS = {
    "ggpo": "Gibbs coefficients were computed per micro-batch (partial groups); now once per round over whole groups",
    "gmc": "group masses were summed per micro-batch (partial groups); now once per round over whole groups",
}

# methods that became compositions (host objective x correction stage): their metrics
# moved from the objective's namespace to the host's and the correction's
_MOVED = {
    "minirl": [("policy/minirl/clip_frac", "policy/clip_frac"), ("policy/minirl/", "correction/minirl/")],
    "missing_old_logits": [("policy/missing_old_logits/clip_frac", "policy/clip_frac"),
                           ("policy/missing_old_logits/staleness_ratio_mean", "policy/ratio/mean"),
                           ("policy/tis/", "correction/tis/")],
    "online_icepop": [("policy/online_icepop/", "correction/online_icepop/")],
    "sis": [("policy/sis/", "correction/sis/")],
}


def _renamed(name: str, key: str) -> str:
    for old, new in _MOVED.get(name, []):
        if key == old or (old.endswith("/") and key.startswith(old)):
            return new + key[len(old):] if old.endswith("/") else new
    return key

_SKIP_PREFIXES = ("time/", "sys/", "rollout/tokens_per_s", "rollout/completions_per_s", "lr")


def _config(name, tiny_model_dir, tmp_path):
    case = CASES[name]
    sections = {k: {**_BASE.get(k, {}), **case.get(k, {})} for k in ("rollout", "train")}
    params = dict(FIXED_DEFAULTS.get(name, {}).get("method_params", {}))
    extra = {k: v for k, v in FIXED_DEFAULTS.get(name, {}).items() if k != "method_params"}
    for k, v in extra.items():
        sections[k] = {**sections.get(k, {}), **v}
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


def _run(name, tiny_model_dir, tmp_path, **train) -> dict:
    cfg = _config(name, tiny_model_dir, tmp_path)
    for k, v in train.items():
        setattr(cfg.train, k, v)
    tr = Trainer(cfg)
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


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-8, abs_tol=1e-11)


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_update_as_recorded(name, tiny_model_dir, tmp_path):
    got = _run(name, tiny_model_dir, tmp_path)
    if RECORD:
        data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        data[name] = got
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    if name in FIXED_BUGS:
        pytest.skip(f"recorded with a bug since fixed: {FIXED_BUGS[name]}")
    want = json.loads(GOLDEN.read_text())[name]
    assert len(got["metrics"]) == len(want["metrics"])
    for step, (g, w) in enumerate(zip(got["metrics"], want["metrics"])):
        w = {_renamed(name, k): v for k, v in w.items()}
        missing = sorted(set(w) - set(g))
        assert not missing, f"step {step}: metrics no longer logged: {missing}"
        wrong = {k: (g[k], w[k]) for k in w if not _close(g[k], w[k])}
        assert not wrong, f"step {step}: metrics differ (got, recorded): {wrong}"
    assert len(got["grads"]) == len(want["grads"]), "a different number of optimizer steps"
    for i, (g, w) in enumerate(zip(got["grads"], want["grads"])):
        assert _close(g["norm"], w["norm"]), (f"optimizer step {i}: gradient norm", g["norm"], w["norm"])
        for a, b in zip(g["proj"], w["proj"]):
            assert math.isclose(a, b, rel_tol=1e-7, abs_tol=1e-9 * max(1.0, w["norm"])), (i, g["proj"], w["proj"])
    assert set(got["weights"]) == set(want["weights"])
    for part, w in want["weights"].items():
        g = got["weights"][part]
        assert _close(g["norm"], w["norm"]), (part, g["norm"], w["norm"])
        for a, b in zip(g["proj"], w["proj"]):
            assert math.isclose(a, b, rel_tol=1e-7, abs_tol=1e-9 * max(1.0, w["norm"])), (part, g["proj"], w["proj"])


@pytest.mark.parametrize("name", methods.names())
def test_update_does_not_depend_on_the_micro_batch_size(name, tiny_model_dir, tmp_path):
    # every registered method (the ones added since the recording too): one round on one
    # batch (8 rows, 2 groups of 4), the whole batch as one optimizer step: one row per
    # micro-batch vs all eight at once must give the same gradient, whatever the method
    # computes across the rows of a group
    exercise = exercise_settings(name, model=str(tiny_model_dir), workdir=tmp_path / "prepared")
    sections = {k: {**_BASE.get(k, {}), **exercise.get(k, {})} for k in ("rollout", "train")}
    sections["train"]["minibatches"] = 1  # the whole batch is the optimizer step here
    cfg = tiny_config(tiny_model_dir, tmp_path / name, method=name,
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
