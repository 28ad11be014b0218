"""Fusion paradigms across task domains: `policylab pipeline fusion CONFIG`.

"Consolidating RLVR Capabilities Across Domains: A Deep Dive into Fusion Paradigms"
(title as given; id **unconfirmed**). From one base model, a domain expert is RL-trained
per domain (GRPO by default), then three routes combine the domains:

    merge   task-vector arithmetic θ = θ_base + Σ_k α_k (θ_k − θ_base) over checkpoints of
            identical layout and vocabulary (`merge_task_vectors`; a mismatch is refused)
    mix     Mix RL: the ordinary RL recipe on the pooled data of the domains
            (task `mixture`, `tasks.mixture`)
    mopd    multi-teacher on-policy distillation: the student samples on pooled prompts and
            each token's signal comes from the teacher of its prompt's domain (method
            `fusion`, `methods.pipelines`)

Every model (base, each expert, each route) is evaluated on each domain's held-out split;
the report is a table per domain (the average is shown next to it, never alone).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..errors import PolicylabError, ShapeError
from . import common

TOP = {"run_dir": "runs/fusion", "model": "embedded", "seed": 0, "threads": 0}
SECTIONS = {
    "domains": None,  # replaced below: a list
    "experts": None,  # a run config's sections (rollout, train, method_params, ...); method grpo by default
    "merge": {"alphas": []},
    "mix": {"mix": [], "steps": 0},
    "mopd": {"steps": 0, "lr": 0.0},
    "routes": None,
    "eval": {"prompts": 40, "samples": 1, "max_new_tokens": 12},
}


def merge_task_vectors(base: dict, experts: list[dict], alphas: list[float]) -> dict:
    """θ = θ_base + Σ_k α_k·(θ_k − θ_base), tensor by tensor (in float64, cast back).

    Every state dict must have the base's keys, shapes and dtypes (identical layout; the
    embedding shapes carry the vocabulary size, so another vocabulary is refused here too).
    One expert with α = 1 returns that expert; all α = 0 returns the base."""
    if not experts or len(alphas) != len(experts):
        raise PolicylabError(f"merge needs one α per expert: {len(alphas)} alphas for {len(experts)} experts")
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


def domain_eval(model, tokenizer, task, domains, *, prompts: int, samples: int, max_new_tokens: int, seed: int) -> dict:
    """Sampled accuracy on each domain's held-out split (and their mean, reported next to them)."""
    from ..evaluate import evaluate
    from ..rewards.verifiers import exact_numeric_reward

    encode = common.chat_encoder(tokenizer)
    engine = common.engine_for(model, tokenizer)
    model.eval()
    out = {}
    for d in domains:
        exs = task.heldout_of(d, prompts)
        res = evaluate(engine, [encode(e.prompt) for e in exs], [e.answer for e in exs], exact_numeric_reward,
                       samples=samples, max_new_tokens=max_new_tokens, seed=seed)
        out[d] = {"accuracy": res["accuracy"], "stderr": res["accuracy_stderr"], "n": prompts * samples}
    out["mean_over_domains"] = sum(out[d]["accuracy"] for d in domains) / len(domains)
    return out


def run(cfg: dict, *, console=None, overwrite: bool = False) -> dict:
    from ..mixedpolicy.state import load_model
    from ..models import load_policy
    from ..tasks.mixture import DOMAINS, MixtureTask

    t0 = time.perf_counter()
    run_dir = Path(cfg["run_dir"])
    common.prepare_run_dir(run_dir, overwrite=overwrite)
    if cfg["threads"]:
        torch.set_num_threads(int(cfg["threads"]))
    seed = int(cfg["seed"])
    domains = list(cfg["domains"] or DOMAINS)
    routes = list(cfg["routes"] or ["merge", "mix", "mopd"])
    bad = sorted(set(routes) - {"merge", "mix", "mopd"})
    if bad:
        raise PolicylabError(f"unknown fusion routes {bad}; routes are merge, mix, mopd")
    task = MixtureTask(domains, [1.0] * len(domains), seed=seed)
    ex_cfg = dict(cfg["experts"])
    base_run = {"seed": seed, "threads": int(cfg["threads"]), "eval": {"n": 0},
                "log": {"tensorboard": False, "progress": False}}

    def run_cfg(name: str, task_cfg: dict, **over) -> dict:
        sections = {k: v for k, v in ex_cfg.items() if k in ("rollout", "train", "method_params")}
        c = {**base_run, "method": ex_cfg.get("method", "grpo"), "model": cfg["model"],
             "run_dir": str(run_dir / name), "task": task_cfg, **sections}
        for k, v in over.items():
            c[k] = {**c.get(k, {}), **v} if isinstance(v, dict) and isinstance(c.get(k), dict) else v
        return c

    report: dict = {"pipeline": "fusion", "model": cfg["model"], "seed": seed, "domains": domains, "routes": routes,
                    "stages": {}}
    say = (lambda s: console.print(s)) if console is not None else (lambda s: None)
    experts = {}
    for d in domains:  # one RL expert per domain, from the base
        say(f"[bold]fusion[/] expert for {d}")
        t = time.perf_counter()
        experts[d] = common.train_run(run_cfg(f"expert_{d}", {"name": d}))
        report["stages"][f"expert_{d}"] = {"checkpoint": str(experts[d]), "seconds": time.perf_counter() - t}
    models = {}
    if "merge" in routes:
        say("[bold]fusion[/] merge (task vectors)")
        base_m, base_tok = load_policy(cfg["model"])
        loaded = [load_model(str(experts[d])) for d in domains]
        check_vocabularies([base_tok] + [tk for _, tk, _ in loaded])
        alphas = list(cfg["merge"]["alphas"]) or [1.0 / len(domains)] * len(domains)
        merged = merge_task_vectors(base_m.state_dict(), [m.state_dict() for m, _, _ in loaded], alphas)
        base_m.load_state_dict(merged)
        models["merge"] = str(common.save_model_dir(base_m, base_tok, run_dir / "merge"))
        report["stages"]["merge"] = {"alphas": alphas, "dir": models["merge"]}
        del loaded, merged
    mix = list(cfg["mix"]["mix"]) or [1.0] * len(domains)
    mixture = {"name": "mixture", "domains": domains, "mix": mix}
    if "mix" in routes:
        say("[bold]fusion[/] Mix RL (pooled data)")
        t = time.perf_counter()
        steps = int(cfg["mix"]["steps"]) or None
        over = {"train": {"steps": steps}} if steps else {}
        models["mix"] = str(common.train_run(run_cfg("mix", mixture, **over)))
        report["stages"]["mix"] = {"checkpoint": models["mix"], "mix": mix, "seconds": time.perf_counter() - t}
    if "mopd" in routes:
        say("[bold]fusion[/] MOPD (student samples, domain teachers)")
        t = time.perf_counter()
        teachers = ",".join(f"{d}={experts[d]}" for d in domains)
        over = {"method": "fusion", "method_params": {"teachers": teachers}}
        if int(cfg["mopd"]["steps"]):
            over["train"] = {"steps": int(cfg["mopd"]["steps"])}
        if float(cfg["mopd"]["lr"]):
            over["train"] = {**over.get("train", {}), "lr": float(cfg["mopd"]["lr"])}
        c = run_cfg("mopd", mixture, **over)
        c["method_params"] = {"teachers": teachers}  # MOPD takes no GRPO parameter
        models["mopd"] = str(common.train_run(c))
        report["stages"]["mopd"] = {"checkpoint": models["mopd"], "teachers": teachers,
                                    "seconds": time.perf_counter() - t}
    say("[bold]fusion[/] per-domain evaluation")
    e = cfg["eval"]
    kw = dict(prompts=int(e["prompts"]), samples=int(e["samples"]), max_new_tokens=int(e["max_new_tokens"]),
              seed=seed + 999)
    table = {}
    m, tok = load_policy(cfg["model"])
    table["base"] = domain_eval(m, tok, task, domains, **kw)
    for d in domains:
        m, tok, _ = load_model(str(experts[d]))
        table[f"expert_{d}"] = domain_eval(m, tok, task, domains, **kw)
    for route, where in models.items():
        m, tok, _ = load_model(where) if route != "merge" else load_policy(where)[:2] + ("merge",)
        table[route] = domain_eval(m, tok, task, domains, **kw)
    report["evaluation"] = table
    report["seconds"] = time.perf_counter() - t0
    md = report_markdown(report)
    common.write_report(run_dir, report, md)
    say(md)
    return report


def report_markdown(r: dict) -> str:
    domains = r["domains"]
    ev = r["evaluation"]
    n = next(iter(ev.values()))[domains[0]]["n"]
    lines = [f"# fusion pipeline ({r['model']}, seed {r['seed']}, {r['seconds']:.0f} s)", "",
             f"Sampled accuracy (T = 1) on each domain's held-out split, {n} samples per domain; the mean over domains "
             "is shown next to the per-domain numbers, never instead of them.", "",
             "| model | " + " | ".join(domains) + " | mean over domains |",
             "|---|" + "---|" * (len(domains) + 1)]
    for name, row in ev.items():
        cells = [f"{row[d]['accuracy']:.3f} ± {row[d]['stderr']:.3f}" for d in domains]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['mean_over_domains']:.3f} |")
    return "\n".join(lines) + "\n"
