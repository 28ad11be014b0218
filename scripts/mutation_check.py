#!/usr/bin/env python3
"""Do the tests notice a wrong kernel, stage or guard? A curated mutation check.

Each mutation below replaces one exact piece of source text (it must occur exactly once
in its file) with a wrong version of the same behaviour and names the tests that must
then fail. The script copies the tree (src/, tests/, configs/, benchmarks/, pyproject)
to a temporary directory, runs the named tests once on the unmutated copy (they must
pass, or the check says nothing), then applies each mutation in turn, runs its tests
with the copy's src/ first on PYTHONPATH, and restores the file:

    killed     the tests failed on the mutated code (what we want)
    survived   the tests passed: no test notices that behaviour
    error      the tests could not run (pytest exit code other than 0 or 1); counted
               apart, never as a kill

Not part of `make test` (a full run takes ~20 minutes on 2 cores); run it niced after
changing a guarded area and commit its result:

    nice -n 10 .venv/bin/python scripts/mutation_check.py            # all, writes the result
    .venv/bin/python scripts/mutation_check.py --list                 # the mutations
    .venv/bin/python scripts/mutation_check.py --only ppo_clip_high,grin_gold_cap --out ''

The result goes to benchmarks/results/mutation_check.{json,md} (with the commit, the
date and the host's CPU features). The verl mutations run in the verl venv
(--verl-python, default .venv-verl/bin/python) and are reported as "skipped" when it is
missing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "mutation_check"
COPY = ("src", "tests", "configs", "benchmarks", "pyproject.toml")
K = "tests/test_mutation_kills.py::"


@dataclass(frozen=True)
class Mutation:
    id: str
    area: str  # kernel | stage | guard | adapter
    file: str  # relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]
    what: str
    python: str = "main"  # "main" or "verl"
    env: dict = field(default_factory=dict)


M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    # ------------------------------------------------------------------ kernels
    M("ppo_clip_high", "kernel", "src/policylab/kernels/objectives/ppo.py",
      "clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)",
      "clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_low)",
      ("tests/kernels/objectives/test_ppo.py", "tests/kernels/objectives/test_objective_fast_paths.py"),
      "PPO's upper clip bound uses eps_low (the plain path)"),
    M("ppo_min_to_max", "kernel", "src/policylab/kernels/objectives/ppo.py",
      "surrogate = torch.minimum(ratio * x.adv, clipped * x.adv)",
      "surrogate = torch.maximum(ratio * x.adv, clipped * x.adv)",
      ("tests/kernels/objectives/test_ppo.py", "tests/kernels/objectives/test_objective_fast_paths.py"),
      "PPO's pessimistic min becomes a max (the plain path)"),
    M("grpo_unbiased_is_population", "kernel", "src/policylab/kernels/advantages/group.py",
      'STD_DDOF = {"unbiased": 1, "population": 0}', 'STD_DDOF = {"unbiased": 0, "population": 0}',
      ("tests/kernels/advantages/test_grpo.py",), "the unbiased group std divides by n, not n − 1"),
    M("k3_sign", "kernel", "src/policylab/kernels/kl.py",
      "return torch.expm1(-d) + d", "return torch.expm1(-d) - d",
      ("tests/kernels/test_kl.py",), "the k3 KL estimator's linear term has the wrong sign"),
    M("tis_cap_loose", "kernel", "src/policylab/kernels/corrections/tis.py",
      "torch.clamp(log_k, max=math.log(cap))", "torch.clamp(log_k, max=math.log(cap) + 0.01)",
      ("tests/kernels/corrections/test_tis.py", "tests/kernels/corrections/test_correction_fast_paths.py"),
      "TIS truncates at 1.01·C instead of C (the plain path)"),
    M("conspo_empty_rows_negative", "kernel", "src/policylab/kernels/objectives/conspo.py",
      "pos, neg = positive & has, ~positive & has", "pos, neg = positive & has, ~positive",
      (K + "test_conspo_a_row_without_counted_tokens_is_not_a_negative",),
      "ConSPO counts rows with no counted token as negatives"),
    M("noise_band_exclusive", "kernel", "src/policylab/kernels/rewards/runtime.py",
      "if lo <= c <= hi:", "if lo < c < hi:",
      (K + "test_runtime_noise_band_is_inclusive_at_both_edges",),
      "the runtime noise band excludes its edges"),
    M("ttpo_conv_exclusive", "kernel", "src/policylab/kernels/testtime/ttpo.py",
      "distill_mask = mask & agree_rows.unsqueeze(-1) & (p <= tau_conv)",
      "distill_mask = mask & agree_rows.unsqueeze(-1) & (p < tau_conv)",
      (K + "test_ttpo_thresholds_keep_a_token_at_exactly_tau",),
      "TTPO drops a token at exactly τ_conv from the distillation set"),
    M("ttpo_err_exclusive", "kernel", "src/policylab/kernels/testtime/ttpo.py",
      "keep = p <= tau_err", "keep = p < tau_err",
      (K + "test_ttpo_thresholds_keep_a_token_at_exactly_tau",),
      "TTPO filters a dissenting token at exactly τ_err"),
    M("erils_kernel_pooled", "kernel", "src/policylab/kernels/mixed.py",
      "key = group.long() * 2 + external.long()", "key = group.long() * 2",
      (K + "test_erils_normalizes_within_each_source_of_a_group",),
      "ERILS's per-source key ignores the source"),
    # ------------------------------------------------------------------ stages
    M("conspo_row_scale_one", "stage", "src/policylab/methods/families/group_objectives.py",
      "scale = n_seq / max(int(pos.sum()), 1)", "scale = 1.0",
      (K + "test_conspo_loss_in_the_trainer_is_the_mean_over_positives",),
      "ConSPO's row scale N_seq/N_pos set to 1 (the loss is no longer a mean over positives)"),
    M("stare_surprisal_behavior", "stage", "src/policylab/methods/families/reweighting.py",
      'src = batch.logp_old if p.surprisal_source == "logp_old" else batch.logp_behavior',
      "src = batch.logp_behavior",
      ("tests/kernels/objectives/test_stare.py",),
      "STARE reads the behavior log-probs instead of π_old for the surprisal"),
    M("rlid_marginal_detached", "stage", "src/policylab/methods/families/turns_and_menus.py",
      "term = p.marginal_coef * coef * rho", "term = (p.marginal_coef * coef * rho).detach()",
      (K + "test_rlid_marginal_term_has_the_gradient_of_its_estimator",),
      "RLiD's label-marginal term detached (the regularizer has no gradient)"),
    M("rlid_one_token_refusal", "stage", "src/policylab/methods/families/turns_and_menus.py",
      "if batch.loss_mask.shape[1] != 1 or not bool(batch.loss_mask.all()):", "if False:",
      (K + "test_rlid_refuses_a_decision_that_is_not_exactly_one_counted_token",),
      "RLiD accepts decisions that are not exactly one counted token"),
    M("grin_gold_cap", "stage", "src/policylab/methods/families/hints_and_gold.py",
      "return max(0, min(G - 1, int(math.floor(a * G + 0.5))))", "return max(0, min(G, int(math.floor(a * G + 0.5))))",
      (K + "test_grin_leaves_at_least_one_own_sample_in_a_group",),
      "GRIN's gold cap G − 1 → G (a group of gold alone)"),
    M("graft_source_keeps_all", "stage", "src/policylab/methods/families/borrowed_rollouts.py",
      "keep = (c >= ctx.p.graft_min_compat).float()", "keep = torch.ones_like(c)",
      (K + "test_graft_source_marks_every_row_below_the_threshold_dropped",),
      "GRAFT keeps every imported row regardless of compatibility (source)"),
    M("graft_loss_ignores_keep", "stage", "src/policylab/methods/families/borrowed_rollouts.py",
      "return Weighting(weight=keep.to(inp.logp.dtype))", "return Weighting(weight=torch.ones_like(keep).to(inp.logp.dtype))",
      (K + "test_graft_rows_below_the_compatibility_threshold_get_no_gradient",),
      "GRAFT's loss ignores the compatibility gate"),
    M("erils_stage_pooled", "stage", "src/policylab/methods/families/borrowed_rollouts.py",
      "a = K.erils_advantages(r, batch.group, ext, std=ctx.p.std, eps=ctx.p.eps, per_source=True)",
      "a = K.erils_advantages(r, batch.group, ext, std=ctx.p.std, eps=ctx.p.eps, per_source=False)",
      (K + "test_erils_normalizes_within_each_source_of_a_group",
       "tests/methods/test_mixed_methods.py::test_erils_caps_external_rows_and_normalizes_per_source"),
      "ERILS pools the sources instead of normalizing per source"),
    M("exact_old_unchecked", "stage", "src/policylab/methods/stages/rounds.py",
      "    corr.require_exact_old(old, beh)\n", "    pass\n",
      (K + "test_missing_old_logits_refuses_old_log_probs_of_other_weights",),
      "missing_old_logits no longer checks that π_old is the trainer at the sampling version"),
    # ------------------------------------------------------------------ the update and its guards
    M("entropy_always_detached", "guard", "src/policylab/backends/update.py",
      'with_entropy = True if need_entropy else "detached"', 'with_entropy = "detached"',
      (K + "test_the_entropy_bonus_reaches_the_gradient",),
      "the training forward's entropy is always detached (entropy_coef, TASCO, Probe-ERPO get no gradient)"),
    M("no_counted_token_not_skipped", "guard", "src/policylab/backends/update.py",
      "if all(n == 0.0 for n in norms.values()):", "if False:",
      (K + "test_a_minibatch_without_a_counted_token_is_a_skipped_step",),
      "a minibatch without a counted token still steps the optimizer and schedule"),
    M("nonfinite_grad_not_skipped", "guard", "src/policylab/backends/update.py",
      "nonfinite = nonfinite or not math.isfinite(grad_norm)", "nonfinite = nonfinite",
      (K + "test_a_non_finite_gradient_skips_the_step_and_touches_nothing",),
      "a non-finite gradient is applied"),
    M("micro_batch_normalizer", "guard", "src/policylab/backends/update.py",
      "part = agg.aggregate(mat, mask, mode, normalizer=norms[name], L_norm=L)",
      "part = agg.aggregate(mat, mask, mode, L_norm=L)",
      ("tests/methods/test_same_update.py::test_update_does_not_depend_on_the_micro_batch_size[grpo]",
       "tests/methods/test_same_update.py::test_update_does_not_depend_on_the_micro_batch_size[dapo]"),
      "each micro-batch normalizes by its own token count (rule 4)"),
    M("checkpoint_unexpected_keys", "guard", "src/policylab/trainer/checkpoint.py",
      "if set(missing) - tied or unexpected:", "if set(missing) - tied:",
      (K + "test_a_checkpoint_with_an_unexpected_key_is_refused",),
      "a checkpoint with weights the model does not have is accepted"),
    M("checkpoint_step_link", "guard", "src/policylab/trainer/checkpoint.py",
      "if path.is_symlink() or (path.exists() and path.resolve().parent != root.resolve()):",
      "if path.exists() and path.resolve().parent != root.resolve():",
      (K + "test_a_checkpoint_reached_through_a_link_is_refused",),
      "a step directory that is a link (to another step of the run) is followed"),
    M("checkpoint_file_link", "guard", "src/policylab/trainer/checkpoint.py",
      "        if f.is_symlink():\n            raise CheckpointError(f\"{f} is a link; a checkpoint file must be a plain file\")\n",
      "",
      (K + "test_a_checkpoint_reached_through_a_link_is_refused",),
      "a checkpoint file that is a link is read"),
    M("sandbox_wall_clock_4x", "guard", "src/policylab/sandbox/runner.py",
      "proc.wait(timeout=float(lim.wall_seconds))", "proc.wait(timeout=4 * float(lim.wall_seconds))",
      ("tests/sandbox/test_sandbox.py::test_sleeping_past_the_wall_clock_limit_is_stopped_there",),
      "the sandbox's wall-clock limit is 4× longer than configured"),
    M("eval_seed_changed", "guard", "src/policylab/trainer/loop.py",
      "seed=self.cfg.seed + 999)", "seed=self.cfg.seed + 998)",
      ("tests/eval/test_eval_fingerprint.py::test_eval_stream_is_the_recorded_one_on_this_host",),
      "the held-out evaluation draws another stream for the same seed (the README's figures would be stale)"),
    # ------------------------------------------------------------------ engine adapters
    M("trl_liger_accepted", "adapter", "src/policylab/integrations/trl.py",
      'if getattr(cfg, "use_liger_kernel", False):', "if False:",
      ("tests/integrations/test_trl.py::test_methods_trl_cannot_host_are_refused_naming_the_missing_role",),
      "TRL's use_liger_kernel (which skips the replaced loss) is accepted"),
    M("verl_token_adv_collapsed", "adapter", "src/policylab/integrations/verl.py",
      "return row if bool(same) else adv", "return row",
      ("tests/integrations/test_verl.py::test_token_level_advantages_reach_the_loss_unchanged",),
      "the verl adapter collapses token-level advantages to one value per row", python="verl"),
)


def cpu_features() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return platform.machine()
    have = set(flags.split(":", 1)[1].split())
    keep = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx_vnni")
    return " ".join(f for f in keep if f in have) or "no AVX2"


def copy_tree(dst: Path) -> None:
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "results"))
        else:
            shutil.copy2(src, dst / name)
    (dst / "benchmarks" / "results").mkdir(exist_ok=True)


def run_tests(tree: Path, tests, python: str, env_extra: dict, timeout: float) -> tuple[int, float, str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "PYTHONDONTWRITEBYTECODE": "1", **env_extra}
    cmd = [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=", *tests]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, time.perf_counter() - t0, "timeout"
    tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-3:])
    return out.returncode, time.perf_counter() - t0, tail


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated mutation ids")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("--verl-python", default=str(ROOT / ".venv-verl" / "bin" / "python"))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per test run")
    ap.add_argument("--out", default=str(RESULTS), help="result path without suffix ('' = print only)")
    ap.add_argument("--update", action="store_true",
                    help="replace only the re-run mutations' rows in the existing result (each row keeps its commit)")
    a = ap.parse_args(argv)
    if a.list:
        for m in MUTATIONS:
            print(f"{m.id:32s} {m.area:8s} {m.what}")
        return 0
    chosen = [m for m in MUTATIONS if not a.only or m.id in a.only.split(",")]
    unknown = set(filter(None, a.only.split(","))) - {m.id for m in MUTATIONS}
    if unknown:
        raise SystemExit(f"unknown mutation ids: {', '.join(sorted(unknown))}")
    pythons = {"main": a.python, "verl": a.verl_python}
    for m in chosen:  # every mutation applies to the current source exactly once
        text = (ROOT / m.file).read_text()
        if text.count(m.old) != 1:
            raise SystemExit(f"{m.id}: the text to mutate occurs {text.count(m.old)} times in {m.file}")
    results, commit = [], _commit()  # the tree as copied now
    with tempfile.TemporaryDirectory(prefix="policylab-mutation-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        baseline = {}
        for kind in ("main", "verl"):
            tests = sorted({t for m in chosen if m.python == kind for t in m.tests})
            if not tests:
                continue
            if not Path(pythons[kind]).exists():
                baseline[kind] = "missing"
                print(f"[baseline {kind}] {pythons[kind]} missing: its mutations are skipped", flush=True)
                continue
            rc, secs, tail = run_tests(tree, tests, pythons[kind], {}, a.timeout * 2)
            print(f"[baseline {kind}] rc={rc} {secs:.0f}s  {tail.splitlines()[-1] if tail else ''}", flush=True)
            if rc != 0:
                raise SystemExit(f"the named tests fail on the unmutated tree ({kind}):\n{tail}")
            baseline[kind] = "pass"
        for m in chosen:
            if baseline.get(m.python) == "missing":
                results.append({**_row(m), "status": "skipped", "seconds": 0.0, "commit": commit,
                                "detail": f"{m.python} venv missing"})
                continue
            f = tree / m.file
            original = f.read_text()
            f.write_text(original.replace(m.old, m.new, 1))
            try:
                rc, secs, tail = run_tests(tree, list(m.tests), pythons[m.python], m.env, a.timeout)
            finally:
                f.write_text(original)
            status = {0: "survived", 1: "killed"}.get(rc, "error")
            results.append({**_row(m), "status": status, "seconds": round(secs, 1), "commit": commit,
                            "detail": tail.splitlines()[-1] if tail else ""})
            print(f"{status:9s} {m.id:32s} {secs:5.0f}s", flush=True)
    if a.update and a.out and Path(a.out).with_suffix(".json").exists():
        old = json.loads(Path(a.out).with_suffix(".json").read_text())
        fresh = {r["id"]: r for r in results}
        order = [m.id for m in MUTATIONS]
        kept = [{"commit": old["commit"], **r} for r in old["mutations"] if r["id"] not in fresh and r["id"] in order]
        results = sorted(kept + results, key=lambda r: order.index(r["id"]))
        commit = f"{old['commit']} (rows re-run at {commit} say so)"
    summary = {s: sum(r["status"] == s for r in results) for s in ("killed", "survived", "error", "skipped")}
    report = {"commit": commit, "date": time.strftime("%Y-%m-%d"), "host_cpu_features": cpu_features(),
              "python": platform.python_version(), "summary": summary, "mutations": results}
    print(json.dumps(summary))
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        out.with_suffix(".md").write_text(_markdown(report))
        print(f"wrote {out.with_suffix('.json')} and .md")
    return 0 if summary["survived"] == 0 and summary["error"] == 0 else 1


def _row(m: Mutation) -> dict:
    return {"id": m.id, "area": m.area, "file": m.file, "what": m.what, "tests": list(m.tests), "python": m.python}


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "tests"], cwd=ROOT, capture_output=True,
                               text=True).stdout
        return sha.strip() + (" (with uncommitted changes)" if dirty.strip() else "")
    except OSError:
        return "unknown"


def _markdown(r: dict) -> str:
    s = r["summary"]
    lines = ["# Mutation check (scripts/mutation_check.py)", "",
             f"Commit {r['commit']}, {r['date']}, CPU features: {r['host_cpu_features']}, Python {r['python']}.", "",
             f"**{s['killed']} killed, {s['survived']} survived, {s['error']} errors, {s['skipped']} skipped** "
             f"of {len(r['mutations'])} mutations.", "",
             "`kills::` is tests/test_mutation_kills.py.", "",
             "| mutation | area | status | what | tests that must fail | commit |", "|---|---|---|---|---|---|"]
    for m in r["mutations"]:
        tests = "<br>".join(t.replace("tests/test_mutation_kills.py::", "kills::") for t in m["tests"])
        lines.append(f"| `{m['id']}` | {m['area']} | {m['status']} | {m['what']} | {tests} | {m.get('commit', '')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
