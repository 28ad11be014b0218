"""The registered methods. One `register(Recipe(...))` per method; the card says what is
implemented, what was checked against the paper, and what is not established.

Status vocabulary (honest, updated only with evidence):
  "kernel verified"                       unit tests of the math pass (hand cases, naive refs, gradients)
  "+ one trainer step (tiny model)"       the recipe ran one real optimizer step in the test suite
  "trained end to end on <model>, <task>" a measured run; numbers in the README / benchmarks/results
"""

from __future__ import annotations

from .registry import Card, KLSpec, Recipe, register

_GRPO_ROLES = dict(
    samples="rollout engine at the current weights (G samples per prompt); π_old = trainer recompute at those weights",
    learns="π_θ (the only differentiable policy)",
)
_KERNEL = "kernel verified; one trainer step on a tiny random Llama in the test suite"
_PPO_CLIP = dict(eps_low=0.2, eps_high=0.2)

register(Recipe(
    name="ppo",
    card=Card(
        title="Proximal Policy Optimization Algorithms (+ Generalized Advantage Estimation, 1506.02438)",
        arxiv="1707.06347", family="advantage + objective",
        samples="π_old (on-policy rollout at the current weights)", learns="π_θ; critic V_φ (value head on a copy of the policy)",
        reference="π_ref (initial policy) through a per-token KL penalty in the reward (InstructGPT style)",
        critic="value head on a copy of the policy backbone, clipped value loss",
        summary="GAE advantages from a critic, clipped ratio surrogate, clipped value loss; KL to the reference folded into the per-token reward",
        status=_KERNEL,
        not_established="critic quality; that the clip is a trust region (it bounds the step relative to π_old only, not to π_ref)",
        confirmed="GAE recursion and clipped surrogate as in the papers' equations; value clipping follows common practice (not in the PPO paper)",
    ),
    advantage="gae", objective="ppo_clip", aggregation="token_mean",
    params=dict(**_PPO_CLIP, gamma=1.0, lam=0.95, value_clip=0.2, whiten=False),
    kl=KLSpec("k1", 0.05, "reward"), needs=("values",), critic=True,
))

register(Recipe(
    name="grpo",
    card=Card(
        title="DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
        arxiv="2402.03300", family="advantage + objective", **_GRPO_ROLES,
        reference="π_ref fixed anchor, k3 KL added to the loss (β = 0.04 in the paper; set kl_coef=0 to drop the reference model)",
        summary="group-standardized outcome reward as every token's advantage; PPO clip; k3 KL in the loss; per-sequence token mean",
        status=_KERNEL,
        not_established="reasoning gains at scale; the std convention of the paper's code (we expose unbiased/population)",
        confirmed="advantage (r − mean)/std and the k3 estimator as in the paper's eqs. for outcome supervision",
    ),
    advantage="grpo", objective="ppo_clip", aggregation="seq_mean_token_mean",
    params=dict(**_PPO_CLIP, std="unbiased", eps=1e-6),
    kl=KLSpec("k3", 0.04, "loss"), needs=("rewards",), min_group_size=2,
))

register(Recipe(
    name="grpo_process",
    card=Card(
        title="DeepSeekMath (process-supervision variant of GRPO)", arxiv="2402.03300",
        family="advantage", **_GRPO_ROLES, reference="as grpo",
        summary="step rewards normalized over the group's pool; a token's advantage sums the normalized rewards of its step and every later step",
        status="kernel verified; the trainer runs it with a rule-based line scorer (a line earns its reward when its last number is right), not a PRM",
        not_established="PRM quality; tokens after the last step get 0 (library decision)",
        unconfirmed=("advantage of tokens after the last step end",),
    ),
    advantage="grpo_process", objective="ppo_clip", aggregation="seq_mean_token_mean",
    params=dict(**_PPO_CLIP, std="unbiased", eps=1e-6), kl=None, min_group_size=2,
))

register(Recipe(
    name="dr_grpo",
    card=Card(
        title="Understanding R1-Zero-Like Training: A Critical Perspective", arxiv="2503.20783",
        family="advantage + aggregation", **_GRPO_ROLES, reference="none (KL off in the paper's main setting)",
        summary="mean-centred group rewards without std division; loss summed over tokens and divided by a constant L_norm",
        status=_KERNEL,
        not_established="removal of length bias (toy lengths cannot show it)",
        confirmed="A = r − mean_g r and the constant normalizer as in the paper",
    ),
    advantage="dr_grpo", objective="ppo_clip", aggregation="seq_mean_token_sum_norm",
    params=dict(**_PPO_CLIP, L_norm=None), min_group_size=2,
))

register(Recipe(
    name="dapo",
    card=Card(
        title="DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arxiv="2503.14476",
        family="objective + filter + shaping", **_GRPO_ROLES, reference="none (KL removed)",
        summary="clip-higher (ε_low 0.2, ε_high 0.28), dynamic sampling on raw correctness, token-mean over the batch, soft overlong penalty",
        status=_KERNEL,
        not_established="32B-scale results; filtering costs generations and cannot help prompts never solved",
        confirmed="ε_high = 0.28, strict 0 < #correct < G filter, overlong ramp (paper: L_max 20480, L_cache 4096)",
    ),
    advantage="grpo", objective="ppo_clip", aggregation="token_mean",
    params=dict(eps_low=0.2, eps_high=0.28, std="unbiased", eps=1e-6, overlong_max=None, overlong_cache=None),
    filter="dynamic_sampling", shaping=("overlong",), min_group_size=2, needs=("rewards",),
))

register(Recipe(
    name="rloo",
    card=Card(
        title="Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs",
        arxiv="2402.14740", family="advantage", samples="π_θ at the current weights, K ≥ 2 samples per prompt",
        learns="π_θ", reference="optional: KL-shaped sequence reward (off by default)",
        summary="leave-one-out mean of the other K−1 rewards as baseline; whole response is one action (REINFORCE)",
        status=_KERNEL, not_established="RM quality; large-model RLHF",
        confirmed="A_i = r_i − mean of the others = K/(K−1)·(r_i − mean)",
    ),
    advantage="rloo", objective="reinforce", aggregation="seq_mean_token_sum", params={}, min_group_size=2,
))

register(Recipe(
    name="remax",
    card=Card(
        title="ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning Large Language Models",
        arxiv="2310.10505", family="advantage", samples="π_θ: one sampled and one greedy response per prompt",
        learns="π_θ (sampled tokens only; greedy tokens never enter the loss)", reference="none",
        summary="reward of the greedy decode of the same prompt is the baseline",
        status=_KERNEL, not_established="memory/latency claims",
    ),
    advantage="remax", objective="reinforce", aggregation="seq_mean_token_sum", params={},
    greedy_baseline=True, needs=("rewards", "greedy_rewards"),
))

register(Recipe(
    name="reinforce_pp",
    card=Card(
        title="REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both Prompt and Reward Models",
        arxiv="2501.03262", family="advantage", samples="π_old (one sample per prompt allowed)", learns="π_θ",
        reference="π_ref through a k1 KL folded into the return-to-go (KL in the reward)",
        summary="KL-shaped return-to-go, whitened over all tokens of the batch, PPO clip; no critic",
        status=_KERNEL, not_established="robustness claims of the paper",
        unconfirmed=("which revision/title of the paper the library cites",),
    ),
    advantage="reinforce_pp", objective="ppo_clip", aggregation="token_mean", params=dict(**_PPO_CLIP),
    kl=KLSpec("k1", 0.01, "reward"), needs=("logp_old",),
))

register(Recipe(
    name="reinforce_pp_baseline",
    card=Card(
        title="REINFORCE++ (group-baseline variant)", arxiv="2501.03262", family="advantage",
        samples="π_old, G samples per prompt", learns="π_θ", reference="none by default",
        summary="group-mean centring, then one global scale (batch std, or √EMA of the second moment)",
        status=_KERNEL, not_established="EMA decay choices; small tests only check semantics",
        unconfirmed=("EMA decay",),
    ),
    advantage="reinforce_pp_baseline", objective="ppo_clip", aggregation="token_mean",
    params=dict(**_PPO_CLIP, scale="batch_std"), min_group_size=2,
))

register(Recipe(
    name="vapo",
    card=Card(
        title="VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks", arxiv="2504.05118",
        family="objective + advantage (value-based)", samples="π_old, G samples per prompt", learns="π_θ; critic V_φ",
        reference="none", critic="value head on a copy of the policy, pretrained on Monte-Carlo returns",
        summary="value pretraining, decoupled GAE (λ_critic 1, λ_policy = 1 − 1/(α·l)), clip-higher, positive-example NLL",
        status="kernel verified; smoke only on CPU (long chains of thought are needed for its effects)",
        not_established="that a short value pretraining gives a good critic; effects need long CoT",
        unconfirmed=("λ_policy for responses shorter than 1/α (clamped to [0, 1], counted: library decision)",),
        confirmed="α = 0.05, ε_high = 0.28, μ_lm = 0.1 as listed in the paper",
    ),
    advantage="vapo", objective="ppo_clip", aggregation="token_mean",
    params=dict(eps_low=0.2, eps_high=0.28, alpha=0.05, lam_critic=1.0, gamma=1.0, value_clip=0.2, nll_coef=0.1),
    critic=True, needs=("values",), min_group_size=1,
))

register(Recipe(
    name="gspo",
    card=Card(
        title="Group Sequence Policy Optimization", arxiv="2507.18071", family="objective", **_GRPO_ROLES,
        reference="none",
        summary="one length-normalized (geometric-mean) ratio per response, one clip decision per sequence",
        status=_KERNEL, not_established="MoE stability benefits (needs an MoE model)",
        unconfirmed=("clip range: ~3e-4 / 4e-4 scale per the paper; set explicitly",),
    ),
    advantage="grpo", objective="gspo", aggregation="seq_mean_token_mean",
    params=dict(eps_low=3e-4, eps_high=4e-4, std="unbiased", eps=1e-6), min_group_size=2,
))

register(Recipe(
    name="cispo",
    card=Card(
        title="MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", arxiv="2506.13585",
        family="objective", **_GRPO_ROLES, reference="none",
        summary="detached clipped IS weight × advantage × logp: no token ever loses its gradient",
        status=_KERNEL, not_established="a trust region (only the weight is bounded)",
        unconfirmed=("ε values: the paper disables the lower bound and tunes the upper one",),
    ),
    advantage="grpo", objective="cispo", aggregation="token_mean",
    params=dict(eps_low=None, eps_high=0.28, std="unbiased", eps=1e-6), min_group_size=2,
))

register(Recipe(
    name="gppo",
    card=Card(
        title="Klear-Reasoner: Advancing Reasoning Capability via Gradient-Preserving Clipping Policy Optimization",
        arxiv="2508.07629", family="objective", **_GRPO_ROLES, reference="none",
        summary="PPO forward values; clipped tokens keep a bounded gradient (1+ε_high or 1−ε_low)",
        status=_KERNEL, not_established="long-CoT claims; loss logs cannot distinguish it from PPO",
    ),
    advantage="grpo", objective="gppo", aggregation="token_mean",
    params=dict(eps_low=0.2, eps_high=0.28, std="unbiased", eps=1e-6), min_group_size=2,
))

register(Recipe(
    name="ttrl",
    card=Card(
        title="TTRL: Test-Time Reinforcement Learning", arxiv="2504.16084", family="test-time adaptation",
        samples="π_θ, N answers per unlabeled prompt", learns="π_θ (online)", reference="none",
        summary="majority-vote pseudo-label, 0/1 agreement reward, GRPO; gold only in the separate evaluator",
        status=_KERNEL, not_established="consensus can be confidently wrong; adapted models are not fixed-model evaluations",
        unconfirmed=("tie rule: tied majorities make the prompt ineligible (library decision)",),
    ),
    advantage="grpo", objective="ppo_clip", aggregation="seq_mean_token_mean",
    params=dict(**_PPO_CLIP, std="unbiased", eps=1e-6), reward_source="majority_vote", min_group_size=2,
))
