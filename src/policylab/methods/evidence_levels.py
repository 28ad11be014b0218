"""Generated from benchmarks/results/evidence.json by scripts/update_evidence_levels.py: do not edit.

The mechanism and capability levels the cards state (policylab.methods.evidence.levels).
"""

MECHANISM: dict[str, str] = {
    'cispo':
        'one seed so far, no claim: mean of `grad_norm` 5.568 vs 4.542 for the control (grpo), '
        'difference +1.03 over 1 seeds (benchmarks/results/evidence.md)',
    'conspo':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.5625 vs 0.1562 for the '
        'control (grpo), difference +0.406 over 1 seeds (benchmarks/results/evidence.md)',
    'dapo':
        'one seed so far, no claim: late-half mean of `policy/entropy` 1.849 vs 2.141 for the '
        'control (dapo with eps_high=0.2), difference -0.292 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'dr_grpo':
        'one seed so far, no claim: late-half mean of `response/length_mean` 11.84 vs 12.66 for the'
        ' control (grpo), difference -0.812 over 1 seeds (benchmarks/results/evidence.md)',
    'ggpo':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.3125 vs 0.1562 for the '
        'control (grpo), difference +0.156 over 1 seeds (benchmarks/results/evidence.md)',
    'gppo':
        'one seed so far, no claim: mean of `grad_norm` 5.908 vs 4.542 for the control (grpo), '
        'difference +1.37 over 1 seeds (benchmarks/results/evidence.md)',
    'gppo_fdiv':
        'one seed so far, no claim: mean of `policy/ratio/max` 1.265 vs 1.289 for the control '
        '(grpo), difference -0.0237 over 1 seeds (benchmarks/results/evidence.md)',
    'gprl':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.3125 vs 0.1562 for the '
        'control (grpo), difference +0.156 over 1 seeds (benchmarks/results/evidence.md)',
    'grpo_process':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.1562 vs 0.1562 for the '
        'control (grpo), difference +0 over 1 seeds (benchmarks/results/evidence.md)',
    'gspo':
        'one seed so far, no claim: mean of `policy/clip_frac` 0.3183 vs 0.02125 for the control '
        '(grpo), difference +0.297 over 1 seeds (benchmarks/results/evidence.md)',
    'reco':
        'one seed so far, no claim: late-half mean of `policy/entropy` 1.885 vs 1.465 for the '
        'control (grpo), difference +0.42 over 1 seeds (benchmarks/results/evidence.md)',
    'reinforce_pp':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.2812 vs 0.1562 for the '
        'control (grpo), difference +0.125 over 1 seeds (benchmarks/results/evidence.md)',
    'reinforce_pp_baseline':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.4062 vs 0.1562 for the '
        'control (grpo), difference +0.25 over 1 seeds (benchmarks/results/evidence.md)',
    'ripo':
        'one seed so far, no claim: mean of `policy/ratio/max` 1.265 vs 1.289 for the control '
        '(grpo), difference -0.0237 over 1 seeds (benchmarks/results/evidence.md)',
    'tapo':
        'one seed so far, no claim: mean of `policy/ratio/max` 1.237 vs 1.289 for the control '
        '(grpo), difference -0.0523 over 1 seeds (benchmarks/results/evidence.md)',
}

CAPABILITY_RUNS: dict[str, str] = {
    'cispo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 57.5% vs GRPO's "
        '47.5% on the same prompts, difference +10.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'conspo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 42.5% vs GRPO's "
        '47.5% on the same prompts, difference -5.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'dapo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 47.5% vs GRPO's "
        '47.5% on the same prompts, difference +0.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'dr_grpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 60.0% vs GRPO's "
        '47.5% on the same prompts, difference +12.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'ggpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 30.0% vs GRPO's "
        '47.5% on the same prompts, difference -17.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'gppo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 50.0% vs GRPO's "
        '47.5% on the same prompts, difference +2.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'gppo_fdiv':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 50.0% vs GRPO's "
        '47.5% on the same prompts, difference +2.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'gprl':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 52.5% vs GRPO's "
        '47.5% on the same prompts, difference +5.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'grpo_process':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 40.0% vs GRPO's "
        '47.5% on the same prompts, difference -7.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'gspo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 45.0% vs GRPO's "
        '47.5% on the same prompts, difference -2.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'reco':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 40.0% vs GRPO's "
        '47.5% on the same prompts, difference -7.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'reinforce_pp':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 45.0% vs GRPO's "
        '47.5% on the same prompts, difference -2.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'reinforce_pp_baseline':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 60.0% vs GRPO's "
        '47.5% on the same prompts, difference +12.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'ripo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 52.5% vs GRPO's "
        '47.5% on the same prompts, difference +5.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'tapo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 42.5% vs GRPO's "
        '47.5% on the same prompts, difference -5.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
}
