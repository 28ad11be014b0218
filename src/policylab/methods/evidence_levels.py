"""Generated from benchmarks/results/evidence.json by scripts/update_evidence_levels.py: do not edit.

The mechanism and capability levels the cards state (policylab.methods.evidence.levels).
"""

MECHANISM: dict[str, str] = {
    'code_opt':
        "refused on its task: the task's base accuracy cannot be measured "
        '(benchmarks/results/evidence.md)',
    'gspo':
        'one seed so far, no claim: mean of `policy/clip_frac` 0.342 vs 0.01986 for the control '
        '(grpo), difference +0.322 over 1 seeds (benchmarks/results/evidence.md)',
    'mad_rl':
        "refused on its task: the task's base accuracy cannot be measured "
        '(benchmarks/results/evidence.md)',
    'tis':
        'one seed so far, no claim: mean of `correction/tis/ess` 0.6932 vs 0.4835 for the control '
        '(tis with tis_cap=1000000.0), difference +0.21 over 1 seeds '
        '(benchmarks/results/evidence.md)',
}

CAPABILITY_RUNS: dict[str, str] = {
}
