"""Fusion paradigms across task domains: `policylab pipeline fusion CONFIG`.

"Consolidating RLVR Capabilities Across Domains: A Deep Dive into Fusion Paradigms"
(arXiv id **unconfirmed**). From one base model, a domain expert is RL-trained per
domain (GRPO by default, through `policylab train`), then three routes combine the
domains:

    merge   task-vector arithmetic θ = θ_base + Σ_k α_k (θ_k − θ_base) over checkpoints of
            identical layout and vocabulary (`merge_task_vectors`; a mismatch is refused)
    mix     Mix RL: the experts' RL recipe on the pooled data of the domains, in the
            proportions `mix.mix` (task `mixture`, `tasks.mixture`)
    mopd    multi-teacher on-policy distillation: the student (the base) samples on pooled
            prompts and each token's signal comes from the expert of its prompt's domain
            (method `fusion`, `methods.pipelines`; per-domain metrics in its log)

Every model (base, each expert, each route) is evaluated on each domain's held-out split;
the report is a table per domain, the mean over domains shown next to it, never alone.

The config (YAML): run_dir, model, seed, threads, domains, routes, and the sections task
(the arithmetic operations and the split every run uses), experts (a run config's method,
rollout, train and method_params), merge, mix, mopd and eval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from policylab.errors import ConfigError
from policylab.errors import PolicylabError, ShapeError
import policylab.pipelines.common as common
from policylab.trainer.config import Range

ROUTES = ("merge", "mix", "mopd")
TOP = {"run_dir": "runs/fusion", "model": "embedded", "seed": 0, "threads": 0,
       "domains": ["arithmetic", "sequence"], "routes": list(ROUTES)}
SECTIONS = {
    "task": {"ops": ["+", "*"], "digits": 1, "heldout_fraction": 0.5, "split_seed": 0},
    "experts": None,  # a run config's method, rollout, train and method_params; method grpo by default
    "merge": {"alphas": []},  # one α per domain; [] = 1 / (number of domains) each
    "mix": {"mix": [], "steps": 0},  # [] = equal proportions; steps 0 = the experts' train.steps
    "mopd": {"steps": 0, "lr": 0.0, "horizon": "token"},  # 0 = the experts' steps / lr
    "eval": {"prompts": 40, "samples": 1, "max_new_tokens": 12},
}
_COUNT = Range(lo=1, integer=True)
# every number of the pipeline's own sections and its accepted values (checked at load,
# before any expert trains)
RULES = {"merge.alphas": Range(why="one task-vector weight per domain"),
         "mix.steps": Range(lo=0, integer=True, why="0 = the experts' train.steps"),
         "mopd.steps": Range(lo=0, integer=True, why="0 = the experts' train.steps"),
         "mopd.lr": Range(lo=0, why="0 = the experts' train.lr"),
         "eval.prompts": _COUNT, "eval.samples": _COUNT, "eval.max_new_tokens": _COUNT,
         "task.digits": Range(lo=1, hi=18, integer=True), "task.heldout_fraction": Range(lo=0, hi=1, lo_open=True,
                                                                                          hi_open=True),
         "task.split_seed": Range(lo=0, hi=2**32 - 1, integer=True)}
EXPERT_SECTIONS = ("method", "rollout", "train", "method_params")


def load_config(path, overrides=()) -> dict:
    """The pipeline config (see the module docstring), checked before anything runs."""
    from policylab.kernels.mixed import MOPD_HORIZONS
    from policylab.tasks.mixture import DOMAINS

    cfg = common.load_pipeline_config(path, overrides, top=TOP, sections=SECTIONS, name="fusion", rules=RULES)
    d = cfg["domains"]
    if len(d) < 2 or len(set(d)) != len(d) or not set(d) <= set(DOMAINS):
        raise ConfigError(f"{path}: domains must be two or more distinct domains of {', '.join(DOMAINS)}, got {d}")
    bad = sorted(set(cfg["routes"]) - set(ROUTES))
    if bad or not cfg["routes"]:
        raise ConfigError(f"{path}: routes must be a non-empty list of {', '.join(ROUTES)}, got {cfg['routes']}")
    extra = sorted(set(cfg["experts"]) - set(EXPERT_SECTIONS))
    if extra:
        raise ConfigError(f"{path}: experts.{extra[0]} cannot be set: the pipeline sets each run's model, task, seed "
                          f"and run_dir; experts takes {', '.join(EXPERT_SECTIONS)}")
    if cfg["experts"].get("method") == "fusion":
        raise ConfigError(f"{path}: experts.method is the domain experts' RL recipe (e.g. grpo), not fusion (MOPD)")
    alphas, mix = cfg["merge"]["alphas"], cfg["mix"]["mix"]
    if alphas and len(alphas) != len(d):
        raise ConfigError(f"{path}: merge.alphas needs one α per domain ({len(d)}), got {alphas}")
    if mix and (len(mix) != len(d) or any(x < 0 for x in mix) or sum(mix) <= 0):
        raise ConfigError(f"{path}: mix.mix needs one proportion >= 0 per domain ({len(d)}) with a positive sum, "
                          f"got {mix}")
    if cfg["mopd"]["horizon"] not in MOPD_HORIZONS:
        raise ConfigError(f"{path}: mopd.horizon must be one of {', '.join(MOPD_HORIZONS)}")
    cfg["_source"] = str(path)
    return cfg


def merge_task_vectors(base: dict, experts: list[dict], alphas: list[float]) -> dict:
    """θ = θ_base + Σ_k α_k·(θ_k − θ_base), tensor by tensor (in float64, cast back).

    Every state dict must have the base's keys, shapes and dtypes (identical layout; the
    embedding shapes carry the vocabulary size, so another vocabulary is refused here too).
    One expert with α = 1 returns that expert; all α = 0 returns the base."""
    import math

    if not experts or len(alphas) != len(experts):
        raise PolicylabError(f"merge needs one α per expert: {len(alphas)} alphas for {len(experts)} experts")
    if not all(isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) for a in alphas):
        raise PolicylabError(f"merge: every α must be a finite number, got {list(alphas)}")
    for k, e in enumerate(experts):
        if set(e) != set(base):
            extra, missing = sorted(set(e) - set(base))[:3], sorted(set(base) - set(e))[:3]
            raise ShapeError(f"expert {k} has another layout than the base (extra {extra}, missing {missing})")
        for name, t in base.items():
            if e[name].shape != t.shape or e[name].dtype != t.dtype:
                what = "vocabulary" if "embed" in name or "lm_head" in name else "layout"
                raise ShapeError(f"expert {k}: `{name}` is {tuple(e[name].shape)} {e[name].dtype}, the base "
                                 f"{tuple(t.shape)} {t.dtype} (another {what})")
    out = {}
    for name, t in base.items():
        if not t.is_floating_point():
            out[name] = t.clone()
            continue
        acc = t.to(torch.float64).clone()
        for a, e in zip(alphas, experts):
            acc += float(a) * (e[name].to(torch.float64) - t.to(torch.float64))
        out[name] = acc.to(t.dtype)
    return out


def check_vocabularies(tokenizers: list) -> None:
    """Refuse checkpoints whose tokenizers map ids differently (the task vectors of their
    embeddings would add unrelated rows)."""
    ref = tokenizers[0].get_vocab()
    for k, tok in enumerate(tokenizers[1:], start=1):
        if tok.get_vocab() != ref:
            raise PolicylabError(f"checkpoint {k} has another vocabulary than the base: task vectors cannot be merged")


def domain_eval(model, tokenizer, task, domains, *, prompts: int, how: common.Sampling) -> dict:
    """Sampled accuracy on each domain's held-out split, `prompts` prompts each (and their
    mean, reported next to them), sampled as `how` says."""
    from policylab.eval.evaluate import evaluate
    from policylab.kernels.rewards.verifiers import exact_numeric_reward

    encode = common.chat_encoder(tokenizer)
    engine = common.engine_for(model, tokenizer)
    model.eval()
    out = {}
    for d in domains:
        exs = task.heldout_of(d, prompts)
        res = evaluate(engine, [encode(e.prompt) for e in exs], [e.answer for e in exs], exact_numeric_reward,
                       samples=how.samples, temperature=how.temperature, max_new_tokens=how.max_new_tokens,
                       seed=how.seed)
        out[d] = {"accuracy": res["accuracy"], "stderr": res["accuracy_stderr"], "n": prompts * how.samples,
                  "distinct_prompts": len({e.prompt for e in exs})}
    out.update(summarize_domains({d: out[d]["accuracy"] for d in domains}))
    return out


def summarize_domains(accuracy: dict) -> dict:
    """Per-domain accuracies summarized WITHOUT hiding them: the mean over domains next to
    the worst and best domain (equal means can hide opposite per-domain results)."""
    if not accuracy:
        raise PolicylabError("summarize_domains needs at least one domain")
    worst = min(accuracy, key=accuracy.get)
    best = max(accuracy, key=accuracy.get)
    return {"mean_over_domains": sum(accuracy.values()) / len(accuracy), "worst_domain": worst,
            "worst_accuracy": accuracy[worst], "best_domain": best, "best_accuracy": accuracy[best]}


def _task_cfg(cfg: dict, name: str, **more) -> dict:
    t = cfg["task"]
    return {"name": name, "ops": list(t["ops"]), "digits": int(t["digits"]),
            "heldout_fraction": float(t["heldout_fraction"]), "split_seed": int(t["split_seed"]), **more}


def run_configs(cfg: dict, run_dir: Path, experts: dict | None = None) -> dict:
    """The run config of every training stage: one expert per domain, Mix RL, MOPD
    (`experts` maps domain -> checkpoint; placeholders before the experts exist)."""
    domains = list(cfg["domains"])
    ex = {k: (dict(v) if isinstance(v, dict) else v) for k, v in cfg["experts"].items()}
    method = ex.pop("method", "grpo")
    base = {"seed": int(cfg["seed"]), "threads": int(cfg["threads"]), "model": cfg["model"],
            "eval": {"n": 0, "before": False, "after": False}, "log": {"tensorboard": False, "progress": False}}
    out = {}
    for d in domains:
        out[f"expert_{d}"] = {**base, **ex, "method": method, "task": _task_cfg(cfg, d),
                              "run_dir": str(run_dir / f"expert_{d}")}
    mix = list(cfg["mix"]["mix"]) or [1.0] * len(domains)
    mixture = _task_cfg(cfg, "mixture", domains=domains, mix=[float(x) for x in mix])
    if "mix" in cfg["routes"]:
        c = {**base, **ex, "method": method, "task": mixture, "run_dir": str(run_dir / "mix")}
        if int(cfg["mix"]["steps"]):
            c["train"] = {**c.get("train", {}), "steps": int(cfg["mix"]["steps"])}
        out["mix"] = c
    if "mopd" in cfg["routes"]:
        experts = experts or {d: str(run_dir / f"expert_{d}") for d in domains}
        teachers = ",".join(f"{d}={experts[d]}" for d in domains)
        train = dict(ex.get("train", {}))
        if int(cfg["mopd"]["steps"]):
            train["steps"] = int(cfg["mopd"]["steps"])
        if float(cfg["mopd"]["lr"]):
            train["lr"] = float(cfg["mopd"]["lr"])
        rollout = dict(ex.get("rollout", {}))
        # MOPD's loss is REINFORCE-style: one update per batch (the method refuses reuse)
        train.update(epochs=1, minibatches=1)
        rollout["staleness"] = 0
        out["mopd"] = {**base, "method": "fusion", "task": mixture, "run_dir": str(run_dir / "mopd"),
                       "rollout": rollout, "train": train,
                       "method_params": {"teachers": teachers, "mopd_horizon": cfg["mopd"]["horizon"]}}
    return out


@dataclass
class _Run:
    """One pipeline run in progress: its config, directory, console and report."""
    cfg: dict
    run_dir: Path
    console: Any
    report: dict

    @property
    def domains(self) -> list[str]:
        return list(self.cfg["domains"])

    def say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text, soft_wrap=True)

    def finished(self, stage: str, summary: dict) -> None:
        self.report["stages"][stage] = summary
        common.stage_finished(self.run_dir, stage)
        common.write_progress(self.run_dir, self.report)


def run(cfg: dict, *, console=None, overwrite: bool = False) -> dict:
    """The whole pipeline (see the module docstring); returns the report. Every value and
    the model are checked, and the run directory locked, before anything is written or
    deleted (`common.prepare_run_dir`)."""
    run_dir = Path(cfg["run_dir"])
    planned = run_configs(cfg, run_dir)
    for c in planned.values():  # every training stage's config is checked before any runs
        common.check_run_config(c)
    common.check_model(cfg["model"], cfg.get("_source", "config"))
    with common.locked(run_dir) as lock:
        if lock.stale and console is not None:
            console.print(f"policylab: {common.stale_note(run_dir, lock.stale)}", soft_wrap=True)
        common.prepare_run_dir(run_dir, list(planned) + ["merge"], overwrite=overwrite, pipeline="fusion")
        return _run_stages(cfg, run_dir, planned, console)


def _run_stages(cfg: dict, run_dir: Path, planned: dict, console) -> dict:
    from policylab.tasks.mixture import MixtureTask

    t0 = time.perf_counter()
    seed = int(cfg["seed"])
    domains, routes = list(cfg["domains"]), list(cfg["routes"])
    if cfg["threads"]:
        torch.set_num_threads(int(cfg["threads"]))
    t = cfg["task"]
    task = MixtureTask(domains, [1.0] * len(domains), seed=seed, ops=tuple(t["ops"]), digits=int(t["digits"]),
                       heldout_fraction=float(t["heldout_fraction"]), split_seed=int(t["split_seed"]))
    r = _Run(cfg, run_dir, console, {"pipeline": "fusion", "model": cfg["model"], "seed": seed, "domains": domains,
                                     "routes": routes, "task": dict(t), "stages": {}})
    experts = _train_experts(r, planned)
    models = {}
    if "merge" in routes:
        models["merge"] = _merge(r, experts)
    models.update(_train_routes(r, run_configs(cfg, run_dir, {d: str(p) for d, p in experts.items()})))
    r.say("[bold]fusion[/] per-domain evaluation")
    r.report["evaluation"] = _evaluation(r, task, experts, models)
    r.report["seconds"] = time.perf_counter() - t0
    md = report_markdown(r.report)
    common.write_report(run_dir, r.report, md)
    r.say(md)
    return r.report


def run_config_file(path, overrides=(), *, console=None, overwrite: bool = False) -> Path:
    """`policylab pipeline fusion PATH`: the config read and checked, the pipeline run;
    returns the run directory (its report.json and report.md)."""
    cfg = load_config(path, overrides)
    run(cfg, console=console, overwrite=overwrite)
    return Path(cfg["run_dir"])


def _train_experts(r: _Run, planned: dict) -> dict:
    """One RL expert per domain, from the base; returns domain -> its latest checkpoint."""
    experts = {}
    for d in r.domains:
        r.say(f"[bold]fusion[/] expert for {d}")
        t1 = time.perf_counter()
        experts[d] = common.train_run(planned[f"expert_{d}"])
        r.finished(f"expert_{d}", {"checkpoint": str(experts[d]), "method": planned[f"expert_{d}"]["method"],
                                   "seconds": time.perf_counter() - t1})
    return experts


def _merge(r: _Run, experts: dict) -> str:
    """The merge route: the experts' task vectors added to the base; returns its directory."""
    from policylab.models.loading import load_model_or_checkpoint as load_model
    from policylab.models.loading import load_policy

    r.say("[bold]fusion[/] merge (task vectors)")
    domains = r.domains
    base_m, base_tok = load_policy(r.cfg["model"])
    loaded = [load_model(str(experts[d])) for d in domains]
    check_vocabularies([base_tok] + [tk for _, tk, _ in loaded])
    alphas = [float(a) for a in r.cfg["merge"]["alphas"]] or [1.0 / len(domains)] * len(domains)
    merged = merge_task_vectors(base_m.state_dict(), [m.state_dict() for m, _, _ in loaded], alphas)
    base_m.load_state_dict(merged)
    where = str(common.save_model_dir(base_m, base_tok, r.run_dir / "merge"))
    r.report["stages"]["merge"] = {"alphas": dict(zip(domains, alphas)), "dir": where}
    common.stage_finished(r.run_dir, "merge")
    return where


def _train_routes(r: _Run, final: dict) -> dict:
    """The training routes asked for (Mix RL, MOPD); returns route -> latest checkpoint."""
    models = {}
    for route, what in (("mix", "Mix RL (pooled data)"), ("mopd", "MOPD (student samples, domain teachers)")):
        if route not in r.cfg["routes"]:
            continue
        r.say(f"[bold]fusion[/] {what}")
        t1 = time.perf_counter()
        models[route] = str(common.train_run(final[route]))
        summary = {"checkpoint": models[route], "method": final[route]["method"], "task": final[route]["task"],
                   "seconds": time.perf_counter() - t1}
        if route == "mopd":
            summary["teachers"] = final[route]["method_params"]["teachers"]
            summary["per_domain_log"] = _per_domain_log(r.run_dir / "mopd")
        r.finished(route, summary)
    return models


def _evaluation(r: _Run, task, experts: dict, models: dict) -> dict:
    """Every model (base, each expert, each route) on each domain's held-out split."""
    from policylab.models.loading import load_model_or_checkpoint as load_model
    from policylab.models.loading import load_policy

    e = r.cfg["eval"]
    kw = dict(prompts=int(e["prompts"]),
              how=common.Sampling(int(e["samples"]), int(e["max_new_tokens"]), int(r.cfg["seed"]) + 999))
    table = {}
    m, tok = load_policy(r.cfg["model"])
    table["base"] = domain_eval(m, tok, task, r.domains, **kw)
    for d in r.domains:
        m, tok, _ = load_model(str(experts[d]))
        table[f"expert_{d}"] = domain_eval(m, tok, task, r.domains, **kw)
    for route, where in models.items():
        m, tok, _ = load_model(where)
        table[route] = domain_eval(m, tok, task, r.domains, **kw)
    return table


def _per_domain_log(run: Path) -> dict:
    """The last logged per-domain metrics of a run (`...@domain=D` keys of metrics.jsonl)."""
    from policylab.trainer.runlog import read_metrics

    path = run / "metrics.jsonl"
    rows = [r for r in read_metrics(path) if any("@domain=" in k for k in r)] if path.is_file() else []
    return {k: v for k, v in rows[-1].items() if "@domain=" in k} if rows else {}


def report_markdown(r: dict) -> str:
    domains = r["domains"]
    ev = r["evaluation"]
    n = next(iter(ev.values()))[domains[0]]["n"]
    lines = [f"# fusion pipeline ({r['model']}, seed {r['seed']}, {r['seconds']:.0f} s)", "",
             f"Sampled accuracy (T = 1) on each domain's held-out split, {n} samples per domain (± binomial standard "
             "error); the mean over domains is shown next to the per-domain numbers, never instead of them.", "",
             "| model | " + " | ".join(domains) + " | mean over domains | worst domain |",
             "|---|" + "---|" * (len(domains) + 2)]
    for name, row in ev.items():
        cells = [f"{row[d]['accuracy']:.3f} ± {row[d]['stderr']:.3f}" for d in domains]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['mean_over_domains']:.3f} | "
                     f"{row['worst_domain']} |")
    st = r["stages"]
    if "merge" in st:
        lines += ["", "merge: α " + ", ".join(f"{d} {a:g}" for d, a in st["merge"]["alphas"].items())]
    if "mix" in st:
        lines += [f"Mix RL: {st['mix']['method']} on the mixture " +
                  ", ".join(f"{d} {m:g}" for d, m in zip(st['mix']['task']['domains'], st['mix']['task']['mix']))]
    if "mopd" in st:
        log = st["mopd"].get("per_domain_log", {})
        gaps = ", ".join(f"{k.split('=')[-1]} {v:.3f}" for k, v in sorted(log.items()) if k.startswith("mopd/"))
        lines += [f"MOPD: teachers {st['mopd']['teachers']}" + (f"; last logged teacher gap per domain: {gaps}"
                                                                if gaps else "")]
    return "\n".join(lines) + "\n"
