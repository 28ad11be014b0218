"""`policylab compare CONFIG`: several methods (and seeds) on one model, task and budget,
one run directory each, then one report.

A compare config is YAML:

    out_dir: runs/compare-chain-sum     # runs/<label>-seed<s>/ per run, and the report
    report_dir: benchmarks/results/compare_chain_sum  # optional: the report goes here instead
    methods:                            # names, or {name, label, method_params}
      - grpo
      - dr_grpo
      - {name: dapo, label: dapo-nofilter, method_params: {dynamic_sampling: false}}
    seeds: [0, 1]
    budget: {steps: 40}                 # or {seconds: 300} or {tokens: 400000}; + max_steps (cap)
    target_accuracy: 0.3                # "time to target": first evaluation at or above it
    keep_checkpoints: true              # false: a finished run's checkpoints are deleted (the
                                        # report needs only report.json and metrics.jsonl)
    common_method_params: {kl_coef: 0.0}  # given to every method that declares the parameter
    run:                                # the run config every run shares (policylab train's sections)
      model: embedded
      task: {name: arithmetic, digits: 2}
      rollout: {prompts_per_step: 4, group_size: 8, max_new_tokens: 16}
      train: {lr: 1.0e-5}
      eval: {n: 200, every: 10}

Budgets. `steps`: every run takes that many rollout steps, each with train.epochs x
train.minibatches optimizer steps (the same for every run: a method entry can set only
its method's parameters), so the optimizer steps are equal. `seconds`: every run trains
until its training wall-clock (evaluations excluded) reaches the budget
(train.budget_seconds). `tokens`: until it has sampled that many response tokens for
training, refills included (train.budget_tokens). A run checks the budget after each step,
so it can overshoot by less than one step; the report gives what each run used.

Same prompts: every run of seed s draws the task's training stream of seed s, which is a
function of the stream position only, so the k-th prompt is the same for every method
(a method that refills, e.g. DAPO's dynamic sampling, draws further along the same
stream). The report checks it from the prompts each run recorded.

Resumable: a run whose report is complete is skipped; an interrupted run resumes from its
last checkpoint (`policylab resume` machinery, so the resumed run equals the uninterrupted
one); a run interrupted before its first checkpoint starts again. A run directory made
with another config is refused before anything runs.

Before any run starts, every problem is reported at once: unknown methods or parameters,
labels that collide, a method the task cannot feed (a field its stages read that nothing
produces, or a judge that needs numeric gold answers on a task without them: derived from
the method's stage specs), budgets that are not comparable, and a task whose base accuracy
cannot be measured (no held-out split, eval.n < 1, a verifier that fails on or rejects
the reference answers).

The report (compare.{json,md} and curves.png in report_dir, default out_dir; the run
directories hold checkpoints, the report directory only the report): held-out accuracy ± standard
error at each evaluation, time to the target accuracy, sampled tokens per training
second, peak memory, clip and correction diagnostics, the difference of each method's
final accuracy from the first method's, and the learning curves of all methods.

The modules, in the order a comparison uses them:

    plan.py      the checked config: method entries, budget, one planned run per method x seed
    loading.py   reading a compare config into a Plan (every problem in one ConfigError)
    budget.py    the steps / seconds / tokens budget and what a method cannot spend of it
    checks.py    can the task be evaluated and feed every method (from the stage specs)
    states.py    each run directory's state (new, done, resume, restart) or a refusal
    running.py   running the unfinished runs under one progress display
    results.py   one finished run read back from report.json and metrics.jsonl
    stats.py     means over seeds, standard errors, time to target, same-prompts check
    report.py    compare.json; markdown.py compare.md; figure.py curves.png
"""

from __future__ import annotations

from pathlib import Path

from policylab.experiments.compare.checks import feed_problems
from policylab.experiments.compare.loading import TOP_KEYS, load_plan, plan_from_dict
from policylab.experiments.compare.markdown import to_markdown
from policylab.experiments.compare.plan import BUDGET_KINDS, Entry, Plan, PlannedRun, describe_plan
from policylab.experiments.compare.report import build_report, write_report
from policylab.experiments.compare.running import run_plan
from policylab.experiments.compare.stats import same_prompts


def compare(config: str | Path | Plan, *, report_only: bool = False, plan_only: bool = False, console=None) -> dict:
    """The `policylab compare` command (see the module doc): `config` is a compare config
    file or a plan already loaded from one."""
    plan = config if isinstance(config, Plan) else load_plan(config)
    if plan_only:
        print(describe_plan(plan))
        for r in plan.runs:
            print(f"  {r.state:8s} {r.run_dir}")
        return {}
    if report_only:
        report = write_report(plan)
        print(f"report: {plan.report_to / 'compare.md'} ({report['runs_finished']} of {report['runs_planned']} runs)")
        return report
    return run_plan(plan, console=console)


__all__ = ["compare", "load_plan", "plan_from_dict", "feed_problems", "build_report", "write_report", "same_prompts",
           "describe_plan", "run_plan", "to_markdown", "Plan", "PlannedRun", "Entry", "TOP_KEYS", "BUDGET_KINDS"]
