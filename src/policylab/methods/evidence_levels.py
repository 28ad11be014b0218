"""Generated from benchmarks/results/evidence.json by scripts/update_evidence_levels.py: do not edit.

The mechanism and capability levels the cards state (policylab.methods.evidence.levels).
"""

MECHANISM: dict[str, str] = {
    'cispo':
        'not observed: mean of `grad_norm` 5.372 vs 4.71 for the control (grpo), difference +0.663 '
        '± 0.363 over 2 seeds (benchmarks/results/evidence.md)',
    'code_opt':
        'one seed so far, no claim: late-half mean of `code/speed_mean` 0 vs 0 for the control '
        '(code_opt with speed_weight=0.0), difference +0 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'conspo':
        'not observed: late-half mean of `reward/mean` 0.4688 vs 0.2031 for the control (grpo), '
        'difference +0.266 ± 0.141 over 2 seeds (benchmarks/results/evidence.md)',
    'dapo':
        'not observed: late-half mean of `policy/entropy` 1.888 vs 2.034 for the control (dapo with'
        ' eps_high=0.2), difference -0.146 ± 0.146 over 2 seeds (benchmarks/results/evidence.md)',
    'dr_grpo':
        'not observed: late-half mean of `response/length_mean` 12.14 vs 12.73 for the control '
        '(grpo), difference -0.594 ± 0.219 over 2 seeds (benchmarks/results/evidence.md)',
    'erils':
        'not observed: mean of `groups/zero_spread_frac` 0.5312 vs 0.3125 for the control (grpo), '
        'difference +0.219 ± 0.0312 over 2 seeds (benchmarks/results/evidence.md)',
    'erpo':
        'not observed: late-half mean of `reward/mean` 0.3281 vs 0.2031 for the control (grpo), '
        'difference +0.125 ± 0.0938 over 2 seeds (benchmarks/results/evidence.md)',
    'ggpo':
        'not observed: late-half mean of `reward/mean` 0.2969 vs 0.2031 for the control (grpo), '
        'difference +0.0938 ± 0.0625 over 2 seeds (benchmarks/results/evidence.md)',
    'gmc':
        'one seed so far, no claim: mean of `grad_norm` 4.425 vs 4.004 for the control (grpo), '
        'difference +0.421 over 1 seeds (benchmarks/results/evidence.md)',
    'gppo':
        'not observed: mean of `grad_norm` 5.756 vs 4.71 for the control (grpo), difference +1.05 ±'
        ' 0.319 over 2 seeds (benchmarks/results/evidence.md)',
    'gppo_fdiv':
        'not observed: mean of `policy/ratio/max` 1.246 vs 1.267 for the control (grpo), difference'
        ' -0.0214 ± 0.00231 over 2 seeds (benchmarks/results/evidence.md)',
    'gprl':
        'not observed: late-half mean of `reward/mean` 0.2812 vs 0.2031 for the control (grpo), '
        'difference +0.0781 ± 0.0781 over 2 seeds (benchmarks/results/evidence.md)',
    'graft':
        'not observed: mean of `groups/zero_spread_frac` 0.2188 vs 0.3125 for the control (grpo), '
        'difference -0.0938 ± 0.0312 over 2 seeds (benchmarks/results/evidence.md)',
    'grin':
        'not observed: mean of `groups/zero_spread_frac` 0.03125 vs 0.3125 for the control (grpo), '
        'difference -0.281 ± 0.0938 over 2 seeds (benchmarks/results/evidence.md)',
    'grpo':
        'not observed: late-half mean of `reward/mean` 0.2031 vs 0.2031 for the control (grpo and '
        'train.lr=0.0), difference +0 ± 0 over 2 seeds (benchmarks/results/evidence.md)',
    'grpo_process':
        'not observed: late-half mean of `reward/mean` 0.2188 vs 0.2031 for the control (grpo), '
        'difference +0.0156 ± 0.0156 over 2 seeds (benchmarks/results/evidence.md)',
    'gspo':
        'not observed: mean of `policy/clip_frac` 0.3585 vs 0.01653 for the control (grpo), '
        'difference +0.342 ± 0.045 over 2 seeds (benchmarks/results/evidence.md)',
    'icepop':
        'not observed: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` 1.008 vs 0.898 '
        'for the control (grpo), difference +0.11 ± 0.052 over 2 seeds '
        '(benchmarks/results/evidence.md)',
    'kpop':
        'not observed: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` 0.9016 vs 0.898 '
        'for the control (grpo), difference +0.00356 ± 0.0811 over 2 seeds '
        '(benchmarks/results/evidence.md)',
    'luffy':
        'not observed: late-half mean of `policy/luffy/demo_token_prob_mean` 0.2328 vs 0.2252 for '
        'the control (luffy with luffy_gamma=1.0), difference +0.00758 ± 0.00145 over 2 seeds '
        '(benchmarks/results/evidence.md)',
    'luspo':
        'not observed: late-half mean of `response/length_mean` 14.56 vs 13.52 for the control '
        '(gspo), difference +1.05 ± 0.734 over 2 seeds (benchmarks/results/evidence.md)',
    'mad_rl':
        'one seed so far, no claim: late-half mean of `distribution/tv_mean` 0.7797 vs 0.7797 for '
        'the control (mad_rl with match_coef=0.0), difference +0 over 1 seeds '
        '(benchmarks/results/evidence.md)',
    'minirl':
        'not observed: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` 0.9862 vs 0.898 '
        'for the control (grpo), difference +0.0881 ± 0.0121 over 2 seeds '
        '(benchmarks/results/evidence.md)',
    'mis':
        'not observed: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` 0.949 vs 0.898 '
        'for the control (grpo), difference +0.0509 ± 0.0177 over 2 seeds '
        '(benchmarks/results/evidence.md)',
    'missing_old_logits':
        'not observed: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` 0.9722 vs 0.9782'
        ' for the control (grpo), difference -0.00595 ± 0.00595 over 2 seeds '
        '(benchmarks/results/evidence.md)',
    'moer':
        'not observed: mean of `groups/zero_spread_frac` 0.09375 vs 0.3125 for the control (grpo), '
        'difference -0.219 ± 0.0938 over 2 seeds (benchmarks/results/evidence.md)',
    'off_context_grpo':
        'not observed: mean of `groups/zero_spread_frac` 0.5625 vs 0.3125 for the control '
        '(off_context_grpo with hint_kind=none), difference +0.25 ± 0.0625 over 2 seeds '
        '(benchmarks/results/evidence.md)',
    'online_icepop':
        'not measurable here: the runs never logged `mismatch/old_vs_behavior_abs_dlogp_mean` as a '
        'finite number at this size and budget (benchmarks/results/evidence.md)',
    'probe_erpo':
        'not observed: final value of `eval/accuracy` 0.425 vs 0.2 for the control (probe_erpo and '
        'train.lr=0.0), difference +0.225 ± 0.075 over 2 seeds (benchmarks/results/evidence.md)',
    'range_grpo':
        'not observed: late-half mean of `reward/mean` 0.2031 vs 0.3281 for the control (dr_grpo), '
        'difference -0.125 ± 0.0938 over 2 seeds (benchmarks/results/evidence.md)',
    'reco':
        'not observed: late-half mean of `policy/entropy` 2.022 vs 1.889 for the control (grpo), '
        'difference +0.133 ± 0.287 over 2 seeds (benchmarks/results/evidence.md)',
    'reinforce_pp':
        'not observed: late-half mean of `reward/mean` 0.2656 vs 0.2031 for the control (grpo), '
        'difference +0.0625 ± 0.0625 over 2 seeds (benchmarks/results/evidence.md)',
    'reinforce_pp_baseline':
        'not observed: late-half mean of `reward/mean` 0.2969 vs 0.2031 for the control (grpo), '
        'difference +0.0938 ± 0.156 over 2 seeds (benchmarks/results/evidence.md)',
    'remax':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.1562 vs 0.1875 for the '
        'control (grpo), difference -0.0312 over 1 seeds (benchmarks/results/evidence.md)',
    'ripo':
        'not observed: mean of `policy/ratio/max` 1.246 vs 1.267 for the control (grpo), difference'
        ' -0.0216 ± 0.0021 over 2 seeds (benchmarks/results/evidence.md)',
    'rlcpr':
        'not observed: late-half mean of `response/length_mean` 12.75 vs 12.73 for the control '
        '(rlcpr with length_coef=0.0), difference +0.0156 ± 0.172 over 2 seeds '
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
        'not observed: late-half mean of `policy/entropy` 1.686 vs 1.686 for the control (stare '
        'with stare_amplify=1.0), difference +0 ± 0 over 2 seeds (benchmarks/results/evidence.md)',
    'tapo':
        'not observed: mean of `policy/ratio/max` 1.202 vs 1.267 for the control (grpo), difference'
        ' -0.0656 ± 0.0133 over 2 seeds (benchmarks/results/evidence.md)',
    'tasco':
        'not observed: late-half mean of `policy/entropy` 2.304 vs 2.306 for the control (tasco and'
        ' train.lr=0.0), difference -0.00184 ± 0.000437 over 2 seeds '
        '(benchmarks/results/evidence.md)',
    'tis':
        'not observed: mean of `correction/tis/ess` 0.6713 vs 0.3879 for the control (tis with '
        'tis_cap=1000000.0), difference +0.283 ± 0.0224 over 2 seeds '
        '(benchmarks/results/evidence.md)',
    'tlm_dre':
        'one seed so far, no claim: late-half mean of `reward/mean` 0.0625 vs 0 for the control '
        '(grpo), difference +0.0625 over 1 seeds (benchmarks/results/evidence.md)',
    'ttpo':
        'not observed: final value of `eval/accuracy` 0.25 vs 0.2 for the control (ttpo and '
        'train.lr=0.0), difference +0.05 ± 0.05 over 2 seeds (benchmarks/results/evidence.md)',
    'ttrl':
        'not observed: late-half mean of `accuracy` 0.4375 vs 0.1875 for the control (ttrl and '
        'train.lr=0.0), difference +0.25 ± 0 over 2 seeds (benchmarks/results/evidence.md)',
    'zcpo':
        'not observed: late-half mean of `reward/mean` 0.2344 vs 0.2031 for the control (grpo), '
        'difference +0.0312 ± 0.0312 over 2 seeds (benchmarks/results/evidence.md)',
}

CAPABILITY_RUNS: dict[str, str] = {
    'cispo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 53.7% vs GRPO's "
        '51.3% on the same prompts, difference +2.5% ± 7.5% (95% interval [-92.8%, +97.8%], not '
        'significant); about 70 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'conspo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 38.8% vs GRPO's "
        '51.3% on the same prompts, difference -12.5% ± 7.5% (95% interval [-107.8%, +82.8%], not '
        'significant); about 3 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'dapo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 48.7% vs GRPO's "
        '51.3% on the same prompts, difference -2.5% ± 2.5% (95% interval [-34.3%, +29.3%], not '
        'significant); about 8 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'dr_grpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 52.5% vs GRPO's "
        '51.3% on the same prompts, difference +1.3% ± 11.3% (95% interval [-141.7%, +144.2%], not '
        'significant); about 623 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'erils':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 22.5% vs GRPO's "
        '51.3% on the same prompts, difference -28.8% ± 6.2% (95% interval [-108.2%, +50.7%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'erpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 48.7% vs GRPO's "
        '51.3% on the same prompts, difference -2.5% ± 2.5% (95% interval [-34.3%, +29.3%], not '
        'significant); about 8 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'ggpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 36.3% vs GRPO's "
        '51.3% on the same prompts, difference -15.0% ± 2.5% (95% interval [-46.8%, +16.8%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'gmc':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 30.0% vs GRPO's "
        '42.5% on the same prompts, difference -12.5%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'gppo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 53.7% vs GRPO's "
        '51.3% on the same prompts, difference +2.5% ± 0.0% (95% interval [+2.5%, +2.5%], too few '
        'seeds for a claim) (benchmarks/results/evidence.md)',
    'gppo_fdiv':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 51.2% vs GRPO's "
        '51.3% on the same prompts, difference -0.0% ± 2.5% (95% interval [-31.8%, +31.8%], not '
        'significant); about 21626321503406 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'gprl':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 55.0% vs GRPO's "
        '51.3% on the same prompts, difference +3.7% ± 1.3% (95% interval [-12.1%, +19.6%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'graft':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 48.7% vs GRPO's "
        '51.3% on the same prompts, difference -2.5% ± 2.5% (95% interval [-34.3%, +29.3%], not '
        'significant); about 8 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'grin':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 47.5% vs GRPO's "
        '51.3% on the same prompts, difference -3.8% ± 13.8% (95% interval [-178.5%, +171.0%], not '
        'significant); about 104 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'grpo_process':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 36.2% vs GRPO's "
        '51.3% on the same prompts, difference -15.0% ± 7.5% (95% interval [-110.3%, +80.3%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'gspo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 32.5% vs GRPO's "
        '51.3% on the same prompts, difference -18.8% ± 16.3% (95% interval [-225.2%, +187.7%], not'
        ' significant); about 6 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'icepop':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 8.7% vs GRPO's 8.8%"
        ' on the same prompts, difference -0.0% ± 5.0% (95% interval [-63.5%, +63.5%], not '
        'significant); about 5536328817628888 seeds would make a difference of this size '
        'significant (benchmarks/results/evidence.md)',
    'kpop':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 10.0% vs GRPO's "
        '8.8% on the same prompts, difference +1.3% ± 6.2% (95% interval [-78.2%, +80.7%], not '
        'significant); about 193 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'luffy':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 37.5% vs GRPO's "
        '51.3% on the same prompts, difference -13.8% ± 13.8% (95% interval [-188.5%, +161.0%], not'
        ' significant); about 8 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'luspo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 32.5% vs GRPO's "
        '51.3% on the same prompts, difference -18.8% ± 11.3% (95% interval [-161.7%, +124.2%], not'
        ' significant); about 3 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'minirl':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 10.0% vs GRPO's "
        '8.8% on the same prompts, difference +1.3% ± 1.3% (95% interval [-14.6%, +17.1%], not '
        'significant); about 8 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'mis':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 11.3% vs GRPO's "
        '8.8% on the same prompts, difference +2.5% ± 2.5% (95% interval [-29.3%, +34.3%], not '
        'significant); about 8 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'missing_old_logits':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 7.5% vs GRPO's 8.8%"
        ' on the same prompts, difference -1.2% ± 1.2% (95% interval [-17.1%, +14.6%], not '
        'significant); about 8 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'moer':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 25.0% vs GRPO's "
        '51.3% on the same prompts, difference -26.3% ± 3.8% (95% interval [-73.9%, +21.4%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'off_context_grpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 13.7% vs GRPO's "
        '51.3% on the same prompts, difference -37.5% ± 7.5% (95% interval [-132.8%, +57.8%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'online_icepop':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 8.8% vs GRPO's "
        '11.3% on the same prompts, difference -2.5% ± 5.0% (95% interval [-66.0%, +61.0%], not '
        'significant); about 31 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'probe_erpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 42.5% vs GRPO's "
        '51.3% on the same prompts, difference -8.7% ± 8.7% (95% interval [-119.9%, +102.4%], not '
        'significant); about 8 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'range_grpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 37.5% vs GRPO's "
        '51.3% on the same prompts, difference -13.8% ± 1.3% (95% interval [-29.6%, +2.1%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'reco':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 43.8% vs GRPO's "
        '51.3% on the same prompts, difference -7.5% ± 0.0% (95% interval [-7.5%, -7.5%], too few '
        'seeds for a claim) (benchmarks/results/evidence.md)',
    'reinforce_pp':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 48.7% vs GRPO's "
        '51.3% on the same prompts, difference -2.5% ± 0.0% (95% interval [-2.5%, -2.5%], too few '
        'seeds for a claim) (benchmarks/results/evidence.md)',
    'reinforce_pp_baseline':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 57.5% vs GRPO's "
        '51.3% on the same prompts, difference +6.3% ± 6.3% (95% interval [-73.2%, +85.7%], not '
        'significant); about 8 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'remax':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 32.5% vs GRPO's "
        '42.5% on the same prompts, difference -10.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'ripo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 48.7% vs GRPO's "
        '51.3% on the same prompts, difference -2.5% ± 7.5% (95% interval [-97.8%, +92.8%], not '
        'significant); about 70 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'rlcpr':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 53.7% vs GRPO's "
        '51.3% on the same prompts, difference +2.5% ± 2.5% (95% interval [-29.3%, +34.3%], not '
        'significant); about 8 seeds would make a difference of this size significant '
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
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 47.5% vs GRPO's "
        '51.3% on the same prompts, difference -3.8% ± 1.3% (95% interval [-19.6%, +12.1%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'tapo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 41.3% vs GRPO's "
        '51.3% on the same prompts, difference -10.0% ± 5.0% (95% interval [-73.5%, +53.5%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'tasco':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 13.8% vs GRPO's "
        '51.3% on the same prompts, difference -37.5% ± 5.0% (95% interval [-101.0%, +26.0%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'tis':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 7.5% vs GRPO's 8.8%"
        ' on the same prompts, difference -1.2% ± 6.2% (95% interval [-80.7%, +78.2%], not '
        'significant); about 193 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'tlm_dre':
        "held-out accuracy after 4 rollout steps on its evidence task, 1 seed: 0.0% vs GRPO's 0.0% "
        'on the same prompts, difference +0.0%; one seed so far, no claim '
        '(benchmarks/results/evidence.md)',
    'ttpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 25.0% vs GRPO's "
        '51.3% on the same prompts, difference -26.3% ± 6.2% (95% interval [-105.7%, +53.2%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'ttrl':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 28.8% vs GRPO's "
        '51.3% on the same prompts, difference -22.5% ± 15.0% (95% interval [-213.1%, +168.1%], not'
        ' significant); about 4 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'zcpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 2 seeds: 48.8% vs GRPO's "
        '51.3% on the same prompts, difference -2.5% ± 2.5% (95% interval [-34.3%, +29.3%], not '
        'significant); about 8 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
}
