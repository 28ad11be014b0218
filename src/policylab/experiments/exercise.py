"""The settings under which a method does anything at all on a given model: its spec's
`exercise` sections plus what must be made first (RFPO's critic). Used by the generic
method tests and `benchmarks/methods_real.py`."""

from __future__ import annotations

from pathlib import Path

from policylab import methods

# RFPO's critic: trained on the base model's own labelled arithmetic rollouts
_CRITIC_BUDGET = {
    "test": dict(prompts=4, group_size=2, epochs=50, max_new_tokens=4),
    "real": dict(prompts=16, group_size=4, epochs=300, max_new_tokens=12),
}


def _prepare_rfpo(model: str, workdir: Path, budget: str) -> dict:
    """Train a critic for `model` on its own arithmetic rollouts into workdir/rfpo-critic."""
    from policylab.trainer.config import config_from_dict
    from policylab.pipelines.critic_pretraining import CriticBudget, train_frozen_critic

    b = dict(_CRITIC_BUDGET[budget])
    out = Path(workdir) / "rfpo-critic"
    if not (out / "critic.json").is_file():
        cfg = config_from_dict({"model": str(model), "run_dir": str(Path(workdir) / "rfpo-critic-run"), "seed": 0,
                                "rollout": {"max_new_tokens": b.pop("max_new_tokens")}})
        train_frozen_critic(cfg, out, CriticBudget(**b), say=lambda *_: None)
    return {"method_params": {"critic_path": str(out)}}


PREPARE = {"rfpo": _prepare_rfpo}


def exercise_settings(name: str, *, model: str, workdir, budget: str = "test") -> dict:
    """The config sections under which method `name` does anything at all: its spec's
    `exercise`, plus what must be made first for this model (e.g. RFPO's critic, trained
    into `workdir` with the "test" or "real" budget)."""
    if budget not in _CRITIC_BUDGET:
        raise ValueError(f"budget must be one of {sorted(_CRITIC_BUDGET)}, got {budget!r}")
    out = {k: dict(v) for k, v in methods.get(name).exercise.items()}
    prepare = PREPARE.get(name)
    if prepare is not None:
        for k, v in prepare(model, workdir, budget).items():
            out[k] = {**out.get(k, {}), **v}
    return out
