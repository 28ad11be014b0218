"""Generated from benchmarks/results/evidence.json by scripts/update_evidence_levels.py: do not edit.

The mechanism and capability levels the cards state (policylab.methods.evidence.levels).
"""

MECHANISM: dict[str, str] = {
    'cispo':
        'not observed: mean of `grad_norm` 5.5 vs 4.902 for the control (grpo), difference +0.598 ±'
        ' 0.219 over 3 seeds (benchmarks/results/evidence.md)',
    'code_opt':
        'not observed: late-half mean of `code/speed_mean` 0 vs 0 for the control (code_opt with '
        'speed_weight=0.0), difference +0 ± 0 over 3 seeds (benchmarks/results/evidence.md)',
    'conspo':
        'not observed: late-half mean of `reward/mean` 0.4271 vs 0.2396 for the control (grpo), '
        'difference +0.188 ± 0.113 over 3 seeds (benchmarks/results/evidence.md)',
    'dapo':
        'not observed: late-half mean of `policy/entropy` 1.777 vs 1.934 for the control (dapo with'
        ' eps_high=0.2), difference -0.157 ± 0.0851 over 3 seeds (benchmarks/results/evidence.md)',
    'dr_grpo':
        'not observed: late-half mean of `response/length_mean` 12.94 vs 13.33 for the control '
        '(grpo), difference -0.396 ± 0.235 over 3 seeds (benchmarks/results/evidence.md)',
    'erils':
        'not observed: mean of `groups/zero_spread_frac` 0.5833 vs 0.3333 for the control (grpo), '
        'difference +0.25 ± 0.0361 over 3 seeds (benchmarks/results/evidence.md)',
    'erpo':
        'not observed: late-half mean of `reward/mean` 0.3333 vs 0.2396 for the control (grpo), '
        'difference +0.0938 ± 0.0625 over 3 seeds (benchmarks/results/evidence.md)',
    'ggpo':
        'not observed: late-half mean of `reward/mean` 0.2812 vs 0.2396 for the control (grpo), '
        'difference +0.0417 ± 0.0634 over 3 seeds (benchmarks/results/evidence.md)',
    'gmc':
        'not observed: mean of `grad_norm` 5.072 vs 5.191 for the control (grpo), difference -0.119'
        ' ± 0.46 over 3 seeds (benchmarks/results/evidence.md)',
    'gppo':
        'not observed: mean of `grad_norm` 5.683 vs 4.902 for the control (grpo), difference +0.78 '
        '± 0.323 over 3 seeds (benchmarks/results/evidence.md)',
    'gppo_fdiv':
        'not observed: mean of `policy/ratio/max` 1.231 vs 1.232 for the control (grpo), difference'
        ' -0.00177 ± 0.0197 over 3 seeds (benchmarks/results/evidence.md)',
    'gprl':
        'not observed: late-half mean of `reward/mean` 0.2812 vs 0.2396 for the control (grpo), '
        'difference +0.0417 ± 0.058 over 3 seeds (benchmarks/results/evidence.md)',
    'graft':
        'observed: mean of `groups/zero_spread_frac` 0.2292 vs 0.3333 for the control (grpo), '
        'difference -0.104 ± 0.0208 over 3 seeds (benchmarks/results/evidence.md)',
    'grin':
        'observed: mean of `groups/zero_spread_frac` 0.02083 vs 0.3333 for the control (grpo), '
        'difference -0.312 ± 0.0625 over 3 seeds (benchmarks/results/evidence.md)',
    'grpo':
        'not observed: late-half mean of `reward/mean` 0.2396 vs 0.1875 for the control (grpo and '
        'train.lr=0.0), difference +0.0521 ± 0.0521 over 3 seeds (benchmarks/results/evidence.md)',
    'grpo_process':
        'not observed: late-half mean of `reward/mean` 0.1771 vs 0.2396 for the control (grpo), '
        'difference -0.0625 ± 0.0786 over 3 seeds (benchmarks/results/evidence.md)',
    'gspo':
        'observed: mean of `policy/clip_frac` 0.3208 vs 0.01316 for the control (grpo), difference '
        '+0.308 ± 0.0431 over 3 seeds (benchmarks/results/evidence.md)',
    'icepop':
        'not observed: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` 1.01 vs 0.903 '
        'for the control (grpo), difference +0.107 ± 0.0301 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'kpop':
        'not observed: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` 0.9367 vs 0.903 '
        'for the control (grpo), difference +0.0336 ± 0.0557 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'luffy':
        'not observed: late-half mean of `policy/luffy/demo_token_prob_mean` 0.2208 vs 0.2027 for '
        'the control (luffy with luffy_gamma=1.0), difference +0.0181 ± 0.0106 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'luspo':
        'not observed: late-half mean of `response/length_mean` 14.77 vs 13.79 for the control '
        '(gspo), difference +0.979 ± 0.429 over 3 seeds (benchmarks/results/evidence.md)',
    'mad_rl':
        'not observed: late-half mean of `distribution/tv_mean` 0.8762 vs 0.8727 for the control '
        '(mad_rl with match_coef=0.0), difference +0.00344 ± 0.00344 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'minirl':
        'not observed: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` 0.9885 vs 0.903 '
        'for the control (grpo), difference +0.0855 ± 0.00746 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'mis':
        'not observed: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` 0.9584 vs 0.903 '
        'for the control (grpo), difference +0.0553 ± 0.0111 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'missing_old_logits':
        'not observed: late-half mean of `mismatch/old_vs_behavior_abs_dlogp_mean` 0.966 vs 0.9696 '
        'for the control (grpo), difference -0.00362 ± 0.00415 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'moer':
        'not observed: mean of `groups/zero_spread_frac` 0.0625 vs 0.3333 for the control (grpo), '
        'difference -0.271 ± 0.0751 over 3 seeds (benchmarks/results/evidence.md)',
    'off_context_grpo':
        'not observed: mean of `groups/zero_spread_frac` 0.5417 vs 0.3333 for the control '
        '(off_context_grpo with hint_kind=none), difference +0.208 ± 0.0551 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'online_icepop':
        'not measurable here: the runs never logged `mismatch/old_vs_behavior_abs_dlogp_mean` as a '
        'finite number at this size and budget (benchmarks/results/evidence.md)',
    'probe_erpo':
        'not observed: final value of `eval/accuracy` 0.3833 vs 0.225 for the control (probe_erpo '
        'and train.lr=0.0), difference +0.158 ± 0.0795 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'range_grpo':
        'not observed: late-half mean of `reward/mean` 0.3021 vs 0.3438 for the control (dr_grpo), '
        'difference -0.0417 ± 0.0994 over 3 seeds (benchmarks/results/evidence.md)',
    'reco':
        'not observed: late-half mean of `policy/entropy` 2.164 vs 1.881 for the control (grpo), '
        'difference +0.282 ± 0.223 over 3 seeds (benchmarks/results/evidence.md)',
    'reinforce_pp':
        'not observed: late-half mean of `reward/mean` 0.3646 vs 0.2396 for the control (grpo), '
        'difference +0.125 ± 0.0722 over 3 seeds (benchmarks/results/evidence.md)',
    'reinforce_pp_baseline':
        'not observed: late-half mean of `reward/mean` 0.2812 vs 0.2396 for the control (grpo), '
        'difference +0.0417 ± 0.104 over 3 seeds (benchmarks/results/evidence.md)',
    'remax':
        'not observed: late-half mean of `reward/mean` 0.1771 vs 0.2396 for the control (grpo), '
        'difference -0.0625 ± 0.0312 over 3 seeds (benchmarks/results/evidence.md)',
    'ripo':
        'not observed: mean of `policy/ratio/max` 1.23 vs 1.232 for the control (grpo), difference '
        '-0.00192 ± 0.0198 over 3 seeds (benchmarks/results/evidence.md)',
    'rlcpr':
        'not observed: late-half mean of `response/length_mean` 13.34 vs 13.33 for the control '
        '(rlcpr with length_coef=0.0), difference +0.0104 ± 0.0994 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'rlcr':
        'not observed: final value of `eval/confidence/brier` 0.2476 vs 0.2821 for the control '
        '(grpo), difference -0.0345 ± 0.103 over 3 seeds (benchmarks/results/evidence.md)',
    'rlid':
        'not observed: late-half mean of `rlid/label_marginal_kl` 0.6206 vs 0.9145 for the control '
        '(rlid with marginal_coef=0.0), difference -0.294 ± 0.266 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'rloo':
        'not observed: late-half mean of `reward/mean` 0.25 vs 0.2396 for the control (grpo), '
        'difference +0.0104 ± 0.0833 over 3 seeds (benchmarks/results/evidence.md)',
    'sis':
        'observed: mean of `policy/clip_frac` 0.007375 vs 0.03446 for the control (grpo), '
        'difference -0.0271 ± 0.00401 over 3 seeds (benchmarks/results/evidence.md)',
    'stare':
        'not observed: late-half mean of `policy/entropy` 1.855 vs 1.855 for the control (stare '
        'with stare_amplify=1.0), difference +0 ± 0 over 3 seeds (benchmarks/results/evidence.md)',
    'tapo':
        'not observed: mean of `policy/ratio/max` 1.187 vs 1.232 for the control (grpo), difference'
        ' -0.0456 ± 0.0214 over 3 seeds (benchmarks/results/evidence.md)',
    'tasco':
        'observed: late-half mean of `policy/entropy` 2.274 vs 2.276 for the control (tasco and '
        'train.lr=0.0), difference -0.00176 ± 0.000265 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'tis':
        'observed: mean of `correction/tis/ess` 0.6701 vs 0.3876 for the control (tis with '
        'tis_cap=1000000.0), difference +0.283 ± 0.013 over 3 seeds '
        '(benchmarks/results/evidence.md)',
    'tlm_dre':
        'not observed: late-half mean of `reward/mean` 0.04167 vs 0 for the control (grpo), '
        'difference +0.0417 ± 0.0208 over 3 seeds (benchmarks/results/evidence.md)',
    'ttpo':
        'not observed: final value of `eval/accuracy` 0.225 vs 0.225 for the control (ttpo and '
        'train.lr=0.0), difference +0 ± 0.0577 over 3 seeds (benchmarks/results/evidence.md)',
    'ttrl':
        'not observed: late-half mean of `accuracy` 0.3785 vs 0.2083 for the control (ttrl and '
        'train.lr=0.0), difference +0.17 ± 0.0799 over 3 seeds (benchmarks/results/evidence.md)',
    'zcpo':
        'not observed: late-half mean of `reward/mean` 0.2604 vs 0.2396 for the control (grpo), '
        'difference +0.0208 ± 0.0208 over 3 seeds (benchmarks/results/evidence.md)',
}

CAPABILITY_RUNS: dict[str, str] = {
    'cispo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 52.5% vs GRPO's "
        '46.7% on the same prompts, difference +5.8% ± 5.5% (95% interval [-17.7%, +29.3%], not '
        'significant); about 11 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'conspo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 34.2% vs GRPO's "
        '46.7% on the same prompts, difference -12.5% ± 4.3% (95% interval [-31.1%, +6.1%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'dapo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 51.7% vs GRPO's "
        '46.7% on the same prompts, difference +5.0% ± 7.6% (95% interval [-27.9%, +37.9%], not '
        'significant); about 27 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'dr_grpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 48.3% vs GRPO's "
        '46.7% on the same prompts, difference +1.7% ± 6.5% (95% interval [-26.3%, +29.7%], not '
        'significant); about 176 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'erils':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 23.3% vs GRPO's "
        '46.7% on the same prompts, difference -23.3% ± 6.5% (95% interval [-51.3%, +4.7%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'erpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 47.5% vs GRPO's "
        '46.7% on the same prompts, difference +0.8% ± 3.6% (95% interval [-14.8%, +16.5%], not '
        'significant); about 219 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'ggpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 30.0% vs GRPO's "
        '46.7% on the same prompts, difference -16.7% ± 2.2% (95% interval [-26.2%, -7.2%], '
        'significant) (benchmarks/results/evidence.md)',
    'gmc':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 28.3% vs GRPO's "
        '34.2% on the same prompts, difference -5.8% ± 4.4% (95% interval [-24.8%, +13.1%], not '
        'significant); about 7 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'gppo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 50.8% vs GRPO's "
        '46.7% on the same prompts, difference +4.2% ± 1.7% (95% interval [-3.0%, +11.3%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'gppo_fdiv':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 52.5% vs GRPO's "
        '46.7% on the same prompts, difference +5.8% ± 6.0% (95% interval [-20.0%, +31.7%], not '
        'significant); about 13 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'gprl':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 51.7% vs GRPO's "
        '46.7% on the same prompts, difference +5.0% ± 1.4% (95% interval [-1.2%, +11.2%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'graft':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 40.0% vs GRPO's "
        '46.7% on the same prompts, difference -6.7% ± 4.4% (95% interval [-25.6%, +12.3%], not '
        'significant); about 6 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'grin':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 45.0% vs GRPO's "
        '46.7% on the same prompts, difference -1.7% ± 8.2% (95% interval [-37.0%, +33.6%], not '
        'significant); about 280 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'grpo_process':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 33.3% vs GRPO's "
        '46.7% on the same prompts, difference -13.3% ± 4.6% (95% interval [-33.3%, +6.6%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'gspo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 35.0% vs GRPO's "
        '46.7% on the same prompts, difference -11.7% ± 11.8% (95% interval [-62.3%, +38.9%], not '
        'significant); about 12 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'icepop':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 10.8% vs GRPO's "
        '8.3% on the same prompts, difference +2.5% ± 3.8% (95% interval [-13.9%, +18.9%], not '
        'significant); about 27 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'kpop':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 8.3% vs GRPO's 8.3%"
        ' on the same prompts, difference +0.0% ± 3.8% (95% interval [-16.4%, +16.4%], not '
        'significant) (benchmarks/results/evidence.md)',
    'luffy':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 32.5% vs GRPO's "
        '46.7% on the same prompts, difference -14.2% ± 7.9% (95% interval [-48.4%, +20.0%], not '
        'significant); about 4 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'luspo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 30.0% vs GRPO's "
        '46.7% on the same prompts, difference -16.7% ± 6.8% (95% interval [-46.0%, +12.7%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'minirl':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 10.8% vs GRPO's "
        '8.3% on the same prompts, difference +2.5% ± 1.4% (95% interval [-3.7%, +8.7%], not '
        'significant); about 4 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'mis':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 10.8% vs GRPO's "
        '8.3% on the same prompts, difference +2.5% ± 1.4% (95% interval [-3.7%, +8.7%], not '
        'significant); about 4 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'missing_old_logits':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 9.2% vs GRPO's 7.5%"
        ' on the same prompts, difference +1.7% ± 3.0% (95% interval [-11.3%, +14.6%], not '
        'significant); about 38 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'moer':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 26.7% vs GRPO's "
        '46.7% on the same prompts, difference -20.0% ± 6.6% (95% interval [-48.5%, +8.5%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'off_context_grpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 20.0% vs GRPO's "
        '46.7% on the same prompts, difference -26.7% ± 11.7% (95% interval [-76.9%, +23.5%], not '
        'significant); about 3 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'online_icepop':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 9.2% vs GRPO's "
        '10.8% on the same prompts, difference -1.7% ± 3.0% (95% interval [-14.6%, +11.3%], not '
        'significant); about 38 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'probe_erpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 38.3% vs GRPO's "
        '46.7% on the same prompts, difference -8.3% ± 5.1% (95% interval [-30.1%, +13.5%], not '
        'significant); about 5 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'range_grpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 37.5% vs GRPO's "
        '46.7% on the same prompts, difference -9.2% ± 4.6% (95% interval [-29.1%, +10.8%], not '
        'significant); about 3 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'reco':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 41.7% vs GRPO's "
        '46.7% on the same prompts, difference -5.0% ± 2.5% (95% interval [-15.8%, +5.8%], not '
        'significant); about 3 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'reinforce_pp':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 45.0% vs GRPO's "
        '46.7% on the same prompts, difference -1.7% ± 0.8% (95% interval [-5.3%, +1.9%], not '
        'significant); about 3 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'reinforce_pp_baseline':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 50.8% vs GRPO's "
        '46.7% on the same prompts, difference +4.2% ± 4.2% (95% interval [-13.8%, +22.1%], not '
        'significant); about 12 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'remax':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 26.7% vs GRPO's "
        '45.8% on the same prompts, difference -19.2% ± 6.8% (95% interval [-48.5%, +10.2%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'ripo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 50.8% vs GRPO's "
        '46.7% on the same prompts, difference +4.2% ± 7.9% (95% interval [-30.0%, +38.4%], not '
        'significant); about 42 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'rlcpr':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 48.3% vs GRPO's "
        '46.7% on the same prompts, difference +1.7% ± 1.7% (95% interval [-5.5%, +8.8%], not '
        'significant); about 12 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'rlcr':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 77.5% vs GRPO's "
        '70.0% on the same prompts, difference +7.5% ± 3.8% (95% interval [-8.9%, +23.9%], not '
        'significant); about 3 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'rloo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 35.8% vs GRPO's "
        '45.8% on the same prompts, difference -10.0% ± 5.2% (95% interval [-32.4%, +12.4%], not '
        'significant); about 4 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'sis':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 36.7% vs GRPO's "
        '34.2% on the same prompts, difference +2.5% ± 8.8% (95% interval [-35.3%, +40.3%], not '
        'significant); about 143 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'stare':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 40.0% vs GRPO's "
        '46.7% on the same prompts, difference -6.7% ± 3.0% (95% interval [-19.6%, +6.3%], not '
        'significant); about 3 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'tapo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 38.3% vs GRPO's "
        '46.7% on the same prompts, difference -8.3% ± 3.3% (95% interval [-22.7%, +6.0%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'tasco':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 18.3% vs GRPO's "
        '46.7% on the same prompts, difference -28.3% ± 9.6% (95% interval [-69.7%, +13.0%], not '
        'significant); about 2 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'tis':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 10.8% vs GRPO's "
        '8.3% on the same prompts, difference +2.5% ± 5.2% (95% interval [-19.9%, +24.9%], not '
        'significant); about 50 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'tlm_dre':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 0.8% vs GRPO's 0.0%"
        ' on the same prompts, difference +0.8% ± 0.8% (95% interval [-2.8%, +4.4%], not '
        'significant); about 12 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'ttpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 22.5% vs GRPO's "
        '46.7% on the same prompts, difference -24.2% ± 4.2% (95% interval [-42.1%, -6.2%], '
        'significant) (benchmarks/results/evidence.md)',
    'ttrl':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 28.3% vs GRPO's "
        '46.7% on the same prompts, difference -18.3% ± 9.6% (95% interval [-59.7%, +23.0%], not '
        'significant); about 4 seeds would make a difference of this size significant '
        '(benchmarks/results/evidence.md)',
    'zcpo':
        "held-out accuracy after 4 rollout steps on its evidence task, 3 seeds: 46.7% vs GRPO's "
        '46.7% on the same prompts, difference +0.0% ± 2.9% (95% interval [-12.4%, +12.4%], not '
        'significant) (benchmarks/results/evidence.md)',
}
