"""The two arms of each mechanism as compare plans: an arm is a method with parameters
on one shared run (the mechanism's task, the method's `exercise` settings, the command's
model, steps, seeds and overrides). Arms whose run and method entry are identical are
one run directory: most controls (plain GRPO on the same task and seed) serve several
methods. One compare plan per distinct shared run, under out_dir/<task>-<hash>/."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from policylab.errors import ConfigError, PolicylabError
from policylab.experiments.compare.loading import plan_from_dict
from policylab.experiments.compare.plan import Plan

COMMON_METHOD_PARAMS = {"kl_coef": 0.0}  # no reference forward unless a method needs one (as in the quickstart)


@dataclass(frozen=True)
class Settings:
    """What every arm of one `policylab evidence` invocation shares."""
    out_dir: Path
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 6
    model: str = "embedded"
    eval_n: int = 50
    sets: tuple[tuple[str, object], ...] = ()  # ("section.key", value) applied to every arm's run

    def describe(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.sets)
        return (f"model {self.model}, seeds {list(self.seeds)}, {self.steps} rollout steps per run, "
                f"{self.eval_n} held-out prompts{extra}")


@dataclass
class Arm:
    """One arm: its compare entry (method, label, parameters) on its shared run."""
    method: str
    label: str
    method_params: dict
    run: dict
    group: str = ""
    out_dir: Path = Path(".")

    def run_dir(self, seed: int) -> Path:
        """Where compare puts this arm's run of `seed` (compare_config's out_dir)."""
        return self.out_dir / self.group / "runs" / f"{self.label}-seed{seed}"


def _merge(into: dict, sections: dict) -> None:
    for sec, kv in sections.items():
        if isinstance(kv, dict):
            into[sec] = {**into.get(sec, {}), **kv}
        else:
            into[sec] = kv


def _set(run: dict, key: str, value) -> None:
    parts = key.split(".")
    node = run
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: `{p}` is not a section")
    node[parts[-1]] = value


def shared_run(mech, settings: Settings, *, control: bool) -> dict:
    """The run config (without method, seed, run_dir) of one arm of `mech`: BASE_RUN, the
    method's `exercise` settings (its own task replaces the arithmetic one), the command's
    model, evaluation and --set overrides, then the mechanism's task preset and, for the
    control, its run overrides (these two win: the measurement depends on them)."""
    from policylab import methods
    from policylab.methods.mechanisms import BASE_RUN, TASKS

    spec = methods.get(mech.method)
    run = copy.deepcopy(BASE_RUN)
    exercise = {k: v for k, v in copy.deepcopy(dict(spec.exercise)).items() if k != "method_params"}
    task = exercise.pop("task", None)
    if task is not None:
        run["task"] = dict(task)  # the method's own task replaces the arithmetic one
    _merge(run, exercise)
    run["model"] = settings.model
    new_tokens = run.get("rollout", {}).get("max_new_tokens", 16)
    run["eval"] = {"n": settings.eval_n, "every": 0, "max_new_tokens": new_tokens,
                   "batch_size": min(settings.eval_n, 100)}
    run["log"] = {"tensorboard": False, "plot_every": 0, "checkpoint_every": max(1, settings.steps // 2)}
    for k, v in settings.sets:
        _set(run, k, v)
    # what the mechanism's measurement needs wins over the command's --set (e.g. one minibatch for
    # REINFORCE-style methods, the int4 engine of a correction), and the control's switch last
    _merge(run, copy.deepcopy(TASKS[mech.task]))
    if control:
        _merge(run, copy.deepcopy(dict(mech.control_run)))
    return run


def _label(name: str, params: dict) -> str:
    if not params:
        return name
    text = "-".join(f"{k}{v}" for k, v in sorted(params.items()))
    text = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)
    if len(text) > 40:
        text = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{name}-{text}"


def group_key(run: dict) -> str:
    task = run.get("task", {}).get("name", "task")
    digest = hashlib.sha256(json.dumps(run, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{task}-{digest}"


def arms_of(mech, settings: Settings) -> tuple[Arm, Arm]:
    """(method arm, control arm) of a measurable mechanism."""
    from policylab import methods

    spec = methods.get(mech.method)
    own = {**dict(spec.exercise).get("method_params", {}), **dict(mech.method_params)}
    m_run = shared_run(mech, settings, control=False)
    c_run = shared_run(mech, settings, control=True)
    method = Arm(mech.method, _label(mech.method, own), own, m_run, group_key(m_run), settings.out_dir)
    cp = mech.control_method_params
    control = Arm(mech.control_method, _label(mech.control_method, cp), cp, c_run, group_key(c_run),
                  settings.out_dir)
    return method, control


def compare_config(group: str, run: dict, arms: list[Arm], settings: Settings, report: str | None = None) -> dict:
    entries, seen = [], set()
    for a in arms:
        if a.label not in seen:
            seen.add(a.label)
            entries.append({"name": a.method, "label": a.label, "method_params": dict(a.method_params)})
    return {"out_dir": str(settings.out_dir / group), "methods": entries, "seeds": list(settings.seeds),
            "budget": {"steps": settings.steps}, "common_method_params": dict(COMMON_METHOD_PARAMS),
            "keep_checkpoints": False, "run": copy.deepcopy(run),
            **({"report_dir": str(settings.out_dir / group / f"compare-{report}")} if report else {})}


def build_plans(mechs, settings: Settings) -> tuple[dict[str, tuple[Arm, Arm]], dict[str, str], dict[str, Plan]]:
    """Arms of every measurable mechanism, the refusals (method -> why its arms cannot run
    on this task), and one compare plan per mechanism (its two arms, in their shared runs'
    directories: a control another mechanism already ran is `done` there and skipped), so
    the runs go mechanism by mechanism in the order given, each finishing all its seeds
    before the next starts. A refused method does not stop the others."""
    arms: dict[str, tuple[Arm, Arm]] = {}
    refused: dict[str, str] = {}
    plans: dict[str, Plan] = {}
    for mech in mechs:
        name = mech.method
        try:
            m, c = arms_of(mech, settings)
            if m.group == c.group:
                own = {name: plan_from_dict(compare_config(m.group, m.run, [m, c], settings, name),
                                            source=f"evidence {name}")}
            else:  # e.g. a no-update control: another shared run, its own plan
                own = {name: plan_from_dict(compare_config(m.group, m.run, [m], settings, name),
                                            source=f"evidence {name}"),
                       f"{name} (control)": plan_from_dict(compare_config(c.group, c.run, [c], settings,
                                                                          f"{name}-control"),
                                                           source=f"evidence {name} (control)")}
        except PolicylabError as exc:  # every problem of its arms on its run, in one message; nothing ran
            refused[name] = str(exc)
            continue
        arms[name] = (m, c)
        plans.update(own)
    return arms, refused, plans
