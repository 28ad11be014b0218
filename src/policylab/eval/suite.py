"""`policylab eval --metrics`: fixed-budget coverage (pass@k), the sharpening tax and
decision-token calibration, for the base and the trained model of a run.

    pass@k          unbiased pass@k per held-out problem (`coverage.coverage_at_k`), each
                    problem's samples pooled over the evaluation's cycles through it
    sharpening_tax  cov_K(base) − cov_K(trained) for every K asked (`coverage.sharpening_tax`)
    calibration     (= calib_rl) the decision token of the arithmetic task: the first reply
                    token's distribution restricted to the ten digit tokens "0".."9"; the
                    decision is right when it is the first digit of the gold answer. The
                    held-out problems are split by a hash of the prompt into "val" (fits
                    the temperature) and "test" (measured): disjoint by construction
                    (`calibration.calib_rl`)

The gold answers are read here, by the evaluator, after training or adaptation, never
by a training stage. Results go to report.json ("eval_metrics") and the reliability
diagram to plots/reliability.png.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from policylab.eval.calibration import calib_rl
from policylab.errors import ConfigError
from policylab.eval.coverage import coverage_at_k, pool_counts, sharpening_tax
from policylab.errors import PolicylabError

ALIASES = {"pass@k": "pass@k", "sharpening_tax": "sharpening_tax", "calibration": "calib_rl", "calib_rl": "calib_rl"}
N_BINS = 10
DECISION = ("the first reply token, its distribution restricted to the ten digit tokens '0'..'9'; "
            "correct when it is the first digit of the gold answer")


def parse_metrics(text: str) -> list[str]:
    """"pass@k,sharpening_tax,calibration" -> canonical names (duplicates dropped)."""
    out = []
    for name in (s.strip() for s in str(text).split(",")):
        if not name:
            continue
        if name not in ALIASES:
            raise ConfigError(f"--metrics: unknown metric {name!r}; known: {', '.join(ALIASES)}")
        if ALIASES[name] not in out:
            out.append(ALIASES[name])
    if not out:
        raise ConfigError("--metrics names no metric; known: " + ", ".join(ALIASES))
    return out


def sampled(trainer, label: str) -> dict:
    """`Trainer.evaluate` (same prompts, settings and seed) with each prompt's number of
    correct samples and its text (the task id)."""
    from policylab.eval.evaluate import evaluate

    e = trainer.cfg.eval
    examples = trainer.task.heldout(e.n)
    prompts = [trainer.encode(x.prompt) for x in examples]
    trainer.model.eval()
    res = evaluate(trainer.engine, prompts, [x.answer for x in examples], trainer.task.reward_fn,
                   samples=e.samples, k=tuple(e.k), temperature=e.temperature, max_new_tokens=e.max_new_tokens,
                   batch_size=e.batch_size, seed=trainer.cfg.seed + 999, counts=True,
                   prompt_texts=[x.prompt for x in examples])
    trainer.model.train()
    res["label"] = label
    res["task_ids"] = [x.prompt for x in examples]
    return res


def coverage(res: dict, ks) -> dict:
    """{k: Coverage} over the distinct problems of a `sampled` result."""
    ids, n, c = pool_counts(res["task_ids"], [res["samples_per_prompt"]] * len(res["task_ids"]),
                            res["correct_per_prompt"])
    return {int(k): coverage_at_k(ids, n, c, int(k)) for k in ks}


def split_of(prompt: str) -> str:
    """"val" or "test" from a hash of the prompt (a pure function of the problem)."""
    h = hashlib.blake2b(f"policylab-calib-split:{prompt}".encode(), digest_size=8).digest()
    return "val" if h[0] % 2 == 0 else "test"


def digit_choices(tokenizer) -> list[int]:
    """Token ids of "0".."9"; each digit must be one token of its own."""
    ids = []
    for d in "0123456789":
        enc = tokenizer(d, add_special_tokens=False)["input_ids"]
        if len(enc) != 1:
            raise PolicylabError(f"the digit {d!r} is not a single token for this tokenizer ({enc}): the digit "
                                 "decision token is undefined")
        ids.append(int(enc[0]))
    return ids


def calibration(trainer, *, n_bins: int = N_BINS) -> dict:
    """Decision-token calibration of the trainer's current model on the distinct held-out
    problems (those whose gold answer starts with a digit)."""
    from policylab.eval.evaluate import decision_logits

    seen, examples = set(), []
    for x in trainer.task.heldout(trainer.cfg.eval.n):
        if x.prompt not in seen and x.answer[:1].isdigit():
            seen.add(x.prompt)
            examples.append(x)
    if len(examples) < 4:
        raise PolicylabError(f"calibration needs at least 4 distinct held-out problems, got {len(examples)}")
    prompts = [trainer.encode(x.prompt) for x in examples]
    pad = trainer.tokenizer.pad_token_id
    z, mass = decision_logits(trainer.model, prompts, digit_choices(trainer.tokenizer), pad_id=pad,
                              batch_size=trainer.cfg.eval.batch_size)
    labels = torch.tensor([int(x.answer[0]) for x in examples])
    tags = [split_of(x.prompt) for x in examples]
    out = calib_rl(z, labels, tags, n_bins=n_bins, ids=[x.prompt for x in examples])
    out["decision"] = DECISION
    out["digit_mass_mean"] = float(mass.mean())
    return out


def measure(trainer, label: str, metrics: list[str]) -> dict:
    """What one model contributes: the sampled evaluation (with counts) and/or calibration."""
    out = {}
    if "pass@k" in metrics or "sharpening_tax" in metrics:
        out["sampled"] = sampled(trainer, label)
    if "calib_rl" in metrics:
        out["calibration"] = calibration(trainer)
    return out


def combine(base: dict, trained: dict | None, metrics: list[str], ks) -> dict:
    """The report's "eval_metrics" section from the two `measure` results."""
    out: dict = {}
    if "pass@k" in metrics:
        out["pass@k"] = {}
        for label, m in (("base", base), ("trained", trained)):
            if m is not None:
                out["pass@k"][label] = {str(k): cov.value for k, cov in coverage(m["sampled"], ks).items()}
        out["pass@k"]["tasks"] = len(set(base["sampled"]["task_ids"]))
        out["pass@k"]["samples_per_task"] = sorted(set(
            pool_counts(base["sampled"]["task_ids"], [base["sampled"]["samples_per_prompt"]] * len(
                base["sampled"]["task_ids"]), base["sampled"]["correct_per_prompt"])[1].tolist()))
    if "sharpening_tax" in metrics:
        if trained is None:
            raise PolicylabError("sharpening_tax compares the base and the trained model: the run has no checkpoint")
        cb, ct = coverage(base["sampled"], ks), coverage(trained["sampled"], ks)
        out["sharpening_tax"] = {str(k): sharpening_tax(cb[k], ct[k]) for k in cb}
    if "calib_rl" in metrics:
        out["calibration"] = {"base": base["calibration"]}
        if trained is not None:
            out["calibration"]["trained"] = trained["calibration"]
        out["calibration"]["decision"] = DECISION
    return out


def summary_rows(em: dict) -> list[tuple[str, float | None, float | None]]:
    """(metric, base, trained) rows for the report table."""
    rows = []
    for k, v in (em.get("pass@k", {}).get("base") or {}).items():
        rows.append((f"coverage pass@{k}", v, (em["pass@k"].get("trained") or {}).get(k)))
    for k, t in (em.get("sharpening_tax") or {}).items():
        rows.append((f"sharpening tax @{k} (base − trained)", None, t["tax"]))
    cal = em.get("calibration") or {}
    for key in ("accuracy", "ece", "brier", "nll"):
        for kind in ("raw", "scaled"):
            b = cal.get("base", {}).get(kind, {}).get(key)
            t = cal.get("trained", {}).get(kind, {}).get(key)
            if b is not None:
                rows.append((f"decision {key} ({'T=1' if kind == 'raw' else 'T fitted on val'})", b, t))
    if "base" in cal:
        rows.append(("decision temperature T*", cal["base"]["temperature"], cal.get("trained", {}).get("temperature")))
    return rows


def reliability_png(cal: dict, path: Path) -> Path:
    """The reliability diagram: accuracy against confidence per bin, base and trained, at
    T = 1 and at the fitted temperature (marker area ~ bin count)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
    for ax, kind, title in ((axes[0], "raw", "T = 1"), (axes[1], "scaled", "T fitted on the val split")):
        ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--", label="calibrated")
        for label, color in (("base", "tab:blue"), ("trained", "tab:orange")):
            if label not in cal:
                continue
            m = cal[label][kind]
            pts = [(b["conf"], b["acc"], b["count"]) for b in m["bins"] if b["count"]]
            if pts:
                xs, ys, ns = zip(*pts)
                ax.plot(xs, ys, marker="o", color=color, label=f"{label}: ECE {m['ece']:.3f} (T={m['temperature']:.2f})")
                ax.scatter(xs, ys, s=[12 + 4 * n for n in ns], color=color, alpha=0.35)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence of the decision token")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("accuracy")
    n_test = cal["base"]["n_test"]
    fig.suptitle(f"decision-token reliability on the test split ({n_test} problems)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
