"""Generated from benchmarks/results/evidence.json by scripts/update_evidence_levels.py: do not edit.

The mechanism and capability levels the cards state (policylab.methods.evidence.levels).
"""

MECHANISM: dict[str, str] = {
    'cispo':
        'one seed so far, no claim: mean of `grad_norm` 5.568 vs 4.542 for the control (grpo), '
        'difference +1.03 over 1 seeds (benchmarks/results/evidence.md)',
    'code_opt':
        'one seed so far, no claim: late-half mean of `code/speed_mean` 0 vs 0 for the control '
        '(code_opt with speed_weight=0.0), difference +0 over 1 seeds '
        '(benchmarks/results/evidence.md)',
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
    'erils':
        'one seed so far, no claim: mean of `groups/zero_spread_frac` 0.625 vs 0.375 for the '
        'control (grpo), difference +0.25 over 1 seeds (benchmarks/results/evidence.md)',
    'erpo':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.375 vs 0.1562 for the control'
        ' (grpo), difference +0.219 over 1 seeds (benchmarks/results/evidence.md)',
    'ggpo':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.3125 vs 0.1562 for the '
        'control (grpo), difference +0.156 over 1 seeds (benchmarks/results/evidence.md)',
    'gmc':
        'one seed so far, no claim: mean of `grad_norm` 4.425 vs 4.004 for the control (grpo), '
        'difference +0.421 over 1 seeds (benchmarks/results/evidence.md)',
    'gppo':
        'one seed so far, no claim: mean of `grad_norm` 5.908 vs 4.542 for the control (grpo), '
        'difference +1.37 over 1 seeds (benchmarks/results/evidence.md)',
    'gppo_fdiv':
        'one seed so far, no claim: mean of `policy/ratio/max` 1.265 vs 1.289 for the control '
        '(grpo), difference -0.0237 over 1 seeds (benchmarks/results/evidence.md)',
    'gprl':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.3125 vs 0.1562 for the '
        'control (grpo), difference +0.156 over 1 seeds (benchmarks/results/evidence.md)',
    'graft':
        'one seed so far, no claim: mean of `groups/zero_spread_frac` 0.25 vs 0.375 for the control'
        ' (grpo), difference -0.125 over 1 seeds (benchmarks/results/evidence.md)',
    'grin':
        'one seed so far, no claim: mean of `groups/zero_spread_frac` 0 vs 0.375 for the control '
        '(grpo), difference -0.375 over 1 seeds (benchmarks/results/evidence.md)',
    'grpo':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.1562 vs 0.1562 for the '
        'control (grpo and train.lr=0.0), difference +0 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'grpo_process':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.1562 vs 0.1562 for the '
        'control (grpo), difference +0 over 1 seeds (benchmarks/results/evidence.md)',
    'gspo':
        'one seed so far, no claim: mean of `policy/clip_frac` 0.3183 vs 0.02125 for the control '
        '(grpo), difference +0.297 over 1 seeds (benchmarks/results/evidence.md)',
    'icepop':
        'one seed so far, no claim: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` '
        '0.9506 vs 0.8925 for the control (grpo), difference +0.058 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'kpop':
        'one seed so far, no claim: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` '
        '0.9773 vs 0.8925 for the control (grpo), difference +0.0847 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'luffy':
        'one seed so far, no claim: late-half mean of `policy/luffy/demo_token_prob_mean` 0.2737 vs'
        ' 0.2675 for the control (luffy with luffy_gamma=1.0), difference +0.00613 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'luspo':
        'one seed so far, no claim: late-half mean of `response/length_mean` 14.38 vs 12.59 for the'
        ' control (gspo), difference +1.78 over 1 seeds (benchmarks/results/evidence.md)',
    'mad_rl':
        'one seed so far, no claim: late-half mean of `distribution/tv_mean` 0.7797 vs 0.7797 for '
        'the control (mad_rl with match_coef=0.0), difference +0 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'minirl':
        'one seed so far, no claim: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` '
        '0.9927 vs 0.8925 for the control (grpo), difference +0.1 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'mis':
        'one seed so far, no claim: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` '
        '0.9258 vs 0.8925 for the control (grpo), difference +0.0333 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'missing_old_logits':
        'one seed so far, no claim: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` '
        '0.9661 vs 0.9661 for the control (grpo), difference +0 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'moer':
        'one seed so far, no claim: mean of `groups/zero_spread_frac` 0.0625 vs 0.375 for the '
        'control (grpo), difference -0.312 over 1 seeds (benchmarks/results/evidence.md)',
    'off_context_grpo':
        'one seed so far, no claim: mean of `groups/zero_spread_frac` 0.5625 vs 0.375 for the '
        'control (off_context_grpo with hint_kind=none), difference +0.188 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'online_icepop':
        'one seed so far, no claim: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` '
        '1.039 vs 1.023 for the control (grpo), difference +0.0164 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'probe_erpo':
        'one seed so far, no claim: final value of `eval/accuracy` 0.3 vs 0.15 for the control '
        '(probe_erpo and train.lr=0.0), difference +0.15 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'range_grpo':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.1875 vs 0.4062 for the '
        'control (dr_grpo), difference -0.219 over 1 seeds (benchmarks/results/evidence.md)',
    'reco':
        'one seed so far, no claim: late-half mean of `policy/entropy` 1.885 vs 1.465 for the '
        'control (grpo), difference +0.42 over 1 seeds (benchmarks/results/evidence.md)',
    'reinforce_pp':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.2812 vs 0.1562 for the '
        'control (grpo), difference +0.125 over 1 seeds (benchmarks/results/evidence.md)',
    'reinforce_pp_baseline':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.4062 vs 0.1562 for the '
        'control (grpo), difference +0.25 over 1 seeds (benchmarks/results/evidence.md)',
    'remax':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.1562 vs 0.1875 for the '
        'control (grpo), difference -0.0312 over 1 seeds (benchmarks/results/evidence.md)',
    'ripo':
        'one seed so far, no claim: mean of `policy/ratio/max` 1.265 vs 1.289 for the control '
        '(grpo), difference -0.0237 over 1 seeds (benchmarks/results/evidence.md)',
    'rlcpr':
        'one seed so far, no claim: late-half mean of `response/length_mean` 12.5 vs 12.66 for the '
        'control (rlcpr with length_coef=0.0), difference -0.156 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'rlcr':
        'one seed so far, no claim: final value of `eval/confidence/brier` 0.1401 vs 0.1664 for the'
        ' control (grpo), difference -0.0263 over 1 seeds (benchmarks/results/evidence.md)',
    'rlid':
        'one seed so far, no claim: late-half mean of `rlid/label_marginal_kl` 0.281 vs 0.284 for '
        'the control (rlid with marginal_coef=0.0), difference -0.003 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'rloo':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.2812 vs 0.1875 for the '
        'control (grpo), difference +0.0938 over 1 seeds (benchmarks/results/evidence.md)',
    'sis':
        'one seed so far, no claim: mean of `policy/clip_frac` 0.006191 vs 0.0358 for the control '
        '(grpo), difference -0.0296 over 1 seeds (benchmarks/results/evidence.md)',
    'stare':
        'one seed so far, no claim: late-half mean of `policy/entropy` 1.51 vs 1.51 for the control'
        ' (stare with stare_amplify=1.0), difference +0 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'tapo':
        'one seed so far, no claim: mean of `policy/ratio/max` 1.237 vs 1.289 for the control '
        '(grpo), difference -0.0523 over 1 seeds (benchmarks/results/evidence.md)',
    'tasco':
        'one seed so far, no claim: late-half mean of `policy/entropy` 2.081 vs 2.082 for the '
        'control (tasco and train.lr=0.0), difference -0.00141 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'tis':
        'one seed so far, no claim: mean of `correction/tis/ess` 0.6628 vs 0.4018 for the control '
        '(tis with tis_cap=1000000.0), difference +0.261 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'tlm_dre':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.0625 vs 0 for the control '
        '(grpo), difference +0.0625 over 1 seeds (benchmarks/results/evidence.md)',
    'ttpo':
        'one seed so far, no claim: final value of `eval/accuracy` 0.15 vs 0.15 for the control '
        '(ttpo and train.lr=0.0), difference +0 over 1 seeds (benchmarks/results/evidence.md)',
    'ttrl':
        'one seed so far, no claim: late-half mean of `accuracy` 0.4375 vs 0.1875 for the control '
        '(ttrl and train.lr=0.0), difference +0.25 over 1 seeds (benchmarks/results/evidence.md)',
    'zcpo':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.2188 vs 0.1562 for the '
        'control (grpo), difference +0.0625 over 1 seeds (benchmarks/results/evidence.md)',
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
    'erils':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 12.5% vs GRPO's "
        '47.5% on the same prompts, difference -35.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'erpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 47.5% vs GRPO's "
        '47.5% on the same prompts, difference +0.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'ggpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 30.0% vs GRPO's "
        '47.5% on the same prompts, difference -17.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'gmc':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 30.0% vs GRPO's "
        '42.5% on the same prompts, difference -12.5%; one seed so far, no claim '
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
    'graft':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 47.5% vs GRPO's "
        '47.5% on the same prompts, difference +0.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'grin':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 57.5% vs GRPO's "
        '47.5% on the same prompts, difference +10.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'grpo_process':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 40.0% vs GRPO's "
        '47.5% on the same prompts, difference -7.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'gspo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 45.0% vs GRPO's "
        '47.5% on the same prompts, difference -2.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'icepop':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 17.5% vs GRPO's "
        '12.5% on the same prompts, difference +5.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'kpop':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 7.5% vs GRPO's 12.5%"
        ' on the same prompts, difference -5.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'luffy':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 47.5% vs GRPO's "
        '47.5% on the same prompts, difference +0.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'luspo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 40.0% vs GRPO's "
        '47.5% on the same prompts, difference -7.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'minirl':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 15.0% vs GRPO's "
        '12.5% on the same prompts, difference +2.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'mis':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 12.5% vs GRPO's "
        '12.5% on the same prompts, difference +0.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'missing_old_logits':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 7.5% vs GRPO's 7.5% "
        'on the same prompts, difference +0.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'moer':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 25.0% vs GRPO's "
        '47.5% on the same prompts, difference -22.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'off_context_grpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 17.5% vs GRPO's "
        '47.5% on the same prompts, difference -30.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'online_icepop':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 10.0% vs GRPO's 7.5%"
        ' on the same prompts, difference +2.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'probe_erpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 30.0% vs GRPO's "
        '47.5% on the same prompts, difference -17.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'range_grpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 35.0% vs GRPO's "
        '47.5% on the same prompts, difference -12.5%; one seed so far, no claim '
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
    'remax':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 32.5% vs GRPO's "
        '42.5% on the same prompts, difference -10.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'ripo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 52.5% vs GRPO's "
        '47.5% on the same prompts, difference +5.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'rlcpr':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 52.5% vs GRPO's "
        '47.5% on the same prompts, difference +5.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'rlcr':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 75.0% vs GRPO's "
        '60.0% on the same prompts, difference +15.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'rloo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 40.0% vs GRPO's "
        '42.5% on the same prompts, difference -2.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'sis':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 35.0% vs GRPO's "
        '42.5% on the same prompts, difference -7.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'stare':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 45.0% vs GRPO's "
        '47.5% on the same prompts, difference -2.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'tapo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 42.5% vs GRPO's "
        '47.5% on the same prompts, difference -5.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'tasco':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 15.0% vs GRPO's "
        '47.5% on the same prompts, difference -32.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'tis':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 5.0% vs GRPO's 12.5%"
        ' on the same prompts, difference -7.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'tlm_dre':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 0.0% vs GRPO's 0.0% "
        'on the same prompts, difference +0.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'ttpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 15.0% vs GRPO's "
        '47.5% on the same prompts, difference -32.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'ttrl':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 40.0% vs GRPO's "
        '47.5% on the same prompts, difference -7.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'zcpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 42.5% vs GRPO's "
        '47.5% on the same prompts, difference -5.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
}
