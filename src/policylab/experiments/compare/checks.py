"""What the shared task and model can do for the comparison, checked before any run: a
base accuracy can be measured (a model, held-out prompts, a verifier that accepts the
reference answers), and every method can be fed (derived from its stage specs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from policylab.experiments.compare.plan import Plan
from policylab.trainer.config import RunConfig

# fields a stage may read that the trainer itself produces (the rest must be written by a stage)
_TRAINER_FIELDS = {"tokens", "attention_mask", "loss_mask", "group", "batch_id", "policy_version", "logp", "entropy",
                   "prompt_width", "logp_old", "logp_ref", "values", "logp_current"}
_NO_BASE = "the task's base accuracy cannot be measured"


def feed_problems(method, numeric_answers: bool, example_answer: str = "") -> list[str]:
    """Why the task cannot feed `method` (empty: it can), from the method's active stages:
    a field a stage reads must be produced by the trainer or written by a stage, and a
    stage kernel that declares `task_needs` (rewards.graded: numeric gold answers) needs a
    task that has it."""
    from policylab.kernels.rewards.graded import NEEDS_NUMERIC_GOLD

    stages = [s for s in method.stages() if s.is_active(method.p)]
    written: dict[str, Any] = {}
    for s in stages:
        for w in s.writes:
            written.setdefault(w, s)
    out = []
    for s in stages:
        for f in s.reads:
            if f in _TRAINER_FIELDS or f in written:
                continue
            out.append(f"{method.name} reads `{f}` (stage `{s.name}`), which neither its stages nor the trainer "
                       "produce: no task can feed it")
    for s in stages:
        for k in s.kernels:
            if getattr(k, "task_needs", None) == NEEDS_NUMERIC_GOLD and not numeric_answers:
                what = ", ".join(w for w in s.writes) or "its output"
                out.append(f"{method.name} gets {what} from stage `{s.name}` ({k.__module__}.{k.__name__}), which "
                           f"needs numeric gold answers; this task's are not all numbers (e.g. {example_answer!r})")
    return out


def inert_note(label: str, spec, cfg: RunConfig) -> list[str]:
    """Methods whose declared `exercise` settings are not met here do nothing beyond their host."""
    missing = []
    for section, keys in (spec.exercise or {}).items():
        sec = getattr(cfg, section, None)
        for k, want in keys.items():
            have = getattr(sec, k, None)
            if k == "engine_dtype" and want != "fp32" and have not in (None, "fp32"):
                continue  # any behavior engine that differs from the trainer (bf16, int8, int4) exercises it
            if have != want and not (isinstance(want, int) and isinstance(have, int) and have >= want > 0):
                missing.append(f"{section}.{k}={want}")
    if missing:
        return [f"{label} acts only with {', '.join(missing)} (its spec's `exercise`); at these settings it "
                "trains like its host method"]
    return []


def _is_number(text: str) -> bool:
    from decimal import Decimal, InvalidOperation

    try:
        return Decimal(str(text).strip().replace(",", "")).is_finite()
    except InvalidOperation:
        return False


def task_problems(plan: Plan, cfg: RunConfig) -> list[str]:
    """Can the shared task be evaluated (a base accuracy measured) and fed to every method?
    Sets `plan.task_describe` once the task is built."""
    from policylab.errors import PolicylabError
    from policylab.tasks.source import build_task, verifier_name

    if cfg.eval.n < 1:
        return [f"run.eval.n={cfg.eval.n}: the base accuracy of the task cannot be measured without held-out prompts"]
    problem = _model_problem(cfg)
    if problem:
        return [problem]
    try:
        task = build_task(cfg.task, seed=cfg.seed)
        held = task.heldout(cfg.eval.n)
    except (PolicylabError, ImportError, FileNotFoundError) as exc:
        return [f"{_NO_BASE}: {exc}"]
    plan.task_describe = task.describe
    if not held:
        return [f"{_NO_BASE}: its held-out split is empty"]
    sample = [e for e in held[: min(len(held), 20)] if str(e.answer)]
    verifier = verifier_name(cfg.task)
    fn = task.reward_fn if sample else None
    try:
        zero = _rejected(fn, sample, verifier, task.reference_reply)
    except Exception as exc:  # the verifier's own code: any failure means no base accuracy
        return [f"{_NO_BASE}: the verifier `{verifier}` fails on the held-out "
                f"reference answers: {type(exc).__name__}: {' '.join(str(exc).split())}"]
    problems = []
    if zero:
        e = sample[zero[0]]
        problems.append(f"{_NO_BASE}: the verifier `{verifier}` gives the "
                        f"reference {'reply' if task.reference_reply else 'answer'} itself 0 on {len(zero)} of "
                        f"{len(sample)} held-out examples, e.g. answer {str(e.answer)!r} of prompt {e.prompt[:80]!r}")
    return problems + _feed_all(plan, cfg, held)


def _model_problem(cfg: RunConfig) -> str | None:
    from policylab.errors import PolicylabError

    if cfg.model == "embedded":
        return None
    from policylab.models.loading import check_model_dir

    if not Path(cfg.model).is_dir():
        return f"model {cfg.model!r} is neither 'embedded' nor a directory"
    try:
        check_model_dir(cfg.model)
    except (PolicylabError, FileNotFoundError) as exc:
        return str(exc)
    return None


def _rejected(reward_fn, sample: list, verifier: str, reference_reply=None) -> list[int]:
    """Indices of the held-out examples whose own reference reply (`reference_reply(e)`, by
    default the gold answer text) the task's verifier (`reward_fn`) scores 0; its exceptions
    propagate."""
    from policylab.kernels.rewards import combine_rewards

    if not sample:
        return []
    replies = [reference_reply(e) if reference_reply else str(e.answer) for e in sample]
    scores, _ = combine_rewards([(verifier, reward_fn, 1.0)], replies,
                                [e.answer for e in sample], prompts=[e.prompt for e in sample])
    return [i for i, v in enumerate(scores.tolist()) if not v > 0]


def _feed_all(plan: Plan, cfg: RunConfig, held: list) -> list[str]:
    """feed_problems of every method entry, with the parameters its runs were planned with."""
    from policylab import methods
    from policylab.trainer.loop import run_shape

    numeric = all(_is_number(str(e.answer)) for e in held)
    example = next((str(e.answer) for e in held if not _is_number(str(e.answer))), "")
    problems = []
    for e in plan.entries:
        params = next(r.cfg.method_params for r in plan.runs if r.label == e.label)
        method = methods.get(e.name).with_params(params, run_shape(cfg))
        problems += [f"{e.label}: {p}" for p in feed_problems(method, numeric, example)]
    return problems
